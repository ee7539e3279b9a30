#include "launch/ranks.h"

#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "backend/cpu/cpu_thread_pool.h"
#include "comm/mpi/mpi_communicator.h"
#include "comm/shm/shm_communicator.h"
#include "base/log.h"
#include "executor/group_executor.h"

namespace pagoda::app {
namespace {

constexpr std::chrono::hours kNoLimit(24 * 365);

Status pin_to(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0) {
    return io_error("cannot pin to CPUs " + std::to_string(cpus.front()) + "..: " + std::strerror(errno));
  }
  return Status::ok_status();
}

// Where job rank `rank` sits: its replica, its stage and tensor-parallel rank within it (vLLM's
// order: a stage's ranks are consecutive), and its rank on the communicator it gets its steps
// on: replica 0's world (local rank j), or its replica's link (1 + j, rank 0 being the driver).
struct Place {
  int replica, stage, tp_rank, rank;
};
Place place_of(int rank, int tp, int pp) {
  const int per = tp * pp;
  const int replica = rank / per, j = rank % per;
  return Place{replica, j / tp, j % tp, replica == 0 ? j : 1 + j};
}

// A worker rank: its shard, the start, then the steps. `steps`: the communicator rank 0's steps
// come over (replica 0's world, or the link of a replica that rank 0 drives from afar);
// `tp_comm`: its stage's tensor-parallel group (null with one rank per stage). Never returns: a
// forked rank ends with _exit (the parent's atexit handlers and static objects are not its own),
// an MPI rank with exit (which finalizes MPI, as mpirun expects).
[[noreturn]] void worker_main(int job_rank, Communicator& steps, Communicator* tp_comm, const ModelFlags& model,
                              const EngineFlags& engine, const std::vector<int64_t>& partition, bool forked) {
  const std::string me = "rank " + std::to_string(job_rank);
  const int tp_size = static_cast<int>(engine.tensor_parallel_size);
  const int pp_size = static_cast<int>(engine.pipeline_parallel_size);
  const Place at = place_of(job_rank, tp_size, pp_size);
  const bool remote = at.replica > 0;  // rank 0 runs no stage of this replica
  const int first = remote ? 1 : 0;    // the replica's first rank on `steps`
  std::unique_ptr<SendQueue> sender;
  if (pp_size > 1 || remote) sender = std::make_unique<SendQueue>(steps);
  const TensorParallel tp{at.tp_rank, tp_size, tp_size > 1 ? tp_comm : nullptr};
  const PipelineParallel pp{at.stage, pp_size, pp_size > 1 ? &steps : nullptr,
                            at.stage > 0 ? at.rank - tp_size : -1, at.stage < pp_size - 1 ? at.rank + tp_size : -1,
                            sender.get(), partition};
  Result<LoadedModel> loaded = load_model_shard(model, tp, pp);
  // Speculating with a draft model: every rank holds the whole draft, next to its shard.
  Result<EngineConfig> config = engine.to_config();
  std::unique_ptr<Model> draft;
  if (loaded.ok() && config.ok() && config->speculative.uses_draft_model()) {
    Result<std::unique_ptr<Model>> d = load_draft_model(draft_flags(model, config->speculative));
    if (d.ok()) draft = std::move(*d);
    else loaded = d.status();
  }
  const std::string what = loaded.ok() ? rank_fingerprint_text(model, engine, loaded->model->config()) : "";
  // A failed start is rank 0's to report (it names the rank); a failure after it, this rank's.
  Status st = agree_to_start(steps, loaded.status(), fingerprint_of(what), what);
  if (st.ok()) {
    const bool sends_output = at.rank == first + (pp_size - 1) * tp_size;
    auto worker = std::make_unique<Worker>(std::move(loaded->model), std::move(draft), WorkerRank{at.tp_rank, tp_size});
    st = sender ? run_pipeline_worker(steps, *sender, std::move(worker), sends_output)
                : run_group_worker(steps, std::move(worker));
    if (!st.ok()) log_line(LogLevel::kError, "ranks", me + ": " + st.message());
  }
  std::fflush(nullptr);
  if (forked) _exit(st.ok() ? 0 : 1);
  std::exit(st.ok() ? 0 : 1);
}

// VLLM_PP_LAYER_PARTITION (vLLM's: each stage's layer count, "12,10"); empty when unset or
// without a pipeline.
Result<std::vector<int64_t>> layer_partition(int pp) {
  const char* text = std::getenv("VLLM_PP_LAYER_PARTITION");
  std::vector<int64_t> counts;
  if (pp == 1 || text == nullptr || *text == '\0') return counts;
  const char* p = text;
  while (true) {
    char* end = nullptr;
    const long long n = std::isdigit(static_cast<unsigned char>(*p)) ? std::strtoll(p, &end, 10) : -1;
    if (n < 0 || end == p || (*end != ',' && *end != '\0')) {
      return invalid_argument(std::string("VLLM_PP_LAYER_PARTITION '") + text +
                              "' is not a list of layer counts, one per pipeline stage (e.g. 12,10)");
    }
    counts.push_back(n);
    if (*end == '\0') return counts;
    p = end + 1;
  }
}

Result<std::vector<int>> parse_cpu_list(const std::string& list) {
  std::vector<int> cpus;
  size_t pos = 0;
  while (pos <= list.size()) {
    const size_t comma = std::min(list.find(',', pos), list.size());
    const std::string item = list.substr(pos, comma - pos);
    int lo = 0, hi = 0;
    char dash = 0;
    char extra = 0;
    const int n = std::sscanf(item.c_str(), "%d%c%d%c", &lo, &dash, &hi, &extra);
    if (n == 1) {
      hi = lo;
    } else if (!(n == 3 && dash == '-')) {
      return invalid_argument("'" + item + "' is not a CPU or a range of CPUs (e.g. 0-3,8)");
    }
    if (lo < 0 || hi < lo || hi >= CPU_SETSIZE) return invalid_argument("CPU range '" + item + "' is out of range");
    for (int c = lo; c <= hi; ++c) cpus.push_back(c);
    pos = comma + 1;
  }
  return cpus;
}

}  // namespace

