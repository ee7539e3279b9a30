// Engine: the thread-safe facade over EngineCore. One engine thread runs the continuous-batching
// loop; any thread may submit requests and read their output streams. Dropping a RequestStream
// before it ends aborts the request; its KV blocks return within one step.
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

class Engine {
 public:
  // Takes over the core and starts the engine thread.
  explicit Engine(std::unique_ptr<EngineCore> core);
  ~Engine();  // stops the thread; unfinished requests are aborted
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates and tokenizes on the calling thread (errors name the parameter), then queues the
  // request for the engine thread.
  Result<RequestStream> submit(GenerateRequest request);

  // Ends a request wherever it is (from any thread). Unknown ids are ignored.
  void abort(RequestId id);

  // Scheduler figures of the last step (running, waiting, KV usage, prefix-cache counts).
  SchedulerStats stats() const;
  const EngineCore& core() const { return *core_; }

 private:
  void loop();
  void deliver(std::vector<OutputChunk> chunks);

  std::unique_ptr<EngineCore> core_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;                                       // guarded by mu_
  RequestId next_id_ = 1;                                   // guarded by mu_
  std::deque<std::pair<RequestId, GenerateRequest>> pending_;  // guarded by mu_
  std::vector<RequestId> aborts_;                           // guarded by mu_
  std::unordered_map<RequestId, std::shared_ptr<RequestStream::State>> streams_;  // guarded by mu_
  SchedulerStats stats_;                                    // guarded by mu_
  std::thread thread_;
};

}  // namespace pagoda
