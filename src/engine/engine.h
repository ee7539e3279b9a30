// Engine: the thread-safe facade over EngineCore. One engine thread runs the continuous-batching
// loop; any thread may submit requests and read their output, either as a RequestStream (pull;
// dropping it before it ends aborts the request) or through a callback (push; what an event-loop
// server wants). An aborted request's KV blocks return within one step.
//
// Failure: if a step throws, the engine is marked failed, every request ends with finish reason
// "error", and later submissions fail with unavailable; health() says so, so that a supervisor
// restarts the process rather than a live process hanging while it looks healthy.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include <atomic>
#include <functional>
#include <string>

#include "base/status.h"
#include "engine/engine_core.h"

namespace pagoda {

class Engine;

// The output of one submitted request, chunk by chunk. Move-only; thread-compatible (one reader).
// A stream must not outlive the Engine that made it.
class RequestStream {
 public:
  RequestStream(RequestStream&&) noexcept = default;
  RequestStream& operator=(RequestStream&&) noexcept = default;
  ~RequestStream();  // aborts the request if it has not finished

  RequestId id() const { return id_; }
  // The next chunk, waiting up to `timeout`; nullopt at the end of the stream or on timeout
  // (done() tells which).
  std::optional<OutputChunk> next(std::chrono::milliseconds timeout = std::chrono::hours(24 * 365));
  bool done() const;

  struct State;  // shared with the engine thread

 private:
  friend class Engine;
  RequestStream(Engine* engine, RequestId id, std::shared_ptr<State> state)
      : engine_(engine), id_(id), state_(std::move(state)) {}
  Engine* engine_ = nullptr;
  RequestId id_ = 0;
  std::shared_ptr<State> state_;
};

struct EngineOptions {
  // Requests waiting to be scheduled (queued or preempted) beyond which submit() refuses new
  // ones with resource_exhausted; 0 = no bound.
  int64_t max_queued_requests = 0;
  // Where the engine records vLLM's metrics; may be null.
  std::shared_ptr<metrics::EngineMetrics> metrics;
  // Fault injection for tests: called on the engine thread before each step that has work,
  // with the step's number (0, 1, ...). It may throw (a failing step) or block (a stuck one).
  std::function<void(int64_t step)> before_step;
};

// Called on the engine thread with each chunk of one request, in order; the last call has
// finish_reason set on its sequence's last chunk. It must return quickly and must not call back
// into the Engine's blocking methods (post the work elsewhere instead).
using ChunkCallback = std::function<void(OutputChunk&&)>;

struct EngineHealth {
  bool failed = false;   // a step threw: the engine serves nothing more
  std::string error;     // why, when failed
  bool stopping = false;
  // Seconds since the loop last made progress (a finished step, or an idle wake-up, which happens
  // at least once a second). A large value with work pending means the loop is stuck.
  double seconds_since_progress = 0;
};

class Engine {
 public:
  // Takes over the core and starts the engine thread.
  explicit Engine(std::unique_ptr<EngineCore> core, EngineOptions options = {});
  ~Engine();  // stops the thread; unfinished requests are aborted
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates and tokenizes on the calling thread (errors name the parameter), then queues the
  // request for the engine thread. Fails with resource_exhausted beyond max_queued_requests and
  // with unavailable once the engine stops or fails.
  Result<RequestStream> submit(GenerateRequest request);
  Result<RequestId> submit(GenerateRequest request, ChunkCallback on_chunk);

  // Ends a request wherever it is (from any thread). Unknown ids are ignored.
  void abort(RequestId id);
  // Ends every request that has not finished (with finish reason abort).
  void abort_all();
  // From now on submit() fails with unavailable(reason); requests already in keep running.
  void refuse_new(std::string reason);

  // Scheduler figures (running, waiting, KV usage, prefix-cache counts) as of the last step:
  // taken when it was scheduled and again when it ended.
  SchedulerStats stats() const;
  // Requests submitted and not yet finished (including those not yet seen by the loop).
  int64_t num_unfinished() const;
  EngineHealth health() const;
  const EngineCore& core() const { return *core_; }

 private:
  struct Sink {  // where one request's chunks go
    ChunkCallback callback;
    int64_t open_sequences = 0;
  };
  Result<RequestId> enqueue(GenerateRequest request, ChunkCallback on_chunk);
  void loop();
  void run_loop();
  void deliver(std::vector<OutputChunk> chunks);
  void fail_all(FinishReason reason);
  void mark_progress();

  std::unique_ptr<EngineCore> core_;
  const EngineOptions options_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;                                       // guarded by mu_
  bool abort_all_ = false;                                  // guarded by mu_
  bool failed_ = false;                                     // guarded by mu_
  std::string refusing_;                                    // guarded by mu_; "" = accepting
  std::string error_;                                       // guarded by mu_
  RequestId next_id_ = 1;                                   // guarded by mu_
  std::deque<std::pair<RequestId, GenerateRequest>> pending_;  // guarded by mu_
  std::vector<RequestId> aborts_;                           // guarded by mu_
  std::unordered_map<RequestId, Sink> sinks_;               // guarded by mu_
  SchedulerStats stats_;                                    // guarded by mu_
  // Requests the loop has taken from pending_ and the scheduler has not yet decided about, which
  // stats_ does not count yet: the queue bound counts them, so none slips in meanwhile.
  int64_t in_transit_ = 0;                                  // guarded by mu_
  std::atomic<int64_t> last_progress_ns_{0};                // steady_clock, since its epoch
  int64_t steps_ = 0;                                       // engine thread only
  std::thread thread_;
};

}  // namespace pagoda