Result<std::vector<int>> rank_cpus(const std::string& spec, int rank, int ranks) {
  if (!spec.empty() && spec != "auto") {
    std::vector<std::string> lists;
    size_t pos = 0;
    while (true) {
      const size_t bar = spec.find('|', pos);
      lists.push_back(spec.substr(pos, bar == std::string::npos ? std::string::npos : bar - pos));
      if (bar == std::string::npos) break;
      pos = bar + 1;
    }
    if (static_cast<int>(lists.size()) != ranks) {
      return invalid_argument("--cpu-affinity '" + spec + "' names CPUs for " + std::to_string(lists.size()) +
                              " ranks, but there are " + std::to_string(ranks) + " (one list per rank, '|' between)");
    }
    Result<std::vector<int>> cpus = parse_cpu_list(lists[static_cast<size_t>(rank)]);
    if (!cpus.ok()) return invalid_argument("--cpu-affinity: " + cpus.status().message());
    return cpus;
  }
  // The allowed cores in NUMA node, package and core order (SMT siblings together), split into
  // `ranks` runs of consecutive cores (rank r: cores [r * n / ranks, (r + 1) * n / ranks)), so
  // that a node's cores go to as few ranks as the split allows (one rank per node when the ranks
  // are the nodes); with fewer cores than ranks, rank r gets core r mod n.
  const std::vector<cpu::CpuCore> cores = cpu::allowed_cores();
  if (cores.empty()) return io_error("sched_getaffinity failed");
  const int n = static_cast<int>(cores.size());
  if (n < ranks) return cores[static_cast<size_t>(rank % n)].cpus;
  std::vector<int> mine;
  for (int c = rank * n / ranks; c < (rank + 1) * n / ranks; ++c) {
    for (int cpu : cores[static_cast<size_t>(c)].cpus) mine.push_back(cpu);
  }
  return mine;
}

