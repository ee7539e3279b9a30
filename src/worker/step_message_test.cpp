// Step messages: the byte encoding round-trips every field, refuses every short, long or
// corrupted message without reading out of bounds, and StepEncoder's deltas rebuild exactly what
// the scheduler scheduled, step by step, through chunked prefill, prefix-cache hits, preemption
// and finished requests.
#include "worker/step_message.h"

#include <gtest/gtest.h>

#include <limits>
#include <map>
#include <memory>
#include <random>
#include <set>

#include "scheduler/scheduler.h"

namespace pagoda {
namespace {

template <class T>
std::vector<T> random_ints(std::mt19937_64& rng, size_t max_len, int64_t lo, int64_t hi) {
  std::vector<T> v(rng() % (max_len + 1));
  for (T& x : v) x = static_cast<T>(lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1)));
  return v;
}

SamplingParams random_params(std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(0, 1);
  SamplingParams p;
  p.temperature = u(rng) * 2;
  p.top_p = u(rng);
  p.top_k = static_cast<int64_t>(rng() % 50) - 1;
  p.min_p = u(rng);
  p.n = 1 + static_cast<int64_t>(rng() % 4);
  p.presence_penalty = u(rng) - 0.5;
  p.frequency_penalty = u(rng) - 0.25;
  p.repetition_penalty = 1 + u(rng);
  for (size_t i = rng() % 4; i > 0; --i) p.logit_bias.emplace_back(static_cast<TokenId>(rng() % 1000), static_cast<float>(u(rng) * 10 - 5));
  if (rng() % 2) p.seed = rng();
  p.max_tokens = 1 + static_cast<int64_t>(rng() % 100);
  p.min_tokens = static_cast<int64_t>(rng() % 3);
  for (size_t i = rng() % 3; i > 0; --i) p.stop.push_back(std::string(1 + rng() % 5, static_cast<char>('a' + rng() % 26)));
  p.stop_token_ids = random_ints<TokenId>(rng, 3, 0, 999);
  p.ignore_eos = rng() % 2;
  p.include_stop_str_in_output = rng() % 2;
  if (rng() % 2) p.logprobs = static_cast<int64_t>(rng() % 6);
  if (rng() % 2) p.prompt_logprobs = static_cast<int64_t>(rng() % 6);
  p.skip_special_tokens = rng() % 2;
  return p;
}

StepMessage random_step(std::mt19937_64& rng) {
  StepMessage m;
  m.step = rng();
  for (size_t i = rng() % 4; i > 0; --i) {
    NewRequestData n;
    n.request_id = rng();
    n.prompt_tokens = random_ints<TokenId>(rng, 40, 0, 31999);
    n.params = random_params(rng);
    n.seed = rng();
    n.min_tokens_suppressed = random_ints<TokenId>(rng, 3, 0, 31999);
    m.new_requests.push_back(std::move(n));
  }
  for (size_t i = rng() % 6; i > 0; --i) {
    ScheduledRequestData s;
    s.request_id = rng();
    s.new_output_tokens = random_ints<TokenId>(rng, 3, 0, 31999);
    s.reset_blocks = rng() % 2;
    s.new_block_ids = random_ints<BlockId>(rng, 5, 0, 4095);
    s.num_computed_tokens = static_cast<int64_t>(rng() % 5000);
    s.num_scheduled_tokens = static_cast<int64_t>(rng() % 512);
    s.draft_tokens = random_ints<TokenId>(rng, 4, 0, 31999);
    s.sample = rng() % 2;
    s.allowed_tokens = random_ints<uint64_t>(rng, 6, 0, std::numeric_limits<int64_t>::max() - 1);
    m.scheduled.push_back(std::move(s));
  }
  m.preempted = random_ints<RequestId>(rng, 3, 0, 1 << 20);
  m.finished = random_ints<RequestId>(rng, 3, 0, 1 << 20);
  auto key = [&] {
    KvBlockKey k;
    for (uint8_t& b : k.bytes) b = static_cast<uint8_t>(rng());
    return k;
  };
  KvConnectorMetadata& kc = m.kv_connector;
  for (size_t i = rng() % 3; i > 0; --i) {
    KvTierLoad load{rng(), {}};
    for (size_t j = rng() % 4; j > 0; --j) {
      load.blocks.push_back({static_cast<BlockId>(rng() % 1000), static_cast<int64_t>(rng() % 50) - 1, key()});
    }
    kc.loads.push_back(std::move(load));
  }
  kc.awaiting = random_ints<RequestId>(rng, 3, 0, 1 << 20);
  for (size_t i = rng() % 3; i > 0; --i) {
    kc.stores.push_back({static_cast<BlockId>(rng() % 1000), static_cast<int64_t>(rng() % 50), key(), rng() % 2 == 0});
  }
  for (size_t i = rng() % 3; i > 0; --i) kc.disk_removes.push_back(key());
  return m;
}

