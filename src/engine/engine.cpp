#include "engine/engine.h"

#include <algorithm>
#include <exception>

#include "base/check.h"

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

Engine::Engine(std::unique_ptr<LLMEngine> engine, EngineOptions options) : options_(std::move(options)) {
  replicas_.push_back(std::make_unique<Replica>());
  replicas_.back()->engine = std::move(engine);
  start();
}

Engine::Engine(std::vector<std::unique_ptr<LLMEngine>> engines, EngineOptions options) : options_(std::move(options)) {
  for (auto& engine : engines) {
    replicas_.push_back(std::make_unique<Replica>());
    replicas_.back()->engine = std::move(engine);
  }
  start();
}

void Engine::start() {
  PAGODA_CHECK(!replicas_.empty());
  PAGODA_CHECK(!options_.metrics || options_.metrics->num_engines() >= num_replicas());
  for (size_t i = 0; i < replicas_.size(); ++i) {
    Replica& r = *replicas_[i];
    PAGODA_CHECK(r.engine != nullptr);
    r.index = static_cast<int>(i);
    if (options_.metrics) r.engine->set_metrics(options_.metrics, r.index);
    mark_progress(r);
  }
  for (auto& r : replicas_) r->thread = std::thread([this, replica = r.get()] { loop(*replica); });
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& r : replicas_) r->thread.join();
}

Result<RequestStream> Engine::submit(GenerateRequest request) {
  // Every replica has the same model and limits: the first one checks for all (immutable state).
  PAGODA_ASSIGN_OR_RETURN(PreparedRequest prepared, replicas_.front()->engine->prepare(std::move(request)));
  return submit(std::move(prepared));
}

Result<RequestId> Engine::submit(GenerateRequest request, ChunkCallback on_chunk) {
  PAGODA_ASSIGN_OR_RETURN(PreparedRequest prepared, replicas_.front()->engine->prepare(std::move(request)));
  return enqueue(std::move(prepared), std::move(on_chunk));
}

Result<RequestStream> Engine::submit(PreparedRequest request) {
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

Result<RequestId> Engine::submit(PreparedRequest request, ChunkCallback on_chunk) {
  return enqueue(std::move(request), std::move(on_chunk));
}

Engine::Replica& Engine::pick_replica() {
  // vLLM's score: a waiting sequence weighs four running ones (it will need a prefill and
  // blocks); scanning from a rotating start spreads equal loads in turn.
  Replica* best = nullptr;
  int64_t best_score = 0;
  for (size_t k = 0; k < replicas_.size(); ++k) {
    Replica& r = *replicas_[(next_pick_ + k) % replicas_.size()];
    const int64_t waiting = r.pending_sequences + r.in_transit + r.stats.num_waiting;
    const int64_t score = 4 * waiting + r.stats.num_running;
    if (best == nullptr || score < best_score) {
      best = &r;
      best_score = score;
    }
  }
  next_pick_ = (next_pick_ + 1) % replicas_.size();
  return *best;
}

Result<RequestId> Engine::enqueue(PreparedRequest request, ChunkCallback on_chunk) {
  RequestId id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_) return unavailable("the engine has failed: " + error_);
    if (stop_) return unavailable("the engine is shutting down");
    if (!refusing_.empty()) return unavailable(refusing_);
    if (options_.max_queued_requests > 0) {
      int64_t waiting = 0;
      for (const auto& r : replicas_) waiting += static_cast<int64_t>(r->pending.size()) + r->in_transit + r->stats.num_waiting;
      if (waiting >= options_.max_queued_requests) {
        return Status(StatusCode::kResourceExhausted,
                      "the server is busy: " + std::to_string(options_.max_queued_requests) +
                          " requests are already waiting (--max-queued-requests); retry later");
      }
    }
    Replica& r = pick_replica();
    id = next_id_++;
    sinks_[id] = Sink{std::move(on_chunk), request.params.n, r.index};
    r.pending_sequences += request.params.n;
    r.pending.emplace_back(id, std::move(request));
  }
  wake_.notify_all();
  return id;
}

void Engine::abort(RequestId id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sinks_.find(id);
    if (it == sinks_.end()) return;  // finished, or never ours
    replicas_[static_cast<size_t>(it->second.replica)]->aborts.push_back(id);
  }
  wake_.notify_all();
}

void Engine::abort_all() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& r : replicas_) r->abort_all = true;
  }
  wake_.notify_all();
}

void Engine::refuse_new(std::string reason) {
  std::lock_guard<std::mutex> lock(mu_);
  refusing_ = reason.empty() ? std::string("the engine takes no new requests") : std::move(reason);
}

SchedulerStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  SchedulerStats sum;
  for (const auto& r : replicas_) {
    sum.num_running += r->stats.num_running;
    sum.num_waiting += r->stats.num_waiting;
    sum.kv_usage += r->stats.kv_usage / static_cast<double>(replicas_.size());
    sum.num_preemptions += r->stats.num_preemptions;
    sum.prefix_cache.queries += r->stats.prefix_cache.queries;
    sum.prefix_cache.hits += r->stats.prefix_cache.hits;
  }
  return sum;
}

SchedulerStats Engine::stats(int replica) const {
  std::lock_guard<std::mutex> lock(mu_);
  return replicas_.at(static_cast<size_t>(replica))->stats;
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
  const int64_t now = steady_now_ns();
  for (const auto& r : replicas_) {
    h.seconds_since_progress = std::max(h.seconds_since_progress, static_cast<double>(now - r->last_progress_ns.load()) * 1e-9);
  }
  return h;
}

void Engine::mark_progress(Replica& r) { r.last_progress_ns.store(steady_now_ns()); }

// Only the engine thread of a request's core erases its sink and calls its callback, so a
// callback is called without the lock held (it may take its own locks) and its Sink stays where
// it is meanwhile (an unordered_map's elements stay put while others come and go). A request's
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

// Ends every request of replica r, including those not yet added to it.
void Engine::fail_all(Replica& r, FinishReason reason) {
  std::deque<std::pair<RequestId, PreparedRequest>> never_added;
  std::vector<RequestId> ids;
  {
    std::lock_guard<std::mutex> lock(mu_);
    never_added.swap(r.pending);
    r.pending_sequences = 0;
    for (auto& [id, sink] : sinks_) {
      if (sink.replica == r.index) ids.push_back(id);
    }
  }
  for (RequestId id : ids) deliver(r.engine->abort(id, reason));
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

void Engine::loop(Replica& r) {
  try {
    run_loop(r);
  } catch (const std::exception& e) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!failed_) error_ = replicas_.size() > 1 ? "data-parallel engine " + std::to_string(r.index) + ": " + e.what()
                                                  : std::string(e.what());
      failed_ = true;
    }
    try {
      fail_all(r, FinishReason::kError);
    } catch (...) {  // the core is broken; the streams still end below
    }
  }
  // Whatever is still open (stop, or a core too broken to abort) ends here, so no reader hangs.
  try {
    fail_all(r, FinishReason::kAbort);
  } catch (...) {
  }
  std::vector<Sink> left;
  std::vector<RequestId> left_ids;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = sinks_.begin(); it != sinks_.end();) {
      if (it->second.replica != r.index) {
        ++it;
        continue;
      }
      left_ids.push_back(it->first);
      left.push_back(std::move(it->second));
      it = sinks_.erase(it);
    }
  }
  for (size_t k = 0; k < left.size(); ++k) {
    for (int64_t i = 0; i < left[k].open_sequences; ++i) {
      OutputChunk c;
      c.request_id = left_ids[k];
      c.index = i;
      c.finish_reason = FinishReason::kAbort;
      left[k].callback(std::move(c));
    }
  }
}

void Engine::run_loop(Replica& r) {
  LLMEngine& engine = *r.engine;
  for (;;) {
    std::deque<std::pair<RequestId, PreparedRequest>> added;
    std::vector<RequestId> aborted;
    bool all = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Wake at least once a second so that health() sees an idle loop as alive.
      wake_.wait_for(lock, std::chrono::seconds(1), [&] {
        return stop_ || r.abort_all || !r.pending.empty() || !r.aborts.empty() || engine.has_unfinished();
      });
      if (stop_) return;
      added.swap(r.pending);
      r.in_transit = r.pending_sequences;
      r.pending_sequences = 0;
      aborted.swap(r.aborts);
      all = r.abort_all;
      r.abort_all = false;
    }
    mark_progress(r);
    for (auto& [id, request] : added) {
      Status st = engine.add_request(id, request);
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
    for (RequestId id : aborted) deliver(engine.abort(id));
    if (all) fail_all(r, FinishReason::kAbort);
    if (options_.before_step && engine.has_unfinished()) options_.before_step(r.steps++);
    // The queue bound sees the step's waiting requests from the moment they are scheduled (or
    // not), so none slips in while a slow forward pass runs.
    auto publish_stats = [this, &r, &engine] {
      std::lock_guard<std::mutex> lock(mu_);
      r.stats = engine.stats();
      r.in_transit = 0;
    };
    std::vector<OutputChunk> chunks = engine.step(publish_stats);
    publish_stats();
    deliver(std::move(chunks));
    mark_progress(r);
  }
}

}  // namespace pagoda