std::string rank_fingerprint_text(const ModelFlags& model, const EngineFlags& engine, const ModelConfig& c) {
  // Every rank must split the layers alike (mpirun passes a rank only the variables it is told to).
  const char* partition = std::getenv("VLLM_PP_LAYER_PARTITION");
  const std::string layers = engine.pipeline_parallel_size == 1 ? ""
                             : std::string(", layer partition ") +
                                   (partition != nullptr && *partition != '\0' ? partition : "vLLM's");
  return model.model + " (" + c.architecture + ", " + std::to_string(c.num_layers) + " layers, hidden " +
         std::to_string(c.hidden_size) + ", vocab " + std::to_string(c.vocab_size) + "), load format " +
         model.load_format + ", dtype " + model.dtype + ", weights seed " + std::to_string(model.weights_seed) +
         ", quantization " + (model.quantization.empty() ? "none" : model.quantization) +
         (model.hf_overrides.empty() ? "" : ", hf overrides " + model.hf_overrides) +
         (model.rope_scaling.empty() ? "" : ", rope scaling " + model.rope_scaling) +
         (model.rope_theta ? ", rope theta " + std::to_string(*model.rope_theta) : "") + ", tensor parallel " +
         std::to_string(engine.tensor_parallel_size) + ", pipeline parallel " +
         std::to_string(engine.pipeline_parallel_size) + ", data parallel " +
         std::to_string(engine.data_parallel_size) + layers + ", KV cache " + engine.kv_cache_dtype + " in blocks of " +
         std::to_string(engine.block_size) + ", max model len " + std::to_string(engine.max_model_len) +
         ", speculative config " + (engine.speculative_config.empty() ? "none" : engine.speculative_config);
}

