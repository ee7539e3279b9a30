// decode_share_bench: how near each weight type's decode product (m = 1, 5632 x 2048, the
// engine's kernel table over testing_context().pool()), and its products of a few rows (--rows: what
// speculative verification and small batches run), come to the memory's read bandwidth, and whether
// it is held back by the memory or by its own arithmetic. The machines here are shared and their
// bandwidth moves by 1.5x within minutes, so nothing is compared across runs: each pass runs,
// one after another, a plain read of a 256 MiB weight stream (the roofline's read_avx2 loop),
// then for each type its product over a stream of weight copies of the same size (from memory,
// as a model's weights come) and over one 512-row weight that the caches hold, for the same
// bytes. Printed: each figure's median over the passes and the median of its ratio to the same
// pass's read. A type whose in-cache rate is not well above the read is bound by its arithmetic.
//
//   decode_share_bench [--passes N] [--stream-mib M] [--types q4_0,q4_k,...] [--rows 1,2,4]
//
// Not part of ctest (docs/benchmarks.md has its figures).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "backend/kernels.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/testing_context.h"
#include "backend/cpu/x86/peak_loops.h"
#include "base/thread_pool.h"
#include "tensor/convert.h"
#include "tensor/tensor.h"

namespace pagoda::cpu {
namespace {

constexpr int64_t kK = 2048, kStreamRows = 5632, kCacheRows = 512;

// A random [n, kK] weight of type t, packed by the table; `bytes` is what one product reads.
struct Packed {
  std::vector<uint8_t> stored;
  Buffer storage;
  Tensor tensor;
  int64_t bytes = 0;
};

Packed pack_random(const Kernels& kernels, DType t, int64_t n) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> row(kK);
  const int64_t row_bytes = static_cast<int64_t>(*dtype_bytes(t, kK));
  Packed p;
  p.stored.resize(static_cast<size_t>(n * row_bytes));
  for (int64_t r = 0; r < n; ++r) {
    for (float& v : row) v = dist(rng);
    quantize_row(t, row.data(), p.stored.data() + r * row_bytes, kK);
  }
  const Tensor w(p.stored.data(), t, {n, kK});
  const bool packs = kernels.table().pack_matmul_weight != nullptr;
  p.tensor = packs ? kernels.pack_matmul_weight(w, &p.storage) : w;
  p.bytes = packs ? static_cast<int64_t>(p.storage.size()) : w.nbytes();
  return p;
}

struct Series {
  std::vector<double> gbps, of_read;
  void add(double g, double read) {
    gbps.push_back(g);
    of_read.push_back(g / read);
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double seconds_of(const auto& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int run(int argc, char** argv) {
  int passes = 20;
  int64_t stream_mib = 256;
  std::string types;
  std::vector<int64_t> row_counts;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--passes" && i + 1 < argc) {
      passes = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--stream-mib" && i + 1 < argc) {
      stream_mib = std::max<int64_t>(16, std::atoll(argv[++i]));
    } else if (a == "--types" && i + 1 < argc) {
      types = argv[++i];
    } else if (a == "--rows" && i + 1 < argc) {
      for (const char* s = argv[++i]; *s != '\0';) {
        char* end = nullptr;
        const long long m = std::strtoll(s, &end, 10);
        if (end == s || m < 1 || m > 64) break;
        row_counts.push_back(m);
        s = *end == ',' ? end + 1 : end;
      }
    } else {
      std::fprintf(stderr,
                   "usage: decode_share_bench [--passes N] [--stream-mib M] [--types q4_0,q4_k,...] [--rows 1,2,4]\n");
      return 2;
    }
  }
  if (row_counts.empty()) row_counts.push_back(1);
  auto backend = CpuBackend::create();
  if (!backend.ok()) {
    std::fprintf(stderr, "decode_share_bench: %s\n", backend.status().message().c_str());
    return 1;
  }
  const Kernels& kernels = (*backend)->kernels();
  std::vector<DType> picked;
  for (const DTypeTraits& t : all_dtypes()) {
    if (!t.dense_matmul) continue;
    if (types.empty() || ("," + types + ",").find("," + std::string(t.name) + ",") != std::string::npos) {
      picked.push_back(t.type);
    }
  }
  const int64_t stream_bytes = stream_mib << 20;
  ThreadPool& pool = cpu::pool_of(kernels.context());
  std::printf("%s\n%d passes, %lld MiB streams, %d threads, %lld x %lld\n", (*backend)->description().c_str(), passes,
              static_cast<long long>(stream_mib), pool.num_threads(), static_cast<long long>(kStreamRows),
              static_cast<long long>(kK));

  // Per type and row count: copies of the packed weight filling the stream (64-byte aligned), and the cached one.
  struct Case {
    DType type;
    int64_t rows = 1;
    Packed source, cached;
    Buffer copies;
    int64_t stride = 0, count = 0;
    Series stream, cache;
  };
  std::vector<Case> cases(picked.size() * row_counts.size());
  for (size_t c = 0; c < cases.size(); ++c) {
    Case& k = cases[c];
    k.type = picked[c / row_counts.size()];
    k.rows = row_counts[c % row_counts.size()];
    k.source = pack_random(kernels, k.type, kStreamRows);
    k.cached = pack_random(kernels, k.type, kCacheRows);
    k.stride = (k.source.bytes + 63) / 64 * 64;
    k.count = std::max<int64_t>(1, stream_bytes / k.stride);
    k.copies = Buffer(static_cast<size_t>(k.count * k.stride));
    for (int64_t i = 0; i < k.count; ++i) {
      std::memcpy(k.copies.as<uint8_t>() + i * k.stride, k.source.tensor.data, static_cast<size_t>(k.source.bytes));
    }
  }
  Buffer read_buffer(static_cast<size_t>(stream_bytes));
  std::memset(read_buffer.data(), 1, read_buffer.size());

  const int64_t max_rows = *std::max_element(row_counts.begin(), row_counts.end());
  std::vector<float> x(max_rows * kK, 0.5f), y(max_rows * kStreamRows);
  Series read;
  volatile uint64_t sink = 0;
  for (int pass = 0; pass < passes; ++pass) {
    const int threads = pool.num_threads();
    const double read_s = seconds_of([&] {
      pool.parallel_for(threads, [&](int64_t begin, int64_t end) {
        const int64_t share = stream_bytes / threads / 256 * 256;
        for (int64_t t = begin; t < end; ++t) sink = sink + read_avx2(read_buffer.as<uint8_t>() + t * share, share);
      });
    });
    const double read_gbps = static_cast<double>(stream_bytes / threads / 256 * 256 * threads) / read_s / 1e9;
    read.add(read_gbps, read_gbps);
    for (Case& k : cases) {
      Tensor w = k.source.tensor;
      const double stream_s = seconds_of([&] {
        for (int64_t i = 0; i < k.count; ++i) {
          w.data = k.copies.as<uint8_t>() + i * k.stride;
          kernels.matmul(x.data(), k.rows, w, y.data());
        }
      });
      k.stream.add(static_cast<double>(k.count * k.source.bytes) / stream_s / 1e9, read_gbps);
      const int64_t repeats = std::max<int64_t>(1, k.count * k.source.bytes / k.cached.bytes);
      const double cache_s = seconds_of([&] {
        for (int64_t i = 0; i < repeats; ++i) kernels.matmul(x.data(), k.rows, k.cached.tensor, y.data());
      });
      k.cache.add(static_cast<double>(repeats * k.cached.bytes) / cache_s / 1e9, read_gbps);
    }
  }
  std::printf(
      "\n| type | rows | from memory, GB/s | of the read | from the cache, GB/s | of the read |\n"
      "|---|---|---|---|---|---|\n");
  std::printf("| read | | %.2f | 1.00 | | |\n", median(read.gbps));
  for (const Case& k : cases) {
    std::printf("| %s | %lld | %.2f | %.2f | %.2f | %.2f |\n", std::string(dtype_name(k.type)).c_str(),
                static_cast<long long>(k.rows), median(k.stream.gbps),
                median(k.stream.of_read), median(k.cache.gbps), median(k.cache.of_read));
  }
  return 0;  // (sink is volatile: the reads are not dropped)
}

}  // namespace
}  // namespace pagoda::cpu

int main(int argc, char** argv) { return pagoda::cpu::run(argc, argv); }
