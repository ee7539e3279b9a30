// Tensor parallelism (model/tensor_parallel.h): the shard plans and what they refuse; integer
// codes sliced as the matrices they decode to are sliced; and models sharded over 2 and 4 forked
// ranks (shared memory) computing the logits one process computes, within a stated tolerance.
//
// Every model runs in a forked child (the CPU thread pool must not exist before a fork), never in
// the test's own process.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_thread_pool.h"
#include "comm/send_queue.h"
#include "comm/shm/shm_communicator.h"
#include "loader/model_source.h"
#include "model/layers/weight_loader.h"
#include "model/model.h"
#include "model/tensor_parallel.h"
#include "support/small_config.h"

namespace pagoda {
namespace {

// The model tests' small Llama, with 2 layers.
ModelConfig small_config() {
  ModelConfig c = testing::small_llama_config();
  c.num_layers = 2;
  return c;
}

TEST(TensorParallelPlan, SplitsHeadsKvHeadsIntermediateAndVocabulary) {
  const ModelConfig tiny = *dummy_preset("tinyllama-1.1b");  // 32 heads, 4 KV heads, 5632, 32000
  LocalCommunicator one;
  // A stand-in communicator of any size: plan_shard only checks size and rank.
  struct Sized final : Communicator {
    int r, n;
    Sized(int rank, int size) : r(rank), n(size) {}
    const char* name() const override { return "sized"; }
    int rank() const override { return r; }
    int size() const override { return n; }
    Status all_reduce_sum(float*, int64_t) override { return Status::ok_status(); }
    Status all_gather(const void*, int64_t, void*) override { return Status::ok_status(); }
    Status broadcast(void*, int64_t, int) override { return Status::ok_status(); }
    Status send(const void*, int64_t, int) override { return Status::ok_status(); }
    Status recv(void*, int64_t, int) override { return Status::ok_status(); }
    Status barrier() override { return Status::ok_status(); }
    void set_timeout(std::chrono::milliseconds) override {}
  };
  Sized r1of2(1, 2);
  auto p = plan_shard(tiny, TensorParallel{1, 2, &r1of2}, "tiny");
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->q_heads.begin, 16);
  EXPECT_EQ(p->q_heads.end, 32);
  EXPECT_EQ(p->kv_heads.begin, 2);
  EXPECT_EQ(p->kv_heads.end, 4);
  EXPECT_EQ(p->intermediate.begin, 2816);
  EXPECT_EQ(p->intermediate.end, 5632);
  EXPECT_EQ(p->vocab.begin, 16000);
  EXPECT_EQ(p->vocab.end, 32000);
  EXPECT_EQ(p->local.num_heads, 16);
  EXPECT_EQ(p->local.num_kv_heads, 2);
  EXPECT_EQ(p->local.intermediate_size, 2816);
  EXPECT_EQ(p->local.hidden_size, 2048);
  // Eight ranks over four KV heads: each KV head on the two ranks whose query heads read it.
  for (int r = 0; r < 8; ++r) {
    Sized c(r, 8);
    auto q = plan_shard(tiny, TensorParallel{r, 8, &c}, "tiny");
    ASSERT_TRUE(q.ok()) << q.status().message();
    EXPECT_EQ(q->kv_heads.begin, r / 2) << r;
    EXPECT_EQ(q->kv_heads.size(), 1);
    EXPECT_EQ(q->q_heads.begin, 4 * r);
    // The query heads of the rank read its KV head: head h reads h / (32 / 4).
    EXPECT_EQ(q->q_heads.begin / 8, q->kv_heads.begin) << r;
    EXPECT_EQ((q->q_heads.end - 1) / 8, q->kv_heads.begin) << r;
  }
  // A vocabulary of 61 over 4 ranks: 16 rows each, the last 13.
  ModelConfig small = small_config();
  Sized r3of4(3, 4);
  auto v = plan_shard(small, TensorParallel{3, 4, &r3of4}, "small");
  ASSERT_TRUE(v.ok()) << v.status().message();
  EXPECT_EQ(v->vocab_per_rank, 16);
  EXPECT_EQ(v->vocab.begin, 48);
  EXPECT_EQ(v->vocab.end, 61);
  // One rank: the whole model.
  auto whole = plan_shard(small, TensorParallel{0, 1, &one}, "small");
  ASSERT_TRUE(whole.ok());
  EXPECT_FALSE(whole->sharded());
  EXPECT_EQ(whole->local.num_heads, 4);
  EXPECT_EQ(whole->vocab.end, 61);

