#include "apps/pagoda/ranks.h"

#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>
#include <tuple>

#include "backends/mpi/mpi_communicator.h"
#include "backends/shm/shm_communicator.h"
#include "base/log.h"
#include "runner/group_executor.h"

namespace pagoda::app {
namespace {

// How long a rank may take to answer during steps (between two collectives of a forward pass:
// about one layer of one step) before the group fails. Loading waits without a limit.
constexpr std::chrono::seconds kStepTimeout(30);
constexpr std::chrono::hours kNoLimit(24 * 365);

int read_int(const std::string& path, int fallback) {
  std::ifstream in(path);
  int v;
  return in >> v ? v : fallback;
}

Status pin_to(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0) {
    return io_error("cannot pin to CPUs " + std::to_string(cpus.front()) + "..: " + std::strerror(errno));
  }
  return Status::ok_status();
}

// Where world rank `rank` sits: stage rank / tp, tensor-parallel rank rank % tp (vLLM's order:
// a stage's ranks are consecutive), and its neighbours in the pipeline.
struct Place {
  int stage, tp_rank, prev, next;
};
Place place_of(int rank, int tp, int pp) {
  const int stage = rank / tp;
  return Place{stage, rank % tp, stage > 0 ? rank - tp : -1, stage < pp - 1 ? rank + tp : -1};
}

// A worker rank: its shard, the start, then the steps. `tp_comm`: its stage's tensor-parallel
// group (null with one rank per stage). Never returns: a forked rank ends with _exit (the
// parent's atexit handlers and static objects are not its own), an MPI rank with exit (which
// finalizes MPI, as mpirun expects).
[[noreturn]] void worker_main(Communicator& world, Communicator* tp_comm, const ModelFlags& model,
                              const EngineFlags& engine, bool forked) {
  const std::string me = "rank " + std::to_string(world.rank());
  const int tp_size = static_cast<int>(engine.tensor_parallel_size);
  const int pp_size = static_cast<int>(engine.pipeline_parallel_size);
  const Place at = place_of(world.rank(), tp_size, pp_size);
  std::unique_ptr<SendQueue> sender;
  if (pp_size > 1) sender = std::make_unique<SendQueue>(world);
  const TensorParallel tp{at.tp_rank, tp_size, tp_size > 1 ? tp_comm : nullptr};
  const PipelineParallel pp{at.stage, pp_size, pp_size > 1 ? &world : nullptr, at.prev, at.next, sender.get()};
  Result<LoadedModel> loaded = load_model_and_tokenizer(model, {}, tp, pp);
  const std::string what = loaded.ok() ? rank_fingerprint_text(model, engine, loaded->model->config()) : "";
  // A failed start is rank 0's to report (it names the rank); a failure after it, this rank's.
  Status st = agree_to_start(world, loaded.status(), fingerprint_of(what), what);
  if (st.ok()) {
    const bool sends_output = world.rank() == (pp_size - 1) * tp_size;
    st = pp_size > 1 ? run_pipeline_worker(world, *sender, std::move(loaded->model), sends_output)
                     : run_group_worker(world, std::move(loaded->model));
    if (!st.ok()) log_line(LogLevel::kError, "ranks", me + ": " + st.message());
  }
  std::fflush(nullptr);
  if (forked) _exit(st.ok() ? 0 : 1);
  std::exit(st.ok() ? 0 : 1);
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
  // The allowed CPUs by (package, core), so that SMT siblings stay together; the cores split
  // into `ranks` runs of consecutive cores (rank r: cores [r * n / ranks, (r + 1) * n / ranks));
  // with fewer cores than ranks, rank r gets core r mod n.
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return io_error("sched_getaffinity failed");
  std::vector<std::tuple<int, int, int>> cpus;  // package, core, cpu
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) continue;
    const std::string topo = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    cpus.emplace_back(read_int(topo + "physical_package_id", 0), read_int(topo + "core_id", cpu), cpu);
  }
  std::sort(cpus.begin(), cpus.end());
  std::vector<std::vector<int>> cores;
  for (size_t i = 0; i < cpus.size(); ++i) {
    if (i == 0 || std::get<0>(cpus[i]) != std::get<0>(cpus[i - 1]) || std::get<1>(cpus[i]) != std::get<1>(cpus[i - 1])) {
      cores.emplace_back();
    }
    cores.back().push_back(std::get<2>(cpus[i]));
  }
  const int n = static_cast<int>(cores.size());
  std::vector<int> mine;
  if (n < ranks) return cores[static_cast<size_t>(rank % n)];
  for (int c = rank * n / ranks; c < (rank + 1) * n / ranks; ++c) {
    for (int cpu : cores[static_cast<size_t>(c)]) mine.push_back(cpu);
  }
  return mine;
}

