// MpiCommunicator: the ranks of an `mpirun` job (Open MPI, from Debian's openmpi-bin and
// libopenmpi-dev) across processes and hosts. The library picks the transport (shared memory
// between the ranks of one host, TCP or a fabric between hosts) and the collective algorithms.
//
// MPI is initialised once per process by the first create_world() (asking for
// MPI_THREAD_MULTIPLE, which a SendQueue's thread needs; MPI_THREAD_SERIALIZED is enough for
// everything else) and finalised at exit. Errors are returned, not fatal
// (MPI_ERRORS_RETURN), and carry the library's message; a peer that dies makes mpirun end the
// job, as it does for every MPI program; one that hangs fails a send or receive waiting for it
// after the timeout (set_timeout); a collective waits for it for ever.
//
// One thread at a time, or, where concurrent_send_and_recv(), one sending while another
// receives or runs collectives.
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <vector>

#include "comm/communicator.h"

namespace pagoda::mpi {

class MpiCommunicator final : public Communicator {
 public:
  // The world of this job (a process started without mpirun is a world of one). Fails when the
  // library cannot start or does not offer serialized threading.
  static Result<std::unique_ptr<MpiCommunicator>> create_world();
  // The ranks of this communicator with the same `color`, ordered by `key` (MPI_Comm_split); every
  // rank must call it. Tensor-parallel groups within a pipeline, for example.
  Result<std::unique_ptr<MpiCommunicator>> split(int color, int key);
  // The group of `ranks` (of this communicator; their order gives the new ranks), which may
  // overlap other groups (MPI_Comm_create_group): only those ranks call it, with the same `tag`.
  // A data-parallel replica's ranks with rank 0, which drives them, for example.
  Result<std::unique_ptr<MpiCommunicator>> subgroup(const std::vector<int>& ranks, int tag);
  ~MpiCommunicator() override;

  // Ends every rank of the job (MPI_Abort; mpirun exits with `code`). Does not return.
  [[noreturn]] void abort_job(int code);

  // Whether the library grants MPI_THREAD_MULTIPLE (a SendQueue on this communicator).
  bool concurrent_send_and_recv() const;

  const char* name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Status all_reduce_sum(float* data, int64_t count) override;
  Status all_gather(const void* send, int64_t bytes, void* recv) override;
  Status broadcast(void* data, int64_t bytes, int root) override;
  Status send(const void* data, int64_t bytes, int dest) override;
  Status recv(void* data, int64_t bytes, int source) override;
  Status barrier() override;
  // Sends and receives run as MPI's non-blocking forms and wait for them: without a limit
  // (MPI_Wait) at first, or, once a timeout is set, polled (MPI_Test: spinning for 2 ms, then
  // every 50 us) until they complete or the time runs out; the group has failed then. The
  // collectives keep MPI's blocking calls, without a limit (Open MPI's non-blocking ones are
  // 1.6 to 3 times as slow at tensor parallelism's sizes).
  void set_timeout(std::chrono::milliseconds timeout) override;

 private:
  MpiCommunicator(MPI_Comm comm, int rank, int size) : comm_(comm), rank_(rank), size_(size) {}
  // Waits for `request` (the call `what`, with `peer` or -1); fills *status when given.
  Status wait(MPI_Request& request, const char* what, int peer = -1, MPI_Status* status = nullptr);
  MPI_Comm comm_;
  int rank_;
  int size_;
  std::atomic<int64_t> timeout_ms_{0};  // 0: no limit; read by a SendQueue's thread too
  std::atomic<bool> failed_{false};
};

}  // namespace pagoda::mpi
