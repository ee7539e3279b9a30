#include "launch/engine_setup.h"

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "launch/ranks.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/guarded/guarded_backend.h"
#include "base/log.h"
#include "base/mapped_file.h"
#include "executor/group_executor.h"

namespace pagoda::app {

Status register_backends() {
  static const Status registered = [] {
    const char* isa_env = std::getenv("PAGODA_CPU_ISA");
    Result<std::string> isa = cpu::parse_cpu_isa(isa_env != nullptr ? isa_env : "");
    if (!isa.ok()) return Status(isa.status().code(), "PAGODA_CPU_ISA: " + isa.status().message());
    cpu::register_cpu_backend(cpu::CpuBackendOptions{.isa = *isa});
    guarded::register_guarded_backend();
    return Status::ok_status();
  }();
  return registered;
}

server::ModelContext model_context(const ModelFlags& model, const EngineSetup& setup, int64_t default_max_tokens) {
  server::ModelContext ctx;
  const std::string& path = model.model;
  std::string name = std::filesystem::path(path).filename().string();
  ctx.served_model_names = {path};
  if (!name.empty() && name != path) ctx.served_model_names.push_back(name);
  const EngineConfig& ec = setup.engine->core().config();
  ctx.max_model_len = ec.scheduler.max_model_len;
  ctx.vocab_size = setup.engine->core().model_config().vocab_size;
  ctx.priority_scheduling = ec.scheduler.policy == SchedulingPolicy::kPriority;
  ctx.tokenizer = setup.tokenizer.get();
  ctx.limits.max_logprobs = ec.max_logprobs;
  ctx.defaults = setup.generation_defaults;
  ctx.default_max_tokens = default_max_tokens;
  ctx.structured.grammars = setup.grammars.get();
  ctx.structured.max_json_depth = ctx.limits.max_json_depth;
  return ctx;
}

Result<GenerationDefaults> load_generation_defaults(const std::string& setting, const std::string& model_path) {
  namespace fs = std::filesystem;
  if (setting == "vllm") return GenerationDefaults{};
  const bool automatic = setting == "auto";
  const fs::path dir = automatic ? fs::path(model_path) : fs::path(setting);
  const fs::path file = dir / "generation_config.json";
  if (!fs::is_directory(dir) || !fs::exists(file)) {
    if (automatic) return GenerationDefaults{};
    return not_found("--generation-config " + setting + ": no generation_config.json there");
  }
  PAGODA_ASSIGN_OR_RETURN(std::string text, read_file(file.string()));
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return invalid_argument(file.string() + ": not a JSON object");
  GenerationDefaults d;
  const auto number = [&](const char* key, std::optional<double>& out) -> Status {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return Status::ok_status();
    if (!it->is_number()) return invalid_argument(file.string() + ": '" + key + "' must be a number");
    out = it->get<double>();
    return Status::ok_status();
  };
  const auto integer = [&](const char* key, std::optional<int64_t>& out) -> Status {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return Status::ok_status();
    if (!it->is_number_integer()) return invalid_argument(file.string() + ": '" + key + "' must be an integer");
    out = it->get<int64_t>();
    return Status::ok_status();
  };
  PAGODA_RETURN_IF_ERROR(number("temperature", d.temperature));
  PAGODA_RETURN_IF_ERROR(number("top_p", d.top_p));
  PAGODA_RETURN_IF_ERROR(number("min_p", d.min_p));
  PAGODA_RETURN_IF_ERROR(number("repetition_penalty", d.repetition_penalty));
  PAGODA_RETURN_IF_ERROR(integer("top_k", d.top_k));
  PAGODA_RETURN_IF_ERROR(integer("max_new_tokens", d.max_new_tokens));
  // The defaults must pass the validator themselves, or every request would be refused.
  SamplingParams p;
  d.apply_to(p);
  if (std::optional<InvalidParam> bad = p.check(/*vocab_size=*/1 << 30)) {
    return invalid_argument(file.string() + ": " + bad->message);
  }
  if (d.max_new_tokens && *d.max_new_tokens < 1) {
    return invalid_argument(file.string() + ": max_new_tokens must be >= 1");
  }
  return d;
}

namespace {

// A draft must tokenize as the model does: the same tokens under the same ids. A draft without a
// vocabulary of its own (a built-in config, a GGUF file without one) borrows --tokenizer when the
// model was given one; EngineCore::create still compares the vocabulary sizes.
Status check_draft_vocabulary(const ModelFlags& model, ModelFlags* draft, const Tokenizer& model_tokenizer) {
  const std::string name = "--speculative-config: draft model " + draft->model;
  Result<std::unique_ptr<Tokenizer>> loaded = load_tokenizer(*draft);
  if (!loaded.ok() && !model.tokenizer.empty() &&
      (std::filesystem::is_regular_file(draft->model) || dummy_preset(draft->model))) {
    draft->tokenizer = model.tokenizer;
    return Status::ok_status();
  }
  if (!loaded.ok()) return invalid_argument(name + ": " + loaded.status().message());
  const Tokenizer& t = **loaded;
  if (t.vocab_size() != model_tokenizer.vocab_size()) {
    return invalid_argument(name + " has a vocabulary of " + std::to_string(t.vocab_size()) + " tokens, the model " +
                            std::to_string(model_tokenizer.vocab_size()) + ": a draft must share the model's vocabulary");
  }
  for (TokenId id = 0; id < t.vocab_size(); ++id) {
    if (t.token_bytes(id) != model_tokenizer.token_bytes(id)) {
      return invalid_argument(name + ": token " + std::to_string(id) + " is '" + t.token_bytes(id) +
                              "' there but '" + model_tokenizer.token_bytes(id) +
                              "' in the model's vocabulary: a draft must share the model's vocabulary");
    }
  }
  return Status::ok_status();
}

}  // namespace

std::unique_ptr<Executor> make_executor(const EngineConfig& config, RankGroup* group, std::unique_ptr<Worker> worker) {
  const ParallelGroup g = group != nullptr ? group->parallel_group() : ParallelGroup{};
  if (g.world != nullptr && g.pipeline_stages > 1) {
    return PipelineExecutor::create(*g.world, *g.sender, g.pipeline_stages, g.output_rank, std::move(worker));
  }
  if (g.world != nullptr && g.world->size() > 1) return std::make_unique<GroupExecutor>(*g.world, std::move(worker));
  return std::make_unique<LocalExecutor>(std::move(worker), config.serialize_steps, config.steps_in_flight);
}

Result<EngineSetup> make_engine(const ModelFlags& model, const EngineFlags& engine,
                                const std::function<Status(const Tokenizer&)>& before_weights, RankGroup* group) {
  PAGODA_ASSIGN_OR_RETURN(EngineConfig config, engine.to_config());
  if ((group != nullptr) != (engine.tensor_parallel_size * engine.pipeline_parallel_size * engine.data_parallel_size > 1)) {
    return internal_error("make_engine: a rank group is needed exactly when there is more than one rank");
  }
  set_log_level(*parse_log_level(engine.log_level));
  EngineSetup setup;
  PAGODA_ASSIGN_OR_RETURN(setup.generation_defaults, load_generation_defaults(engine.generation_config, model.model));
  if (!setup.generation_defaults.empty()) {
    log_line(LogLevel::kInfo, "engine",
             "request defaults from generation_config.json (--generation-config vllm to use the engine's own)");
  }
  const bool has_draft = config.speculative.method == "draft_model";
  ModelFlags draft = draft_flags(model, config.speculative);
  Result<LoadedModel> loaded = load_model_and_tokenizer(
      model,
      [&](const Tokenizer& tokenizer) -> Status {
        if (before_weights) PAGODA_RETURN_IF_ERROR(before_weights(tokenizer));
        return has_draft ? check_draft_vocabulary(model, &draft, tokenizer) : Status::ok_status();
      },
      group != nullptr ? group->tp() : TensorParallel{}, group != nullptr ? group->pp() : PipelineParallel{});
  // Speculating with a draft model: every rank holds the whole draft, next to its shard.
  std::unique_ptr<Model> draft_model;
  if (loaded.ok() && has_draft) {
    Result<std::unique_ptr<Model>> d = load_draft_model(draft);
    if (d.ok()) draft_model = std::move(*d);
    else loaded = d.status();
  }
  if (group != nullptr) {
    // Every rank's shard loaded alike, or every rank stops here.
    const std::string what = loaded.ok() ? rank_fingerprint_text(model, engine, loaded->model->config()) : "";
    const Status agreed = group->agree(loaded.status(), what);
    if (loaded.ok() && !agreed.ok()) return agreed;
    config.replicas_on_host = group->replicas_on_host();
  }
  if (!loaded.ok()) return loaded.status();
  if (loaded->backend != nullptr) setup.kernels = loaded->backend->description();
  setup.tokenizer = std::shared_ptr<const Tokenizer>(std::move(loaded->tokenizer));
  config.model_fingerprint = loaded->weights_fingerprint;
  const WorkerRank rank{0, static_cast<int>(engine.tensor_parallel_size)};
  auto worker = std::make_unique<Worker>(std::move(loaded->model), std::move(draft_model), rank);
  PAGODA_ASSIGN_OR_RETURN(std::unique_ptr<EngineCore> core,
                          EngineCore::create(make_executor(config, group, std::move(worker)), config));
  // Data parallelism: the other replicas' engines, each driving its ranks from here, started as
  // replica 0's.
  for (int d = 1; group != nullptr && d < group->data_parallel_size(); ++d) {
    const RankGroup::RemoteReplica r = group->remote_replica(d);
    group->driving(d);
    Result<std::unique_ptr<EngineCore>> replica = EngineCore::create_replica(
        *core, PipelineExecutor::create_remote(*r.link, *r.sender, r.stages, r.output_rank, core->model_config()));
    if (!replica.ok()) {
      return Status(replica.status().code(),
                    "data-parallel replica " + std::to_string(d) + ": " + replica.status().message());
    }
    setup.replicas.push_back(std::make_unique<LLMEngine>(std::move(*replica), setup.tokenizer));
  }
  setup.grammars = structured::GrammarCompiler::for_model(setup.tokenizer, core->model_config().vocab_size);
  setup.engine = std::make_unique<LLMEngine>(std::move(core), setup.tokenizer);
  if (group != nullptr) group->running();
  return setup;
}

}  // namespace pagoda::app
