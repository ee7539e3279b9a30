// The executor layer on a real model (stories260K): steps that go through their byte encoding,
// as between processes, give exactly what the in-process hand-over gives, through everything
// that makes the deltas interesting (chunked prefill, preemption, prefix-cache hits, seeded
// sampling with penalties, logprobs, n > 1, speculative drafts); and a Worker refuses every
// message that does not fit its state, naming the problem, without running anything.
#include <gtest/gtest.h>

#include <functional>
#include <memory>

#include "launch/model_loading.h"
#include "backend/cpu/cpu_backend.h"
#include "engine/llm.h"
#include "worker/worker.h"
#include "support/engine_core.h"
#include "support/test_data.h"

namespace pagoda {
namespace {

constexpr const char* kModel = "stories260K/stories260K.gguf";

std::vector<GenerateRequest> mixed_requests() {
  const char* names[] = {"Lily", "Tom", "Ben", "Sue", "Max", "Anna"};
  std::vector<GenerateRequest> rs;
  for (int i = 0; i < 10; ++i) {
    GenerateRequest r;
    r.prompt = std::string("Once upon a time, ") + names[i % 6] + " went to the park. " + names[i % 6] + " saw a";
    r.params.max_tokens = 40;
    if (i % 2 == 0) {
      r.params.temperature = 0;
    } else {
      r.params.temperature = 0.9;
      r.params.top_p = 0.9;
      r.params.presence_penalty = 0.4;
      r.params.seed = 100 + i;
    }
    if (i % 3 == 0) r.params.logprobs = 2;
    if (i == 4) r.params.prompt_logprobs = 1;
    if (i == 5) r.params.n = 2;
    if (i == 7) r.params.logit_bias = {{13, 2.5f}};
    rs.push_back(std::move(r));
  }
  return rs;
}

// A small cache (preemptions), a small step budget (chunked prefill), n-gram drafts.
EngineConfig tight(bool serialize_steps) {
  EngineConfig c;
  c.block_size = 4;
  c.scheduler.max_model_len = 128;
  c.scheduler.max_num_batched_tokens = 48;
  c.kv_cache_memory = 48 * 4 * 2 * 5 * 4 * 8 * 4;  // 48 blocks of 4 tokens of stories260K's KV
  c.speculative.method = "ngram";
  c.speculative.num_speculative_tokens = 3;
  c.speculative.prompt_lookup_min = 2;
  c.speculative.prompt_lookup_max = 4;
  c.serialize_steps = serialize_steps;
  return c;
}

TEST(Executor, StepsThroughBytesEqualStepsHandedOver) {
  PAGODA_TEST_FILE(model, kModel);
  LLM direct(testing::make_engine_core(model, tight(false)));
  LLM bytes(testing::make_engine_core(model, tight(true)));
  const auto rs = mixed_requests();
  auto a = direct.generate(rs);
  auto b = bytes.generate(rs);
  ASSERT_TRUE(a.ok()) << a.status().message();
  ASSERT_TRUE(b.ok()) << b.status().message();
  ASSERT_EQ(a->size(), b->size());
  for (size_t i = 0; i < a->size(); ++i) {
    const RequestOutput& x = (*a)[i];
    const RequestOutput& y = (*b)[i];
    EXPECT_EQ(x.prompt_logprobs, y.prompt_logprobs) << i;
    ASSERT_EQ(x.outputs.size(), y.outputs.size());
    for (size_t j = 0; j < x.outputs.size(); ++j) {
      EXPECT_EQ(x.outputs[j].token_ids, y.outputs[j].token_ids) << i << "." << j;
      EXPECT_EQ(x.outputs[j].logprobs, y.outputs[j].logprobs) << i << "." << j;
      EXPECT_EQ(x.outputs[j].text, y.outputs[j].text) << i << "." << j;
    }
  }
  // The workload did what it was built for, in both runs alike.
  for (LLM* llm : {&direct, &bytes}) {
    EXPECT_GT(llm->core().stats().num_preemptions, 0);
    EXPECT_GT(llm->core().stats().prefix_cache.hits, 0);
    EXPECT_GT(llm->core().spec_stats().num_accepted_tokens, 0);
  }
  EXPECT_EQ(direct.core().stats().num_preemptions, bytes.core().stats().num_preemptions);
}

// Pipeline parallelism's batch queue, in one process: with two steps in flight the engine
// schedules a step while the one before it is still to be collected (the scheduler leaves out
// the requests whose token is pending and never preempts one in flight), and every output is the
// same as one step at a time: seeded samples included, which a preempted in-flight request
// would change (its generator would have drawn for a token then dropped).
TEST(Executor, TwoStepsInFlightGiveTheSameOutputs) {
  PAGODA_TEST_FILE(model, kModel);
  EngineConfig one = tight(false);
  one.speculative = {};
  EngineConfig two = one;
  two.serialize_steps = true;
  two.steps_in_flight = 2;
  LLM serial(testing::make_engine_core(model, one));
  LLM queued(testing::make_engine_core(model, two));
  const auto rs = mixed_requests();
  auto a = serial.generate(rs);
  auto b = queued.generate(rs);
  ASSERT_TRUE(a.ok()) << a.status().message();
  ASSERT_TRUE(b.ok()) << b.status().message();
  ASSERT_EQ(a->size(), b->size());
  for (size_t i = 0; i < a->size(); ++i) {
    EXPECT_EQ((*a)[i].prompt_logprobs, (*b)[i].prompt_logprobs) << i;
    if (rs[i].params.prompt_logprobs) {
      // One entry per prompt position after the first, even for a prompt preempted midway and
      // computed again (each position's row comes back once more then).
      for (const RequestOutput* o : {&(*a)[i], &(*b)[i]}) {
        ASSERT_EQ(o->prompt_logprobs.size(), o->prompt_token_ids.size() - 1) << i;
        for (size_t k = 0; k < o->prompt_logprobs.size(); ++k) {
          EXPECT_EQ(o->prompt_logprobs[k].token, o->prompt_token_ids[k + 1]) << k;
        }
      }
    }
    ASSERT_EQ((*a)[i].outputs.size(), (*b)[i].outputs.size());
    for (size_t j = 0; j < (*a)[i].outputs.size(); ++j) {
      EXPECT_EQ((*a)[i].outputs[j].token_ids, (*b)[i].outputs[j].token_ids) << i << "." << j;
      EXPECT_EQ((*a)[i].outputs[j].logprobs, (*b)[i].outputs[j].logprobs) << i << "." << j;
    }
  }
  EXPECT_GT(queued.core().stats().num_preemptions, 0);
  EXPECT_GT(queued.core().stats().prefix_cache.hits, 0);
  EXPECT_FALSE(queued.core().has_unfinished());

  // Driven by hand: a step that returns outputs has already submitted the next one.
  auto core = testing::make_engine_core(model, two);
  ASSERT_NE(core, nullptr);
  for (RequestId id = 1; id <= 4; ++id) {
    auto r = core->prepare(rs[static_cast<size_t>(id)]);
    ASSERT_TRUE(r.ok());
    ASSERT_TRUE(core->add_request(id, *r).ok());
  }
  EXPECT_TRUE(core->step().empty());  // the first step is submitted, nothing is collected
  EXPECT_EQ(core->num_steps_in_flight(), 1);
  int64_t overlapped = 0, finished = 0;
  while (core->has_unfinished()) {
    std::vector<OutputChunk> chunks = core->step();
    EXPECT_LE(core->num_steps_in_flight(), 1);
    if (!chunks.empty() && core->num_steps_in_flight() == 1) ++overlapped;
    for (const OutputChunk& c : chunks) finished += c.finish_reason != FinishReason::kNone;
  }
  EXPECT_GT(overlapped, 10);
  EXPECT_EQ(finished, 4);
  // An abort while the request's step is in flight: its output is dropped when it comes back.
  auto r = core->prepare(rs[0]);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(core->add_request(9, *r).ok());
  EXPECT_TRUE(core->step().empty());
  EXPECT_EQ(core->abort(9).size(), 1u);
  EXPECT_TRUE(core->has_unfinished());  // the step is still to be collected
  EXPECT_TRUE(core->step().empty());
  EXPECT_FALSE(core->has_unfinished());
}

class WorkerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PAGODA_TEST_FILE(path, kModel);
    path_ = path;
  }
  // A fresh worker on stories260K with 16 blocks of 4 tokens.
  std::unique_ptr<Worker> worker() {
    cpu::register_cpu_backend({});
    app::ModelFlags flags;
    flags.model = path_;
    auto loaded = app::load_model_and_tokenizer(flags);
    EXPECT_TRUE(loaded.ok()) << loaded.status().message();
    if (!loaded.ok()) return nullptr;
    auto w = std::make_unique<Worker>(std::move(loaded->model));
    WorkerInit init;
    init.num_blocks = 16;
    init.block_size = 4;
    init.max_model_len = 512;
    init.max_num_batched_tokens = 512;
    const Status started = w->initialize(init);
    EXPECT_TRUE(started.ok()) << started.message();
    return started.ok() ? std::move(w) : nullptr;
  }

