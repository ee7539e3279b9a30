#include "apps/pagoda/engine_flags.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <set>

namespace pagoda::app {

void EngineFlags::add_to(CLI::App& app) {
  app.add_option("--block-size", block_size, "tokens per KV cache block (1..256)")->capture_default_str();
  app.add_option("--kv-cache-memory", kv_cache_memory,
                 "KV cache size, e.g. 4GiB (default: a quarter of the available memory, capped at what "
                 "--max-num-seqs full-length sequences need)");
  app.add_option("--max-num-seqs", max_num_seqs, "most sequences in one step")->capture_default_str();
  app.add_option("--max-num-batched-tokens", max_num_batched_tokens, "token budget of one step")
      ->capture_default_str();
  app.add_option("--max-model-len", max_model_len,
                 "longest prompt + output in tokens (default: the model's context length)");
  app.add_option("--long-prefill-token-threshold", long_prefill_token_threshold,
                 "most tokens one request may take in a step (0 = no cap)")
      ->capture_default_str();
  app.add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", enable_prefix_caching,
               "automatic prefix caching (on by default; --no-enable-prefix-caching turns it off)");
  app.add_option("--scheduling-policy", scheduling_policy, "fcfs or priority (lower first)")->capture_default_str();
  app.add_option("--seed", seed, "seed for requests that bring none of their own")->capture_default_str();
}

Result<EngineConfig> EngineFlags::to_config() const {
  EngineConfig c;
  c.block_size = block_size;
  if (!kv_cache_memory.empty()) {
    PAGODA_ASSIGN_OR_RETURN(c.kv_cache_memory, parse_byte_size(kv_cache_memory));
  }
  c.scheduler.max_num_seqs = max_num_seqs;
  c.scheduler.max_num_batched_tokens = max_num_batched_tokens;
  c.scheduler.max_model_len = max_model_len;
  c.scheduler.long_prefill_token_threshold = long_prefill_token_threshold;
  if (scheduling_policy == "fcfs") {
    c.scheduler.policy = SchedulingPolicy::kFcfs;
  } else if (scheduling_policy == "priority") {
    c.scheduler.policy = SchedulingPolicy::kPriority;
  } else {
    return invalid_argument("--scheduling-policy must be fcfs or priority, got '" + scheduling_policy + "'");
  }
  c.enable_prefix_caching = enable_prefix_caching;
  c.seed = seed;
  return c;
}

namespace {

using nlohmann::json;

Status wrong_type(const std::string& key, const char* want) {
  return invalid_argument("'" + key + "' must be " + want);
}

template <typename T>
Status read_number(const json& j, const std::string& key, T* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::ok_status();
  if constexpr (std::is_integral_v<T>) {
    if (!it->is_number_integer()) return wrong_type(key, "an integer");
    if (it->is_number_unsigned()) {
      *out = static_cast<T>(it->get<uint64_t>());
    } else {
      *out = static_cast<T>(it->get<int64_t>());
    }
  } else {
    if (!it->is_number()) return wrong_type(key, "a number");
    *out = it->get<T>();
  }
  return Status::ok_status();
}

Status read_bool(const json& j, const std::string& key, bool* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::ok_status();
  if (!it->is_boolean()) return wrong_type(key, "true or false");
  *out = it->get<bool>();
  return Status::ok_status();
}

Status read_ids(const json& j, const std::string& key, std::vector<TokenId>* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::ok_status();
  if (!it->is_array()) return wrong_type(key, "a list of token ids");
  for (const json& v : *it) {
    if (!v.is_number_integer()) return wrong_type(key, "a list of token ids");
    int64_t id = v.get<int64_t>();
    if (id < 0 || id > INT32_MAX) return invalid_argument("'" + key + "' holds an invalid token id");
    out->push_back(static_cast<TokenId>(id));
  }
  return Status::ok_status();
}

}  // namespace