  // Refusals name the model and what does not divide.
  Sized r0of3(0, 3), r0of5(0, 5), r0of4(0, 4);
  ModelConfig six_heads = small;
  six_heads.num_heads = 6;
  six_heads.head_dim = 8;
  const std::pair<Result<ShardPlan>, const char*> refused[] = {
      {plan_shard(small, TensorParallel{0, 3, &r0of3}, "small"), "does not divide the attention heads (4)"},
      {plan_shard(six_heads, TensorParallel{0, 3, &r0of3}, "small"),
       "is larger than the KV heads (2) and not a multiple of them"},
      {plan_shard(small, TensorParallel{0, 4, nullptr}, "small"), "needs a communicator of that size"},
      {plan_shard(small, TensorParallel{0, 4, &r0of3}, "small"), "needs a communicator of that size"},
  };
  for (const auto& [plan, words] : refused) {
    ASSERT_FALSE(plan.ok()) << words;
    EXPECT_NE(plan.status().message().find(words), std::string::npos) << plan.status().message();
    EXPECT_EQ(plan.status().message().rfind("small: ", 0), 0u) << plan.status().message();
  }
  ModelConfig odd_mlp = small;
  odd_mlp.intermediate_size = 50;
  auto m = plan_shard(odd_mlp, TensorParallel{0, 4, &r0of4}, "small");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("does not divide the MLP's intermediate size (50)"), std::string::npos)
      << m.status().message();
}

// The float matrix integer codes stand for: w[row][input column] = (code - zero) * scale.
std::vector<double> decode(const IntCodes& c) {
  std::vector<double> w(static_cast<size_t>(c.n * c.k));
  const int64_t row_bytes = c.bits == 8 ? c.k : c.k / 2;
  for (int64_t r = 0; r < c.n; ++r) {
    for (int64_t t = 0; t < c.k; ++t) {
      const uint8_t* row = c.codes.data() + r * row_bytes;
      int code = c.bits == 8 ? static_cast<int8_t>(row[t]) : ((row[t / 2] >> (4 * (t % 2))) & 0xF);
      if (c.bits == 4 && code > 7) code -= 16;
      const int64_t g = t / c.group_size, groups = c.groups();
      const int zero = c.zero_points.empty() ? 0 : c.zero_points[static_cast<size_t>(r * groups + g)];
      const int64_t col = c.perm.empty() ? t : c.perm[static_cast<size_t>(t)];
      w[static_cast<size_t>(r * c.k + col)] = (code - zero) * double{c.scales[static_cast<size_t>(r * groups + g)]};
    }
  }
  return w;
}

IntCodes random_codes(int bits, int64_t n, int64_t k, int64_t group, bool zeros, bool act_order, uint32_t seed) {
  std::mt19937 rng(seed);
  IntCodes c;
  c.bits = bits;
  c.n = n;
  c.k = k;
  c.group_size = group;
  c.method = "test";
  const int64_t row_bytes = bits == 8 ? k : k / 2;
  c.codes.resize(static_cast<size_t>(n * row_bytes));
  for (auto& b : c.codes) b = static_cast<uint8_t>(rng());
  c.scales.resize(static_cast<size_t>(n * c.groups()));
  for (auto& s : c.scales) s = 0.01f + static_cast<float>(rng() % 100) / 1000.0f;
  if (zeros) {
    c.zero_points.resize(c.scales.size());
    for (auto& z : c.zero_points) z = static_cast<int32_t>(rng() % 5) - 2;
  }
  if (act_order) {
    // Groups of code columns, each gathered from input columns of one group of the input
    // (shuffled within the group, the groups in shuffled order).
    std::vector<int32_t> groups(static_cast<size_t>(k / group));
    for (size_t g = 0; g < groups.size(); ++g) groups[g] = static_cast<int32_t>(g);
    std::shuffle(groups.begin(), groups.end(), rng);
    for (int32_t g : groups) {
      std::vector<int32_t> cols;
      for (int64_t t = 0; t < group; ++t) cols.push_back(static_cast<int32_t>(g * group + t));
      std::shuffle(cols.begin(), cols.end(), rng);
      c.perm.insert(c.perm.end(), cols.begin(), cols.end());
    }
  }
  return c;
}