  // A valid first step: request 1, a 6-token prompt in blocks 3 and 5, all computed and sampled.
  static StepMessage first_step() {
    StepMessage m;
    m.step = 1;
    NewRequestData n;
    n.request_id = 1;
    n.prompt_tokens = {1, 403, 407, 261, 378, 10};
    n.params.temperature = 0;
    m.new_requests.push_back(n);
    ScheduledRequestData d;
    d.request_id = 1;
    d.reset_blocks = true;
    d.new_block_ids = {3, 5};
    d.num_scheduled_tokens = 6;
    d.sample = true;
    m.scheduled.push_back(d);
    return m;
  }

  // Runs first_step() changed by `edit` on a fresh worker: the error's message, "" when it ran.
  std::string refusal(const std::function<void(StepMessage&)>& edit) {
    auto w = worker();
    if (!w) return "no worker";
    StepMessage m = first_step();
    edit(m);
    auto r = w->execute(m);
    if (r.ok()) return "";
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
    return r.status().message();
  }

  std::string path_;
};

TEST_F(WorkerTest, RunsValidStepsAndRefusesWhatDoesNotFit) {
  {  // The valid step, then a decode of the sampled token with a third block.
    auto w = worker();
    ASSERT_TRUE(w);
    auto out = w->execute(first_step());
    ASSERT_TRUE(out.ok()) << out.status().message();
    ASSERT_EQ(out->sampled.size(), 1u);
    StepMessage next;
    next.step = 2;
    ScheduledRequestData d;
    d.request_id = 1;
    d.new_output_tokens = {out->sampled[0].token};
    d.new_block_ids = {7};
    d.num_computed_tokens = 6;
    d.num_scheduled_tokens = 1;
    d.sample = true;
    next.scheduled.push_back(d);
    auto out2 = w->execute(next);
    ASSERT_TRUE(out2.ok()) << out2.status().message();
    EXPECT_EQ(out2->sampled.size(), 1u);
    StepMessage done;
    done.step = 3;
    done.finished = {1};
    ASSERT_TRUE(w->execute(done).ok());
    EXPECT_EQ(w->num_requests(), 0u);
  }
  EXPECT_EQ(refusal([](StepMessage&) {}), "");
  const auto refused = [&](const std::function<void(StepMessage&)>& edit, const std::string& says) {
    const std::string message = refusal(edit);
    EXPECT_NE(message.find(says), std::string::npos) << "'" << message << "' does not say '" << says << "'";
  };
  refused([](StepMessage& m) { m.step = 2; }, "step message 2 after step 0");
  refused([](StepMessage& m) { m.new_requests.push_back(m.new_requests[0]); }, "already known");
  refused([](StepMessage& m) { m.scheduled[0].request_id = 9; }, "request 9 is unknown");
  refused([](StepMessage& m) { m.scheduled.push_back(m.scheduled[0]); }, "scheduled twice");
  refused([](StepMessage& m) { m.finished = {4}; }, "finished request 4 is unknown");
  refused([](StepMessage& m) { m.preempted = {4}; }, "preempted request 4 is unknown");
  refused([](StepMessage& m) { m.new_requests[0].prompt_tokens[2] = 512; }, "prompt token 512 outside the vocabulary");
  refused([](StepMessage& m) { m.new_requests[0].prompt_tokens.clear(); }, "empty prompt");
  refused([](StepMessage& m) { m.new_requests[0].params.top_p = 7; }, "top_p");
  refused([](StepMessage& m) { m.scheduled[0].new_block_ids[1] = 16; }, "block 16 outside the cache's 16");
  refused([](StepMessage& m) { m.scheduled[0].new_block_ids.pop_back(); }, "do not cover position 5");
  refused([](StepMessage& m) { m.scheduled[0].num_scheduled_tokens = 7; }, "but it has 6");
  refused([](StepMessage& m) { m.scheduled[0].num_computed_tokens = -1; }, "scheduled, but it has 6");
  refused([](StepMessage& m) { m.scheduled[0].sample = false; }, "sample is unset for a step that reaches");
  refused([](StepMessage& m) { m.scheduled[0].draft_tokens = {600}; }, "draft token 600 outside the vocabulary");
  refused([](StepMessage& m) { m.scheduled[0].draft_tokens = {5, 6, 7}; }, "do not cover position 8");
  refused([](StepMessage& m) { m.scheduled[0].new_output_tokens = {-3}; }, "output token -3");
}

}  // namespace
}  // namespace pagoda
