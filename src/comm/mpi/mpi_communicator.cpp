#include "comm/mpi/mpi_communicator.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace pagoda::mpi {
namespace {

// MPI counts are ints: larger buffers go in pieces of this many elements.
constexpr int64_t kMaxCount = int64_t{1} << 30;

Status check(int code, const char* what) {
  if (code == MPI_SUCCESS) return Status::ok_status();
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return unavailable(std::string("MPI ") + what + ": " + std::string(text, static_cast<size_t>(len)));
}

// MPI starts once per process, at the first create_world(), and is finalised at exit.
std::mutex g_mu;
bool g_thread_multiple = false;  // MPI_THREAD_MULTIPLE was granted

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace

Result<std::unique_ptr<MpiCommunicator>> MpiCommunicator::create_world() {
  std::lock_guard<std::mutex> lock(g_mu);
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return unavailable("MPI was finalised in this process and cannot start again");
    int provided = 0;
    PAGODA_RETURN_IF_ERROR(check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "init"));
    g_thread_multiple = provided >= MPI_THREAD_MULTIPLE;
    if (provided < MPI_THREAD_SERIALIZED) {
      MPI_Finalize();
      return unavailable("the MPI library offers threading level " + std::to_string(provided) +
                         ", below MPI_THREAD_SERIALIZED");
    }
    std::atexit(finalize_at_exit);
    PAGODA_RETURN_IF_ERROR(check(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "set_errhandler"));
  }
  int rank = 0, size = 0;
  PAGODA_RETURN_IF_ERROR(check(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "comm_rank"));
  PAGODA_RETURN_IF_ERROR(check(MPI_Comm_size(MPI_COMM_WORLD, &size), "comm_size"));
  return std::unique_ptr<MpiCommunicator>(new MpiCommunicator(MPI_COMM_WORLD, rank, size));
}

bool MpiCommunicator::concurrent_send_and_recv() const {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_thread_multiple;
}

Result<std::unique_ptr<MpiCommunicator>> MpiCommunicator::split(int color, int key) {
  MPI_Comm sub = MPI_COMM_NULL;
  PAGODA_RETURN_IF_ERROR(check(MPI_Comm_split(comm_, color, key, &sub), "comm_split"));
  PAGODA_RETURN_IF_ERROR(check(MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN), "set_errhandler"));
  int rank = 0, size = 0;
  PAGODA_RETURN_IF_ERROR(check(MPI_Comm_rank(sub, &rank), "comm_rank"));
  PAGODA_RETURN_IF_ERROR(check(MPI_Comm_size(sub, &size), "comm_size"));
  return std::unique_ptr<MpiCommunicator>(new MpiCommunicator(sub, rank, size));
}

Result<std::unique_ptr<MpiCommunicator>> MpiCommunicator::subgroup(const std::vector<int>& ranks, int tag) {
  MPI_Group all = MPI_GROUP_NULL, some = MPI_GROUP_NULL;
  PAGODA_RETURN_IF_ERROR(check(MPI_Comm_group(comm_, &all), "comm_group"));
  const int incl = MPI_Group_incl(all, static_cast<int>(ranks.size()), ranks.data(), &some);
  MPI_Group_free(&all);
  PAGODA_RETURN_IF_ERROR(check(incl, "group_incl"));
  MPI_Comm sub = MPI_COMM_NULL;
  const int created = MPI_Comm_create_group(comm_, some, tag, &sub);
  MPI_Group_free(&some);
  PAGODA_RETURN_IF_ERROR(check(created, "comm_create_group"));
  PAGODA_RETURN_IF_ERROR(check(MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN), "set_errhandler"));
  int rank = 0, size = 0;
  PAGODA_RETURN_IF_ERROR(check(MPI_Comm_rank(sub, &rank), "comm_rank"));
  PAGODA_RETURN_IF_ERROR(check(MPI_Comm_size(sub, &size), "comm_size"));
  return std::unique_ptr<MpiCommunicator>(new MpiCommunicator(sub, rank, size));
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm_ != MPI_COMM_WORLD && !finalized) MPI_Comm_free(&comm_);
}

void MpiCommunicator::abort_job(int code) {
  MPI_Abort(comm_, code);
  std::_Exit(code);  // MPI_Abort should not return
}

void MpiCommunicator::set_timeout(std::chrono::milliseconds timeout) { timeout_ms_.store(timeout.count()); }