SampledOutput random_sampled(std::mt19937_64& rng) {
  SampledOutput s{rng(), static_cast<TokenId>(rng() % 32000), -static_cast<float>(rng() % 1000) / 100, {}};
  for (size_t i = rng() % 4; i > 0; --i) s.top_logprobs.push_back({static_cast<TokenId>(rng() % 32000), -1.5f});
  return s;
}

ModelRunnerOutput random_output(std::mt19937_64& rng) {
  ModelRunnerOutput o;
  for (size_t i = rng() % 8; i > 0; --i) o.sampled.push_back(random_sampled(rng));
  for (size_t i = rng() % 3; i > 0; --i) {
    o.spec.push_back({rng(), static_cast<int64_t>(rng() % 5), static_cast<int64_t>(rng() % 5)});
  }
  for (size_t i = rng() % 3; i > 0; --i) {
    PromptLogprobsOutput p{rng(), static_cast<int64_t>(rng() % 100), {}};
    for (size_t j = rng() % 4; j > 0; --j) p.entries.push_back(random_sampled(rng));
    o.prompt_logprobs.push_back(std::move(p));
  }
  for (size_t i = rng() % 4; i > 0; --i) o.kv_connector.load_states.push_back(static_cast<KvLoadState>(rng() % 3));
  KvTransferCounters& c = o.kv_connector.counters;
  c.loaded_blocks = static_cast<int64_t>(rng() % 100);
  c.disk_stored_bytes = static_cast<int64_t>(rng() % 100000);
  c.failed_blocks = static_cast<int64_t>(rng() % 3);
  c.load_seconds = static_cast<double>(rng() % 1000) / 7;
  return o;
}

TEST(StepMessage, EveryFieldRoundTrips) {
  std::mt19937_64 rng(1);
  for (int i = 0; i < 500; ++i) {
    const StepMessage m = random_step(rng);
    auto back = deserialize_step(serialize_step(m));
    ASSERT_TRUE(back.ok()) << back.status().message();
    ASSERT_EQ(*back, m) << "message " << i;
    const ModelRunnerOutput o = random_output(rng);
    auto out = deserialize_output(serialize_output(o));
    ASSERT_TRUE(out.ok()) << out.status().message();
    ASSERT_EQ(*out, o) << "output " << i;
  }
}

TEST(StepMessage, ShortLongAndWrongMessagesAreRefused) {
  std::mt19937_64 rng(2);
  StepMessage m = random_step(rng);
  while (m.new_requests.empty() || m.scheduled.empty()) m = random_step(rng);
  const std::vector<uint8_t> bytes = serialize_step(m);
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto r = deserialize_step(std::span<const uint8_t>(bytes.data(), n));
    ASSERT_FALSE(r.ok()) << "a message cut to " << n << " of " << bytes.size() << " bytes was accepted";
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  }
  std::vector<uint8_t> longer = bytes;
  longer.push_back(0);
  auto r = deserialize_step(longer);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("left over"), std::string::npos) << r.status().message();
  // A step message is not an output, nor the other way round.
  EXPECT_FALSE(deserialize_output(bytes).ok());
  EXPECT_FALSE(deserialize_step(serialize_output(random_output(rng))).ok());
}

