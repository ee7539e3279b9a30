#include "engine/engine.h"

#include <exception>

namespace pagoda {

namespace {

int64_t steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

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

Engine::Engine(std::unique_ptr<EngineCore> core, EngineOptions options)
    : core_(std::move(core)), options_(std::move(options)) {
  if (options_.metrics) core_->set_metrics(options_.metrics);
  mark_progress();
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

Result<RequestStream> Engine::submit(GenerateRequest request) {
  auto state = std::make_shared<RequestStream::State>();
  state->open_sequences = request.params.n;
  auto on_chunk = [state](OutputChunk&& c) {
    std::lock_guard<std::mutex> lock(state->mu);
    if (c.finished()) --state->open_sequences;
    state->chunks.push_back(std::move(c));
    state->cv.notify_all();
  };
  PAGODA_ASSIGN_OR_RETURN(RequestId id, enqueue(std::move(request), std::move(on_chunk)));
  return RequestStream(this, id, std::move(state));
}

Result<RequestId> Engine::submit(GenerateRequest request, ChunkCallback on_chunk) {
  return enqueue(std::move(request), std::move(on_chunk));
}

Result<RequestId> Engine::enqueue(GenerateRequest request, ChunkCallback on_chunk) {
  PAGODA_RETURN_IF_ERROR(core_->prepare(request));  // reads immutable state only
  RequestId id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_) return unavailable("the engine has failed: " + error_);
    if (stop_) return unavailable("the engine is shutting down");
    if (!refusing_.empty()) return unavailable(refusing_);
    if (options_.max_queued_requests > 0 &&
        static_cast<int64_t>(pending_.size()) + in_transit_ + stats_.num_waiting >= options_.max_queued_requests) {
      return Status(StatusCode::kResourceExhausted,
                    "the server is busy: " + std::to_string(options_.max_queued_requests) +
                        " requests are already waiting (--max-queued-requests); retry later");
    }
    id = next_id_++;
    sinks_[id] = Sink{std::move(on_chunk), request.params.n};
    pending_.emplace_back(id, std::move(request));
  }
  wake_.notify_all();
  return id;
}

void Engine::abort(RequestId id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    aborts_.push_back(id);
  }
  wake_.notify_all();
}

void Engine::abort_all() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    abort_all_ = true;
  }
  wake_.notify_all();
}

void Engine::refuse_new(std::string reason) {
  std::lock_guard<std::mutex> lock(mu_);
  refusing_ = reason.empty() ? std::string("the engine takes no new requests") : std::move(reason);
}

SchedulerStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

int64_t Engine::num_unfinished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(sinks_.size());
}

EngineHealth Engine::health() const {
  EngineHealth h;
  {
    std::lock_guard<std::mutex> lock(mu_);
    h.failed = failed_;
    h.error = error_;
    h.stopping = stop_;
  }
  h.seconds_since_progress = static_cast<double>(steady_now_ns() - last_progress_ns_.load()) * 1e-9;
  return h;
}

void Engine::mark_progress() { last_progress_ns_.store(steady_now_ns()); }

// Only the engine thread erases sinks and calls callbacks, so a callback is called without the
// lock held (it may take its own locks) and its Sink stays where it is meanwhile. A request's
// sink is gone before its last callback runs, so whoever sees the end also sees
// num_unfinished() without it.
void Engine::deliver(std::vector<OutputChunk> chunks) {
  for (OutputChunk& c : chunks) {
    Sink* sink = nullptr;
    std::optional<Sink> last;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = sinks_.find(c.request_id);
      if (it == sinks_.end()) continue;
      sink = &it->second;
      if (c.finished() && --sink->open_sequences == 0) {
        last.emplace(std::move(it->second));
        sinks_.erase(it);
        sink = &*last;
      }
    }
    sink->callback(std::move(c));
  }
}

// Ends every request the engine knows of, including those not yet added to the core.
void Engine::fail_all(FinishReason reason) {
  std::deque<std::pair<RequestId, GenerateRequest>> never_added;
  std::vector<RequestId> ids;
  {
    std::lock_guard<std::mutex> lock(mu_);
    never_added.swap(pending_);
    for (auto& [id, _] : sinks_) ids.push_back(id);
  }
  for (RequestId id : ids) deliver(core_->abort(id, reason));
  std::vector<OutputChunk> unstarted;
  for (auto& [id, request] : never_added) {
    for (int64_t i = 0; i < request.params.n; ++i) {
      OutputChunk c;
      c.request_id = id;
      c.index = i;
      c.finish_reason = reason;
      unstarted.push_back(std::move(c));
    }
  }
  deliver(std::move(unstarted));
}

void Engine::loop() {
  try {
    run_loop();
  } catch (const std::exception& e) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      failed_ = true;
      error_ = e.what();
    }
    try {
      fail_all(FinishReason::kError);
    } catch (...) {  // the core is broken; the streams still end below
    }
  }
  // Whatever is still open (stop, or a core too broken to abort) ends here, so no reader hangs.
  try {
    fail_all(FinishReason::kAbort);
  } catch (...) {
  }
  std::unordered_map<RequestId, Sink> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    left.swap(sinks_);
  }
  for (auto& [id, sink] : left) {
    for (int64_t i = 0; i < sink.open_sequences; ++i) {
      OutputChunk c;
      c.request_id = id;
      c.index = i;
      c.finish_reason = FinishReason::kAbort;
      sink.callback(std::move(c));
    }
  }
}

void Engine::run_loop() {
  for (;;) {
    std::deque<std::pair<RequestId, GenerateRequest>> added;
    std::vector<RequestId> aborted;
    bool all = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Wake at least once a second so that health() sees an idle loop as alive.
      wake_.wait_for(lock, std::chrono::seconds(1), [&] {
        return stop_ || abort_all_ || !pending_.empty() || !aborts_.empty() || core_->has_unfinished();
      });
      if (stop_) return;
      added.swap(pending_);
      in_transit_ = static_cast<int64_t>(added.size());
      aborted.swap(aborts_);
      all = abort_all_;
      abort_all_ = false;
    }
    mark_progress();
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
    if (all) fail_all(FinishReason::kAbort);
    if (options_.before_step && core_->has_unfinished()) options_.before_step(steps_++);
    // The queue bound sees the step's waiting requests from the moment they are scheduled (or
    // not), so none slips in while a slow forward pass runs.
    auto publish_stats = [this] {
      std::lock_guard<std::mutex> lock(mu_);
      stats_ = core_->stats();
      in_transit_ = 0;
    };
    std::vector<OutputChunk> chunks = core_->step(publish_stats);
    publish_stats();
    deliver(std::move(chunks));
    mark_progress();
  }
}

}  // namespace pagoda