// A slice of the codes decodes to the same slice of the matrix: rows (column-parallel layers)
// and columns (row-parallel ones), int8 and int4, per channel and in groups, with zero points and
// with GPTQ's act-order permutation.
TEST(SliceIntCodes, SlicesDecodeToTheMatrixSlices) {
  struct Case {
    int bits;
    int64_t group;
    bool zeros, act_order;
  };
  const int64_t n = 6, k = 64;
  for (const Case& cs : {Case{8, 64, false, false}, Case{8, 16, false, false}, Case{4, 16, true, false},
                         Case{4, 8, false, true}, Case{4, 64, false, false}}) {
    const IntCodes c = random_codes(cs.bits, n, k, cs.group, cs.zeros, cs.act_order, 7);
    const std::vector<double> whole = decode(c);
    const std::string label = "bits " + std::to_string(cs.bits) + " group " + std::to_string(cs.group);
    auto rows = slice_int_codes(c, Slice::rows({2, 5}), "t");
    ASSERT_TRUE(rows.ok()) << label << ": " << rows.status().message();
    EXPECT_EQ(rows->n, 3);
    const std::vector<double> got_rows = decode(*rows);
    for (int64_t r = 0; r < 3; ++r) {
      for (int64_t t = 0; t < k; ++t) {
        ASSERT_EQ(got_rows[static_cast<size_t>(r * k + t)], whole[static_cast<size_t>((r + 2) * k + t)]) << label;
      }
    }
    for (IndexRange part : {IndexRange{0, 32}, IndexRange{32, 64}, IndexRange{16, 48}}) {
      auto cols = slice_int_codes(c, Slice::cols(part), "t");
      ASSERT_TRUE(cols.ok()) << label << ": " << cols.status().message();
      ASSERT_EQ(cols->k, part.size()) << label;
      const std::vector<double> got = decode(*cols);
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t t = 0; t < part.size(); ++t) {
          ASSERT_EQ(got[static_cast<size_t>(r * part.size() + t)], whole[static_cast<size_t>(r * k + part.begin + t)])
              << label << " columns [" << part.begin << ", " << part.end << ") row " << r << " column " << t;
        }
      }
    }
  }
  // A column range that takes part of a group is refused, naming the context.
  auto cut = slice_int_codes(random_codes(4, n, k, 32, false, false, 3), Slice::cols({16, 48}), "m.gguf: tensor x");
  ASSERT_FALSE(cut.ok());
  EXPECT_NE(cut.status().message().find("m.gguf: tensor x has scales in groups of 32 columns"), std::string::npos)
      << cut.status().message();
}

TEST(SliceDense, ColumnsCopyWholeBlocksAndRefuseToCutOne) {
  std::vector<uint8_t> bytes(4 * 2 * 34);  // q8_0 [4, 64]: 2 blocks of 34 bytes per row
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 7);
  Tensor t(bytes.data(), DType::kQ8_0, {4, 64});
  Buffer storage;
  auto right = slice_dense(t, Slice::cols({32, 64}), &storage, "m");
  ASSERT_TRUE(right.ok()) << right.status().message();
  EXPECT_EQ(right->row_len(), 32);
  for (int64_t r = 0; r < 4; ++r) {
    EXPECT_EQ(std::memcmp(right->row(r), t.row(r) + 34, 34), 0) << r;
  }
  auto rows = slice_dense(t, Slice::rows({1, 3}), &storage, "m");
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(rows->data, t.row(1));  // a view
  EXPECT_EQ(rows->num_rows(), 2);
  auto cut = slice_dense(t, Slice::cols({16, 48}), &storage, "m: tensor w");
  ASSERT_FALSE(cut.ok());
  EXPECT_NE(cut.status().message().find("m: tensor w is q8_0 in blocks of 32 columns"), std::string::npos)
      << cut.status().message();
}

