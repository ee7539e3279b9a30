#include "worker/step_message.h"

#include <utility>

#include "base/check.h"
#include "base/wire.h"

namespace pagoda {
namespace {

// Leading bytes of each message kind: a message of the wrong kind fails at once.
constexpr uint32_t kStepMagic = 0x50535433;    // "PST3"
constexpr uint32_t kOutputMagic = 0x504f5533;  // "POU3"
constexpr uint32_t kInitMagic = 0x50494e32;    // "PIN2"

template <class T>
void put_optional(ByteWriter& w, const std::optional<T>& v) {
  w.put_bool(v.has_value());
  if (v) w.put<T>(*v);
}
template <class T>
std::optional<T> get_optional(ByteReader& r) {
  if (!r.get_bool()) return std::nullopt;
  return r.get<T>();
}

void put_params(ByteWriter& w, const SamplingParams& p) {
  w.put<double>(p.temperature);
  w.put<double>(p.top_p);
  w.put<int64_t>(p.top_k);
  w.put<double>(p.min_p);
  w.put<int64_t>(p.n);
  w.put<double>(p.presence_penalty);
  w.put<double>(p.frequency_penalty);
  w.put<double>(p.repetition_penalty);
  w.put<uint64_t>(p.logit_bias.size());
  for (const auto& [token, bias] : p.logit_bias) {
    w.put<TokenId>(token);
    w.put<float>(bias);
  }
  put_optional(w, p.seed);
  w.put<int64_t>(p.max_tokens);
  w.put<int64_t>(p.min_tokens);
  w.put<uint64_t>(p.stop.size());
  for (const std::string& s : p.stop) w.put_string(s);
  w.put_vector(p.stop_token_ids);
  w.put_bool(p.ignore_eos);
  w.put_bool(p.include_stop_str_in_output);
  put_optional(w, p.logprobs);
  put_optional(w, p.prompt_logprobs);
  w.put_bool(p.skip_special_tokens);
}

SamplingParams get_params(ByteReader& r) {
  SamplingParams p;
  p.temperature = r.get<double>();
  p.top_p = r.get<double>();
  p.top_k = r.get<int64_t>();
  p.min_p = r.get<double>();
  p.n = r.get<int64_t>();
  p.presence_penalty = r.get<double>();
  p.frequency_penalty = r.get<double>();
  p.repetition_penalty = r.get<double>();
  const uint64_t num_bias = r.get_count(sizeof(TokenId) + sizeof(float));
  for (uint64_t i = 0; i < num_bias && r.ok(); ++i) {
    const TokenId token = r.get<TokenId>();
    p.logit_bias.emplace_back(token, r.get<float>());
  }
  p.seed = get_optional<uint64_t>(r);
  p.max_tokens = r.get<int64_t>();
  p.min_tokens = r.get<int64_t>();
  const uint64_t num_stop = r.get_count(sizeof(uint64_t));
  for (uint64_t i = 0; i < num_stop && r.ok(); ++i) p.stop.push_back(r.get_string());
  p.stop_token_ids = r.get_vector<TokenId>();
  p.ignore_eos = r.get_bool();
  p.include_stop_str_in_output = r.get_bool();
  p.logprobs = get_optional<int64_t>(r);
  p.prompt_logprobs = get_optional<int64_t>(r);
  p.skip_special_tokens = r.get_bool();
  return p;
}

void put_sampled(ByteWriter& w, const SampledOutput& s) {
  w.put<RequestId>(s.request_id);
  w.put<TokenId>(s.token);
  w.put<float>(s.logprob);
  w.put<uint64_t>(s.top_logprobs.size());
  for (const TokenLogprobEntry& e : s.top_logprobs) {
    w.put<TokenId>(e.token);
    w.put<float>(e.logprob);
  }
}

SampledOutput get_sampled(ByteReader& r) {
  SampledOutput s;
  s.request_id = r.get<RequestId>();
  s.token = r.get<TokenId>();
  s.logprob = r.get<float>();
  const uint64_t n = r.get_count(sizeof(TokenId) + sizeof(float));
  for (uint64_t i = 0; i < n && r.ok(); ++i) {
    TokenLogprobEntry e;
    e.token = r.get<TokenId>();
    e.logprob = r.get<float>();
    s.top_logprobs.push_back(e);
  }
  return s;
}

void put_key(ByteWriter& w, const KvBlockKey& k) {
  for (uint8_t b : k.bytes) w.put<uint8_t>(b);
}

KvBlockKey get_key(ByteReader& r) {
  KvBlockKey k;
  for (uint8_t& b : k.bytes) b = r.get<uint8_t>();
  return k;
}

void put_connector(ByteWriter& w, const KvConnectorMetadata& m) {
  w.put<uint64_t>(m.loads.size());
  for (const KvTierLoad& l : m.loads) {
    w.put<RequestId>(l.request_id);
    w.put<uint64_t>(l.blocks.size());
    for (const KvTierLoadBlock& b : l.blocks) {
      w.put<BlockId>(b.block);
      w.put<int64_t>(b.slot);
      put_key(w, b.key);
    }
  }
  w.put_vector(m.awaiting);
  w.put<uint64_t>(m.stores.size());
  for (const KvTierStore& st : m.stores) {
    w.put<BlockId>(st.block);
    w.put<int64_t>(st.slot);
    put_key(w, st.key);
    w.put_bool(st.to_disk);
  }
  w.put<uint64_t>(m.disk_removes.size());
  for (const KvBlockKey& k : m.disk_removes) put_key(w, k);
  w.put<uint64_t>(m.recvs.size());
  for (const KvRemoteRecv& v : m.recvs) {
    w.put<RequestId>(v.request_id);
    w.put_string(v.host);
    w.put<int32_t>(v.port);
    w.put<int32_t>(v.tp_size);
    w.put<uint64_t>(v.transfer_id);
    for (uint8_t b : v.prompt_hash) w.put<uint8_t>(b);
    w.put<int64_t>(v.num_tokens);
    w.put<int64_t>(v.first_block);
    w.put_vector(v.blocks);
  }
  w.put<uint64_t>(m.sends.size());
  for (const KvRemoteSend& v : m.sends) {
    w.put<uint64_t>(v.transfer_id);
    for (uint8_t b : v.prompt_hash) w.put<uint8_t>(b);
    w.put<int64_t>(v.num_tokens);
    w.put_vector(v.blocks);
  }
}

constexpr uint64_t kKeyBytes = sizeof(KvBlockKey::bytes);

KvConnectorMetadata get_connector(ByteReader& r) {
  KvConnectorMetadata m;
  const uint64_t num_loads = r.get_count(sizeof(RequestId) + 8);
  for (uint64_t i = 0; i < num_loads && r.ok(); ++i) {
    KvTierLoad l;
    l.request_id = r.get<RequestId>();
    const uint64_t n = r.get_count(sizeof(BlockId) + 8 + kKeyBytes);
    for (uint64_t j = 0; j < n && r.ok(); ++j) {
      KvTierLoadBlock b;
      b.block = r.get<BlockId>();
      b.slot = r.get<int64_t>();
      b.key = get_key(r);
      l.blocks.push_back(b);
    }
    m.loads.push_back(std::move(l));
  }
  m.awaiting = r.get_vector<RequestId>();
  const uint64_t num_stores = r.get_count(sizeof(BlockId) + 8 + kKeyBytes + 1);
  for (uint64_t i = 0; i < num_stores && r.ok(); ++i) {
    KvTierStore st;
    st.block = r.get<BlockId>();
    st.slot = r.get<int64_t>();
    st.key = get_key(r);
    st.to_disk = r.get_bool();
    m.stores.push_back(st);
  }
  const uint64_t num_removes = r.get_count(kKeyBytes);
  for (uint64_t i = 0; i < num_removes && r.ok(); ++i) m.disk_removes.push_back(get_key(r));
  const uint64_t num_recvs = r.get_count(sizeof(RequestId) + 8 + 4 + 4 + 8 + 32 + 8 + 8 + 8);
  for (uint64_t i = 0; i < num_recvs && r.ok(); ++i) {
    KvRemoteRecv v;
    v.request_id = r.get<RequestId>();
    v.host = r.get_string();
    v.port = r.get<int32_t>();
    v.tp_size = r.get<int32_t>();
    v.transfer_id = r.get<uint64_t>();
    for (uint8_t& b : v.prompt_hash) b = r.get<uint8_t>();
    v.num_tokens = r.get<int64_t>();
    v.first_block = r.get<int64_t>();
    v.blocks = r.get_vector<BlockId>();
    m.recvs.push_back(std::move(v));
  }
  const uint64_t num_sends = r.get_count(8 + 32 + 8 + 8);
  for (uint64_t i = 0; i < num_sends && r.ok(); ++i) {
    KvRemoteSend v;
    v.transfer_id = r.get<uint64_t>();
    for (uint8_t& b : v.prompt_hash) b = r.get<uint8_t>();
    v.num_tokens = r.get<int64_t>();
    v.blocks = r.get_vector<BlockId>();
    m.sends.push_back(std::move(v));
  }
  return m;
}

void put_connector_output(ByteWriter& w, const KvConnectorOutput& o) {
  w.put<uint64_t>(o.load_states.size());
  for (KvLoadState s : o.load_states) w.put<uint8_t>(static_cast<uint8_t>(s));
  const KvTransferCounters& c = o.counters;
  for (int64_t v : {c.loaded_blocks, c.loaded_bytes, c.disk_loaded_blocks, c.disk_loaded_bytes, c.stored_blocks,
                    c.stored_bytes, c.disk_stored_blocks, c.disk_stored_bytes, c.failed_blocks, c.staged_blocks,
                    c.staged_bytes, c.sent_blocks,
                    c.sent_bytes, c.received_blocks, c.received_bytes, c.failed_transfers}) {
    w.put<int64_t>(v);
  }
  w.put<double>(c.load_seconds);
  w.put<double>(c.store_seconds);
  w.put<double>(c.transfer_seconds);
  w.put<uint64_t>(o.disk_dropped.size());
  for (const KvBlockKey& k : o.disk_dropped) put_key(w, k);
}

KvConnectorOutput get_connector_output(ByteReader& r) {
  KvConnectorOutput o;
  const uint64_t n = r.get_count(1);
  for (uint64_t i = 0; i < n && r.ok(); ++i) {
    const uint8_t s = r.get<uint8_t>();
    if (s > static_cast<uint8_t>(KvLoadState::kFailed)) r.fail("an unknown KV load state " + std::to_string(s));
    o.load_states.push_back(static_cast<KvLoadState>(s));
  }
  KvTransferCounters& c = o.counters;
  for (int64_t* v : {&c.loaded_blocks, &c.loaded_bytes, &c.disk_loaded_blocks, &c.disk_loaded_bytes,
                     &c.stored_blocks, &c.stored_bytes, &c.disk_stored_blocks, &c.disk_stored_bytes,
                     &c.failed_blocks, &c.staged_blocks, &c.staged_bytes, &c.sent_blocks, &c.sent_bytes, &c.received_blocks, &c.received_bytes,
                     &c.failed_transfers}) {
    *v = r.get<int64_t>();
  }
  c.load_seconds = r.get<double>();
  c.store_seconds = r.get<double>();
  c.transfer_seconds = r.get<double>();
  const uint64_t num_dropped = r.get_count(kKeyBytes);
  for (uint64_t i = 0; i < num_dropped && r.ok(); ++i) o.disk_dropped.push_back(get_key(r));
  return o;
}

// The smallest encodings of the repeated items, which bound a count against the bytes left.
constexpr uint64_t kMinSampledBytes = sizeof(RequestId) + sizeof(TokenId) + sizeof(float) + sizeof(uint64_t);
constexpr uint64_t kMinScheduledBytes = sizeof(RequestId) + 8 + 1 + 8 + 8 + 8 + 8 + 1 + 8;
constexpr uint64_t kMinNewRequestBytes = sizeof(RequestId) + 8 + 8 + 8 + 8;

}  // namespace

std::vector<uint8_t> serialize_step(const StepMessage& m) {
  ByteWriter w;
  w.put<uint32_t>(kStepMagic);
  w.put<uint64_t>(m.step);
  w.put<uint64_t>(m.new_requests.size());
  for (const NewRequestData& n : m.new_requests) {
    w.put<RequestId>(n.request_id);
    w.put_vector(n.prompt_tokens);
    put_params(w, n.params);
    w.put<uint64_t>(n.seed);
    w.put_vector(n.min_tokens_suppressed);
    w.put_string(n.cache_salt);
    w.put<int64_t>(n.skip_draws);
  }
  w.put<uint64_t>(m.scheduled.size());
  for (const ScheduledRequestData& s : m.scheduled) {
    w.put<RequestId>(s.request_id);
    w.put_vector(s.new_output_tokens);
    w.put_bool(s.reset_blocks);
    w.put_vector(s.new_block_ids);
    w.put<int64_t>(s.num_computed_tokens);
    w.put<int64_t>(s.num_scheduled_tokens);
    w.put_vector(s.draft_tokens);
    w.put_bool(s.sample);
    w.put_vector(s.allowed_tokens);
  }
  w.put_vector(m.preempted);
  w.put_vector(m.finished);
  put_connector(w, m.kv_connector);
  return w.take();
}

Result<StepMessage> deserialize_step(std::span<const uint8_t> bytes) {
  ByteReader r(bytes);
  StepMessage m;
  if (r.get<uint32_t>() != kStepMagic) r.fail("not a step message (wrong magic)");
  m.step = r.get<uint64_t>();
  const uint64_t num_new = r.get_count(kMinNewRequestBytes);
  for (uint64_t i = 0; i < num_new && r.ok(); ++i) {
    NewRequestData n;
    n.request_id = r.get<RequestId>();
    n.prompt_tokens = r.get_vector<TokenId>();
    n.params = get_params(r);
    n.seed = r.get<uint64_t>();
    n.min_tokens_suppressed = r.get_vector<TokenId>();
    n.cache_salt = r.get_string();
    n.skip_draws = r.get<int64_t>();
    m.new_requests.push_back(std::move(n));
  }
  const uint64_t num_scheduled = r.get_count(kMinScheduledBytes);
  for (uint64_t i = 0; i < num_scheduled && r.ok(); ++i) {
    ScheduledRequestData s;
    s.request_id = r.get<RequestId>();
    s.new_output_tokens = r.get_vector<TokenId>();
    s.reset_blocks = r.get_bool();
    s.new_block_ids = r.get_vector<BlockId>();
    s.num_computed_tokens = r.get<int64_t>();
    s.num_scheduled_tokens = r.get<int64_t>();
    s.draft_tokens = r.get_vector<TokenId>();
    s.sample = r.get_bool();
    s.allowed_tokens = r.get_vector<uint64_t>();
    m.scheduled.push_back(std::move(s));
  }
  m.preempted = r.get_vector<RequestId>();
  m.finished = r.get_vector<RequestId>();
  m.kv_connector = get_connector(r);
  PAGODA_RETURN_IF_ERROR(r.finish("step message"));
  return m;
}

std::vector<uint8_t> serialize_output(const ModelRunnerOutput& o) {
  ByteWriter w;
  w.put<uint32_t>(kOutputMagic);
  w.put<uint64_t>(o.sampled.size());
  for (const SampledOutput& s : o.sampled) put_sampled(w, s);
  w.put<uint64_t>(o.spec.size());
  for (const SpecDecodeCounts& c : o.spec) {
    w.put<RequestId>(c.request_id);
    w.put<int64_t>(c.num_draft_tokens);
    w.put<int64_t>(c.num_accepted);
  }
  w.put<uint64_t>(o.prompt_logprobs.size());
  for (const PromptLogprobsOutput& p : o.prompt_logprobs) {
    w.put<RequestId>(p.request_id);
    w.put<int64_t>(p.first_index);
    w.put<uint64_t>(p.entries.size());
    for (const SampledOutput& s : p.entries) put_sampled(w, s);
  }
  w.put<uint64_t>(o.drafts.size());
  for (const DraftTokens& d : o.drafts) {
    w.put<RequestId>(d.request_id);
    w.put_vector(d.tokens);
  }
  put_connector_output(w, o.kv_connector);
  return w.take();
}

Result<ModelRunnerOutput> deserialize_output(std::span<const uint8_t> bytes) {
  ByteReader r(bytes);
  ModelRunnerOutput o;
  if (r.get<uint32_t>() != kOutputMagic) r.fail("not a step output (wrong magic)");
  const uint64_t num_sampled = r.get_count(kMinSampledBytes);
  for (uint64_t i = 0; i < num_sampled && r.ok(); ++i) o.sampled.push_back(get_sampled(r));
  const uint64_t num_spec = r.get_count(sizeof(RequestId) + 16);
  for (uint64_t i = 0; i < num_spec && r.ok(); ++i) {
    SpecDecodeCounts c;
    c.request_id = r.get<RequestId>();
    c.num_draft_tokens = r.get<int64_t>();
    c.num_accepted = r.get<int64_t>();
    o.spec.push_back(c);
  }
  const uint64_t num_prompt = r.get_count(sizeof(RequestId) + 16);
  for (uint64_t i = 0; i < num_prompt && r.ok(); ++i) {
    PromptLogprobsOutput p;
    p.request_id = r.get<RequestId>();
    p.first_index = r.get<int64_t>();
    const uint64_t n = r.get_count(kMinSampledBytes);
    for (uint64_t j = 0; j < n && r.ok(); ++j) p.entries.push_back(get_sampled(r));
    o.prompt_logprobs.push_back(std::move(p));
  }
  const uint64_t num_drafts = r.get_count(sizeof(RequestId) + 8);
  for (uint64_t i = 0; i < num_drafts && r.ok(); ++i) {
    DraftTokens d;
    d.request_id = r.get<RequestId>();
    d.tokens = r.get_vector<TokenId>();
    o.drafts.push_back(std::move(d));
  }
  o.kv_connector = get_connector_output(r);
  PAGODA_RETURN_IF_ERROR(r.finish("step output"));
  return o;
}

std::vector<uint8_t> serialize_init(const WorkerInit& init) {
  ByteWriter w;
  w.put<uint32_t>(kInitMagic);
  w.put<int64_t>(init.num_blocks);
  w.put<int64_t>(init.block_size);
  w.put<uint8_t>(static_cast<uint8_t>(init.kv_cache_dtype));
  const SpeculativeConfig& s = init.speculative;
  w.put_string(s.method);
  w.put<int64_t>(s.num_speculative_tokens);
  w.put<int64_t>(s.prompt_lookup_min);
  w.put<int64_t>(s.prompt_lookup_max);
  w.put<int64_t>(s.disable_by_batch_size);
  w.put_string(s.model);
  w.put_string(s.quantization);
  w.put<int64_t>(init.max_model_len);
  w.put<int64_t>(init.max_num_batched_tokens);
  w.put_bool(init.enable_prefix_caching);
  const KvConnectorWorkerConfig& kc = init.kv_connector;
  w.put_string(kc.connector);
  w.put<int64_t>(kc.num_host_slots);
  w.put_string(kc.disk_path);
  for (uint8_t b : kc.fingerprint) w.put<uint8_t>(b);
  w.put_string(kc.remote_connector);
  w.put_string(kc.kv_role);
  w.put<int32_t>(kc.tp_size);
  w.put_string(kc.engine_id);
  w.put_string(kc.kv_ip);
  w.put<int32_t>(kc.kv_port);
  w.put<int64_t>(kc.kv_buffer_size);
  for (uint8_t b : kc.transfer_fingerprint) w.put<uint8_t>(b);
  w.put_string(kc.transfer_description);
  return w.take();
}

Result<WorkerInit> deserialize_init(std::span<const uint8_t> bytes) {
  ByteReader r(bytes);
  WorkerInit init;
  if (r.get<uint32_t>() != kInitMagic) r.fail("not a worker's start (wrong magic)");
  init.num_blocks = r.get<int64_t>();
  init.block_size = r.get<int64_t>();
  const uint8_t dtype = r.get<uint8_t>();
  if (dtype > static_cast<uint8_t>(KvCacheDtype::kInt8)) r.fail("an unknown KV cache dtype");
  init.kv_cache_dtype = static_cast<KvCacheDtype>(dtype);
  SpeculativeConfig& s = init.speculative;
  s.method = r.get_string();
  s.num_speculative_tokens = r.get<int64_t>();
  s.prompt_lookup_min = r.get<int64_t>();
  s.prompt_lookup_max = r.get<int64_t>();
  s.disable_by_batch_size = r.get<int64_t>();
  s.model = r.get_string();
  s.quantization = r.get_string();
  init.max_model_len = r.get<int64_t>();
  init.max_num_batched_tokens = r.get<int64_t>();
  init.enable_prefix_caching = r.get_bool();
  KvConnectorWorkerConfig& kc = init.kv_connector;
  kc.connector = r.get_string();
  kc.num_host_slots = r.get<int64_t>();
  kc.disk_path = r.get_string();
  for (uint8_t& b : kc.fingerprint) b = r.get<uint8_t>();
  kc.remote_connector = r.get_string();
  kc.kv_role = r.get_string();
  kc.tp_size = r.get<int32_t>();
  kc.engine_id = r.get_string();
  kc.kv_ip = r.get_string();
  kc.kv_port = r.get<int32_t>();
  kc.kv_buffer_size = r.get<int64_t>();
  for (uint8_t& b : kc.transfer_fingerprint) b = r.get<uint8_t>();
  kc.transfer_description = r.get_string();
  PAGODA_RETURN_IF_ERROR(r.finish("worker start"));
  if (init.num_blocks < 1 || init.block_size < 1 || init.max_model_len < 1) {
    return data_loss("worker start: a KV cache of " + std::to_string(init.num_blocks) + " blocks of " +
                     std::to_string(init.block_size) + " tokens for contexts of " + std::to_string(init.max_model_len));
  }
  return init;
}

void StepEncoder::add_request(NewRequestData request) {
  const RequestId id = request.request_id;
  PAGODA_CHECK(!requests_.count(id));
  requests_.emplace(id, Known{std::move(request)});
}

void StepEncoder::remove_request(RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  const bool sent = !it->second.unsent;
  requests_.erase(it);
  if (sent) finished_.push_back(id);
}

void StepEncoder::preempt(std::span<const RequestId> ids) {
  for (RequestId id : ids) {
    auto it = requests_.find(id);
    if (it == requests_.end() || it->second.unsent) continue;  // the workers never saw it: nothing to undo
    it->second.blocks_valid = false;
    it->second.num_blocks = 0;
    preempted_.push_back(id);
  }
}

StepMessage StepEncoder::encode(const SchedulerOutput& scheduled) {
  StepMessage m;
  m.step = ++step_;
  m.finished = std::move(finished_);
  finished_.clear();
  preempt(scheduled.preempted);
  m.preempted = std::move(preempted_);
  preempted_.clear();
  for (const ScheduledSeq& seq : scheduled.seqs) {
    auto it = requests_.find(seq.request_id);
    PAGODA_CHECK(it != requests_.end());
    Known& sent = it->second;
    if (sent.unsent) {
      sent.unsent->prompt_tokens.assign(seq.prompt_tokens.begin(), seq.prompt_tokens.end());
      m.new_requests.push_back(std::move(*sent.unsent));
      sent.unsent.reset();
    }
    ScheduledRequestData d;
    d.request_id = seq.request_id;
    PAGODA_CHECK(seq.output_tokens.size() >= sent.num_output_tokens);
    d.new_output_tokens.assign(seq.output_tokens.begin() + static_cast<ptrdiff_t>(sent.num_output_tokens),
                               seq.output_tokens.end());
    sent.num_output_tokens = seq.output_tokens.size();
    // Block tables only grow between preemptions (kv/kv_cache_manager.h).
    d.reset_blocks = !sent.blocks_valid;
    PAGODA_CHECK(seq.block_table.size() >= sent.num_blocks);
    d.new_block_ids.assign(seq.block_table.begin() + static_cast<ptrdiff_t>(sent.num_blocks), seq.block_table.end());
    sent.num_blocks = seq.block_table.size();
    sent.blocks_valid = true;
    d.num_computed_tokens = seq.num_computed_tokens;
    d.num_scheduled_tokens = static_cast<int64_t>(seq.tokens.size());
    d.draft_tokens.assign(seq.draft_tokens.begin(), seq.draft_tokens.end());
    d.sample = seq.sample;
    d.allowed_tokens.assign(seq.allowed_tokens.begin(), seq.allowed_tokens.end());
    m.scheduled.push_back(std::move(d));
  }
  m.kv_connector = scheduled.kv_connector;
  return m;
}

}  // namespace pagoda