// Every byte set to each of a few values: decoding either fails or yields some message, never
// reads out of bounds or allocates what the message cannot hold (ASan checks both).
TEST(StepMessage, CorruptedBytesNeverReadOutOfBounds) {
  std::mt19937_64 rng(3);
  StepMessage m = random_step(rng);
  while (m.new_requests.empty() || m.scheduled.empty()) m = random_step(rng);
  const std::vector<uint8_t> bytes = serialize_step(m);
  int refused = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (uint8_t v : {uint8_t{0}, uint8_t{2}, uint8_t{0x7f}, uint8_t{0xff}}) {
      std::vector<uint8_t> bad = bytes;
      if (bad[i] == v) continue;
      bad[i] = v;
      refused += deserialize_step(bad).ok() ? 0 : 1;
    }
  }
  EXPECT_GT(refused, 0);
  const std::vector<uint8_t> out = serialize_output(random_output(rng));
  for (size_t i = 0; i < out.size(); ++i) {
    std::vector<uint8_t> bad = out;
    bad[i] ^= 0xff;
    (void)deserialize_output(bad);
  }
}

// What a worker holds of one request, rebuilt from the messages alone.
struct Mirror {
  std::vector<TokenId> prompt, output;
  std::vector<BlockId> blocks;
};

// Applies a message as a worker does; fails the test where a delta does not fit.
void apply(const StepMessage& m, std::map<RequestId, Mirror>& mirror) {
  for (RequestId id : m.finished) ASSERT_EQ(mirror.erase(id), 1u) << "finished " << id;
  for (RequestId id : m.preempted) {
    ASSERT_TRUE(mirror.count(id));
    mirror[id].blocks.clear();
  }
  for (const NewRequestData& n : m.new_requests) {
    ASSERT_FALSE(mirror.count(n.request_id));
    mirror[n.request_id].prompt = n.prompt_tokens;
  }
  for (const ScheduledRequestData& d : m.scheduled) {
    ASSERT_TRUE(mirror.count(d.request_id));
    Mirror& r = mirror[d.request_id];
    r.output.insert(r.output.end(), d.new_output_tokens.begin(), d.new_output_tokens.end());
    if (d.reset_blocks) r.blocks.clear();
    r.blocks.insert(r.blocks.end(), d.new_block_ids.begin(), d.new_block_ids.end());
  }
}

std::unique_ptr<Request> request(RequestId id, int64_t prompt_len, int64_t max_tokens, int shared_prefix) {
  auto r = std::make_unique<Request>();
  r->id = id;
  for (int64_t i = 0; i < prompt_len; ++i) {
    r->prompt_tokens.push_back(static_cast<TokenId>(i < shared_prefix ? i : id * 1000 + i));
  }
  r->max_tokens = max_tokens;
  r->arrival_seq = id;
  return r;
}

