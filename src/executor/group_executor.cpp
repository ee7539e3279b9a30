#include "executor/group_executor.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <vector>

#include "base/wire.h"

namespace pagoda {
namespace {

constexpr uint8_t kStart = 'K', kStep = 'S', kStop = 'Q', kOutput = 'O';
// The largest message a rank accepts from another (a step's or an output's bytes).
constexpr int64_t kMaxMessageBytes = int64_t{1} << 30;

// agree_to_start's record per rank: ok, the fingerprint, the message (error or description).
constexpr int64_t kRecordBytes = 1024;
constexpr size_t kTextBytes = kRecordBytes - 1 - 8;

std::string text_of(const uint8_t* record) {
  const auto* text = reinterpret_cast<const char*>(record + 9);
  return std::string(text, strnlen(text, kTextBytes));
}

// Rank 0's start of a group's engine: the workers' start to every rank, then `mine` (rank 0's own
// worker's start, when it has one) and every rank's agreement that it started.
Status announce_start(Communicator& comm, const WorkerInit& init, Worker* mine) {
  std::vector<uint8_t> bytes = serialize_init(init);
  bytes.insert(bytes.begin(), kStart);
  PAGODA_RETURN_IF_ERROR(broadcast_bytes(comm, bytes, 0));
  const Status started = mine != nullptr ? mine->initialize(init) : Status::ok_status();
  return agree_to_start(comm, started, 0, "the workers' start");
}

}  // namespace

uint64_t fingerprint_of(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

Status agree_to_start(Communicator& comm, const Status& mine, uint64_t fingerprint, const std::string& what) {
  std::vector<uint8_t> record(kRecordBytes, 0);
  record[0] = mine.ok() ? 1 : 0;
  std::memcpy(record.data() + 1, &fingerprint, sizeof fingerprint);
  const std::string text = mine.ok() ? what : mine.message();
  std::memcpy(record.data() + 9, text.data(), std::min(text.size(), kTextBytes - 1));
  std::vector<uint8_t> all(static_cast<size_t>(comm.size() * kRecordBytes));
  PAGODA_RETURN_IF_ERROR(comm.all_gather(record.data(), kRecordBytes, all.data()));
  for (int r = 0; r < comm.size(); ++r) {
    const uint8_t* rec = all.data() + r * kRecordBytes;
    if (rec[0] != 1) return unavailable("rank " + std::to_string(r) + ": " + text_of(rec));
  }
  for (int r = 1; r < comm.size(); ++r) {
    const uint8_t* rec = all.data() + r * kRecordBytes;
    uint64_t theirs = 0;
    std::memcpy(&theirs, rec + 1, sizeof theirs);
    uint64_t first = 0;
    std::memcpy(&first, all.data() + 1, sizeof first);
    if (theirs != first) {
      return invalid_argument("rank " + std::to_string(r) + " loaded another model or configuration than rank 0 (" +
                                 text_of(rec) + " against " + text_of(all.data()) + ")");
    }
  }
  return Status::ok_status();
}

Status GroupExecutor::initialize(const WorkerInit& init) {
  Status st = announce_start(comm_, init, worker_.get());
  if (!st.ok()) failed_ = true;
  return st;
}

std::string GroupExecutor::proposer_description() const {
  return worker_->proposer() != nullptr ? worker_->proposer()->describe() : "";
}

Status stop_group(Communicator& comm) {
  std::vector<uint8_t> stop{kStop};
  return broadcast_bytes(comm, stop, 0);
}

GroupExecutor::~GroupExecutor() {
  if (!failed_) (void)stop_group(comm_);  // a group that fails now has nobody left to tell
}

Result<ModelRunnerOutput> GroupExecutor::execute_step(const StepMessage& message) {
  if (failed_) return unavailable("the tensor-parallel group failed earlier");
  std::vector<uint8_t> bytes = serialize_step(message);
  bytes.insert(bytes.begin(), kStep);
  if (Status st = broadcast_bytes(comm_, bytes, 0); !st.ok()) {
    failed_ = true;
    return st;
  }
  // The other ranks run the same message; the forward pass's collectives fail if one of them
  // cannot (Model::forward throws, and the engine fails the step).
  Result<ModelRunnerOutput> out = worker_->execute(message);
  if (!out.ok()) failed_ = true;
  if (out.ok()) {
    if (Status st = agree_on_loads(comm_, message, *out); !st.ok()) {
      failed_ = true;
      return st;
    }
  }
  return out;
}

Status agree_on_loads(Communicator& comm, const StepMessage& message, ModelRunnerOutput& out) {
  const size_t n = message.kv_connector.awaiting.size();
  if (n == 0 || comm.size() == 1) return Status::ok_status();
  std::vector<KvLoadState>& mine = out.kv_connector.load_states;
  if (mine.size() != n) mine.assign(n, KvLoadState::kFailed);  // a worker that lost count fails them
  std::vector<KvLoadState> all(n * static_cast<size_t>(comm.size()));
  PAGODA_RETURN_IF_ERROR(comm.all_gather(mine.data(), static_cast<int64_t>(n), all.data()));
  for (size_t i = 0; i < n; ++i) {
    bool done = true, failed = false;
    for (int r = 0; r < comm.size(); ++r) {
      const KvLoadState s = all[static_cast<size_t>(r) * n + i];
      done = done && s == KvLoadState::kDone;
      failed = failed || s == KvLoadState::kFailed;
    }
    mine[i] = failed ? KvLoadState::kFailed : done ? KvLoadState::kDone : KvLoadState::kPending;
  }
  return Status::ok_status();
}

namespace {

// A worker rank's start: rank 0's first message (the workers' start, or stop), `worker`'s start,
// every rank's agreement. Null (and OK) when rank 0 stopped the group first.
Result<std::unique_ptr<Worker>> start_worker(Communicator& comm, std::unique_ptr<Worker> worker) {
  std::vector<uint8_t> bytes;
  PAGODA_RETURN_IF_ERROR(broadcast_bytes(comm, bytes, 0));
  if (!bytes.empty() && bytes[0] == kStop) return std::unique_ptr<Worker>();  // rank 0 stopped before its first step
  if (bytes.empty() || bytes[0] != kStart) {
    return data_loss("rank " + std::to_string(comm.rank()) + ": rank 0's first message is not the workers' start");
  }
  Result<WorkerInit> init = deserialize_init(std::span<const uint8_t>(bytes).subspan(1));
  const Status started = init.ok() ? worker->initialize(*init) : init.status();
  PAGODA_RETURN_IF_ERROR(agree_to_start(comm, started, 0, "the workers' start"));
  return worker;
}

// Runs one step on `worker`: the output, or the error naming this rank (a refused message, or a
// collective or transfer of the forward pass that failed).
Result<ModelRunnerOutput> run_step(Communicator& comm, Worker& worker, const StepMessage& message) {
  try {
    return worker.execute(message);
  } catch (const std::exception& e) {  // Model::forward
    return unavailable(std::string("rank ") + std::to_string(comm.rank()) + ": " + e.what());
  }
}

}  // namespace

Status run_group_worker(Communicator& comm, std::unique_ptr<Worker> worker) {
  PAGODA_ASSIGN_OR_RETURN(std::unique_ptr<Worker> started, start_worker(comm, std::move(worker)));
  if (!started) return Status::ok_status();
  std::vector<uint8_t> bytes;
  while (true) {
    PAGODA_RETURN_IF_ERROR(broadcast_bytes(comm, bytes, 0));
    if (bytes.empty()) return data_loss("rank " + std::to_string(comm.rank()) + ": an empty message from rank 0");
    if (bytes[0] == kStop) return Status::ok_status();
    if (bytes[0] != kStep) {
      return data_loss("rank " + std::to_string(comm.rank()) + ": a message of unknown kind " +
                       std::to_string(bytes[0]) + " from rank 0");
    }
    PAGODA_ASSIGN_OR_RETURN(StepMessage message, deserialize_step(std::span<const uint8_t>(bytes).subspan(1)));
    PAGODA_ASSIGN_OR_RETURN(ModelRunnerOutput out, run_step(comm, *started, message));
    PAGODA_RETURN_IF_ERROR(agree_on_loads(comm, message, out));
  }
}

Status run_pipeline_worker(Communicator& world, SendQueue& sender, std::unique_ptr<Worker> worker, bool sends_output) {
  PAGODA_ASSIGN_OR_RETURN(std::unique_ptr<Worker> started, start_worker(world, std::move(worker)));
  if (!started) return Status::ok_status();
  const std::string me = "rank " + std::to_string(world.rank());
  while (true) {
    PAGODA_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, recv_bytes(world, 0, kMaxMessageBytes));
    if (bytes.empty()) return data_loss(me + ": an empty message from rank 0");
    if (bytes[0] == kStop) return sender.flush();
    if (bytes[0] != kStep) return data_loss(me + ": a message of unknown kind " + std::to_string(bytes[0]) + " from rank 0");
    PAGODA_ASSIGN_OR_RETURN(StepMessage message, deserialize_step(std::span<const uint8_t>(bytes).subspan(1)));
    PAGODA_ASSIGN_OR_RETURN(ModelRunnerOutput out, run_step(world, *started, message));
    if (sends_output) {
      std::vector<uint8_t> reply = serialize_output(out);
      reply.insert(reply.begin(), kOutput);
      PAGODA_RETURN_IF_ERROR(sender.post(0, std::move(reply), /*with_size=*/true));
    }
  }
}

std::unique_ptr<PipelineExecutor> PipelineExecutor::create(Communicator& world, SendQueue& sender, int stages,
                                                           int output_rank, std::unique_ptr<Worker> worker) {
  const ModelConfig config = worker->config();
  return std::unique_ptr<PipelineExecutor>(
      new PipelineExecutor(world, sender, stages, output_rank, config, std::move(worker)));
}

std::unique_ptr<PipelineExecutor> PipelineExecutor::create_remote(Communicator& link, SendQueue& sender, int stages,
                                                                  int output_rank, const ModelConfig& config) {
  return std::unique_ptr<PipelineExecutor>(new PipelineExecutor(link, sender, stages, output_rank, config, nullptr));
}

Result<WorkerMemory> PipelineExecutor::memory(int64_t block_size, KvCacheDtype dtype, int64_t max_num_batched_tokens,
                                              int64_t max_num_seqs) const {
  if (!worker_) return unimplemented("a replica whose workers run elsewhere is sized as the replica it copies");
  return worker_->memory(block_size, dtype, max_num_batched_tokens, max_num_seqs);
}

Status PipelineExecutor::initialize(const WorkerInit& init) {
  started_ = true;
  Status st = announce_start(world_, init, worker_.get());
  if (!st.ok()) failed_ = true;
  return st;
}

std::string PipelineExecutor::proposer_description() const {
  return worker_ && worker_->proposer() != nullptr ? worker_->proposer()->describe() : "";
}

PipelineExecutor::~PipelineExecutor() {
  if (failed_) return;  // a group that failed has nobody left to tell
  if (!started_) {      // the ranks still wait for their start, which comes by broadcast
    (void)stop_group(world_);
    return;
  }
  for (int r = 1; r < world_.size(); ++r) (void)sender_.post(r, {kStop}, /*with_size=*/true);
  (void)sender_.flush();
}

Status PipelineExecutor::submit_step(const StepMessage& message) {
  if (failed_) return unavailable(worker_ ? "the pipeline-parallel group failed earlier" : "the replica's ranks failed earlier");
  std::vector<uint8_t> bytes = serialize_step(message);
  bytes.insert(bytes.begin(), kStep);
  Status st;
  for (int r = 1; r < world_.size() && st.ok(); ++r) st = sender_.post(r, bytes, /*with_size=*/true);
  // Stage 0 of the step (the message as it is; the other ranks decode its bytes); its forward
  // pass queues the activations for stage 1. A remote replica's stage 0 is rank 1's.
  if (st.ok() && worker_) st = run_step(world_, *worker_, message).status();
  if (!st.ok()) failed_ = true;
  return st;
}

Result<ModelRunnerOutput> PipelineExecutor::collect_step() {
  if (failed_) return unavailable(worker_ ? "the pipeline-parallel group failed earlier" : "the replica's ranks failed earlier");
  Result<std::vector<uint8_t>> bytes = recv_bytes(world_, output_rank_, kMaxMessageBytes);
  Result<ModelRunnerOutput> out = bytes.status();
  if (bytes.ok()) {
    if (bytes->empty() || (*bytes)[0] != kOutput) {
      out = data_loss("rank " + std::to_string(output_rank_) + " sent something other than a step's output");
    } else {
      out = deserialize_output(std::span<const uint8_t>(*bytes).subspan(1));
    }
  }
  if (!out.ok()) failed_ = true;
  return out;
}

Result<ModelRunnerOutput> PipelineExecutor::execute_step(const StepMessage& message) {
  PAGODA_RETURN_IF_ERROR(submit_step(message));
  return collect_step();
}

}  // namespace pagoda
