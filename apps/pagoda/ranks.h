// Starting the ranks of a parallel engine (--tensor-parallel-size T x --pipeline-parallel-size P
// = N > 1 ranks; rank r is tensor-parallel rank r % T of pipeline stage r / T), as vLLM's
// executor backends do:
//  - mp (one host, the default outside mpirun): this process forks N - 1 worker ranks before it
//    starts any thread; the ranks talk through shared memory (backends/shm), and each is pinned
//    to its own share of the CPUs (--cpu-affinity or VLLM_CPU_OMP_THREADS_BIND, else the allowed
//    cores split evenly). A worker ends when rank 0 stops it, exits or dies (it is killed with
//    its parent).
//  - mpi (the default under mpirun, `mpirun -np N pagoda serve M -tp N`, across hosts with a
//    hostfile): the job's ranks over MPI (backends/mpi); mpirun places and binds them.
// Rank 0 runs the command (server, scheduler and its own shard, apps/pagoda/engine_setup.h);
// every other rank loads its shard and runs the steps rank 0 sends (run_group_worker, or
// run_pipeline_worker with a pipeline). With both, each stage's ranks also have a group of their
// own for the tensor-parallel collectives (a shared-memory region per stage, or MPI_Comm_split).
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "apps/pagoda/engine_flags.h"
#include "apps/pagoda/model_loading.h"
#include "backend/communicator.h"
#include "backend/send_queue.h"
#include "engine/engine_types.h"
#include "base/status.h"
#include "model/tensor_parallel.h"

namespace pagoda::shm {
class ShmCommunicator;
}

namespace pagoda::app {

class RankGroup {
 public:
  // nullptr when there is one rank. Returns in rank 0 only: the other ranks run
  // their worker in here and end their process (status 0 when rank 0 stopped them, 1 on an
  // error, which they log first).
  static Result<std::unique_ptr<RankGroup>> start(const ModelFlags& model, const EngineFlags& engine);
  // Waits for the forked workers (stopped by the engine, or, if the group never started or
  // failed, by aborting the group), killing any that do not end within seconds.
  ~RankGroup();

  // Rank 0's shard (stage 0's first tensor-parallel rank) and what the engine runs the group with.
  TensorParallel tp() const;
  PipelineParallel pp() const;
  ParallelGroup parallel_group() const;
  Communicator& comm() { return *world_; }

  // Rank 0's side of the start: its own shard's outcome, then every rank's (agree_to_start).
  Status agree(const Status& loaded, const std::string& what);
  // The engine runs: a peer that does not answer within the step timeout fails the step.
  void running();
  // mp: whether every forked rank still runs; an error names the first that has ended (its exit
  // status or signal). An idle server would otherwise notice a dead rank only at its next step.
  Status check_workers();
  // mp: makes every wait of the group fail from now on (a collective in flight, or the next step's).
  void abort();

 private:
  RankGroup() = default;

  void finish_start();  // rank 0's SendQueue (pipeline)
  std::vector<shm::ShmCommunicator*> shm_comms() const;

  int tp_size_ = 1;
  int pp_size_ = 1;
  std::unique_ptr<Communicator> world_;        // every rank
  std::unique_ptr<Communicator> stage_group_;  // pipeline x tensor: stage 0's tensor-parallel ranks
  std::unique_ptr<SendQueue> sender_;          // pipeline: rank 0's sends
  bool agreed_ = false;              // every rank loaded its shard
  bool running_ = false;             // the engine (and its GroupExecutor) exists
  std::vector<pid_t> workers_;       // mp: the forked ranks 1 .. N-1 (-1 once reaped)
};

// What the ranks must agree on, in words: the model, its shape and type, and the engine flags that
// shape the KV cache and the shards. Equal on every rank started with the same command line.
std::string rank_fingerprint_text(const ModelFlags& model, const EngineFlags& engine, const ModelConfig& config);

// The CPUs of rank `rank` of `ranks` under `spec` ("0-3|4-7": one list per rank, '|' between
// ranks, ',' and '-' within one; "" or "auto": the allowed cores split evenly, SMT siblings
// together). Fails naming the problem in `spec`.
Result<std::vector<int>> rank_cpus(const std::string& spec, int rank, int ranks);

}  // namespace pagoda::app
