#include "executor/executor.h"

#include <algorithm>
#include <utility>

namespace pagoda {

void Executor::add_request(RequestId id, const SamplingParams& params, uint64_t seed,
                           std::vector<TokenId> min_tokens_suppressed, std::string cache_salt, int64_t skip_draws) {
  NewRequestData n;
  n.request_id = id;
  n.params = params;
  n.seed = seed;
  n.min_tokens_suppressed = std::move(min_tokens_suppressed);
  n.skip_draws = skip_draws;
  n.cache_salt = std::move(cache_salt);
  // The prompt is filled in from the scheduler's view when the request is first scheduled.
  encoder_.add_request(std::move(n));
}

void Executor::remove_request(RequestId id) { encoder_.remove_request(id); }

Result<ModelRunnerOutput> Executor::execute(const SchedulerOutput& scheduled) {
  return execute_step(encoder_.encode(scheduled));
}

Status Executor::submit(const SchedulerOutput& scheduled) { return submit_step(encoder_.encode(scheduled)); }

Result<ModelRunnerOutput> Executor::collect() { return collect_step(); }

Status Executor::submit_step(const StepMessage& message) {
  done_.push_back(execute_step(message));
  return Status::ok_status();
}

Result<ModelRunnerOutput> Executor::collect_step() {
  if (done_.empty()) return internal_error("collect without a step in flight");
  Result<ModelRunnerOutput> out = std::move(done_.front());
  done_.pop_front();
  return out;
}

LocalExecutor::LocalExecutor(std::unique_ptr<Worker> worker, bool through_bytes, int max_in_flight)
    : worker_(std::move(worker)), through_bytes_(through_bytes), max_in_flight_(std::max(1, max_in_flight)) {}

Status LocalExecutor::initialize(const WorkerInit& init) {
  if (!through_bytes_) return worker_->initialize(init);
  PAGODA_ASSIGN_OR_RETURN(WorkerInit received, deserialize_init(serialize_init(init)));
  return worker_->initialize(received);
}

std::string LocalExecutor::proposer_description() const {
  return worker_->proposer() != nullptr ? worker_->proposer()->describe() : "";
}

Result<ModelRunnerOutput> LocalExecutor::execute_step(const StepMessage& message) {
  if (!through_bytes_) return worker_->execute(message);
  PAGODA_ASSIGN_OR_RETURN(StepMessage received, deserialize_step(serialize_step(message)));
  PAGODA_ASSIGN_OR_RETURN(ModelRunnerOutput out, worker_->execute(received));
  return deserialize_output(serialize_output(out));
}

}  // namespace pagoda