// A scheduler with a small cache (preemptions), a small token budget (chunked prefill) and
// prompts sharing a prefix (prefix-cache hits), run to the end with random sampled tokens: after
// every message, what the deltas rebuild equals the scheduler's views, and a request's prompt
// travels once.
TEST(StepEncoder, DeltasRebuildTheSchedulersViews) {
  SchedulerConfig c;
  c.max_num_batched_tokens = 24;
  c.max_model_len = 256;
  Scheduler s(c, KvCacheConfig{24, 4, true});
  StepEncoder encoder;
  std::mt19937_64 rng(4);
  for (RequestId id = 1; id <= 8; ++id) {
    ASSERT_TRUE(s.add_request(request(id, 10 + static_cast<int64_t>(id % 3) * 7, 12, 8)).ok());
    NewRequestData n;
    n.request_id = id;
    n.seed = id;
    encoder.add_request(n);
  }
  std::map<RequestId, Mirror> mirror;
  std::set<RequestId> prompts_sent;
  int64_t preemptions = 0, resets_after_preemption = 0, decode_steps = 0;
  std::set<RequestId> preempted_once;
  for (int step = 0; s.has_unfinished() && step < 500; ++step) {
    const SchedulerOutput out = s.schedule();
    const StepMessage m = encoder.encode(out);
    ASSERT_EQ(m.step, static_cast<uint64_t>(step + 1));
    const auto round = deserialize_step(serialize_step(m));
    ASSERT_TRUE(round.ok());
    ASSERT_NO_FATAL_FAILURE(apply(*round, mirror));
    preemptions += static_cast<int64_t>(m.preempted.size());
    for (RequestId id : m.preempted) preempted_once.insert(id);
    for (const NewRequestData& n : m.new_requests) EXPECT_TRUE(prompts_sent.insert(n.request_id).second);
    ASSERT_EQ(m.scheduled.size(), out.seqs.size());
    for (size_t i = 0; i < out.seqs.size(); ++i) {
      const ScheduledSeq& seq = out.seqs[i];
      const ScheduledRequestData& d = m.scheduled[i];
      const Mirror& r = mirror[seq.request_id];
      EXPECT_EQ(r.prompt, std::vector<TokenId>(seq.prompt_tokens.begin(), seq.prompt_tokens.end()));
      EXPECT_EQ(r.output, std::vector<TokenId>(seq.output_tokens.begin(), seq.output_tokens.end()));
      EXPECT_EQ(r.blocks, std::vector<BlockId>(seq.block_table.begin(), seq.block_table.end()));
      EXPECT_EQ(d.num_computed_tokens, seq.num_computed_tokens);
      EXPECT_EQ(d.num_scheduled_tokens, static_cast<int64_t>(seq.tokens.size()));
      EXPECT_EQ(d.sample, seq.sample);
      if (d.reset_blocks && preempted_once.count(d.request_id)) ++resets_after_preemption;
      if (!d.reset_blocks && seq.tokens.size() == 1) {  // a decode: one token, at most one block
        ++decode_steps;
        EXPECT_LE(d.new_output_tokens.size(), 1u);
        EXPECT_LE(d.new_block_ids.size(), 1u);
      }
    }
    ModelRunnerOutput produced;
    for (const ScheduledSeq& seq : out.seqs) {
      if (seq.sample) produced.sampled.push_back({seq.request_id, static_cast<TokenId>(100 + rng() % 50), 0, {}});
    }
    for (const RequestUpdate& u : s.update_from_output(out, produced)) {
      // The engine's output processor stops a request at max_tokens; here the test does.
      const Request* r = s.find(u.request_id);
      if (r != nullptr && r->num_output_tokens() >= r->max_tokens) {
        s.finish_request(u.request_id);
        encoder.remove_request(u.request_id);
      }
    }
  }
  EXPECT_FALSE(s.has_unfinished());
  EXPECT_GT(preemptions, 0) << "the cache was meant to be too small for all eight";
  EXPECT_GT(resets_after_preemption, 0);
  EXPECT_GT(decode_steps, 20);
  EXPECT_EQ(s.stats().prefix_cache.hits > 0, true);
  EXPECT_EQ(encoder.num_requests(), 0u);
  // The last finished requests go out with the next message.
  const StepMessage last = encoder.encode(SchedulerOutput{});
  ASSERT_NO_FATAL_FAILURE(apply(last, mirror));
  EXPECT_TRUE(mirror.empty());
}

TEST(StepMessage, WorkerInitRoundTripsWithItsConnector) {
  WorkerInit init;
  init.num_blocks = 77;
  init.block_size = 32;
  init.kv_cache_dtype = KvCacheDtype::kInt8;
  init.max_model_len = 4096;
  init.kv_connector.connector = "OffloadingConnector";
  init.kv_connector.num_host_slots = 1234;
  init.kv_connector.disk_path = "/var/cache/pagoda";
  init.kv_connector.fingerprint[5] = 9;
  auto back = deserialize_init(serialize_init(init));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(*back, init);
  std::vector<uint8_t> bytes = serialize_init(init);
  bytes.pop_back();
  EXPECT_FALSE(deserialize_init(bytes).ok());
}

}  // namespace
}  // namespace pagoda
