// OutputProcessor: the one place that decides where a sequence stops (stop ids once min_tokens
// are out, max_tokens, max_model_len, stop strings), the n fan-out and aborts; on the byte
// tokenizer (ids 0..255 are bytes, 257 = </s>), with the core's updates made by hand.
#include "engine/output_processor.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace pagoda {
namespace {

EngineConfig config_with_max_model_len(int64_t n) {
  EngineConfig c;
  c.scheduler.max_model_len = n;
  c.seed = 42;
  return c;
}

GenerateRequest request(const SamplingParams& p) {
  GenerateRequest r;
  r.prompt_token_ids = {256, 'h', 'i'};  // <s> "hi"
  r.params = p;
  return r;
}

// One step's output: `tokens` for sequence `id`.
CoreStepOutput update(RequestId id, std::vector<TokenId> tokens) {
  CoreStepOutput out;
  RequestUpdate u;
  u.request_id = id;
  for (TokenId t : tokens) u.samples.push_back(SampledOutput{id, t, 0, {}});
  u.new_tokens = std::move(tokens);
  out.updates.push_back(std::move(u));
  return out;
}

TEST(OutputProcessor, StopIdsCountOnceMinTokensAreOut) {
  OutputProcessor op(make_byte_tokenizer(), config_with_max_model_len(64));
  SamplingParams p;
  p.max_tokens = 10;
  p.min_tokens = 2;
  p.stop_token_ids = {7};
  auto seqs = op.add_request(1, request(p));
  ASSERT_TRUE(seqs.ok());
  ASSERT_EQ(seqs->size(), 1u);
  const RequestId id = (*seqs)[0].id;
  // The stop ids (and </s>) are what the sampler masks before min_tokens.
  EXPECT_EQ((*seqs)[0].min_tokens_suppressed, (std::vector<TokenId>{7, 257}));
  int steps = 0;
  OutputProcessor::Processed last;
  while (op.has_request(1)) {
    last = op.process(update(id, {7}));
    ++steps;
  }
  EXPECT_EQ(steps, 3);  // 7 every step; it only stops the sequence after 2 tokens
  ASSERT_EQ(last.chunks.size(), 1u);
  EXPECT_EQ(last.chunks[0].finish_reason, FinishReason::kStop);
  EXPECT_EQ(last.chunks[0].stop_token, 7);
  EXPECT_EQ(last.chunks[0].completion_tokens, 3);
  EXPECT_EQ(last.finished, (std::vector<RequestId>{id}));
}

TEST(OutputProcessor, MaxTokensAndTheContextCutAStepsTokens) {
  OutputProcessor op(make_byte_tokenizer(), config_with_max_model_len(64));
  SamplingParams p;
  p.max_tokens = 10;
  auto seqs = op.add_request(1, request(p));
  ASSERT_TRUE(seqs.ok());
  const RequestId id = (*seqs)[0].id;
  OutputProcessor::Processed first = op.process(update(id, std::vector<TokenId>(9, 'x')));
  EXPECT_TRUE(first.finished.empty());
  // Accepted drafts run past max_tokens: the tenth ends it, the rest are dropped.
  OutputProcessor::Processed second = op.process(update(id, {'a', 'b', 'c'}));
  ASSERT_EQ(second.chunks.size(), 1u);
  EXPECT_EQ(second.chunks[0].token_ids, (std::vector<TokenId>{'a'}));
  EXPECT_EQ(second.chunks[0].finish_reason, FinishReason::kLength);
  EXPECT_EQ(second.finished, (std::vector<RequestId>{id}));
  // A prompt of 3 in a context of 8: the fifth output token ends it.
  OutputProcessor small(make_byte_tokenizer(), config_with_max_model_len(8));
  seqs = small.add_request(2, request(p));
  ASSERT_TRUE(seqs.ok());
  OutputProcessor::Processed cut = small.process(update((*seqs)[0].id, {'a', 'b', 'c', 'd', 'e', 'f'}));
  ASSERT_EQ(cut.chunks.size(), 1u);
  EXPECT_EQ(cut.chunks[0].token_ids.size(), 5u);
  EXPECT_EQ(cut.chunks[0].finish_reason, FinishReason::kLength);
}

TEST(OutputProcessor, StopStringsSpanTokensAndHoldBackTheirStart) {
  OutputProcessor op(make_byte_tokenizer(), config_with_max_model_len(64));
  SamplingParams p;
  p.max_tokens = 20;
  p.stop = {"end"};
  auto seqs = op.add_request(1, request(p));
  ASSERT_TRUE(seqs.ok());
  const RequestId id = (*seqs)[0].id;
  OutputProcessor::Processed a = op.process(update(id, {'o', 'k', ' ', 'e'}));
  ASSERT_EQ(a.chunks.size(), 1u);
  EXPECT_EQ(a.chunks[0].text, "ok");  // " e" could start "end": held back
  OutputProcessor::Processed b = op.process(update(id, {'n', 'd', '!', '!'}));
  ASSERT_EQ(b.chunks.size(), 1u);
  EXPECT_EQ(b.chunks[0].finish_reason, FinishReason::kStop);
  EXPECT_EQ(b.chunks[0].stop_string, "end");
  EXPECT_EQ(b.chunks[0].text, " ");
  EXPECT_EQ(b.chunks[0].token_ids, (std::vector<TokenId>{'n', 'd'}));  // the tokens after it are dropped
  EXPECT_EQ(b.chunks[0].stop_token, -1);
}

TEST(OutputProcessor, FansOutNSeededSequencesAndAbortsThemAll) {
  OutputProcessor op(make_byte_tokenizer(), config_with_max_model_len(64));
  SamplingParams p;
  p.n = 3;
  p.seed = 100;
  auto seqs = op.add_request(5, request(p));
  ASSERT_TRUE(seqs.ok());
  ASSERT_EQ(seqs->size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ((*seqs)[i].seed, 100u + i);
  EXPECT_FALSE(op.add_request(5, request(p)).ok());  // the id is in use
  // Without a seed of their own, each sequence's comes from the engine's seed and its id.
  p.seed.reset();
  auto unseeded = op.add_request(6, request(p));
  ASSERT_TRUE(unseeded.ok());
  EXPECT_NE((*unseeded)[0].seed, (*unseeded)[1].seed);
  std::vector<RequestId> ids;
  std::vector<OutputChunk> last = op.abort(5, FinishReason::kAbort, &ids);
  ASSERT_EQ(last.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(last[i].index, static_cast<int64_t>(i));
    EXPECT_EQ(last[i].finish_reason, FinishReason::kAbort);
    EXPECT_EQ(ids[i], (*seqs)[i].id);
  }
  EXPECT_FALSE(op.has_request(5));
  EXPECT_TRUE(op.has_request(6));
}

}  // namespace
}  // namespace pagoda
