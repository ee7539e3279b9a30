// Scheduler unit tests with a fake runner: token budget, chunking, admission-order scheduling of
// running requests, preemption choice, admission rules, rejection and abort.
#include "scheduler/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <utility>
#include <vector>

namespace pagoda {
namespace {

std::unique_ptr<Request> make_request(RequestId id, int64_t prompt_len, int64_t max_tokens, int64_t priority = 0) {
  auto r = std::make_unique<Request>();
  r->id = id;
  r->prompt_tokens.resize(static_cast<size_t>(prompt_len));
  std::iota(r->prompt_tokens.begin(), r->prompt_tokens.end(), static_cast<TokenId>(id * 1000));
  r->max_tokens = max_tokens;
  r->arrival_seq = id;
  r->priority = priority;
  return r;
}

// Samples token 7 for every sequence that asks.
ModelRunnerOutput fake_run(const SchedulerOutput& out) {
  ModelRunnerOutput r;
  for (const auto& s : out.seqs) {
    if (s.sample) r.sampled.push_back({s.request_id, 7, 0, {}});
  }
  return r;
}

// A step's output applied, then what the engine's output processor does with it here: each request
// that reached max_tokens is finished.
std::vector<RequestUpdate> update(Scheduler& s, const SchedulerOutput& out, const ModelRunnerOutput& produced) {
  std::vector<RequestUpdate> updates = s.update_from_output(out, produced);
  for (const RequestUpdate& u : updates) {
    const Request* r = s.find(u.request_id);
    if (r != nullptr && r->num_output_tokens() >= r->max_tokens) s.finish_request(u.request_id);
  }
  return updates;
}

int64_t scheduled_for(const SchedulerOutput& out, RequestId id) {
  for (const auto& s : out.seqs) {
    if (s.request_id == id) return static_cast<int64_t>(s.tokens.size());
  }
  return 0;
}

// The batch as (request id, tokens scheduled) in batch order.
using Batch = std::vector<std::pair<RequestId, int64_t>>;
Batch batch_of(const SchedulerOutput& out) {
  Batch b;
  for (const auto& s : out.seqs) b.emplace_back(s.request_id, static_cast<int64_t>(s.tokens.size()));
  return b;
}

// Running requests are scheduled in the order they were admitted, each taking its tokens out of
// the step's budget before the next one, then waiting requests: there is no decode-first rule. A
// decode admitted before a long prompt goes first; a long prompt admitted before a decode, or
// before another prompt, gets its chunk first.
TEST(Scheduler, LongPromptIsChunkedAndRunningRequestsGoInAdmissionOrder) {
  {  // A decode admitted first: its token, then the long prompt's chunks out of what is left.
    SchedulerConfig c;
    c.max_num_batched_tokens = 32;
    Scheduler s(c, {64, 16, true});
    ASSERT_TRUE(s.add_request(make_request(1, 10, 5)).ok());
    auto o1 = s.schedule();
    EXPECT_EQ(batch_of(o1), (Batch{{1, 10}}));
    update(s, o1, fake_run(o1));
    ASSERT_TRUE(s.add_request(make_request(2, 100, 5)).ok());
    for (int64_t want : {31, 31, 31, 7}) {
      auto o = s.schedule();
      ASSERT_EQ(batch_of(o), (Batch{{1, 1}, {2, want}}));
      EXPECT_EQ(o.seqs[1].sample, want == 7);  // the prompt's last chunk samples
      update(s, o, fake_run(o));
    }
    EXPECT_EQ(s.find(1), nullptr);  // its 5 tokens are out
  }
  {  // A long prompt admitted first (chunks of at most 20): its chunk, then the newer decode.
    SchedulerConfig c;
    c.max_num_batched_tokens = 32;
    c.long_prefill_token_threshold = 20;
    Scheduler s(c, {64, 16, true});
    ASSERT_TRUE(s.add_request(make_request(1, 100, 5)).ok());
    ASSERT_TRUE(s.add_request(make_request(2, 10, 5)).ok());
    auto o = s.schedule();
    EXPECT_EQ(batch_of(o), (Batch{{1, 20}, {2, 10}}));
    update(s, o, fake_run(o));
    for (int step = 2; step <= 5; ++step) {
      o = s.schedule();
      EXPECT_EQ(batch_of(o), (Batch{{1, 20}, {2, 1}})) << "step " << step;
      update(s, o, fake_run(o));
    }
  }
  {  // Where the budget binds, the older prompt's chunk comes out of it first: with 21 tokens a
     // step, the newer prompt gets the 1 left over until the older one's prefill is done.
    SchedulerConfig c;
    c.max_num_batched_tokens = 21;
    c.long_prefill_token_threshold = 20;
    Scheduler s(c, {64, 16, true});
    ASSERT_TRUE(s.add_request(make_request(1, 100, 5)).ok());
    ASSERT_TRUE(s.add_request(make_request(2, 10, 5)).ok());
    for (int step = 1; step <= 5; ++step) {
      auto o = s.schedule();
      EXPECT_EQ(batch_of(o), (Batch{{1, 20}, {2, 1}})) << "step " << step;
      update(s, o, fake_run(o));
    }
    auto o = s.schedule();
    EXPECT_EQ(batch_of(o), (Batch{{1, 1}, {2, 5}}));  // 1 decodes; 2's last 5 prompt tokens
  }
}

TEST(Scheduler, PreemptsMostRecentAndNeverToAdmit) {
  SchedulerConfig c;
  c.max_num_batched_tokens = 1000;
  Scheduler s(c, {6, 4, false});  // 24 token slots for three requests of up to 16 tokens
  for (RequestId id : {1, 2, 3}) {
    ASSERT_TRUE(s.add_request(make_request(id, 6, 10)).ok());
  }
  auto o = s.schedule();
  EXPECT_EQ(o.seqs.size(), 3u);  // 2 blocks each
  update(s, o, fake_run(o));
  int64_t steps_with_preemption = 0;
  while (s.has_unfinished()) {
    o = s.schedule();
    for (RequestId victim : o.preempted) EXPECT_NE(victim, 1u) << "the oldest request is preempted last";
    if (!o.preempted.empty()) {
      ++steps_with_preemption;
      // A step that preempted admits nobody: everything scheduled was already running.
      for (const auto& seq : o.seqs) EXPECT_GT(seq.num_computed_tokens, 0);
    }
    update(s, o, fake_run(o));
    ASSERT_TRUE(s.kv().pool().check_invariants().ok());
  }
  EXPECT_GT(steps_with_preemption, 0);
  EXPECT_EQ(s.stats().num_preemptions, steps_with_preemption);
  EXPECT_EQ(s.kv().num_free_blocks(), 6);
}

// Pipeline parallelism keeps several steps in flight: a request in one of them is never the
// victim (its blocks are still being written, its token is still to come), even where the
// policy would pick it; the request that needs the blocks gives way instead.
TEST(Scheduler, NeverPreemptsARequestWhoseStepIsInFlight) {
  SchedulerConfig c;
  c.policy = SchedulingPolicy::kPriority;
  Scheduler s(c, {2, 4, false});  // two blocks of 4 tokens
  ASSERT_TRUE(s.add_request(make_request(1, 4, 4, /*priority=*/0)).ok());
  auto step1 = s.schedule();
  EXPECT_EQ(batch_of(step1), (Batch{{1, 4}}));
  ASSERT_TRUE(s.add_request(make_request(2, 4, 4, /*priority=*/10)).ok());
  auto step2 = s.schedule();  // step 1 is in flight: request 1 waits for its token
  EXPECT_EQ(batch_of(step2), (Batch{{2, 4}}));
  update(s, step1, fake_run(step1));
  // Request 1 needs a second block; request 2, the policy's victim, is in flight.
  auto step3 = s.schedule();
  EXPECT_TRUE(step3.seqs.empty());
  EXPECT_EQ(step3.preempted, (std::vector<RequestId>{1}));
  update(s, step3, fake_run(step3));
  auto updates = update(s, step2, fake_run(step2));
  ASSERT_EQ(updates.size(), 1u);
  EXPECT_EQ(updates[0].request_id, 2u);  // its token arrived
  // Request 2 goes on in the block request 1 gave back.
  auto step4 = s.schedule();
  EXPECT_EQ(batch_of(step4), (Batch{{2, 1}}));
  EXPECT_TRUE(step4.preempted.empty());
  update(s, step4, fake_run(step4));
  ASSERT_TRUE(s.kv().pool().check_invariants().ok());
}

// A pipeline of two stages splits four requests over its two steps in flight: each step takes
// at most two sequences, in order, and a request whose token is pending waits for it.
TEST(Scheduler, CapsTheSequencesOfAStep) {
  SchedulerConfig c;
  Scheduler s(c, {64, 4, false});
  for (RequestId id : {1, 2, 3, 4}) ASSERT_TRUE(s.add_request(make_request(id, 4, 4)).ok());
  auto a = s.schedule(2);
  EXPECT_EQ(batch_of(a), (Batch{{1, 4}, {2, 4}}));
  auto b = s.schedule(2);
  EXPECT_EQ(batch_of(b), (Batch{{3, 4}, {4, 4}}));
  update(s, a, fake_run(a));
  auto a2 = s.schedule(2);
  EXPECT_EQ(batch_of(a2), (Batch{{1, 1}, {2, 1}}));
  EXPECT_EQ(batch_of(s.schedule(0)), Batch{});  // everything else is in flight
}

TEST(Scheduler, PriorityPolicyAdmitsLowerFirst) {
  SchedulerConfig c;
  c.policy = SchedulingPolicy::kPriority;
  c.max_num_seqs = 1;
  Scheduler s(c, {64, 16, true});
  ASSERT_TRUE(s.add_request(make_request(1, 4, 2, /*priority=*/5)).ok());
  ASSERT_TRUE(s.add_request(make_request(2, 4, 2, /*priority=*/-1)).ok());
  auto o = s.schedule();
  ASSERT_EQ(o.seqs.size(), 1u);
  EXPECT_EQ(o.seqs[0].request_id, 2u);
}

TEST(Scheduler, RejectsWhatCanNeverFit) {
  SchedulerConfig c;
  c.max_model_len = 100;
  Scheduler s(c, {4, 16, true});  // 64 token slots
  EXPECT_FALSE(s.add_request(make_request(1, 90, 20)).ok());  // beyond max_model_len
  EXPECT_FALSE(s.add_request(make_request(2, 60, 10)).ok());  // more blocks than the cache
  EXPECT_FALSE(s.add_request(make_request(3, 0, 10)).ok());   // empty prompt
  EXPECT_TRUE(s.add_request(make_request(4, 30, 10)).ok());
  EXPECT_EQ(s.num_unfinished(), 1);
}

TEST(Scheduler, AbortFreesBlocksWherever) {
  SchedulerConfig c;
  c.max_num_seqs = 1;
  Scheduler s(c, {64, 16, true});
  ASSERT_TRUE(s.add_request(make_request(1, 40, 10)).ok());
  ASSERT_TRUE(s.add_request(make_request(2, 40, 10)).ok());
  auto o = s.schedule();
  update(s, o, fake_run(o));
  EXPECT_LT(s.kv().num_free_blocks(), 64);
  EXPECT_TRUE(s.finish_request(2));  // waiting
  EXPECT_TRUE(s.finish_request(1));  // running
  EXPECT_FALSE(s.finish_request(1));
  EXPECT_FALSE(s.has_unfinished());
  EXPECT_EQ(s.kv().num_free_blocks(), 64);
}

// --no-enable-chunked-prefill: a prompt runs whole in one step or waits; with chunking on the
// same requests split at the budget.
TEST(Scheduler, WithoutChunkedPrefillAPromptIsNeverSplit) {
  for (const bool chunked : {true, false}) {
    SCOPED_TRACE(chunked ? "chunked" : "not chunked");
    SchedulerConfig c;
    c.max_num_batched_tokens = 64;
    c.max_model_len = 64;
    c.long_prefill_token_threshold = 16;  // ignored when chunking is off
    c.enable_chunked_prefill = chunked;
    Scheduler s(c, {64, 16, true});
    ASSERT_TRUE(s.add_request(make_request(1, 40, 4)).ok());
    ASSERT_TRUE(s.add_request(make_request(2, 40, 4)).ok());
    auto o1 = s.schedule();
    if (chunked) {
      EXPECT_EQ(scheduled_for(o1, 1), 16);  // the threshold caps each request's share
      EXPECT_EQ(scheduled_for(o1, 2), 16);
    } else {
      EXPECT_EQ(scheduled_for(o1, 1), 40);  // whole; the second does not fit in the 24 left
      EXPECT_EQ(scheduled_for(o1, 2), 0);
    }
    update(s, o1, fake_run(o1));
    auto o2 = s.schedule();
    if (!chunked) {
      EXPECT_EQ(scheduled_for(o2, 1), 1);   // decode
      EXPECT_EQ(scheduled_for(o2, 2), 40);  // now whole
    }
    int64_t steps = 0;
    for (auto o = o2; s.has_unfinished() && steps < 100; o = s.schedule(), ++steps) {
      for (const auto& seq : o.seqs) {
        // Without chunking every prefill starts at token 0 and covers the whole prompt.
        if (!chunked && seq.num_computed_tokens == 0) {
          EXPECT_EQ(seq.tokens.size(), 40u);
        }
      }
      update(s, o, fake_run(o));
    }
    EXPECT_FALSE(s.has_unfinished());
  }
}

}  // namespace
}  // namespace pagoda