std::string rank_fingerprint_text(const ModelFlags& model, const EngineFlags& engine, const ModelConfig& c) {
  return model.model + " (" + c.architecture + ", " + std::to_string(c.num_layers) + " layers, hidden " +
         std::to_string(c.hidden_size) + ", vocab " + std::to_string(c.vocab_size) + "), load format " +
         model.load_format + ", dtype " + model.dtype + ", weights seed " + std::to_string(model.weights_seed) +
         ", quantization " + (model.quantization.empty() ? "none" : model.quantization) + ", tensor parallel " +
         std::to_string(engine.tensor_parallel_size) + ", pipeline parallel " +
         std::to_string(engine.pipeline_parallel_size) + ", KV cache " + engine.kv_cache_dtype + " in blocks of " +
         std::to_string(engine.block_size) + ", max model len " + std::to_string(engine.max_model_len);
}

Result<std::unique_ptr<RankGroup>> RankGroup::start(const ModelFlags& model, const EngineFlags& engine) {
  PAGODA_RETURN_IF_ERROR(engine.to_config().status());  // every flag checked before a rank starts
  const int tp = static_cast<int>(engine.tensor_parallel_size);
  const int pp = static_cast<int>(engine.pipeline_parallel_size);
  const int ranks = tp * pp;
  if (ranks == 1) return std::unique_ptr<RankGroup>();
  const std::string sizes = "--tensor-parallel-size " + std::to_string(tp) + " x --pipeline-parallel-size " +
                            std::to_string(pp);
  const bool under_mpirun = std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr;
  std::string backend = engine.distributed_executor_backend;
  if (backend.empty()) backend = under_mpirun ? "mpi" : "mp";
  std::unique_ptr<RankGroup> group(new RankGroup());
  group->tp_size_ = tp;
  group->pp_size_ = pp;
  if (backend == "mpi") {
    PAGODA_ASSIGN_OR_RETURN(std::unique_ptr<mpi::MpiCommunicator> world, mpi::MpiCommunicator::create_world());
    if (world->size() != ranks) {
      return invalid_argument(sizes + " under an MPI job of " + std::to_string(world->size()) +
                              " ranks: start as many ranks as the sizes' product (mpirun -np " + std::to_string(ranks) + ")");
    }
    if (pp > 1 && !world->concurrent_send_and_recv()) {
      return unavailable("--pipeline-parallel-size " + std::to_string(pp) +
                         " under MPI needs MPI_THREAD_MULTIPLE, which this MPI library does not grant");
    }
    std::unique_ptr<Communicator> stage_group;
    if (pp > 1 && tp > 1) {  // every rank splits the world, together
      const Place at = place_of(world->rank(), tp, pp);
      PAGODA_ASSIGN_OR_RETURN(stage_group, world->split(at.stage, at.tp_rank));
    }
    Communicator* tp_comm = pp > 1 ? stage_group.get() : world.get();
    if (world->rank() != 0) worker_main(*world, tp_comm, model, engine, /*forked=*/false);
    group->world_ = std::move(world);
    group->stage_group_ = std::move(stage_group);
    group->finish_start();
    return group;
  }
  if (backend != "mp") {
    return invalid_argument("--distributed-executor-backend " + backend + " runs one process; " + sizes +
                            " needs mp or mpi");
  }
  // Every rank's CPUs, checked before anything starts (vLLM's CPU backend reads the same lists
  // from VLLM_CPU_OMP_THREADS_BIND; "all" or "nobind" there, or here, leaves the CPUs alone).
  std::string affinity = engine.cpu_affinity;
  if (const char* env = std::getenv("VLLM_CPU_OMP_THREADS_BIND"); affinity.empty() && env != nullptr) affinity = env;
  const bool pin = affinity != "all" && affinity != "nobind";
  std::vector<std::vector<int>> cpus(static_cast<size_t>(ranks));
  for (int r = 0; pin && r < ranks; ++r) {
    PAGODA_ASSIGN_OR_RETURN(cpus[static_cast<size_t>(r)], rank_cpus(affinity, r, ranks));
  }
  PAGODA_ASSIGN_OR_RETURN(std::shared_ptr<shm::ShmRegion> region, shm::ShmRegion::create(ranks));
  // With a pipeline, each stage's tensor-parallel ranks have a region of their own.
  std::vector<std::shared_ptr<shm::ShmRegion>> stage_regions;
  for (int s = 0; pp > 1 && tp > 1 && s < pp; ++s) {
    PAGODA_ASSIGN_OR_RETURN(std::shared_ptr<shm::ShmRegion> r, shm::ShmRegion::create(tp));
    stage_regions.push_back(std::move(r));
  }
  const pid_t parent = getpid();
  std::fflush(nullptr);  // nothing buffered is written twice
  for (int r = 1; r < ranks; ++r) {
    const pid_t pid = fork();
    if (pid < 0) {
      for (pid_t w : group->workers_) kill(w, SIGKILL);
      return io_error(std::string("fork of tensor-parallel rank failed: ") + std::strerror(errno));
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive rank 0
      if (getppid() != parent) _exit(1);
      signal(SIGINT, SIG_IGN);  // a terminal's Ctrl-C goes to rank 0, which stops the workers
      signal(SIGTERM, SIG_DFL);
      shm::ShmCommunicator comm(region, r, kNoLimit);
      std::unique_ptr<shm::ShmCommunicator> stage_comm;
      if (!stage_regions.empty()) {
        const Place at = place_of(r, tp, pp);
        stage_comm = std::make_unique<shm::ShmCommunicator>(stage_regions[static_cast<size_t>(at.stage)], at.tp_rank,
                                                            kNoLimit);
      }
      if (Status st = pin ? pin_to(cpus[static_cast<size_t>(r)]) : Status::ok_status(); !st.ok()) {
        log_line(LogLevel::kWarning, "ranks", "rank " + std::to_string(r) + ": " + st.message());
      }
      worker_main(comm, pp > 1 ? stage_comm.get() : &comm, model, engine, /*forked=*/true);
    }
    group->workers_.push_back(pid);
  }
  if (Status st = pin ? pin_to(cpus[0]) : Status::ok_status(); !st.ok()) log_line(LogLevel::kWarning, "ranks", "rank 0: " + st.message());
  group->world_ = std::make_unique<shm::ShmCommunicator>(region, 0, kNoLimit);
  if (!stage_regions.empty()) group->stage_group_ = std::make_unique<shm::ShmCommunicator>(stage_regions[0], 0, kNoLimit);
  group->finish_start();
  log_line(LogLevel::kInfo, "ranks",
           sizes + ": " + std::to_string(ranks) + " ranks on this host (mp, shared memory), rank 0 pid " +
               std::to_string(parent));
  return group;
}