Status MpiCommunicator::wait(MPI_Request& request, const char* what, int peer, MPI_Status* status) {
  MPI_Status ignored;
  MPI_Status* st = status != nullptr ? status : &ignored;
  const int64_t timeout_ms = timeout_ms_.load();
  if (timeout_ms <= 0) return check(MPI_Wait(&request, st), what);
  // Polled: spinning at first (a collective's peers are microseconds behind), then with short
  // sleeps (a whole step's output may take seconds), until done or out of time.
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::milliseconds(timeout_ms);
  for (int64_t i = 0;; ++i) {
    int done = 0;
    PAGODA_RETURN_IF_ERROR(check(MPI_Test(&request, &done, st), what));
    if (done) return Status::ok_status();
    if ((i & 255) != 255) continue;
    const auto now = Clock::now();
    if (now > deadline) {
      failed_ = true;  // the request stays posted: this communicator is not used again
      return unavailable(std::string("MPI ") + what + (peer >= 0 ? " with rank " + std::to_string(peer) : std::string()) +
                         " on rank " + std::to_string(rank_) + ": no answer within " + std::to_string(timeout_ms) + " ms");
    }
    if (now - start > std::chrono::milliseconds(2)) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

// The collectives stay blocking: Open MPI's non-blocking ones (libnbc) took 1.6 to 3 times as long
// at tensor parallelism's sizes (comm_bench, 2 ranks on one host, 2026-12-05).
Status MpiCommunicator::all_reduce_sum(float* data, int64_t count) {
  if (failed_) return unavailable("the MPI group failed earlier");
  for (int64_t off = 0; off < count; off += kMaxCount) {
    const int n = static_cast<int>(std::min(kMaxCount, count - off));
    PAGODA_RETURN_IF_ERROR(check(MPI_Allreduce(MPI_IN_PLACE, data + off, n, MPI_FLOAT, MPI_SUM, comm_), "allreduce"));
  }
  return Status::ok_status();
}

Status MpiCommunicator::all_gather(const void* send, int64_t bytes, void* recv) {
  if (failed_) return unavailable("the MPI group failed earlier");
  if (bytes <= kMaxCount) {
    return check(MPI_Allgather(send, static_cast<int>(bytes), MPI_BYTE, recv, static_cast<int>(bytes), MPI_BYTE,
                               comm_),
                 "allgather");
  }
  // Larger pieces: gather each piece into a staging buffer, then place every rank's part.
  std::vector<uint8_t> staging(static_cast<size_t>(kMaxCount) * static_cast<size_t>(size_));
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  for (int64_t off = 0; off < bytes; off += kMaxCount) {
    const int n = static_cast<int>(std::min(kMaxCount, bytes - off));
    PAGODA_RETURN_IF_ERROR(check(MPI_Allgather(in + off, n, MPI_BYTE, staging.data(), n, MPI_BYTE, comm_), "allgather"));
    for (int r = 0; r < size_; ++r) std::copy_n(staging.data() + static_cast<size_t>(r) * n, n, out + r * bytes + off);
  }
  return Status::ok_status();
}

Status MpiCommunicator::broadcast(void* data, int64_t bytes, int root) {
  if (failed_) return unavailable("the MPI group failed earlier");
  auto* p = static_cast<uint8_t*>(data);
  for (int64_t off = 0; off < bytes; off += kMaxCount) {
    const int n = static_cast<int>(std::min(kMaxCount, bytes - off));
    PAGODA_RETURN_IF_ERROR(check(MPI_Bcast(p + off, n, MPI_BYTE, root, comm_), "bcast"));
  }
  return Status::ok_status();
}

Status MpiCommunicator::send(const void* data, int64_t bytes, int dest) {
  if (failed_) return unavailable("the MPI group failed earlier");
  const auto* p = static_cast<const uint8_t*>(data);
  int64_t off = 0;
  do {  // a zero-byte message is one empty piece, as recv expects
    const int n = static_cast<int>(std::min(kMaxCount, bytes - off));
    MPI_Request request;
    PAGODA_RETURN_IF_ERROR(check(MPI_Isend(p + off, n, MPI_BYTE, dest, 0, comm_, &request), "send"));
    PAGODA_RETURN_IF_ERROR(wait(request, "send", dest));
    off += n;
  } while (off < bytes);
  return Status::ok_status();
}

Status MpiCommunicator::recv(void* data, int64_t bytes, int source) {
  if (failed_) return unavailable("the MPI group failed earlier");
  auto* p = static_cast<uint8_t*>(data);
  int64_t off = 0;
  do {
    const int n = static_cast<int>(std::min(kMaxCount, bytes - off));
    MPI_Request request;
    MPI_Status status;
    PAGODA_RETURN_IF_ERROR(check(MPI_Irecv(p + off, n, MPI_BYTE, source, 0, comm_, &request), "recv"));
    PAGODA_RETURN_IF_ERROR(wait(request, "recv", source, &status));
    int got = 0;
    MPI_Get_count(&status, MPI_BYTE, &got);
    if (got != n) {
      return data_loss("MPI recv from rank " + std::to_string(source) + ": " + std::to_string(got) + " bytes where " +
                       std::to_string(n) + " were expected");
    }
    off += n;
  } while (off < bytes);
  return Status::ok_status();
}

Status MpiCommunicator::barrier() {
  if (failed_) return unavailable("the MPI group failed earlier");
  return check(MPI_Barrier(comm_), "barrier");
}

}  // namespace pagoda::mpi
