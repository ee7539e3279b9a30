// Starting the ranks of a parallel engine, as vLLM's executor backends do:
// --data-parallel-size D replicas of --tensor-parallel-size T x --pipeline-parallel-size P ranks,
// N = D x P x T ranks in all. Rank r is in replica r / (P x T); within it, local rank
// j = r % (P x T) is tensor-parallel rank j % T of pipeline stage j / T (vLLM's order).
//  - mp (one host, the default outside mpirun): this process forks N - 1 worker ranks before it
//    starts any thread; the ranks talk through shared memory (src/comm/shm), and each is pinned
//    to its own share of the CPUs (--cpu-affinity or VLLM_CPU_OMP_THREADS_BIND, else the allowed
//    cores split evenly; one rank is pinned only to CPUs named there). A worker ends when rank 0 stops it, exits or dies (it is killed with
//    its parent).
//  - mpi (the default under mpirun, `mpirun -np N pagoda serve M -tp N`, across hosts with a
//    hostfile): the job's ranks over MPI (src/comm/mpi); mpirun places and binds them.
// Rank 0 runs the command (server, every replica's scheduler, and replica 0's first shard,
// apps/pagoda/engine_setup.h); every other rank loads its shard and runs the steps rank 0 sends
// (run_group_worker, or run_pipeline_worker with a pipeline). Communicators: replica 0's ranks
// (its "world"); each stage's tensor-parallel ranks (a shared-memory region per stage, or
// MPI_Comm_split); and for each other replica, a "link" of rank 0 and the replica's ranks, over
// which rank 0 drives it as a pipeline whose stage 0 runs elsewhere (PipelineExecutor::
// create_remote), whatever its P.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "launch/engine_flags.h"
#include "launch/model_loading.h"
#include "comm/communicator.h"
#include "comm/send_queue.h"
#include "engine/engine_types.h"
#include "executor/parallel_group.h"
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

  // Replica 0's first shard (stage 0's first tensor-parallel rank) and what its engine runs the
  // group with (no world when replica 0 is this one rank).
  TensorParallel tp() const;
  PipelineParallel pp() const;
  ParallelGroup parallel_group() const;

  // Data parallelism: replica d (1 .. D - 1), which rank 0 drives over its link.
  struct RemoteReplica {
    Communicator* link = nullptr;  // rank 0 (this one) and the replica's ranks, 1 .. P x T
    SendQueue* sender = nullptr;   // this rank's sends on the link
    int stages = 1;
    int output_rank = 1;           // the last stage's first rank, on the link
  };
  int data_parallel_size() const { return dp_size_; }
  RemoteReplica remote_replica(int d) const;
  // The engine of replica d now drives its ranks (it stops them when it ends).
  void driving(int d) { links_.at(static_cast<size_t>(d - 1)).driven = true; }
  // The replicas on this host, which share its memory.
  int replicas_on_host() const { return replicas_on_host_; }

  // Rank 0's side of the start: its own shard's outcome, then every rank's (agree_to_start), in
  // replica 0 and on every link.
  Status agree(const Status& loaded, const std::string& what);
  // The engines run: a peer that does not answer within the step timeout
  // (--distributed-timeout-seconds, on every communicator of rank 0's) fails the step.
  void running();
  // mp: whether every forked rank still runs; an error names the first that has ended (its exit
  // status or signal). An idle server would otherwise notice a dead rank only at its next step.
  Status check_workers();
  // mp: makes every wait of the group fail from now on (a collective in flight, or the next
  // step's). Under mpirun it ends the whole job at once (MPI_Abort, status 1): a hung rank would
  // keep MPI from finalizing, and a rank 0 thread stuck in a collective from ever returning.
  void abort();

 private:
  RankGroup() = default;

  void finish_start();  // rank 0's SendQueues
  std::vector<Communicator*> comms() const;  // rank 0's, every group's
  std::vector<shm::ShmCommunicator*> shm_comms() const;

  struct Link {
    std::unique_ptr<Communicator> comm;
    std::unique_ptr<SendQueue> sender;
    bool driven = false;
  };
  int tp_size_ = 1;
  int pp_size_ = 1;
  int dp_size_ = 1;
  int replicas_on_host_ = 1;
  std::chrono::milliseconds step_timeout_{30000};
  std::vector<int64_t> layer_partition_;       // VLLM_PP_LAYER_PARTITION; empty: vLLM's split
  std::unique_ptr<Communicator> job_;          // mpi: the whole job, which the others split
  std::unique_ptr<Communicator> world_;        // replica 0's ranks (null when it has one)
  std::unique_ptr<Communicator> stage_group_;  // pipeline x tensor: stage 0's tensor-parallel ranks
  std::unique_ptr<SendQueue> sender_;          // pipeline: rank 0's sends in replica 0
  std::vector<Link> links_;                    // replicas 1 .. D - 1
  bool agreed_ = false;              // every rank loaded its shard
  bool running_ = false;             // the engines (and their executors) exist
  std::vector<pid_t> workers_;       // mp: the forked ranks 1 .. N-1 (-1 once reaped)
};

// What the ranks must agree on, in words: the model, its shape and type, and the engine flags that
// shape the KV cache and the shards. Equal on every rank started with the same command line.
std::string rank_fingerprint_text(const ModelFlags& model, const EngineFlags& engine, const ModelConfig& config);

// The CPUs of rank `rank` of `ranks` under `spec` ("0-3|4-7": one list per rank, '|' between
// ranks, ',' and '-' within one; "" or "auto": the allowed cores in NUMA node order split
// evenly, SMT siblings together). Fails naming the problem in `spec`.
Result<std::vector<int>> rank_cpus(const std::string& spec, int rank, int ranks);

}  // namespace pagoda::app
