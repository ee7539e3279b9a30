#include "kv_transfer/kv_transfer_params.h"

#include <nlohmann/json.hpp>

namespace pagoda {

Result<KvTransferParams> KvTransferParams::from_json(const std::string& text) {
  const auto bad = [](const std::string& why) { return invalid_argument("kv_transfer_params: " + why); };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return bad(std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) return bad("must be an object");
  KvTransferParams p;
  try {
    auto flag = [&](const char* key, bool* out) -> Status {
      if (!j.contains(key) || j[key].is_null()) return Status::ok_status();
      if (!j[key].is_boolean()) return bad(std::string(key) + " must be a boolean");
      *out = j[key].get<bool>();
      return Status::ok_status();
    };
    PAGODA_RETURN_IF_ERROR(flag("do_remote_decode", &p.do_remote_decode));
    PAGODA_RETURN_IF_ERROR(flag("do_remote_prefill", &p.do_remote_prefill));
    if (!p.do_remote_prefill) return p;
    auto string = [&](const char* key, std::string* out) -> Status {
      if (!j.contains(key) || !j[key].is_string() || j[key].get<std::string>().empty()) {
        return bad(std::string(key) + " must be a non-empty string with do_remote_prefill");
      }
      *out = j[key].get<std::string>();
      return Status::ok_status();
    };
    auto integer = [&](const char* key, int64_t lo, int64_t hi, int64_t* out) -> Status {
      // vLLM's proxies pass ids through JSON, where a large one may arrive as a string.
      if (j.contains(key) && j[key].is_string()) {
        try {
          size_t used = 0;
          const unsigned long long v = std::stoull(j[key].get<std::string>(), &used);
          if (used == j[key].get<std::string>().size() && v <= static_cast<unsigned long long>(hi)) {
            *out = static_cast<int64_t>(v);
            if (*out >= lo) return Status::ok_status();
          }
        } catch (...) {
        }
      } else if (j.contains(key) && j[key].is_number_integer()) {
        const int64_t v = j[key].get<int64_t>();
        if (v >= lo && v <= hi) {
          *out = v;
          return Status::ok_status();
        }
      }
      return bad(std::string(key) + " must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                 "] with do_remote_prefill");
    };
    PAGODA_RETURN_IF_ERROR(string("remote_engine_id", &p.remote_engine_id));
    PAGODA_RETURN_IF_ERROR(string("remote_host", &p.remote_host));
    int64_t port = 0, id = 0, tokens = 0, tp = 1;
    PAGODA_RETURN_IF_ERROR(integer("remote_port", 1, 65535, &port));
    PAGODA_RETURN_IF_ERROR(integer("remote_request_id", 0, INT64_MAX, &id));
    PAGODA_RETURN_IF_ERROR(integer("remote_num_tokens", 1, INT64_MAX, &tokens));
    if (j.contains("remote_tp_size")) PAGODA_RETURN_IF_ERROR(integer("remote_tp_size", 1, 64, &tp));
    p.remote_port = static_cast<int>(port);
    p.remote_request_id = static_cast<uint64_t>(id);
    p.remote_num_tokens = tokens;
    p.remote_tp_size = static_cast<int>(tp);
    if (j.contains("first_token") && !j["first_token"].is_null()) {
      const nlohmann::json& f = j["first_token"];
      if (!f.is_object() || !f.contains("id") || !f["id"].is_number_integer() || f["id"].get<int64_t>() < 0 ||
          f["id"].get<int64_t>() > INT32_MAX || (f.contains("logprob") && !f["logprob"].is_number())) {
        return bad("first_token must be {\"id\": token, \"logprob\": number, \"top_logprobs\": [[token, number], ...]}");
      }
      KvFirstToken t;
      t.token = static_cast<TokenId>(f["id"].get<int64_t>());
      if (f.contains("logprob")) t.logprob = f["logprob"].get<float>();
      if (f.contains("top_logprobs")) {
        if (!f["top_logprobs"].is_array() || f["top_logprobs"].size() > 1000) return bad("first_token.top_logprobs must be a list");
        for (const nlohmann::json& e : f["top_logprobs"]) {
          if (!e.is_array() || e.size() != 2 || !e[0].is_number_integer() || !e[1].is_number() ||
              e[0].get<int64_t>() < 0 || e[0].get<int64_t>() > INT32_MAX) {
            return bad("first_token.top_logprobs entries must be [token, logprob]");
          }
          t.top_logprobs.emplace_back(static_cast<TokenId>(e[0].get<int64_t>()), e[1].get<float>());
        }
      }
      p.first_token = std::move(t);
    }
  } catch (const nlohmann::json::exception& e) {
    return bad(e.what());
  }
  return p;
}

std::string KvTransferParams::to_json() const {
  nlohmann::json j;
  j["do_remote_prefill"] = do_remote_prefill;
  j["do_remote_decode"] = false;
  j["remote_engine_id"] = remote_engine_id;
  j["remote_host"] = remote_host;
  j["remote_port"] = remote_port;
  j["remote_request_id"] = std::to_string(remote_request_id);  // exact in any JSON reader
  j["remote_num_tokens"] = remote_num_tokens;
  j["remote_tp_size"] = remote_tp_size;
  j["remote_block_ids"] = nlohmann::json::array();  // vLLM's field; the blocks are found by request id here
  if (first_token) {
    nlohmann::json top = nlohmann::json::array();
    for (const auto& [id, lp] : first_token->top_logprobs) top.push_back({id, lp});
    j["first_token"] = {{"id", first_token->token}, {"logprob", first_token->logprob}, {"top_logprobs", top}};
  }
  return j.dump();
}

}  // namespace pagoda
