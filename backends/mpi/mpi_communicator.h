// MpiCommunicator: the ranks of an `mpirun` job (Open MPI, from Debian's openmpi-bin and
// libopenmpi-dev) across processes and hosts. The library picks the transport (shared memory
// between the ranks of one host, TCP or a fabric between hosts) and the collective algorithms.
//
// MPI is initialised once per process (MPI_THREAD_SERIALIZED: any thread, one at a time) by the
// first create_world() and finalised at exit. Errors are returned, not fatal
// (MPI_ERRORS_RETURN), and carry the library's message; a peer that dies makes mpirun end the
// job, as it does for every MPI program.
//
// One thread at a time.
#pragma once

#include <memory>

#include "backend/communicator.h"

namespace pagoda::mpi {

class MpiCommunicator final : public Communicator {
 public:
  // The world of this job (a process started without mpirun is a world of one). Fails when the
  // library cannot start or does not offer serialized threading.
  static Result<std::unique_ptr<MpiCommunicator>> create_world();

  const char* name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Status all_reduce_sum(float* data, int64_t count) override;
  Status all_gather(const void* send, int64_t bytes, void* recv) override;
  Status broadcast(void* data, int64_t bytes, int root) override;
  Status send(const void* data, int64_t bytes, int dest) override;
  Status recv(void* data, int64_t bytes, int source) override;
  Status barrier() override;

 private:
  MpiCommunicator(int rank, int size) : rank_(rank), size_(size) {}
  int rank_;
  int size_;
};

}  // namespace pagoda::mpi
