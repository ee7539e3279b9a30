// What every Communicator implementation must do, checked from inside one rank: all-reduce
// against a float64 sum of what every rank contributed, all-gather, broadcast from every root,
// send/recv around a ring, the variable-length helpers and barriers, at sizes from 0 bytes to
// several times a shared-memory slot. Every rank of the group calls check_collectives() at once.
// Plain C++ (no gtest), so forked rank processes can run it too: returns "" when everything
// holds, else the first problem.
// Header-only.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace pagoda::testing {

// Rank `rank`'s contribution: n floats in [-1, 1), its own sequence.
inline std::vector<float> rank_values(int rank, int64_t n) {
  std::mt19937 rng(1000u + static_cast<uint32_t>(rank));
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

inline uint8_t pattern_byte(int rank, int64_t i) { return static_cast<uint8_t>((rank * 131 + i * 7 + (i >> 9)) & 0xff); }

inline uint64_t fnv1a(const void* data, size_t n) {
  uint64_t h = 1469598103934665603ull;
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// `identical_sums`: whether every rank must get the same bits from all_reduce_sum (the
// shared-memory implementation promises it).
inline std::string check_collectives(Communicator& c, bool identical_sums) {
  const int rank = c.rank();
  const int n = c.size();
  const std::string at = " (rank " + std::to_string(rank) + " of " + std::to_string(n) + ")";
  if (n < 1 || rank < 0 || rank >= n) return "bad rank or size" + at;
  auto failed = [&](const Status& s, const char* what) { return std::string(what) + " failed: " + s.message() + at; };

  // All-reduce: small, odd, and larger than a 4 MiB slot (1.5 M floats = 6 MiB).
  for (int64_t count : {int64_t{1}, int64_t{7}, int64_t{4099}, int64_t{1536} * 1024}) {
    std::vector<float> data = rank_values(rank, count);
    std::vector<double> want(static_cast<size_t>(count), 0.0), magnitude(static_cast<size_t>(count), 0.0);
    for (int r = 0; r < n; ++r) {
      const std::vector<float> v = rank_values(r, count);
      for (size_t i = 0; i < v.size(); ++i) {
        want[i] += v[i];
        magnitude[i] += std::fabs(v[i]);
      }
    }
    if (Status s = c.all_reduce_sum(data.data(), count); !s.ok()) return failed(s, "all_reduce_sum");
    for (size_t i = 0; i < data.size(); ++i) {
      // n - 1 float additions: each rounds by at most half an ulp of the running sum.
      const double bound = n * std::ldexp(magnitude[i], -24) + 1e-30;
      if (!(std::fabs(data[i] - want[i]) <= bound)) {
        return "all_reduce_sum of " + std::to_string(count) + " floats: element " + std::to_string(i) + " is " +
               std::to_string(data[i]) + ", the float64 sum is " + std::to_string(want[i]) + at;
      }
    }
    if (identical_sums) {
      const uint64_t mine = fnv1a(data.data(), data.size() * sizeof(float));
      std::vector<uint64_t> all(static_cast<size_t>(n));
      if (Status s = c.all_gather(&mine, sizeof mine, all.data()); !s.ok()) return failed(s, "all_gather");
      for (int r = 0; r < n; ++r) {
        if (all[static_cast<size_t>(r)] != mine) return "rank " + std::to_string(r) + "'s sums differ in their bits" + at;
      }
    }
  }

  // All-gather: a few bytes, and 5 MiB per rank.
  for (int64_t bytes : {int64_t{5}, int64_t{5} << 20}) {
    std::vector<uint8_t> mine(static_cast<size_t>(bytes));
    for (int64_t i = 0; i < bytes; ++i) mine[static_cast<size_t>(i)] = pattern_byte(rank, i);
    std::vector<uint8_t> all(static_cast<size_t>(bytes * n), 0xEE);
    if (Status s = c.all_gather(mine.data(), bytes, all.data()); !s.ok()) return failed(s, "all_gather");
    for (int r = 0; r < n; ++r) {
      for (int64_t i = 0; i < bytes; ++i) {
        if (all[static_cast<size_t>(r * bytes + i)] != pattern_byte(r, i)) {
          return "all_gather of " + std::to_string(bytes) + " bytes: rank " + std::to_string(r) + "'s byte " +
                 std::to_string(i) + " is wrong" + at;
        }
      }
    }
  }

  // Broadcast from every root.
  for (int root = 0; root < n; ++root) {
    for (int64_t bytes : {int64_t{0}, int64_t{3}, int64_t{5} << 20}) {
      std::vector<uint8_t> data(static_cast<size_t>(bytes), 0);
      if (rank == root) {
        for (int64_t i = 0; i < bytes; ++i) data[static_cast<size_t>(i)] = pattern_byte(root, i);
      }
      if (Status s = c.broadcast(data.data(), bytes, root); !s.ok()) return failed(s, "broadcast");
      for (int64_t i = 0; i < bytes; ++i) {
        if (data[static_cast<size_t>(i)] != pattern_byte(root, i)) {
          return "broadcast of " + std::to_string(bytes) + " bytes from rank " + std::to_string(root) + ": byte " +
                 std::to_string(i) + " is wrong" + at;
        }
      }
    }
  }

  // Around the ring: even ranks send first, odd ranks receive first (no cycle of blocked sends).
  if (n > 1) {
    const int next = (rank + 1) % n;
    const int prev = (rank + n - 1) % n;
    for (int64_t bytes : {int64_t{0}, int64_t{11}, int64_t{9} << 20}) {
      std::vector<uint8_t> out(static_cast<size_t>(bytes));
      for (int64_t i = 0; i < bytes; ++i) out[static_cast<size_t>(i)] = pattern_byte(rank, i);
      std::vector<uint8_t> in(static_cast<size_t>(bytes), 0xEE);
      auto do_send = [&] { return c.send(out.data(), bytes, next); };
      auto do_recv = [&] { return c.recv(in.data(), bytes, prev); };
      Status first = rank % 2 == 0 ? do_send() : do_recv();
      if (!first.ok()) return failed(first, rank % 2 == 0 ? "send" : "recv");
      Status second = rank % 2 == 0 ? do_recv() : do_send();
      if (!second.ok()) return failed(second, rank % 2 == 0 ? "recv" : "send");
      for (int64_t i = 0; i < bytes; ++i) {
        if (in[static_cast<size_t>(i)] != pattern_byte(prev, i)) {
          return "recv of " + std::to_string(bytes) + " bytes from rank " + std::to_string(prev) + ": byte " +
                 std::to_string(i) + " is wrong" + at;
        }
      }
    }
    // Variable-length messages: rank 0 to the last rank, and a broadcast.
    if (rank == 0) {
      const std::vector<uint8_t> msg(1000, 42);
      if (Status s = send_bytes(c, msg, n - 1); !s.ok()) return failed(s, "send_bytes");
    } else if (rank == n - 1) {
      auto got = recv_bytes(c, 0, 1 << 20);
      if (!got.ok()) return failed(got.status(), "recv_bytes");
      if (*got != std::vector<uint8_t>(1000, 42)) return "recv_bytes got other bytes" + at;
    }
  }
  std::vector<uint8_t> msg;
  if (rank == 0) msg.assign(777, 9);
  if (Status s = broadcast_bytes(c, msg, 0); !s.ok()) return failed(s, "broadcast_bytes");
  if (msg != std::vector<uint8_t>(777, 9)) return "broadcast_bytes gave other bytes" + at;
  for (int i = 0; i < 3; ++i) {
    if (Status s = c.barrier(); !s.ok()) return failed(s, "barrier");
  }
  return "";
}

}  // namespace pagoda::testing
