#include "apps/pagoda/engine_setup.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "base/log.h"
#include "base/mapped_file.h"

namespace pagoda::app {

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

Result<EngineSetup> make_engine(const ModelFlags& model, const EngineFlags& engine,
                                const std::function<Status(const Tokenizer&)>& before_weights) {
  PAGODA_ASSIGN_OR_RETURN(EngineConfig config, engine.to_config());
  set_log_level(*parse_log_level(engine.log_level));
  EngineSetup setup;
  PAGODA_ASSIGN_OR_RETURN(setup.generation_defaults, load_generation_defaults(engine.generation_config, model.model));
  if (!setup.generation_defaults.empty()) {
    log_line(LogLevel::kInfo, "engine",
             "request defaults from generation_config.json (--generation-config vllm to use the engine's own)");
  }
  PAGODA_ASSIGN_OR_RETURN(LoadedModel loaded, load_model_and_tokenizer(model, before_weights));
  setup.tokenizer = std::shared_ptr<const Tokenizer>(std::move(loaded.tokenizer));
  PAGODA_ASSIGN_OR_RETURN(setup.core, EngineCore::create(std::move(loaded.model), setup.tokenizer, config));
  return setup;
}

}  // namespace pagoda::app