Result<std::unique_ptr<RankGroup>> RankGroup::start(const ModelFlags& model, const EngineFlags& engine) {
  PAGODA_RETURN_IF_ERROR(engine.to_config().status());  // every flag checked before a rank starts
  const int tp = static_cast<int>(engine.tensor_parallel_size);
  const int pp = static_cast<int>(engine.pipeline_parallel_size);
  const int dp = static_cast<int>(engine.data_parallel_size);
  const int per = tp * pp;  // the ranks of one replica
  const int ranks = dp * per;
  // The CPUs named by --cpu-affinity, else VLLM_CPU_OMP_THREADS_BIND as vLLM's CPU backend reads
  // it; "all" or "nobind" there, or here, leaves the CPUs alone, and so does "auto" for one rank.
  std::string affinity = engine.cpu_affinity;
  if (const char* env = std::getenv("VLLM_CPU_OMP_THREADS_BIND"); affinity.empty() && env != nullptr) affinity = env;
  const bool pin = affinity != "all" && affinity != "nobind";
  if (ranks == 1) {
    // One process is pinned before it starts a thread, so that its thread pool sizes itself from
    // the CPUs it was given.
    if (!pin || affinity.empty() || affinity == "auto") return std::unique_ptr<RankGroup>();
    PAGODA_ASSIGN_OR_RETURN(std::vector<int> cpus, rank_cpus(affinity, 0, 1));
    if (Status st = pin_to(cpus); !st.ok()) return invalid_argument("--cpu-affinity '" + affinity + "': " + st.message());
    log_line(LogLevel::kInfo, "ranks", "pinned to CPUs " + affinity);
    return std::unique_ptr<RankGroup>();
  }
  std::string sizes = "--tensor-parallel-size " + std::to_string(tp) + " x --pipeline-parallel-size " +
                      std::to_string(pp);
  if (dp > 1) sizes = "--data-parallel-size " + std::to_string(dp) + " x " + sizes;
  const bool under_mpirun = std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr;
  std::string backend = engine.distributed_executor_backend;
  if (backend.empty()) backend = under_mpirun ? "mpi" : "mp";
  std::unique_ptr<RankGroup> group(new RankGroup());
  group->tp_size_ = tp;
  group->pp_size_ = pp;
  group->dp_size_ = dp;
  group->step_timeout_ = std::chrono::milliseconds(static_cast<int64_t>(engine.distributed_timeout_seconds * 1000));
  PAGODA_ASSIGN_OR_RETURN(group->layer_partition_, layer_partition(pp));
  if (backend == "mpi") {
    PAGODA_ASSIGN_OR_RETURN(std::unique_ptr<mpi::MpiCommunicator> job, mpi::MpiCommunicator::create_world());
    if (job->size() != ranks) {
      return invalid_argument(sizes + " under an MPI job of " + std::to_string(job->size()) +
                              " ranks: start as many ranks as the sizes' product (mpirun -np " + std::to_string(ranks) + ")");
    }
    if ((pp > 1 || dp > 1) && !job->concurrent_send_and_recv()) {
      return unavailable(sizes + " under MPI needs MPI_THREAD_MULTIPLE, which this MPI library does not grant");
    }
    // Every rank splits the job, together: by replica (replica 0's world), by stage (the
    // tensor-parallel groups); then each other replica's ranks and rank 0 make its link.
    const int me = job->rank();
    const Place at = place_of(me, tp, pp);
    PAGODA_ASSIGN_OR_RETURN(std::unique_ptr<mpi::MpiCommunicator> replica, job->split(at.replica, me % per));
    PAGODA_ASSIGN_OR_RETURN(std::unique_ptr<mpi::MpiCommunicator> stage, job->split(at.replica * pp + at.stage, at.tp_rank));
    std::vector<std::unique_ptr<Communicator>> links;
    for (int d = 1; d < dp; ++d) {
      if (me != 0 && at.replica != d) continue;
      std::vector<int> members{0};
      for (int j = 0; j < per; ++j) members.push_back(d * per + j);
      PAGODA_ASSIGN_OR_RETURN(std::unique_ptr<mpi::MpiCommunicator> link, job->subgroup(members, d));
      links.push_back(std::move(link));
    }
    if (me != 0) {
      // mpirun passes a SIGTERM or SIGINT on to every rank: the workers leave it to rank 0, which
      // drains its requests and then stops them (mpirun's SIGKILL follows if it never does).
      signal(SIGTERM, SIG_IGN);
      signal(SIGINT, SIG_IGN);
      Communicator& steps = at.replica == 0 ? static_cast<Communicator&>(*replica) : *links.front();
      // Replica 0's collectives are rank 0's: on its world when that is its one stage.
      worker_main(me, steps, at.replica == 0 && pp == 1 ? &steps : stage.get(), model, engine, group->layer_partition_,
                  /*forked=*/false);
    }
    // The replicas on this host: its ranks (mpirun's count) over a replica's.
    if (const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE")) {
      group->replicas_on_host_ = std::clamp(std::atoi(local) / per, 1, dp);
    }
    if (per > 1) group->world_ = std::move(replica);
    if (pp > 1 && tp > 1) group->stage_group_ = std::move(stage);
    for (auto& link : links) group->links_.push_back(Link{std::move(link), nullptr, false});
    group->job_ = std::move(job);
    group->finish_start();
    return group;
  }
  if (backend != "mp") {
    return invalid_argument("--distributed-executor-backend " + backend + " runs one process; " + sizes +
                            " needs mp or mpi");
  }
  // Every rank's CPUs, checked before anything starts.
  std::vector<std::vector<int>> cpus(static_cast<size_t>(ranks));
  for (int r = 0; pin && r < ranks; ++r) {
    PAGODA_ASSIGN_OR_RETURN(cpus[static_cast<size_t>(r)], rank_cpus(affinity, r, ranks));
  }
  // The regions: replica 0's world; each other replica's link (rank 0 and its ranks); each
  // stage's tensor-parallel ranks, where a stage has several and they are not a world already.
  std::shared_ptr<shm::ShmRegion> world;
  if (per > 1) {
    PAGODA_ASSIGN_OR_RETURN(world, shm::ShmRegion::create(per));
  }
  std::vector<std::shared_ptr<shm::ShmRegion>> links;
  for (int d = 1; d < dp; ++d) {
    PAGODA_ASSIGN_OR_RETURN(std::shared_ptr<shm::ShmRegion> r, shm::ShmRegion::create(per + 1));
    links.push_back(std::move(r));
  }
  std::vector<std::shared_ptr<shm::ShmRegion>> stages(static_cast<size_t>(dp * pp));  // by replica * pp + stage
  for (int d = 0; d < dp && tp > 1; ++d) {
    for (int s = 0; s < pp; ++s) {
      if (d == 0 && pp == 1) continue;  // replica 0's world is its stage
      PAGODA_ASSIGN_OR_RETURN(stages[static_cast<size_t>(d * pp + s)], shm::ShmRegion::create(tp));
    }
  }
  const pid_t parent = getpid();
  std::fflush(nullptr);  // nothing buffered is written twice
  for (int r = 1; r < ranks; ++r) {
    const pid_t pid = fork();
    if (pid < 0) {
      for (pid_t w : group->workers_) kill(w, SIGKILL);
      return io_error(std::string("fork of rank ") + std::to_string(r) + " failed: " + std::strerror(errno));
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive rank 0
      if (getppid() != parent) _exit(1);
      signal(SIGINT, SIG_IGN);  // a terminal's Ctrl-C goes to rank 0, which stops the workers
      signal(SIGTERM, SIG_DFL);
      const Place at = place_of(r, tp, pp);
      shm::ShmCommunicator steps(at.replica == 0 ? world : links[static_cast<size_t>(at.replica - 1)], at.rank, kNoLimit);
      std::unique_ptr<shm::ShmCommunicator> stage_comm;
      if (const auto& region = stages[static_cast<size_t>(at.replica * pp + at.stage)]) {
        stage_comm = std::make_unique<shm::ShmCommunicator>(region, at.tp_rank, kNoLimit);
      }
      if (Status st = pin ? pin_to(cpus[static_cast<size_t>(r)]) : Status::ok_status(); !st.ok()) {
        log_line(LogLevel::kWarning, "ranks", "rank " + std::to_string(r) + ": " + st.message());
      }
      worker_main(r, steps, stage_comm ? stage_comm.get() : &steps, model, engine, group->layer_partition_,
                  /*forked=*/true);
    }
    group->workers_.push_back(pid);
  }
  if (Status st = pin ? pin_to(cpus[0]) : Status::ok_status(); !st.ok()) log_line(LogLevel::kWarning, "ranks", "rank 0: " + st.message());
  if (world) group->world_ = std::make_unique<shm::ShmCommunicator>(world, 0, kNoLimit);
  if (stages[0]) group->stage_group_ = std::make_unique<shm::ShmCommunicator>(stages[0], 0, kNoLimit);
  for (auto& link : links) {
    group->links_.push_back(Link{std::make_unique<shm::ShmCommunicator>(link, 0, kNoLimit), nullptr, false});
  }
  group->replicas_on_host_ = dp;
  group->finish_start();
  log_line(LogLevel::kInfo, "ranks",
           sizes + ": " + std::to_string(ranks) + " ranks on this host (mp, shared memory), rank 0 pid " +
               std::to_string(parent));
  return group;
}

