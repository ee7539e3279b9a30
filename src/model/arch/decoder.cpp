#include "model/arch/decoder.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/send_queue.h"
#include "base/check.h"
#include "model/layers/attention.h"
#include "model/layers/rope_freqs.h"

namespace pagoda {
namespace {

class DecoderModel final : public Model {
 public:
  DecoderModel(ModelSource source, const Backend& backend, ShardPlan plan)
      : source_(std::move(source)), cfg_(source_.config), k_(backend.kernels()), plan_(std::move(plan)) {}

  Status init(const Backend& backend, const ArchitectureSpec& spec);

  const ModelConfig& config() const override { return cfg_; }
  const ModelConfig& shard_config() const override { return plan_.local; }
  bool computes_logits() const override { return plan_.last_stage(); }
  int64_t weight_bytes() const override;
  Tensor forward(const ForwardBatch& batch, const KvCacheTensors& kv) override;
  void compute_logits(const Tensor& hidden, const int64_t* rows, int64_t num_rows, float* logits) override;

 private:
  struct Layer {
    AttentionBlock attention;
    std::unique_ptr<FeedForward> feed_forward;
  };

  ModelSource source_;
  const ModelConfig& cfg_;
  const Kernels k_;  // a copy: function pointers, so the Backend object need not outlive the model
  const ShardPlan plan_;       // the whole model, or this tensor-parallel rank's shard
  Tensor token_embd_;          // [vocab, hidden] (this rank's rows), as loaded or converted
  Buffer token_embd_storage_;  // token_embd_'s memory when converted
  Linear lm_head_;             // [vocab, hidden] (this rank's rows); a packed copy of token_embd_ when tied
  F32Vector output_norm_;
  std::vector<Layer> layers_;
  std::vector<float> inv_freq_;  // [head_dim / 2]

