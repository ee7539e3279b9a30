// Engine: the thread-safe facade over one LLMEngine, or several (data parallelism: replicas of
// the model, each with its own scheduler, KV cache and workers). One engine thread per replica
// runs the continuous-batching loop; any thread may submit requests and read their output, either as
// a RequestStream (pull; dropping it before it ends aborts the request) or through a callback
// (push; what an event-loop server wants). An aborted request's KV blocks return within one step.
//
// Data parallelism (vLLM's DP load balancing): each request goes to the replica with the least
// load, 4 x waiting + running sequences counted as of now (a request submitted a moment ago
// counts as waiting), ties taken in turn; it stays there for life, and abort() finds it there.
//
// Failure: if a step throws, the engine is marked failed, the requests of that core end with
// finish reason "error" (the others run on until the owner stops the engine), and later
// submissions fail with unavailable; health() says so, so that a supervisor restarts the process
// rather than a live process hanging while it looks healthy.
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
#include "engine/llm_engine.h"

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
  // Where the engine records vLLM's metrics (core i as engine i: it must have as many); may be null.
  std::shared_ptr<metrics::EngineMetrics> metrics;
  // Fault injection for tests: called on each core's engine thread before each step that has
  // work, with that core's step number (0, 1, ...). It may throw (a failing step) or block (a
  // stuck one).
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
  // at least once a second); the slowest loop's, with several cores. A large value with work
  // pending means the loop is stuck.
  double seconds_since_progress = 0;
};

class Engine {
 public:
  // Takes over the engine and starts its thread.
  explicit Engine(std::unique_ptr<LLMEngine> engine, EngineOptions options = {});
  // Data parallelism: takes over the engines (at least one, alike: the same model and limits) and
  // starts a thread for each.
  explicit Engine(std::vector<std::unique_ptr<LLMEngine>> engines, EngineOptions options = {});
  ~Engine();  // stops the threads; unfinished requests are aborted
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Tokenizes and validates on the calling thread (LLMEngine::prepare; errors name the parameter),
  // then queues the request for the engine thread. Fails with resource_exhausted beyond
  // max_queued_requests and with unavailable once the engine stops or fails.
  Result<RequestStream> submit(GenerateRequest request);
  Result<RequestId> submit(GenerateRequest request, ChunkCallback on_chunk);
  // The same for a request a parser has checked already (server/openai_request.h): queued as it is.
  Result<RequestStream> submit(PreparedRequest request);
  Result<RequestId> submit(PreparedRequest request, ChunkCallback on_chunk);

  // Ends a request wherever it is (from any thread). Unknown ids are ignored.
  void abort(RequestId id);
  // Ends every request that has not finished (with finish reason abort).
  void abort_all();
  // From now on submit() fails with unavailable(reason); requests already in keep running.
  void refuse_new(std::string reason);

  // Scheduler figures (running, waiting, KV usage, prefix-cache counts) as of the last step:
  // taken when it was scheduled and again when it ended. Summed over the cores (KV usage
  // averaged), or core `replica`'s.
  SchedulerStats stats() const;
  SchedulerStats stats(int replica) const;
  // Requests submitted and not yet finished (including those not yet seen by the loops).
  int64_t num_unfinished() const;
  EngineHealth health() const;
  int num_replicas() const { return static_cast<int>(replicas_.size()); }
  const EngineCore& core(int replica = 0) const { return replicas_.at(static_cast<size_t>(replica))->engine->core(); }

 private:
  struct Sink {  // where one request's chunks go
    ChunkCallback callback;
    int64_t open_sequences = 0;
    int replica = 0;
  };
  // One replica (its LLMEngine) and what its thread works on.
  struct Replica {
    int index = 0;
    std::unique_ptr<LLMEngine> engine;
    std::deque<std::pair<RequestId, PreparedRequest>> pending;  // guarded by mu_
    int64_t pending_sequences = 0;                              // guarded by mu_
    std::vector<RequestId> aborts;                              // guarded by mu_
    bool abort_all = false;                                     // guarded by mu_
    SchedulerStats stats;                                       // guarded by mu_
    // Requests the loop has taken from pending and the scheduler has not yet decided about,
    // which stats does not count yet: the queue bound and the balancing count them, so none
    // slips in meanwhile.
    int64_t in_transit = 0;                                     // guarded by mu_
    std::atomic<int64_t> last_progress_ns{0};                   // steady_clock, since its epoch
    int64_t steps = 0;                                          // its thread only
    std::thread thread;
  };
  void start();
  Replica& pick_replica();  // requires mu_
  Result<RequestId> enqueue(PreparedRequest request, ChunkCallback on_chunk);
  void loop(Replica& r);
  void run_loop(Replica& r);
  void deliver(std::vector<OutputChunk> chunks);
  void fail_all(Replica& r, FinishReason reason);
  static void mark_progress(Replica& r);

  const EngineOptions options_;
  std::vector<std::unique_ptr<Replica>> replicas_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;                                       // guarded by mu_
  bool failed_ = false;                                     // guarded by mu_
  std::string refusing_;                                    // guarded by mu_; "" = accepting
  std::string error_;                                       // guarded by mu_
  RequestId next_id_ = 1;                                   // guarded by mu_
  size_t next_pick_ = 0;                                    // guarded by mu_; ties go in turn
  // Only a request's own core's thread erases its sink (and calls its callback).
  std::unordered_map<RequestId, Sink> sinks_;               // guarded by mu_
};

}  // namespace pagoda