void RankGroup::finish_start() {
  if (pp_size_ > 1) sender_ = std::make_unique<SendQueue>(*world_);
  for (Link& link : links_) link.sender = std::make_unique<SendQueue>(*link.comm);
}

TensorParallel RankGroup::tp() const {
  if (tp_size_ == 1) return TensorParallel{};
  return TensorParallel{0, tp_size_, pp_size_ > 1 ? stage_group_.get() : world_.get()};
}

PipelineParallel RankGroup::pp() const {
  if (pp_size_ == 1) return PipelineParallel{};
  return PipelineParallel{0, pp_size_, world_.get(), -1, tp_size_, sender_.get(), layer_partition_};
}

ParallelGroup RankGroup::parallel_group() const {
  return ParallelGroup{world_.get(), pp_size_, sender_.get(), (pp_size_ - 1) * tp_size_};
}

RankGroup::RemoteReplica RankGroup::remote_replica(int d) const {
  const Link& link = links_.at(static_cast<size_t>(d - 1));
  return RemoteReplica{link.comm.get(), link.sender.get(), pp_size_, 1 + (pp_size_ - 1) * tp_size_};
}

std::vector<shm::ShmCommunicator*> RankGroup::shm_comms() const {
  std::vector<shm::ShmCommunicator*> out;
  for (Communicator* c : comms()) {
    if (auto* shm = dynamic_cast<shm::ShmCommunicator*>(c)) out.push_back(shm);
  }
  return out;
}

