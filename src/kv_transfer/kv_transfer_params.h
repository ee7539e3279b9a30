// KvTransferParams: a request's kv_transfer_params (vLLM's field of the completion and chat
// requests and responses) for disaggregated prefill and decode.
//
// The proxy sends the prompt to a prefill instance with {"do_remote_decode": true}: it computes
// the prompt, samples the first token, keeps the prompt's KV blocks for a decode instance to read
// (TcpConnector / ShmConnector) and answers with the parameters that find them:
//   {"do_remote_prefill": true, "remote_engine_id", "remote_host", "remote_port",
//    "remote_request_id", "remote_num_tokens", "remote_tp_size", "remote_block_ids": [],
//    "first_token": {"id", "logprob", "top_logprobs": [[id, logprob], ...]}}
// The proxy passes them on, unchanged, to a decode instance, which loads those tokens' KV instead
// of computing them and continues from the first token (with it: none of the prompt is
// computed; without it, as vLLM does, the last prompt token is).
// Plain values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "base/types.h"

namespace pagoda {

// The first token a prefill instance sampled, with its logprob and the top logprobs it computed.
struct KvFirstToken {
  TokenId token = 0;
  float logprob = 0;
  std::vector<std::pair<TokenId, float>> top_logprobs;

  bool operator==(const KvFirstToken&) const = default;
};

struct KvTransferParams {
  // Prefill side (the request as the proxy sends it to a prefill instance).
  bool do_remote_decode = false;
  uint64_t transfer_id = 0;            // set by the prefill instance: what its blocks are kept under
  // Decode side (what the prefill instance answered).
  bool do_remote_prefill = false;
  std::string remote_engine_id;
  std::string remote_host;
  int remote_port = 0;                 // the prefill instance's rank 0 (rank r listens on port + r)
  uint64_t remote_request_id = 0;
  int64_t remote_num_tokens = 0;       // the prompt's tokens whose KV the prefill instance holds
  int remote_tp_size = 1;
  std::optional<KvFirstToken> first_token;

  bool operator==(const KvTransferParams&) const = default;

  // Reads the JSON object of a request's kv_transfer_params. Unknown fields are ignored (vLLM's
  // connectors add their own); a known field of the wrong type fails naming it.
  static Result<KvTransferParams> from_json(const std::string& json_text);
  // The decode side's parameters as a JSON object (the prefill instance's answer).
  std::string to_json() const;
};

}  // namespace pagoda