// ---- Sharded models in forked ranks ----

// Shared memory for what the ranks report: rank 0's result floats and each rank's error.
struct Report {
  static constexpr size_t kErrorBytes = 1024;
  static constexpr size_t kMaxFloats = size_t{16} << 20;
  char errors[8][kErrorBytes];
  uint64_t count;
  float values[kMaxFloats];
};

using RankBody = std::function<Result<std::vector<float>>(const TensorParallel& tp, const PipelineParallel& pp)>;

// Runs `body` on tp x pp forked ranks (rank r: tensor-parallel rank r % tp of stage r / tp, as
// pagoda places them; a shared-memory group over all, and one per stage for its tensor-parallel
// collectives; one rank: no communicator) and returns the result of the last stage's first rank;
// a failure on any rank fails the test with its message.
std::vector<float> run_ranks(int tp_size, const RankBody& body, int pp_size = 1) {
  const int ranks = tp_size * pp_size;
  const int reporter = (pp_size - 1) * tp_size;
  void* mem = mmap(nullptr, sizeof(Report), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  EXPECT_NE(mem, MAP_FAILED);
  if (mem == MAP_FAILED) return {};
  auto* report = new (mem) Report();
  auto region = shm::ShmRegion::create(ranks);
  EXPECT_TRUE(region.ok());
  std::vector<std::shared_ptr<shm::ShmRegion>> stage_regions;
  for (int s = 0; pp_size > 1 && tp_size > 1 && s < pp_size; ++s) stage_regions.push_back(*shm::ShmRegion::create(tp_size));
  std::vector<pid_t> pids;
  for (int r = 0; r < ranks; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      std::unique_ptr<shm::ShmCommunicator> comm, stage_comm;
      std::unique_ptr<SendQueue> sender;
      TensorParallel tp;
      PipelineParallel pp;
      const int stage = r / tp_size;
      if (ranks > 1) comm = std::make_unique<shm::ShmCommunicator>(*region, r, std::chrono::seconds(120));
      if (!stage_regions.empty()) {
        stage_comm = std::make_unique<shm::ShmCommunicator>(stage_regions[static_cast<size_t>(stage)], r % tp_size,
                                                            std::chrono::seconds(120));
      }
      if (tp_size > 1) tp = TensorParallel{r % tp_size, tp_size, stage_comm ? stage_comm.get() : comm.get()};
      if (pp_size > 1) {
        sender = std::make_unique<SendQueue>(*comm);
        pp = PipelineParallel{stage, pp_size, comm.get(), stage > 0 ? r - tp_size : -1,
                              stage < pp_size - 1 ? r + tp_size : -1, sender.get()};
      }
      Result<std::vector<float>> out = internal_error("no result");
      try {
        out = body(tp, pp);
        if (Status st = sender ? sender->flush() : Status::ok_status(); out.ok() && !st.ok()) out = st;
      } catch (const std::exception& e) {
        out = internal_error(std::string("exception: ") + e.what());
      }
      if (!out.ok()) {
        std::snprintf(report->errors[r], Report::kErrorBytes, "rank %d: %s", r, out.status().message().c_str());
        if (comm) comm->abort();
        _exit(1);
      }
      if (r == reporter) {
        report->count = std::min(out->size(), Report::kMaxFloats);
        std::copy_n(out->data(), report->count, report->values);
      }
      _exit(0);
    }
    pids.push_back(pid);
  }
  bool ok = true;
  for (int r = 0; r < ranks; ++r) {
    int status = 0;
    waitpid(pids[static_cast<size_t>(r)], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ok = false;
      ADD_FAILURE() << "rank " << r << " of " << ranks << " failed: " << report->errors[r];
    }
  }
  std::vector<float> result;
  if (ok) result.assign(report->values, report->values + report->count);
  munmap(mem, sizeof(Report));
  return result;
}