namespace pagoda {
namespace {

// Speculative drafts: a decoding request takes its last token plus its drafts (as many as the
// budget leaves); rejected drafts' positions are given back; the emitted tokens are appended (the
// output processor decides where a request stops: output_processor_test.cpp).
TEST(Scheduler, DraftsAreScheduledVerifiedAndRolledBack) {
  SchedulerConfig c;
  c.max_num_batched_tokens = 4;
  Scheduler s(c, {64, 4, true});
  ASSERT_TRUE(s.add_request(make_request(1, 3, 10)).ok());
  s.set_draft_tokens(1, {50, 51});  // still waiting: dropped
  auto o = s.schedule();
  ASSERT_EQ(batch_of(o), (Batch{{1, 3}}));
  EXPECT_TRUE(o.seqs[0].draft_tokens.empty());
  s.update_from_output(o, fake_run(o));  // emits 7: 4 tokens, 3 computed

  s.set_draft_tokens(1, {60, 61, 62, 63, 64});
  o = s.schedule();
  ASSERT_EQ(batch_of(o), (Batch{{1, 1}}));
  // The budget of 4 leaves room for 3 of the 5 drafts.
  EXPECT_EQ(std::vector<TokenId>(o.seqs[0].draft_tokens.begin(), o.seqs[0].draft_tokens.end()),
            (std::vector<TokenId>{60, 61, 62}));
  EXPECT_EQ(o.num_scheduled_tokens, 4);
  EXPECT_TRUE(o.seqs[0].sample);
  EXPECT_EQ(s.kv().block_table(1).size(), 2u);  // 7 positions in blocks of 4
  ModelRunnerOutput r;
  r.sampled = {{1, 60, 0, {}}, {1, 61, 0, {}}, {1, 9, 0, {}}};  // two accepted, then a correction
  r.spec = {{1, 3, 2}};
  auto updates = s.update_from_output(o, r);
  ASSERT_EQ(updates.size(), 1u);
  EXPECT_EQ(updates[0].new_tokens, (std::vector<TokenId>{60, 61, 9}));
  const Request* req = s.find(1);
  ASSERT_NE(req, nullptr);
  EXPECT_EQ(req->num_tokens(), 7);
  EXPECT_EQ(req->num_computed_tokens, 6);  // 3 + 1 + 2 accepted: the correction has no KV yet
  EXPECT_TRUE(req->scheduled_spec_tokens.empty());

  // Next step: the correction alone (no drafts set).
  o = s.schedule();
  ASSERT_EQ(batch_of(o), (Batch{{1, 1}}));
  EXPECT_TRUE(o.seqs[0].draft_tokens.empty());
  s.update_from_output(o, fake_run(o));  // 5 output tokens
  s.set_draft_tokens(1, {70, 71, 72});
  o = s.schedule();
  r.sampled = {{1, 70, 0, {}}, {1, 71, 0, {}}, {1, 72, 0, {}}, {1, 73, 0, {}}};
  r.spec = {{1, 3, 3}};
  updates = s.update_from_output(o, r);
  ASSERT_EQ(updates.size(), 1u);
  EXPECT_EQ(updates[0].new_tokens.size(), 4u);
  // Then a run past max_tokens (10, 9 out): every token comes back; the request runs until the
  // output processor finishes it.
  s.set_draft_tokens(1, {80, 81});
  o = s.schedule();
  r.sampled = {{1, 80, 0, {}}, {1, 81, 0, {}}, {1, 82, 0, {}}};
  r.spec = {{1, 2, 2}};
  updates = s.update_from_output(o, r);
  ASSERT_EQ(updates.size(), 1u);
  EXPECT_EQ(updates[0].new_tokens, (std::vector<TokenId>{80, 81, 82}));
  EXPECT_TRUE(s.finish_request(1));
  EXPECT_EQ(s.find(1), nullptr);
  EXPECT_EQ(s.kv().num_free_blocks(), 64);
}

// A connector that offers `offer` tokens to every request and reports each load as the test says.
class FakeConnector final : public KvConnectorScheduler {
 public:
  int64_t offer = 0;
  std::map<RequestId, KvLoadState> state;  // what the workers report, per awaited request
  std::vector<RequestId> awaiting, finished;
  std::vector<std::pair<RequestId, int64_t>> scheduled;  // (request, computed after)

