#include "executor/group_executor.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <vector>

#include "base/wire.h"

namespace pagoda {
namespace {

constexpr uint8_t kKvCache = 'K', kStep = 'S', kStop = 'Q', kOutput = 'O';
// The largest message a rank accepts from another (a step's or an output's bytes).
constexpr int64_t kMaxMessageBytes = int64_t{1} << 30;

// agree_to_start's record per rank: ok, the fingerprint, the message (error or description).
constexpr int64_t kRecordBytes = 1024;
constexpr size_t kTextBytes = kRecordBytes - 1 - 8;

std::string text_of(const uint8_t* record) {
  const auto* text = reinterpret_cast<const char*>(record + 9);
  return std::string(text, strnlen(text, kTextBytes));
}

// Rank 0's start of a group's engine: the KV cache's size to every rank, then every rank's
// agreement that it allocated its own.
Status announce_kv_cache(Communicator& comm, int64_t num_blocks, int64_t block_size, KvCacheDtype dtype) {
  ByteWriter w;
  w.put<uint8_t>(kKvCache);
  w.put<int64_t>(num_blocks);
  w.put<int64_t>(block_size);
  w.put<uint8_t>(static_cast<uint8_t>(dtype));
  std::vector<uint8_t> bytes = w.take();
  PAGODA_RETURN_IF_ERROR(broadcast_bytes(comm, bytes, 0));
  return agree_to_start(comm, Status::ok_status(), 0, "the KV cache");
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

Result<std::unique_ptr<GroupExecutor>> GroupExecutor::create(Communicator& comm, std::unique_ptr<ModelRunner> runner) {
  const KvCacheTensors& kv = runner->kv_cache();
  PAGODA_RETURN_IF_ERROR(announce_kv_cache(comm, kv.num_blocks(), kv.block_size(), kv.dtype()));
  return std::unique_ptr<GroupExecutor>(new GroupExecutor(comm, std::move(runner)));
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
  Result<ModelRunnerOutput> out = worker_.execute(message);
  if (!out.ok()) failed_ = true;
  return out;
}

namespace {

// A worker rank's start: rank 0's first message (the KV cache's size, or stop), this shard's KV
// cache, every rank's agreement. Null (and OK) when rank 0 stopped the group first.
Result<std::unique_ptr<Worker>> start_worker(Communicator& comm, std::unique_ptr<Model> shard) {
  std::vector<uint8_t> bytes;
  PAGODA_RETURN_IF_ERROR(broadcast_bytes(comm, bytes, 0));
  ByteReader r(bytes);
  const uint8_t kind = r.get<uint8_t>();
  if (kind == kStop) return std::unique_ptr<Worker>();  // rank 0 stopped before its first step
  const int64_t num_blocks = r.get<int64_t>(), block_size = r.get<int64_t>();
  const uint8_t dtype = r.get<uint8_t>();
  if (!r.ok() || kind != kKvCache || dtype > static_cast<uint8_t>(KvCacheDtype::kInt8)) {
    return data_loss("rank " + std::to_string(comm.rank()) + ": rank 0's first message is not the KV cache's size");
  }
  Result<KvCacheTensors> kv =
      KvCacheTensors::allocate(shard->shard_config(), num_blocks, block_size, static_cast<KvCacheDtype>(dtype));
  PAGODA_RETURN_IF_ERROR(agree_to_start(comm, kv.status(), 0, "the KV cache"));
  return std::make_unique<Worker>(std::make_unique<ModelRunner>(std::move(shard), std::move(*kv)));
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

Status run_group_worker(Communicator& comm, std::unique_ptr<Model> shard) {
  PAGODA_ASSIGN_OR_RETURN(std::unique_ptr<Worker> started, start_worker(comm, std::move(shard)));
  if (!started) return Status::ok_status();
  Worker& worker = *started;
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
    PAGODA_RETURN_IF_ERROR(run_step(comm, worker, message).status());
  }
}

Status run_pipeline_worker(Communicator& world, SendQueue& sender, std::unique_ptr<Model> shard, bool sends_output) {
  PAGODA_ASSIGN_OR_RETURN(std::unique_ptr<Worker> started, start_worker(world, std::move(shard)));
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

Result<std::unique_ptr<PipelineExecutor>> PipelineExecutor::create(Communicator& world, SendQueue& sender, int stages,
                                                                   int output_rank, std::unique_ptr<ModelRunner> runner) {
  const KvCacheTensors& kv = runner->kv_cache();
  PAGODA_RETURN_IF_ERROR(announce_kv_cache(world, kv.num_blocks(), kv.block_size(), kv.dtype()));
  const ModelConfig config = runner->config();
  return std::unique_ptr<PipelineExecutor>(new PipelineExecutor(world, sender, stages, output_rank, config,
                                                                std::make_unique<Worker>(std::move(runner))));
}

Result<std::unique_ptr<PipelineExecutor>> PipelineExecutor::create_remote(Communicator& link, SendQueue& sender,
                                                                          int stages, int output_rank,
                                                                          const ModelConfig& config, int64_t num_blocks,
                                                                          int64_t block_size, KvCacheDtype dtype) {
  PAGODA_RETURN_IF_ERROR(announce_kv_cache(link, num_blocks, block_size, dtype));
  return std::unique_ptr<PipelineExecutor>(new PipelineExecutor(link, sender, stages, output_rank, config, nullptr));
}

PipelineExecutor::~PipelineExecutor() {
  if (failed_) return;  // a group that failed has nobody left to tell
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