// The logits of every position of two sequences, fed as a prefill of each, then one decoded
// token each (reading the shard's KV cache), from the model of `config` with dummy weights of
// `dtype`, sharded as tp says.
RankBody logits_of(const ModelConfig& config, DType dtype, std::optional<QuantMix> mix = std::nullopt) {
  return [=](const TensorParallel& tp, const PipelineParallel& pp) -> Result<std::vector<float>> {
    PAGODA_ASSIGN_OR_RETURN(WeightMap w, make_dummy_weights(config, dtype, 5, "dummy"));
    PAGODA_ASSIGN_OR_RETURN(std::unique_ptr<cpu::CpuBackend> backend, cpu::CpuBackend::create({.threads = 1}));
    ModelSource source{"dummy", LoadFormat::kDummy, config, std::move(w)};
    PAGODA_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, create_model(std::move(source), *backend, tp, pp, mix));
    const int64_t bs = 4;
    PAGODA_ASSIGN_OR_RETURN(KvCacheTensors kv, KvCacheTensors::allocate(model->kernels(), model->shard_config(), 16, bs));
    const int64_t vocab = config.vocab_size;
    const std::vector<TokenId> a = {1, 17, 5, 60, 33, 2, 41, 8, 8}, b = {1, 9, 44, 3, 3};
    const std::vector<BlockId> table_a = {3, 0, 7}, table_b = {5, 1};
    std::vector<float> out;
    auto step = [&](const ForwardBatchBuffers& in) {
      const ForwardBatch batch = in.batch();
      Tensor hidden = model->forward(batch, kv);
      if (!model->computes_logits()) return;  // a stage before the last
      std::vector<int64_t> rows(static_cast<size_t>(batch.num_tokens()));
      for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int64_t>(i);
      std::vector<float> logits(rows.size() * static_cast<size_t>(vocab));
      model->compute_logits(hidden, rows.data(), static_cast<int64_t>(rows.size()), logits.data());
      out.insert(out.end(), logits.begin(), logits.end());
    };
    ForwardBatchBuffers in;
    in.add_sequence(a, {}, 0, table_a, bs);
    in.add_sequence(b, {}, 0, table_b, bs);
    step(in);
    in.clear();
    const std::vector<TokenId> next_a = {7}, next_b = {11};
    in.add_sequence(next_a, {}, static_cast<int64_t>(a.size()), table_a, bs);
    in.add_sequence(next_b, {}, static_cast<int64_t>(b.size()), table_b, bs);
    step(in);
    return out;
  };
}

// small_config as a Qwen2-MoE with biases: 6 experts, 2 per token, a shared expert, layer 1 dense.
ModelConfig small_moe_config() {
  ModelConfig moe = small_config();
  moe.architecture = "qwen2_moe";
  moe.attention_bias = true;
  moe.moe_intermediate_size = 24;
  moe.num_experts = 6;
  moe.num_experts_per_tok = 2;
  moe.shared_expert_intermediate_size = 40;
  moe.mlp_only_layers = {1};
  return moe;
}

// The largest |sharded - whole| over every logit, as a fraction of the largest |whole| of its row.
double largest_relative_difference(const std::vector<float>& whole, const std::vector<float>& sharded, int64_t vocab) {
  EXPECT_EQ(whole.size(), sharded.size());
  double worst = 0;
  for (size_t row = 0; row + static_cast<size_t>(vocab) <= std::min(whole.size(), sharded.size());
       row += static_cast<size_t>(vocab)) {
    double scale = 0;
    for (int64_t i = 0; i < vocab; ++i) scale = std::max(scale, std::fabs(double{whole[row + i]}));
    for (int64_t i = 0; i < vocab; ++i) {
      worst = std::max(worst, std::fabs(double{sharded[row + i]} - whole[row + i]) / scale);
    }
  }
  return worst;
}

