#include "comm/shm/shm_communicator.h"

#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <new>
#include <string>

#include "base/check.h"

namespace pagoda::shm {
namespace {

constexpr int kMaxRanks = 256;
constexpr size_t kPage = 4096;
constexpr size_t kMailboxHeaderBytes = 128;
// Busy polls before a wait sleeps on the futex: a peer that is a few microseconds behind is met
// without a system call; one that is not does not hold a core for long (ranks may share cores).
constexpr int kSpins = 2000;
constexpr std::chrono::milliseconds kPollInterval(50);

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Where each part of the region starts.
struct Layout {
  size_t mailboxes, slots, mailbox_data, total;
  Layout(int n, int64_t slot_bytes) {
    const size_t ranks = static_cast<size_t>(n);
    const size_t slot = static_cast<size_t>(slot_bytes);
    mailboxes = kPage;
    slots = mailboxes + round_up(ranks * ranks * kMailboxHeaderBytes, kPage);
    mailbox_data = slots + ranks * slot;
    total = mailbox_data + ranks * ranks * slot;
  }
};

void futex_wake_all(const void* word) {
  syscall(SYS_futex, const_cast<void*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

void cpu_relax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

// 'R', 'S', 'Z', ... from /proc/<pid>/stat; 0 when there is no such process.
char process_state(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!f || !std::getline(f, stat)) return 0;
  const size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return 0;
  return stat[close + 2];
}

}  // namespace

struct ShmHeader {
  alignas(64) std::atomic<uint32_t> barrier_count{0};
  alignas(64) std::atomic<uint32_t> barrier_generation{0};
  alignas(64) std::atomic<int32_t> aborted_by{-1};  // the rank that called abort(), or -1
  alignas(64) std::atomic<int32_t> pids[kMaxRanks];  // 0: not yet here; -1: left the group
};

struct ShmMailbox {
  alignas(64) std::atomic<uint32_t> posted{0};  // chunks the sender has written
  std::atomic<uint64_t> bytes{0};               // size of the chunk posted
  alignas(64) std::atomic<uint32_t> taken{0};   // chunks the receiver has read
};
static_assert(sizeof(ShmMailbox) <= kMailboxHeaderBytes);
static_assert(sizeof(ShmHeader) <= kPage);

Result<std::shared_ptr<ShmRegion>> ShmRegion::create(int num_ranks, int64_t slot_bytes) {
  if (num_ranks < 1 || num_ranks > kMaxRanks) {
    return invalid_argument("a shared-memory group of " + std::to_string(num_ranks) + " ranks (1 to " +
                            std::to_string(kMaxRanks) + ")");
  }
  if (slot_bytes < 4096 || slot_bytes % 64 != 0) {
    return invalid_argument("shared-memory slots of " + std::to_string(slot_bytes) +
                            " bytes (a multiple of 64, at least 4096)");
  }
  const Layout layout(num_ranks, slot_bytes);
  // Pages are only backed when touched: the mailboxes of pairs that never talk cost nothing.
  void* p = mmap(nullptr, layout.total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return io_error("mapping " + std::to_string(layout.total) + " bytes of shared memory: " + std::strerror(errno));
  }
  std::shared_ptr<ShmRegion> region(new ShmRegion());
  region->base_ = static_cast<uint8_t*>(p);
  region->bytes_ = layout.total;
  region->num_ranks_ = num_ranks;
  region->slot_bytes_ = slot_bytes;
  auto* header = new (region->base_) ShmHeader();
  for (auto& pid : header->pids) pid.store(0);
  for (int i = 0; i < num_ranks * num_ranks; ++i) {
    new (region->base_ + layout.mailboxes + static_cast<size_t>(i) * kMailboxHeaderBytes) ShmMailbox();
  }
  return region;
}

ShmRegion::~ShmRegion() {
  if (base_ != nullptr) munmap(base_, bytes_);
}

ShmCommunicator::ShmCommunicator(std::shared_ptr<ShmRegion> region, int rank, std::chrono::milliseconds timeout)
    : region_(std::move(region)), rank_(rank), size_(region_->num_ranks()), timeout_(timeout) {
  PAGODA_CHECK(rank_ >= 0 && rank_ < size_);
  const Layout layout(size_, region_->slot_bytes());
  mailboxes_ = region_->base() + layout.mailboxes;
  slots_ = region_->base() + layout.slots;
  mailbox_data_ = region_->base() + layout.mailbox_data;
  header().pids[rank_].store(static_cast<int32_t>(getpid()), std::memory_order_release);
}

ShmCommunicator::~ShmCommunicator() { header().pids[rank_].store(-1, std::memory_order_release); }

ShmHeader& ShmCommunicator::header() const {
  return *reinterpret_cast<ShmHeader*>(region_->base());
}

uint8_t* ShmCommunicator::slot(int rank) const {
  return slots_ + static_cast<size_t>(rank) * static_cast<size_t>(region_->slot_bytes());
}

ShmMailbox& ShmCommunicator::mailbox(int from, int to) const {
  const size_t index = static_cast<size_t>(from) * static_cast<size_t>(size_) + static_cast<size_t>(to);
  return *reinterpret_cast<ShmMailbox*>(mailboxes_ + index * kMailboxHeaderBytes);
}

uint8_t* ShmCommunicator::mailbox_data(int from, int to) const {
  const size_t index = static_cast<size_t>(from) * static_cast<size_t>(size_) + static_cast<size_t>(to);
  return mailbox_data_ + index * static_cast<size_t>(region_->slot_bytes());
}

void ShmCommunicator::abort() {
  int32_t none = -1;
  header().aborted_by.compare_exchange_strong(none, rank_);
  failed_ = true;
  futex_wake_all(&header().barrier_generation);
}

Status ShmCommunicator::check_peers() const {
  const ShmHeader& h = header();
  const int32_t aborted = h.aborted_by.load(std::memory_order_acquire);
  if (aborted >= 0) return unavailable("rank " + std::to_string(aborted) + " aborted the group");
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const int32_t pid = h.pids[r].load(std::memory_order_acquire);
    if (pid == -1) return unavailable("rank " + std::to_string(r) + " has left the group");
    if (pid == 0) continue;  // not started yet
    const char state = process_state(pid);
    if (state == 0 || state == 'Z' || state == 'X') {
      return unavailable("rank " + std::to_string(r) + " (pid " + std::to_string(pid) + ") has exited");
    }
  }
  return Status::ok_status();
}

Status ShmCommunicator::wait_change(const void* word_ptr, uint32_t value, const char* what) {
  const auto* word = static_cast<const std::atomic<uint32_t>*>(word_ptr);
  for (int i = 0; i < kSpins; ++i) {
    if (word->load(std::memory_order_acquire) != value) return Status::ok_status();
    cpu_relax();
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  const timespec interval{0, std::chrono::duration_cast<std::chrono::nanoseconds>(kPollInterval).count()};
  while (true) {
    if (word->load(std::memory_order_acquire) != value) return Status::ok_status();
    syscall(SYS_futex, const_cast<std::atomic<uint32_t>*>(word), FUTEX_WAIT, value, &interval, nullptr, 0);
    if (word->load(std::memory_order_acquire) != value) return Status::ok_status();
    Status peers = check_peers();
    if (!peers.ok()) {
      failed_ = true;
      return peers.with_context(std::string("shm ") + what + " on rank " + std::to_string(rank_));
    }
    if (std::chrono::steady_clock::now() > deadline) {
      failed_ = true;
      return unavailable(std::string("shm ") + what + " on rank " + std::to_string(rank_) + ": no answer within " +
                         std::to_string(timeout_.count()) + " ms");
    }
  }
}

Status ShmCommunicator::barrier() {
  if (failed_) return unavailable("the shared-memory group failed earlier");
  ShmHeader& h = header();
  const uint32_t generation = h.barrier_generation.load(std::memory_order_acquire);
  if (h.barrier_count.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(size_)) {
    // The count is reset before the generation moves: a rank that passes and enters the next
    // barrier counts from zero.
    h.barrier_count.store(0, std::memory_order_relaxed);
    h.barrier_generation.fetch_add(1, std::memory_order_release);
    futex_wake_all(&h.barrier_generation);
    return Status::ok_status();
  }
  return wait_change(&h.barrier_generation, generation, "barrier");
}

Status ShmCommunicator::all_reduce_sum(float* data, int64_t count) {
  const int64_t chunk = region_->slot_bytes() / static_cast<int64_t>(sizeof(float));
  auto* sum = reinterpret_cast<float*>(slot(0));
  for (int64_t off = 0; off < count; off += chunk) {
    const int64_t n = std::min(chunk, count - off);
    std::memcpy(slot(rank_), data + off, static_cast<size_t>(n) * sizeof(float));
    PAGODA_RETURN_IF_ERROR(barrier());
    // This rank's share of the elements, summed over the slots in rank order into slot 0 (which
    // holds rank 0's values): each element is written by one rank only.
    const int64_t share = (n + size_ - 1) / size_;
    const int64_t lo = std::min(n, share * rank_);
    const int64_t hi = std::min(n, lo + share);
    for (int r = 1; r < size_; ++r) {
      const auto* add = reinterpret_cast<const float*>(slot(r));
      for (int64_t i = lo; i < hi; ++i) sum[i] += add[i];
    }
    PAGODA_RETURN_IF_ERROR(barrier());
    std::memcpy(data + off, sum, static_cast<size_t>(n) * sizeof(float));
    // Slot 0 is read by everyone before the next chunk (or call) overwrites it.
    PAGODA_RETURN_IF_ERROR(barrier());
  }
  return Status::ok_status();
}

Status ShmCommunicator::all_gather(const void* send, int64_t bytes, void* recv) {
  const int64_t chunk = region_->slot_bytes();
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  for (int64_t off = 0; off < bytes; off += chunk) {
    const size_t n = static_cast<size_t>(std::min(chunk, bytes - off));
    std::memcpy(slot(rank_), in + off, n);
    PAGODA_RETURN_IF_ERROR(barrier());
    for (int r = 0; r < size_; ++r) std::memcpy(out + r * bytes + off, slot(r), n);
    PAGODA_RETURN_IF_ERROR(barrier());
  }
  return Status::ok_status();
}

Status ShmCommunicator::broadcast(void* data, int64_t bytes, int root) {
  if (root < 0 || root >= size_) return invalid_argument("broadcast from rank " + std::to_string(root));
  const int64_t chunk = region_->slot_bytes();
  auto* p = static_cast<uint8_t*>(data);
  for (int64_t off = 0; off < bytes; off += chunk) {
    const size_t n = static_cast<size_t>(std::min(chunk, bytes - off));
    if (rank_ == root) std::memcpy(slot(root), p + off, n);
    PAGODA_RETURN_IF_ERROR(barrier());
    if (rank_ != root) std::memcpy(p + off, slot(root), n);
    PAGODA_RETURN_IF_ERROR(barrier());
  }
  return Status::ok_status();
}

Status ShmCommunicator::send(const void* data, int64_t bytes, int dest) {
  if (failed_) return unavailable("the shared-memory group failed earlier");
  if (dest < 0 || dest >= size_ || dest == rank_) return invalid_argument("send to rank " + std::to_string(dest));
  ShmMailbox& m = mailbox(rank_, dest);
  uint8_t* box = mailbox_data(rank_, dest);
  const auto* in = static_cast<const uint8_t*>(data);
  int64_t off = 0;
  do {  // a zero-byte message is one empty chunk
    const int64_t n = std::min(region_->slot_bytes(), bytes - off);
    // The receiver has taken every chunk posted so far: the box is free.
    for (uint32_t taken; (taken = m.taken.load(std::memory_order_acquire)) != m.posted.load(std::memory_order_relaxed);) {
      PAGODA_RETURN_IF_ERROR(wait_change(&m.taken, taken, "send"));
    }
    if (n > 0) std::memcpy(box, in + off, static_cast<size_t>(n));
    m.bytes.store(static_cast<uint64_t>(n), std::memory_order_relaxed);
    m.posted.fetch_add(1, std::memory_order_release);
    futex_wake_all(&m.posted);
    off += n;
  } while (off < bytes);
  return Status::ok_status();
}

Status ShmCommunicator::recv(void* data, int64_t bytes, int source) {
  if (failed_) return unavailable("the shared-memory group failed earlier");
  if (source < 0 || source >= size_ || source == rank_) {
    return invalid_argument("recv from rank " + std::to_string(source));
  }
  ShmMailbox& m = mailbox(source, rank_);
  const uint8_t* box = mailbox_data(source, rank_);
  auto* out = static_cast<uint8_t*>(data);
  int64_t off = 0;
  do {
    const int64_t n = std::min(region_->slot_bytes(), bytes - off);
    for (uint32_t posted; (posted = m.posted.load(std::memory_order_acquire)) == m.taken.load(std::memory_order_relaxed);) {
      PAGODA_RETURN_IF_ERROR(wait_change(&m.posted, posted, "recv"));
    }
    const uint64_t got = m.bytes.load(std::memory_order_relaxed);
    if (got != static_cast<uint64_t>(n)) {
      failed_ = true;
      return data_loss("shm recv on rank " + std::to_string(rank_) + ": rank " + std::to_string(source) + " sent a chunk of " +
                       std::to_string(got) + " bytes where " + std::to_string(n) + " were expected");
    }
    if (n > 0) std::memcpy(out + off, box, static_cast<size_t>(n));
    m.taken.fetch_add(1, std::memory_order_release);
    futex_wake_all(&m.taken);
    off += n;
  } while (off < bytes);
  return Status::ok_status();
}

}  // namespace pagoda::shm