  std::vector<float> x_;        // the residual stream [T, hidden]
  Workspace ws_;                // the blocks' scratch
  std::vector<float> picked_;   // compute_logits: the selected hidden rows
  // Tensor parallelism: the tokens' ids in this rank's vocabulary rows; this rank's logits padded
  // to vocab_per_rank, and every rank's gathered.
  std::vector<TokenId> local_ids_;
  std::vector<float> picked_logits_, rank_logits_, gathered_logits_;
};

Status DecoderModel::init(const Backend& backend, const ArchitectureSpec& spec) {
  WeightLoader w(source_, backend, plan_);
  const int64_t hidden = cfg_.hidden_size;
  // Tied embeddings are one tensor, typed as llama-quantize types a tied one: as the output.
  const std::string embd_slot = cfg_.tie_word_embeddings ? "output.weight" : "token_embd.weight";
  // Under pipeline parallelism the first stage looks up the embedding and the last one holds the
  // final norm and the LM head (the embedding too when the head is tied to it).
  const bool last = plan_.last_stage();
  if (plan_.first_stage() || (last && cfg_.tie_word_embeddings)) {
    PAGODA_ASSIGN_OR_RETURN(token_embd_, w.matrix_rows("token_embd.weight", cfg_.vocab_size, hidden, plan_.vocab));
    PAGODA_ASSIGN_OR_RETURN(token_embd_, w.convert("token_embd.weight", embd_slot, token_embd_, &token_embd_storage_));
  }
  if (last && cfg_.tie_word_embeddings) {
    // The embedding table as it is now (converted once above), packed for the matmul.
    lm_head_ = Linear::dense(k_, token_embd_, Buffer());
    lm_head_.set_name("output.weight");
  } else if (last) {
    PAGODA_ASSIGN_OR_RETURN(lm_head_,
                            w.linear("output.weight", cfg_.vocab_size, hidden, {}, Slice::rows(plan_.vocab)));
  }
  if (last) {
    PAGODA_ASSIGN_OR_RETURN(output_norm_, w.vector("output_norm.weight", hidden));
  }
  layers_.reserve(static_cast<size_t>(plan_.layers.size()));
  for (int64_t i = plan_.layers.begin; i < plan_.layers.end; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    PAGODA_ASSIGN_OR_RETURN(AttentionBlock attention, AttentionBlock::load(w, p, cfg_));
    PAGODA_ASSIGN_OR_RETURN(std::unique_ptr<FeedForward> ffn, spec.feed_forward(w, p, cfg_, i));
    layers_.push_back(Layer{std::move(attention), std::move(ffn)});
  }
  inv_freq_ = rope_inv_freq(cfg_);
  w.log_types();
  return Status::ok_status();
}

int64_t DecoderModel::weight_bytes() const {
  // A tied LM head is a separate copy only when packing or conversion made one.
  int64_t bytes = token_embd_.nbytes() + output_norm_.bytes();
  if (plan_.last_stage() && (!cfg_.tie_word_embeddings || lm_head_.dense_weight().data != token_embd_.data)) {
    bytes += lm_head_.weight_bytes();
  }
  for (const Layer& l : layers_) bytes += l.attention.weight_bytes() + l.feed_forward->weight_bytes();
  return bytes;
}

Tensor DecoderModel::forward(const ForwardBatch& batch, const KvCacheTensors& kv) {
  const int64_t n = batch.num_tokens(), hidden = cfg_.hidden_size;
  if (static_cast<int64_t>(x_.size()) < n * hidden) x_.resize(static_cast<size_t>(n * hidden));
  ws_.ensure(n, plan_.local);
  float* x = x_.data();
  const int64_t stream_bytes = n * hidden * static_cast<int64_t>(sizeof(float));
  if (!plan_.first_stage()) {
    // The residual stream as the previous stage left it.
    if (Status st = plan_.pp.comm->recv(x, stream_bytes, plan_.pp.prev); !st.ok()) {
      throw std::runtime_error("pipeline stage " + std::to_string(plan_.pp.stage) + " receiving from rank " +
                               std::to_string(plan_.pp.prev) + ": " + st.message());
    }
  } else if (!plan_.sharded()) {
    k_.embedding(token_embd_, batch.token_ids.data(), n, x);
  } else {
    // Vocabulary-parallel: each rank looks up the tokens in its rows, zeros the others' rows,
    // and the all-reduce puts every row together.
    const IndexRange v = plan_.vocab;
    local_ids_.resize(static_cast<size_t>(n));
    for (int64_t t = 0; t < n; ++t) {
      const TokenId id = batch.token_ids[static_cast<size_t>(t)];
      local_ids_[static_cast<size_t>(t)] = id >= v.begin && id < v.end ? static_cast<TokenId>(id - v.begin) : 0;
    }
    if (v.size() > 0) k_.embedding(token_embd_, local_ids_.data(), n, x);
    for (int64_t t = 0; t < n; ++t) {
      const TokenId id = batch.token_ids[static_cast<size_t>(t)];
      if (v.size() == 0 || id < v.begin || id >= v.end) std::fill_n(x + t * hidden, hidden, 0.0f);
    }
    all_reduce_or_throw(plan_.tp, x, n * hidden);
  }
  for (size_t li = 0; li < layers_.size(); ++li) {
    const Layer& l = layers_[li];
    l.attention.forward(k_, batch, kv.layer(static_cast<int64_t>(li)), inv_freq_.data(), x, ws_);
    l.feed_forward->forward(k_, n, x, ws_);
  }
  if (!plan_.last_stage()) {
    // On to the next stage (queued: this stage goes on with the next step meanwhile).
    const auto* bytes = reinterpret_cast<const uint8_t*>(x);
    if (Status st = plan_.pp.sender->post(plan_.pp.next, std::vector<uint8_t>(bytes, bytes + stream_bytes)); !st.ok()) {
      throw std::runtime_error("pipeline stage " + std::to_string(plan_.pp.stage) + " sending to rank " +
                               std::to_string(plan_.pp.next) + ": " + st.message());
    }
    return Tensor();
  }
  float* h = ws_.h.data();
  k_.rms_norm(x, output_norm_.ptr(), n, hidden, static_cast<float>(cfg_.rms_norm_eps), h);
  return Tensor(h, DType::kF32, {n, hidden});
}

void DecoderModel::compute_logits(const Tensor& hidden, const int64_t* rows, int64_t num_rows, float* logits) {
  const int64_t dim = cfg_.hidden_size;
  picked_.resize(static_cast<size_t>(num_rows * dim));
  for (int64_t i = 0; i < num_rows; ++i) {
    PAGODA_CHECK(rows[i] >= 0 && rows[i] < hidden.dim(0));
    const float* src = hidden.as<float>() + rows[i] * dim;
    std::copy(src, src + dim, picked_.begin() + i * dim);
  }
  if (!plan_.sharded()) {
    lm_head_.apply(k_, picked_.data(), num_rows, logits);
    return;
  }
  // Vocabulary-parallel: each rank's rows of the vocabulary, padded to vocab_per_rank, gathered.
  const int64_t per = plan_.vocab_per_rank, mine = plan_.vocab.size(), ranks = plan_.tp.size;
  rank_logits_.assign(static_cast<size_t>(num_rows * per), 0.0f);
  gathered_logits_.resize(static_cast<size_t>(ranks * num_rows * per));
  if (mine > 0) {
    picked_logits_.resize(static_cast<size_t>(num_rows * mine));
    lm_head_.apply(k_, picked_.data(), num_rows, picked_logits_.data());
    for (int64_t i = 0; i < num_rows; ++i) {
      std::copy_n(picked_logits_.data() + i * mine, mine, rank_logits_.data() + i * per);
    }
  }
  const int64_t bytes = num_rows * per * static_cast<int64_t>(sizeof(float));
  if (Status st = plan_.tp.comm->all_gather(rank_logits_.data(), bytes, gathered_logits_.data()); !st.ok()) {
    throw std::runtime_error("tensor-parallel all-gather of the logits: " + st.message());
  }
  const int64_t vocab = cfg_.vocab_size;
  for (int64_t r = 0; r < ranks; ++r) {
    const int64_t begin = r * per, width = std::clamp<int64_t>(vocab - begin, 0, per);
    for (int64_t i = 0; i < num_rows; ++i) {
      std::copy_n(gathered_logits_.data() + (r * num_rows + i) * per, width, logits + i * vocab + begin);
    }
  }
}

}  // namespace

Result<std::unique_ptr<Model>> create_decoder_model(ModelSource source, const Backend& backend,
                                                    const ArchitectureSpec& spec, const TensorParallel& tp,
                                                    const PipelineParallel& pp) {
  PAGODA_RETURN_IF_ERROR(source.config.validate(source.path));
  PAGODA_ASSIGN_OR_RETURN(ShardPlan plan, plan_shard(source.config, tp, source.path, pp));
  auto model = std::make_unique<DecoderModel>(std::move(source), backend, std::move(plan));
  PAGODA_RETURN_IF_ERROR(model->init(backend, spec));
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace pagoda