// A TinyLlama-1.1B-shaped model (hidden 2048, 32 / 4 heads of 64, intermediate 5632, vocab
// 32000; 2 of its 22 layers) over 2 ranks. The all-reduces add each rank's partial sums of o and
// down in another order than one rank's dot products: f32 logits move by rounding only (measured
// 2.4e-6 of the row's largest logit on a Zen 3). q8_0 computes on activations quantized to int8
// per block of 32: the ranks split at block boundaries, but wherever the rounding-level
// difference of the residual straddles an int8 rounding step, a whole step moves, and the random
// layers carry it on (measured 8.9e-3; the fast-against-scalar kernel test sees the same effect,
// 7.5e-3). A wrong shard moves logits by O(1).
TEST(TensorParallelModel, TinyLlamaShapedLogitsMatchOneRank) {
  ModelConfig cfg = *dummy_preset("tinyllama-1.1b");
  cfg.num_layers = 2;
  for (auto [dtype, tol] : {std::pair{DType::kF32, 1e-5}, std::pair{DType::kQ8_0, 2e-2}}) {
    const std::vector<float> whole = run_ranks(1, logits_of(cfg, dtype));
    const std::vector<float> two = run_ranks(2, logits_of(cfg, dtype));
    ASSERT_FALSE(whole.empty());
    const double diff = largest_relative_difference(whole, two, cfg.vocab_size);
    EXPECT_LE(diff, tol) << dtype_name(dtype);
    std::printf("tinyllama-shaped %s, 2 ranks: largest logit difference %.3g of the row's largest\n",
                std::string(dtype_name(dtype)).c_str(), diff);
  }
}

// Four ranks over 2 KV heads (each replicated on two ranks), a vocabulary of 61 (16 rows per
// rank, the last 13), Q/K/V biases split with their heads (Qwen2); and a mixture of experts with
// a shared expert over two ranks (each expert split by its intermediate features).
TEST(TensorParallelModel, ReplicatedKvHeadsPaddedVocabularyBiasesAndExperts) {
  ModelConfig qwen2 = small_config();
  qwen2.architecture = "qwen2";
  qwen2.attention_bias = true;
  const std::vector<float> whole = run_ranks(1, logits_of(qwen2, DType::kF32));
  const std::vector<float> four = run_ranks(4, logits_of(qwen2, DType::kF32));
  ASSERT_FALSE(whole.empty());
  EXPECT_LE(largest_relative_difference(whole, four, qwen2.vocab_size), 1e-5);

  const ModelConfig moe = small_moe_config();
  const std::vector<float> moe_whole = run_ranks(1, logits_of(moe, DType::kF32));
  const std::vector<float> moe_two = run_ranks(2, logits_of(moe, DType::kF32));
  ASSERT_FALSE(moe_whole.empty());
  EXPECT_LE(largest_relative_difference(moe_whole, moe_two, moe.vocab_size), 1e-5);
}