void RankGroup::finish_start() {
  if (pp_size_ > 1) sender_ = std::make_unique<SendQueue>(*world_);
}

TensorParallel RankGroup::tp() const {
  if (tp_size_ == 1) return TensorParallel{};
  return TensorParallel{0, tp_size_, pp_size_ > 1 ? stage_group_.get() : world_.get()};
}

PipelineParallel RankGroup::pp() const {
  if (pp_size_ == 1) return PipelineParallel{};
  return PipelineParallel{0, pp_size_, world_.get(), -1, tp_size_, sender_.get()};
}

ParallelGroup RankGroup::parallel_group() const {
  return ParallelGroup{world_.get(), pp_size_, sender_.get(), (pp_size_ - 1) * tp_size_};
}

std::vector<shm::ShmCommunicator*> RankGroup::shm_comms() const {
  std::vector<shm::ShmCommunicator*> out;
  for (Communicator* c : {world_.get(), stage_group_.get()}) {
    if (auto* shm = dynamic_cast<shm::ShmCommunicator*>(c)) out.push_back(shm);
  }
  return out;
}

Status RankGroup::agree(const Status& loaded, const std::string& what) {
  Status st = agree_to_start(*world_, loaded, fingerprint_of(what), what);
  agreed_ = st.ok();
  return st;
}

void RankGroup::running() {
  running_ = true;
  for (shm::ShmCommunicator* shm : shm_comms()) shm->set_timeout(kStepTimeout);
}

void RankGroup::abort() {
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
    // The shards loaded but the engine was not built: the workers wait for their first message.
    for (shm::ShmCommunicator* shm : shm_comms()) shm->set_timeout(kStepTimeout);
    (void)stop_group(*world_);
  }
  sender_.reset();  // sends what it still holds (the engine's stop) before the workers are reaped
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
