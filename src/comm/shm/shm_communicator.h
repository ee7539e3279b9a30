// ShmCommunicator: the ranks of one host talking through one shared memory region, without MPI
// (vLLM's shared-memory all-reduce on CPU plays the same part). The region is mapped before the
// rank processes are forked (ShmRegion::create), so every rank sees the same bytes.
//
// Layout: a header (barrier counters, each rank's pid, an abort flag), one staging slot per rank
// for the collectives, and one mailbox per ordered pair of ranks for send/recv. Collectives larger
// than a slot go through it in chunks.
// - all_reduce_sum: every rank copies its chunk into its slot; rank r sums its share of the
//   elements over the slots in rank order 0, 1, ..., so every rank gets the same bits; every rank
//   copies the whole sum back. Three barriers per chunk.
// - waits spin briefly, then sleep on a futex; every 50 ms they check that each peer process is
//   still alive and that no rank has aborted, and they give up after the timeout: a dead or hung
//   rank is an error naming it within a fraction of a second (dead) or the timeout (hung), never
//   a hang.
//
// One thread at a time per communicator, or one sending while another receives or runs
// collectives (a SendQueue: sends touch only this rank's outgoing mailboxes); one communicator
// per rank process and group.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>

#include "comm/communicator.h"

namespace pagoda::shm {

struct ShmHeader;   // the barrier counters, pids and abort flag at the start of the region
struct ShmMailbox;  // one per ordered pair of ranks

// A shared anonymous mapping, inherited by the processes forked after it is created.
class ShmRegion {
 public:
  // `slot_bytes` (a multiple of 64, at least 4096): the staging slot per rank and mailbox size.
  static Result<std::shared_ptr<ShmRegion>> create(int num_ranks, int64_t slot_bytes = int64_t{4} << 20);
  ~ShmRegion();
  ShmRegion(const ShmRegion&) = delete;
  ShmRegion& operator=(const ShmRegion&) = delete;

  int num_ranks() const { return num_ranks_; }
  int64_t slot_bytes() const { return slot_bytes_; }
  uint8_t* base() const { return base_; }
  size_t bytes() const { return bytes_; }

 private:
  ShmRegion() = default;
  uint8_t* base_ = nullptr;
  size_t bytes_ = 0;
  int num_ranks_ = 0;
  int64_t slot_bytes_ = 0;
};

class ShmCommunicator final : public Communicator {
 public:
  // Rank `rank` of the region's group, in the calling process (after the fork). Records this
  // process's pid for the others' liveness checks. `timeout`: how long a wait for peers may last.
  ShmCommunicator(std::shared_ptr<ShmRegion> region, int rank,
                  std::chrono::milliseconds timeout = std::chrono::seconds(60));
  ~ShmCommunicator() override;

  const char* name() const override { return "shm"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Status all_reduce_sum(float* data, int64_t count) override;
  Status all_gather(const void* send, int64_t bytes, void* recv) override;
  Status broadcast(void* data, int64_t bytes, int root) override;
  Status send(const void* data, int64_t bytes, int dest) override;
  Status recv(void* data, int64_t bytes, int source) override;
  Status barrier() override;

  // Tells every rank to stop waiting: their calls fail from now on (a rank that is going down).
  void abort();
  // How long a wait for peers may last from now on (a group waits without a limit while its
  // ranks load their weights, and with one while it runs steps).
  void set_timeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }

 private:
  ShmHeader& header() const;
  uint8_t* slot(int rank) const;
  ShmMailbox& mailbox(int from, int to) const;
  uint8_t* mailbox_data(int from, int to) const;
  // Waits until *word != value (futex word in the region); fails on abort, a dead peer or the
  // timeout, naming what it waited for.
  Status wait_change(const void* word, uint32_t value, const char* what);
  Status check_peers() const;

  std::shared_ptr<ShmRegion> region_;
  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  // Where the mailbox headers, the slots and the mailboxes' data start in the region.
  uint8_t* mailboxes_ = nullptr;
  uint8_t* slots_ = nullptr;
  uint8_t* mailbox_data_ = nullptr;
  std::atomic<bool> failed_{false};  // read by a SendQueue's thread too
};

}  // namespace pagoda::shm