// Pipeline parallelism: the layers in stages (3 layers in 2 and 3 stages; with 2 tensor-parallel
// ranks per stage), the activations sent on from stage to stage, the logits from the last. A
// pipeline adds no sum of its own: without tensor parallelism the logits are the one-process
// logits bit for bit, through the embedding (first stage), the tied LM head (last stage, which
// loads the embedding for it) and the mixture's experts.
TEST(PipelineParallelModel, StagesGiveTheOneProcessLogits) {
  // vLLM's split: the remainder one layer each to the stages before the last, from the
  // second-to-last back; or the partition given (VLLM_PP_LAYER_PARTITION), checked.
  const auto layers_of = [](int64_t layers, int stages, const std::vector<int64_t>& partition = {}) {
    std::vector<int64_t> counts;
    for (int s = 0; s < stages; ++s) {
      Result<IndexRange> r = stage_layers(layers, s, stages, partition);
      if (!r.ok()) return std::vector<int64_t>{-1};
      EXPECT_EQ(r->begin, std::accumulate(counts.begin(), counts.end(), int64_t{0}));
      counts.push_back(r->size());
    }
    return counts;
  };
  EXPECT_EQ(layers_of(5, 2), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(layers_of(22, 4), (std::vector<int64_t>{5, 6, 6, 5}));
  EXPECT_EQ(layers_of(23, 4), (std::vector<int64_t>{6, 6, 6, 5}));
  EXPECT_EQ(layers_of(24, 4), (std::vector<int64_t>{6, 6, 6, 6}));
  EXPECT_EQ(layers_of(3, 3), (std::vector<int64_t>{1, 1, 1}));
  EXPECT_EQ(layers_of(5, 2, {1, 4}), (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(layers_of(5, 2, {2, 2}), (std::vector<int64_t>{-1}));
  EXPECT_EQ(layers_of(5, 2, {5, 0}), (std::vector<int64_t>{-1}));
  EXPECT_EQ(layers_of(5, 2, {1, 1, 3}), (std::vector<int64_t>{-1}));
  EXPECT_EQ(stage_layers(5, 0, 2, {2, 2}).status().message(),
            "the layer partition 2,2 sums to 4 layers, not the 5 of the model");
  ModelConfig moe = small_moe_config();
  moe.num_layers = 3;
  moe.tie_word_embeddings = true;
  const std::vector<float> whole = run_ranks(1, logits_of(moe, DType::kF32));
  ASSERT_FALSE(whole.empty());
  EXPECT_EQ(run_ranks(1, logits_of(moe, DType::kF32), 2), whole);
  EXPECT_EQ(run_ranks(1, logits_of(moe, DType::kF32), 3), whole);
  EXPECT_LE(largest_relative_difference(whole, run_ranks(2, logits_of(moe, DType::kF32), 2), moe.vocab_size), 1e-5);
  // More stages than layers, or a stage without its communicator, is refused.
  auto four = plan_shard(moe, TensorParallel{}, "moe", PipelineParallel{0, 4});
  ASSERT_FALSE(four.ok());
  EXPECT_EQ(four.status().message(), "moe: --pipeline-parallel-size 4 is more than the 3 layers");
  EXPECT_FALSE(plan_shard(moe, TensorParallel{}, "moe", PipelineParallel{0, 2}).ok());
}

// A weight type whose blocks a rank's share would cut is refused at load, naming the tensor.
TEST(TensorParallelModel, BlocksCutByTheShardsAreRefused) {
  ModelConfig cfg = small_config();
  cfg.hidden_size = 64;
  cfg.head_dim = 16;
  cfg.intermediate_size = 96;  // 48 per rank: not whole blocks of 32
  // Each rank reports its own load error; the first rank's is the test's.
  auto body = [cfg](const TensorParallel& tp, const PipelineParallel&) -> Result<std::vector<float>> {
    PAGODA_ASSIGN_OR_RETURN(WeightMap w, make_dummy_weights(cfg, DType::kQ8_0, 5, "dummy"));
    PAGODA_ASSIGN_OR_RETURN(std::unique_ptr<cpu::CpuBackend> backend, cpu::CpuBackend::create({.threads = 1}));
    ModelSource source{"dummy.gguf", LoadFormat::kDummy, cfg, std::move(w)};
    Result<std::unique_ptr<Model>> model = create_model(std::move(source), *backend, tp);
    if (model.ok()) return internal_error("the model loaded");
    const std::string message = model.status().message();
    return std::vector<float>(message.begin(), message.end());
  };
  const std::vector<float> chars = run_ranks(2, body);
  const std::string message(chars.begin(), chars.end());
  EXPECT_NE(message.find("dummy.gguf: tensor blk.0.ffn_down.weight (tensor-parallel rank 0 of 2) is q8_0 in blocks of "
                         "32 columns, and its columns [0, 48) cut a block"),
            std::string::npos)
      << message;
}

}  // namespace
}  // namespace pagoda