  int64_t get_num_new_matched_tokens(const KvRequest& r, int64_t local) override {
    return std::min(offer, (r.num_tokens() - 1) / 16 * 16 - local);
  }
  void update_state_after_alloc(const KvRequest& r, std::span<const BlockId> blocks, int64_t local,
                                int64_t external) override {
    if (external > 0) {
      EXPECT_GE(static_cast<int64_t>(blocks.size()) * 16, local + external);
      awaiting.push_back(r.id);
    }
  }
  void on_scheduled(const KvRequest& r, int64_t after, std::span<const BlockId>) override {
    scheduled.emplace_back(r.id, after);
  }
  KvConnectorMetadata build_meta() override {
    KvConnectorMetadata m;
    m.awaiting = awaiting;
    return m;
  }
  void update_connector_output(const KvConnectorMetadata& meta, const KvConnectorOutput&, std::vector<RequestId>& done,
                               std::vector<RequestId>& failed) override {
    for (RequestId id : meta.awaiting) {
      const KvLoadState st = state.count(id) ? state[id] : KvLoadState::kPending;
      if (st == KvLoadState::kPending) continue;
      (st == KvLoadState::kDone ? done : failed).push_back(id);
      awaiting.erase(std::remove(awaiting.begin(), awaiting.end(), id), awaiting.end());
    }
  }
  void request_finished(const KvRequest& r) override {
    finished.push_back(r.id);
    awaiting.erase(std::remove(awaiting.begin(), awaiting.end(), r.id), awaiting.end());
  }
  KvConnectorStats stats() const override { return {}; }
};

// A request whose tokens a connector loads waits outside the batch, taking no budget, while the
// others run; once loaded it computes only what is left; a failed load computes everything.
TEST(Scheduler, ConnectorLoadsWaitWithoutBlockingOthers) {
  SchedulerConfig sc;
  sc.max_num_batched_tokens = 64;
  auto owned = std::make_unique<FakeConnector>();
  FakeConnector& conn = *owned;
  Scheduler s(sc, KvCacheConfig{64, 16, true}, std::move(owned));
  conn.offer = 48;
  ASSERT_TRUE(s.add_request(make_request(1, 70, 2)).ok());  // 64 loadable tokens: 48 offered
  SchedulerOutput out = s.schedule();
  conn.offer = 0;
  EXPECT_TRUE(out.seqs.empty());
  EXPECT_EQ(out.kv_connector.awaiting, std::vector<RequestId>{1});
  EXPECT_EQ(s.find(1)->status, RequestStatus::kWaitingForKv);
  EXPECT_EQ(s.stats().num_waiting, 1);
  update(s, out, fake_run(out));  // still pending
  ASSERT_TRUE(s.add_request(make_request(2, 20, 2)).ok());
  out = s.schedule();
  EXPECT_EQ(batch_of(out), (Batch{{2, 20}}));  // 2 runs while 1 waits
  conn.state[1] = KvLoadState::kDone;
  update(s, out, fake_run(out));
  EXPECT_EQ(s.find(1)->status, RequestStatus::kRunning);
  EXPECT_EQ(s.find(1)->num_computed_tokens, 48);
  out = s.schedule();
  EXPECT_EQ(scheduled_for(out, 1), 70 - 48);  // only what was not loaded
  EXPECT_EQ(s.kv().check_invariants().message(), "");

  conn.offer = 32;
  ASSERT_TRUE(s.add_request(make_request(3, 40, 2)).ok());
  update(s, out, fake_run(out));
  out = s.schedule();
  conn.offer = 0;
  EXPECT_EQ(scheduled_for(out, 3), 0);
  EXPECT_EQ(s.find(3)->status, RequestStatus::kWaitingForKv);
  conn.state[3] = KvLoadState::kFailed;
  update(s, out, fake_run(out));
  EXPECT_EQ(s.find(3)->num_computed_tokens, 0);
  out = s.schedule();
  EXPECT_EQ(scheduled_for(out, 3), 40);  // computes its tokens itself
  while (s.has_unfinished()) {
    update(s, out, fake_run(out));
    out = s.schedule();
  }
  EXPECT_EQ(s.kv().num_free_blocks(), 64);
  EXPECT_EQ(s.kv().check_invariants().message(), "");
}

// A request that ends while its load is in flight gives its blocks back at once and is no
// longer awaited.
TEST(Scheduler, ConnectorLoadAbortedWhileWaiting) {
  auto owned = std::make_unique<FakeConnector>();
  FakeConnector& conn = *owned;
  Scheduler s(SchedulerConfig{}, KvCacheConfig{16, 16, true}, std::move(owned));
  conn.offer = 64;
  ASSERT_TRUE(s.add_request(make_request(1, 100, 4)).ok());
  SchedulerOutput out = s.schedule();
  EXPECT_EQ(s.find(1)->status, RequestStatus::kWaitingForKv);
  EXPECT_LT(s.kv().num_free_blocks(), 16);
  EXPECT_TRUE(s.finish_request(1));
  EXPECT_EQ(conn.finished, std::vector<RequestId>{1});
  EXPECT_EQ(s.kv().num_free_blocks(), 16);
  EXPECT_FALSE(s.has_unfinished());
  conn.state[1] = KvLoadState::kDone;  // a late report changes nothing
  update(s, out, fake_run(out));
  EXPECT_FALSE(s.has_unfinished());
  EXPECT_TRUE(s.schedule().kv_connector.awaiting.empty());
}

}  // namespace
}  // namespace pagoda
