#include "engine/engine.h"

namespace pagoda {

struct RequestStream::State {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<OutputChunk> chunks;  // guarded by mu
  int64_t open_sequences = 0;      // guarded by mu; the stream ends when it reaches 0
};

RequestStream::~RequestStream() {
  if (engine_ && state_ && !done()) engine_->abort(id_);
}

bool RequestStream::done() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->open_sequences == 0 && state_->chunks.empty();
}

std::optional<OutputChunk> RequestStream::next(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(state_->mu);
  state_->cv.wait_for(lock, timeout, [&] { return !state_->chunks.empty() || state_->open_sequences == 0; });
  if (state_->chunks.empty()) return std::nullopt;
  OutputChunk c = std::move(state_->chunks.front());
  state_->chunks.pop_front();
  return c;
}

Engine::Engine(std::unique_ptr<EngineCore> core) : core_(std::move(core)) {
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
  // Wake any reader still waiting.
  for (auto& [id, state] : streams_) {
    std::lock_guard<std::mutex> lock(state->mu);
    state->open_sequences = 0;
    state->cv.notify_all();
  }
}

Result<RequestStream> Engine::submit(GenerateRequest request) {
  PAGODA_RETURN_IF_ERROR(core_->prepare(request));  // reads immutable state only
  auto state = std::make_shared<RequestStream::State>();
  state->open_sequences = request.params.n;
  RequestId id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return internal_error("the engine is shutting down");
    id = next_id_++;
    streams_[id] = state;
    pending_.emplace_back(id, std::move(request));
  }
  wake_.notify_all();
  return RequestStream(this, id, std::move(state));
}

void Engine::abort(RequestId id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    aborts_.push_back(id);
  }
  wake_.notify_all();
}

SchedulerStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void Engine::deliver(std::vector<OutputChunk> chunks) {
  for (OutputChunk& c : chunks) {
    std::shared_ptr<RequestStream::State> state;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = streams_.find(c.request_id);
      if (it == streams_.end()) continue;
      state = it->second;
      if (c.finished()) {
        std::lock_guard<std::mutex> slock(state->mu);
        if (state->open_sequences == 1) streams_.erase(it);
      }
    }
    std::lock_guard<std::mutex> slock(state->mu);
    if (c.finished()) --state->open_sequences;
    state->chunks.push_back(std::move(c));
    state->cv.notify_all();
  }
}

void Engine::loop() {
  for (;;) {
    std::deque<std::pair<RequestId, GenerateRequest>> added;
    std::vector<RequestId> aborted;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || !pending_.empty() || !aborts_.empty() || core_->has_unfinished(); });
      if (stop_) break;
      added.swap(pending_);
      aborted.swap(aborts_);
    }
    for (auto& [id, request] : added) {
      Status st = core_->add_request(id, request);
      if (!st.ok()) {  // cannot happen after prepare(); end the stream rather than hang it
        std::vector<OutputChunk> failed;
        for (int64_t i = 0; i < request.params.n; ++i) {
          OutputChunk c;
          c.request_id = id;
          c.index = i;
          c.finish_reason = FinishReason::kAbort;
          failed.push_back(c);
        }
        deliver(std::move(failed));
      }
    }
    for (RequestId id : aborted) deliver(core_->abort(id));
    deliver(core_->step());
    std::lock_guard<std::mutex> lock(mu_);
    stats_ = core_->stats();
  }
  // Shutdown: abort whatever is left so streams end.
  std::vector<RequestId> ids;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, _] : streams_) ids.push_back(id);
  }
  for (RequestId id : ids) deliver(core_->abort(id));
}

}  // namespace pagoda
