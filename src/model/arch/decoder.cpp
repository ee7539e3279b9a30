#include "model/arch/decoder.h"

#include <algorithm>
#include <string>
#include <vector>

#include "base/check.h"
#include "model/layers/attention.h"
#include "model/layers/rope_freqs.h"

namespace pagoda {
namespace {

class DecoderModel final : public Model {
 public:
  DecoderModel(ModelSource source, const Backend& backend)
      : source_(std::move(source)), cfg_(source_.config), k_(backend.kernels()) {}

  Status init(const Backend& backend, const ArchitectureSpec& spec);

  const ModelConfig& config() const override { return cfg_; }
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
  Tensor token_embd_;          // [vocab, hidden], as loaded or converted (the embedding reads its rows)
  Buffer token_embd_storage_;  // token_embd_'s memory when converted
  Linear lm_head_;             // [vocab, hidden]; a packed copy of token_embd_ when tied
  F32Vector output_norm_;
  std::vector<Layer> layers_;
  std::vector<float> inv_freq_;  // [head_dim / 2]

  std::vector<float> x_;        // the residual stream [T, hidden]
  Workspace ws_;                // the blocks' scratch
  std::vector<float> picked_;   // compute_logits: the selected hidden rows
};

Status DecoderModel::init(const Backend& backend, const ArchitectureSpec& spec) {
  WeightLoader w(source_, backend);
  const int64_t hidden = cfg_.hidden_size;
  // Tied embeddings are one tensor, typed as llama-quantize types a tied one: as the output.
  const std::string embd_slot = cfg_.tie_word_embeddings ? "output.weight" : "token_embd.weight";
  PAGODA_ASSIGN_OR_RETURN(token_embd_, w.matrix("token_embd.weight", cfg_.vocab_size, hidden));
  PAGODA_ASSIGN_OR_RETURN(token_embd_, w.convert("token_embd.weight", embd_slot, token_embd_, &token_embd_storage_));
  if (cfg_.tie_word_embeddings) {
    // The embedding table as it is now (converted once above), packed for the matmul.
    lm_head_ = Linear::dense(k_, token_embd_, Buffer());
    lm_head_.set_name("output.weight");
  } else {
    PAGODA_ASSIGN_OR_RETURN(lm_head_, w.linear("output.weight", cfg_.vocab_size, hidden));
  }
  PAGODA_ASSIGN_OR_RETURN(output_norm_, w.vector("output_norm.weight", hidden));
  layers_.reserve(static_cast<size_t>(cfg_.num_layers));
  for (int64_t i = 0; i < cfg_.num_layers; ++i) {
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
  if (!cfg_.tie_word_embeddings || lm_head_.dense_weight().data != token_embd_.data) bytes += lm_head_.weight_bytes();
  for (const Layer& l : layers_) bytes += l.attention.weight_bytes() + l.feed_forward->weight_bytes();
  return bytes;
}

Tensor DecoderModel::forward(const ForwardBatch& batch, const KvCacheTensors& kv) {
  const int64_t n = batch.num_tokens(), hidden = cfg_.hidden_size;
  if (static_cast<int64_t>(x_.size()) < n * hidden) x_.resize(static_cast<size_t>(n * hidden));
  ws_.ensure(n, cfg_);
  float* x = x_.data();
  k_.embedding(token_embd_, batch.token_ids.data(), n, x);
  for (size_t li = 0; li < layers_.size(); ++li) {
    const Layer& l = layers_[li];
    l.attention.forward(k_, batch, kv.layer(static_cast<int64_t>(li)), inv_freq_.data(), x, ws_);
    l.feed_forward->forward(k_, n, x, ws_);
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
  lm_head_.apply(k_, picked_.data(), num_rows, logits);
}

}  // namespace

Result<std::unique_ptr<Model>> create_decoder_model(ModelSource source, const Backend& backend,
                                                    const ArchitectureSpec& spec) {
  PAGODA_RETURN_IF_ERROR(source.config.validate(source.path));
  auto model = std::make_unique<DecoderModel>(std::move(source), backend);
  PAGODA_RETURN_IF_ERROR(model->init(backend, spec));
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace pagoda
