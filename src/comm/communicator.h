// Communicator: what the ranks of one parallel engine (tensor, pipeline or data parallel) say to
// each other: collectives (all-reduce, all-gather, broadcast, barrier) and point-to-point
// messages. The seam where MPI (across processes and hosts), shared memory (the ranks of one
// host) and later NCCL / HCCL plug in: nothing above this interface knows which one runs.
//
// Every rank of the group calls the collectives in the same order with the same sizes; send and
// recv pair up in the order they are called between two ranks. Calls block until this rank's
// part is done. An error (a peer that died or stopped answering, a transport failure) names the
// problem; the group is then unusable, and the engine fails.
//
// One thread at a time per communicator (the engine or worker thread); implementations that say
// so also let one thread send while another receives or runs collectives (SendQueue).
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "base/status.h"

namespace pagoda {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual const char* name() const = 0;  // "mpi", "shm", "local"
  virtual int rank() const = 0;          // 0 .. size() - 1
  virtual int size() const = 0;

  // data: [count] f32, in place: the element-wise sum over the ranks. Which order the sums are
  // taken in is the implementation's (the shared-memory one sums in rank order, the same bits on
  // every rank); the results differ from a serial sum by rounding only.
  virtual Status all_reduce_sum(float* data, int64_t count) = 0;
  // send: [bytes] from every rank; recv: [size() * bytes], rank r's bytes at r * bytes.
  virtual Status all_gather(const void* send, int64_t bytes, void* recv) = 0;
  // root's `bytes` bytes at data are copied to every other rank's data.
  virtual Status broadcast(void* data, int64_t bytes, int root) = 0;
  // Point to point: the next recv(.., source = this rank) on `dest` gets these bytes (same size).
  virtual Status send(const void* data, int64_t bytes, int dest) = 0;
  virtual Status recv(void* data, int64_t bytes, int source) = 0;
  virtual Status barrier() = 0;
  // How long a wait for peers may last from now on before it fails (a hung peer); the ranks wait
  // without a limit while they load their weights, and with one while they run steps. Where a
  // transport cannot bound its waits, it keeps its own rule.
  virtual void set_timeout(std::chrono::milliseconds timeout) = 0;
};

// Messages of any length (a StepMessage's bytes): the size, then the bytes.
// root's `bytes` replace every other rank's.
Status broadcast_bytes(Communicator& comm, std::vector<uint8_t>& bytes, int root);
Status send_bytes(Communicator& comm, const std::vector<uint8_t>& bytes, int dest);
// `max_bytes` bounds what a peer may announce (a corrupted size is an error, not an allocation).
Result<std::vector<uint8_t>> recv_bytes(Communicator& comm, int source, int64_t max_bytes);

// The group of one: every collective is a copy or nothing; send and recv have no peer to talk
// to and fail.
class LocalCommunicator final : public Communicator {
 public:
  const char* name() const override { return "local"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  Status all_reduce_sum(float*, int64_t) override { return Status::ok_status(); }
  Status all_gather(const void* send, int64_t bytes, void* recv) override;
  Status broadcast(void*, int64_t, int root) override;
  Status send(const void*, int64_t, int dest) override;
  Status recv(void*, int64_t, int source) override;
  Status barrier() override { return Status::ok_status(); }
  void set_timeout(std::chrono::milliseconds) override {}  // it never waits
};

}  // namespace pagoda
