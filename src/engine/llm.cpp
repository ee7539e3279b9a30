#include "engine/llm.h"

#include <unordered_map>

namespace pagoda {

Result<std::vector<RequestOutput>> LLM::generate(std::vector<GenerateRequest> requests,
                                                 const std::function<void(size_t, size_t)>& progress,
                                                 const std::function<bool()>& interrupted) {
  std::vector<PreparedRequest> prepared;
  prepared.reserve(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    Result<PreparedRequest> p = engine_->prepare(std::move(requests[i]));
    if (!p.ok()) return p.status().with_context("request " + std::to_string(i));
    prepared.push_back(std::move(*p));
  }
  return generate(prepared, progress, interrupted);
}

Result<std::vector<RequestOutput>> LLM::generate(const std::vector<PreparedRequest>& requests,
                                                 const std::function<void(size_t, size_t)>& progress,
                                                 const std::function<bool()>& interrupted) {
  std::vector<RequestOutput> results(requests.size());
  std::unordered_map<RequestId, size_t> slot;
  std::vector<int64_t> open(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const RequestId id = next_id_++;
    Status st = engine_->add_request(id, requests[i]);
    if (!st.ok()) {
      for (auto& [done_id, _] : slot) engine_->abort(done_id);
      return st.with_context("request " + std::to_string(i));
    }
    slot[id] = i;
    open[i] = requests[i].params.n;
    results[i].prompt_token_ids = requests[i].prompt_token_ids;
    results[i].prompt_tokens = static_cast<int64_t>(requests[i].prompt_token_ids.size());
    results[i].outputs.resize(static_cast<size_t>(requests[i].params.n));
    for (int64_t k = 0; k < requests[i].params.n; ++k) results[i].outputs[static_cast<size_t>(k)].index = k;
  }
  size_t finished = 0;
  while (engine_->has_unfinished()) {
    for (OutputChunk& c : engine_->step()) {
      const size_t i = slot.at(c.request_id);
      RequestOutput& r = results[i];
      CompletionOutput& o = r.outputs[static_cast<size_t>(c.index)];
      o.text += c.text;
      o.token_ids.insert(o.token_ids.end(), c.token_ids.begin(), c.token_ids.end());
      o.logprobs.insert(o.logprobs.end(), c.logprobs.begin(), c.logprobs.end());
      if (!c.prompt_logprobs.empty() && c.index == 0) {
        r.prompt_logprobs.insert(r.prompt_logprobs.end(), c.prompt_logprobs.begin(), c.prompt_logprobs.end());
      }
      if (c.finished()) {
        o.finish_reason = c.finish_reason;
        o.stop_string = c.stop_string;
        o.stop_token = c.stop_token;
        r.completion_tokens += c.completion_tokens;
        r.cached_tokens = std::max(r.cached_tokens, c.cached_tokens);
        r.timings = c.timings;
        if (--open[i] == 0 && progress) progress(++finished, requests.size());
      }
    }
    if (interrupted && interrupted()) {
      for (const auto& [id, i] : slot) {
        if (open[i] > 0) engine_->abort(id);
      }
      while (engine_->has_unfinished()) engine_->step();  // collects the aborted requests' last chunks
      return unavailable("interrupted: " + std::to_string(finished) + " of " + std::to_string(requests.size()) +
                         " requests had finished");
    }
  }
  return results;
}

Result<std::vector<RequestOutput>> LLM::generate(const std::vector<std::string>& prompts,
                                                 const SamplingParams& params) {
  std::vector<GenerateRequest> requests(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    requests[i].prompt = prompts[i];
    requests[i].params = params;
  }
  return generate(std::move(requests));
}

}  // namespace pagoda
