#include "engine/llm_engine.h"

namespace pagoda {

LLMEngine::LLMEngine(std::unique_ptr<EngineCore> core, std::shared_ptr<const Tokenizer> tokenizer)
    : core_(std::move(core)), tokenizer_(std::move(tokenizer)), output_(tokenizer_, core_->config()) {}

Result<std::unique_ptr<LLMEngine>> LLMEngine::create(std::unique_ptr<Model> model,
                                                     std::shared_ptr<const Tokenizer> tokenizer,
                                                     const EngineConfig& config, std::unique_ptr<Model> draft_model) {
  auto worker = std::make_unique<Worker>(std::move(model), std::move(draft_model));
  auto executor = std::make_unique<LocalExecutor>(std::move(worker), config.serialize_steps, config.steps_in_flight);
  PAGODA_ASSIGN_OR_RETURN(std::unique_ptr<EngineCore> core, EngineCore::create(std::move(executor), config));
  return std::make_unique<LLMEngine>(std::move(core), std::move(tokenizer));
}

RequestLimits LLMEngine::request_limits() const {
  const EngineConfig& c = core_->config();
  return RequestLimits{core_->model_config().vocab_size, c.scheduler.max_model_len, c.max_logprobs};
}

Result<PreparedRequest> LLMEngine::prepare(GenerateRequest r) const {
  if (r.prompt_token_ids.empty()) r.prompt_token_ids = tokenizer_->encode(r.prompt, r.add_special_tokens);
  std::variant<PreparedRequest, RequestError> prepared = prepare_request(std::move(r), request_limits());
  if (auto* bad = std::get_if<RequestError>(&prepared)) return invalid_argument(bad->message);
  return std::move(std::get<PreparedRequest>(prepared));
}

Status LLMEngine::add_request(RequestId id, const PreparedRequest& request) {
  PAGODA_ASSIGN_OR_RETURN(std::vector<CoreRequest> sequences, output_.add_request(id, request));
  std::vector<RequestId> added;
  for (CoreRequest& c : sequences) {
    const RequestId seq_id = c.id;
    if (Status st = core_->add_request(std::move(c)); !st.ok()) {
      core_->finish_requests(added);
      output_.remove_request(id);
      return st;
    }
    added.push_back(seq_id);
  }
  return Status::ok_status();
}

std::vector<OutputChunk> LLMEngine::abort(RequestId id, FinishReason reason) {
  std::vector<RequestId> sequences;
  std::vector<OutputChunk> chunks = output_.abort(id, reason, &sequences);
  core_->finish_requests(sequences);
  return chunks;
}

std::vector<OutputChunk> LLMEngine::step(const std::function<void()>& on_scheduled) {
  CoreStepOutput out = core_->step(on_scheduled);
  const int64_t scheduled_tokens = out.num_scheduled_tokens;
  OutputProcessor::Processed processed = output_.process(std::move(out));
  core_->finish_requests(processed.finished);
  if (output_.has_metrics()) {
    output_.record_step(core_->stats(), scheduled_tokens);
    if (std::optional<KvConnectorStats> kv = core_->connector_stats()) output_.record_kv_connector(*kv);
  }
  return std::move(processed.chunks);
}

}  // namespace pagoda