Status RankGroup::agree(const Status& loaded, const std::string& what) {
  // Every group agrees, whatever the others said: their ranks wait for it.
  Status first;
  if (world_) first = agree_to_start(*world_, loaded, fingerprint_of(what), what);
  for (size_t i = 0; i < links_.size(); ++i) {
    Status st = agree_to_start(*links_[i].comm, loaded, fingerprint_of(what), what);
    if (!st.ok() && first.ok()) {
      // The link's rank k is the replica's k - 1: name it by its rank in the job.
      first = Status(st.code(), "data-parallel replica " + std::to_string(i + 1) + " (ranks " +
                                    std::to_string((i + 1) * tp_size_ * pp_size_) + " .. " +
                                    std::to_string((i + 2) * tp_size_ * pp_size_ - 1) + "): " + st.message());
    }
  }
  agreed_ = first.ok();
  return first;
}

std::vector<Communicator*> RankGroup::comms() const {
  std::vector<Communicator*> out;
  for (Communicator* c : {world_.get(), stage_group_.get()}) {
    if (c != nullptr) out.push_back(c);
  }
  for (const Link& link : links_) out.push_back(link.comm.get());
  return out;
}

void RankGroup::running() {
  running_ = true;
  for (Communicator* c : comms()) c->set_timeout(step_timeout_);
}

void RankGroup::abort() {
  if (job_) {
    std::fflush(nullptr);
    static_cast<mpi::MpiCommunicator&>(*job_).abort_job(1);
  }
  for (shm::ShmCommunicator* shm : shm_comms()) shm->abort();
}

Status RankGroup::check_workers() {
  for (size_t i = 0; i < workers_.size(); ++i) {
    if (workers_[i] < 0) continue;
    int status = 0;
    if (waitpid(workers_[i], &status, WNOHANG) != workers_[i]) continue;
    const std::string who = "rank " + std::to_string(i + 1) + " (pid " + std::to_string(workers_[i]) + ")";
    workers_[i] = -1;
    if (WIFSIGNALED(status)) return unavailable(who + " was killed by signal " + std::to_string(WTERMSIG(status)));
    return unavailable(who + " exited with status " + std::to_string(WEXITSTATUS(status)));
  }
  return Status::ok_status();
}

RankGroup::~RankGroup() {
  if (agreed_ && !running_) {
    // The shards loaded but the engines were not all built: the ranks of those that were not wait
    // for their first message.
    for (Communicator* c : comms()) c->set_timeout(step_timeout_);
    if (world_) (void)stop_group(*world_);
    for (Link& link : links_) {
      if (!link.driven) (void)stop_group(*link.comm);
    }
  }
  // Each sends what it still holds (an engine's stop) before the workers are reaped.
  sender_.reset();
  for (Link& link : links_) link.sender.reset();
  if (workers_.empty()) return;
  // The workers stopped (the engine said so), or are told to now: an aborted group fails their
  // waits at once.
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::seconds(5);
  bool aborted = false;
  for (pid_t w : workers_) {
    if (w < 0) continue;  // reaped by check_workers
    int status = 0;
    while (waitpid(w, &status, WNOHANG) == 0) {
      if (!aborted && std::chrono::steady_clock::now() > start + std::chrono::seconds(1)) {
        for (shm::ShmCommunicator* shm : shm_comms()) shm->abort();
        aborted = true;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        kill(w, SIGKILL);
        waitpid(w, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

}  // namespace pagoda::app