Result<GenerateRequest> request_from_json(const json& j) {
  static const std::set<std::string> known = {
      "prompt", "prompt_token_ids", "max_tokens", "temperature", "top_p", "top_k", "min_p", "n",
      "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "seed", "stop",
      "stop_token_ids", "ignore_eos", "min_tokens", "include_stop_str_in_output", "logprobs",
      "prompt_logprobs", "skip_special_tokens", "priority", "cache_salt"};
  if (!j.is_object()) return invalid_argument("a request must be a JSON object");
  for (const auto& [key, _] : j.items()) {
    if (!known.count(key)) return invalid_argument("unknown field '" + key + "'");
  }
  GenerateRequest r;
  SamplingParams& p = r.params;
  if (auto it = j.find("prompt"); it != j.end()) {
    if (!it->is_string()) return wrong_type("prompt", "a string");
    r.prompt = it->get<std::string>();
  }
  PAGODA_RETURN_IF_ERROR(read_ids(j, "prompt_token_ids", &r.prompt_token_ids));
  if (!j.contains("prompt") && r.prompt_token_ids.empty()) return invalid_argument("'prompt' is required");
  PAGODA_RETURN_IF_ERROR(read_number(j, "max_tokens", &p.max_tokens));
  PAGODA_RETURN_IF_ERROR(read_number(j, "temperature", &p.temperature));
  PAGODA_RETURN_IF_ERROR(read_number(j, "top_p", &p.top_p));
  PAGODA_RETURN_IF_ERROR(read_number(j, "top_k", &p.top_k));
  PAGODA_RETURN_IF_ERROR(read_number(j, "min_p", &p.min_p));
  PAGODA_RETURN_IF_ERROR(read_number(j, "n", &p.n));
  PAGODA_RETURN_IF_ERROR(read_number(j, "presence_penalty", &p.presence_penalty));
  PAGODA_RETURN_IF_ERROR(read_number(j, "frequency_penalty", &p.frequency_penalty));
  PAGODA_RETURN_IF_ERROR(read_number(j, "repetition_penalty", &p.repetition_penalty));
  PAGODA_RETURN_IF_ERROR(read_number(j, "min_tokens", &p.min_tokens));
  PAGODA_RETURN_IF_ERROR(read_number(j, "priority", &r.priority));
  if (j.contains("seed") && !j["seed"].is_null()) {
    uint64_t seed = 0;
    PAGODA_RETURN_IF_ERROR(read_number(j, "seed", &seed));
    p.seed = seed;
  }
  for (const char* key : {"logprobs", "prompt_logprobs"}) {
    if (j.contains(key) && !j[key].is_null()) {
      int64_t v = 0;
      PAGODA_RETURN_IF_ERROR(read_number(j, key, &v));
      (std::string(key) == "logprobs" ? p.logprobs : p.prompt_logprobs) = v;
    }
  }
  PAGODA_RETURN_IF_ERROR(read_bool(j, "ignore_eos", &p.ignore_eos));
  PAGODA_RETURN_IF_ERROR(read_bool(j, "include_stop_str_in_output", &p.include_stop_str_in_output));
  PAGODA_RETURN_IF_ERROR(read_bool(j, "skip_special_tokens", &p.skip_special_tokens));
  PAGODA_RETURN_IF_ERROR(read_ids(j, "stop_token_ids", &p.stop_token_ids));
  if (auto it = j.find("stop"); it != j.end() && !it->is_null()) {
    if (it->is_string()) {
      p.stop.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      for (const json& s : *it) {
        if (!s.is_string()) return wrong_type("stop", "a string or a list of strings");
        p.stop.push_back(s.get<std::string>());
      }
    } else {
      return wrong_type("stop", "a string or a list of strings");
    }
  }
  if (auto it = j.find("logit_bias"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return wrong_type("logit_bias", "an object of token id -> bias");
    for (const auto& [key, value] : it->items()) {
      char* end = nullptr;
      long long id = std::strtoll(key.c_str(), &end, 10);
      if (key.empty() || *end != '\0' || id < 0 || id > INT32_MAX) {
        return invalid_argument("'logit_bias' key '" + key + "' is not a token id");
      }
      if (!value.is_number()) return wrong_type("logit_bias", "an object of token id -> number");
      p.logit_bias.emplace_back(static_cast<TokenId>(id), value.get<float>());
    }
  }
  if (auto it = j.find("cache_salt"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) return wrong_type("cache_salt", "a string");
    r.cache_salt = it->get<std::string>();
  }
  return r;
}

}  // namespace pagoda::app
