#include "model/arch/decoder.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/send_queue.h"
#include "base/check.h"
#include "model/layers/attention.h"
#include "model/layers/rope_freqs.h"
#include "model/quant/quant_method.h"

namespace pagoda {
namespace {

class DecoderModel final : public Model {
 public:
  DecoderModel(ModelSource source, const Backend& backend, ShardPlan plan)
      : source_(std::move(source)), cfg_(source_.config), k_(backend.kernels()), plan_(std::move(plan)) {}

  Status init(const Backend& backend, const ArchitectureSpec& spec, std::optional<QuantMix> mix);

  const ModelConfig& config() const override { return cfg_; }
  const Kernels& kernels() const override { return k_; }
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
  const Kernels k_;  // a copy: it keeps the backend's context alive, so the Backend object need not
  const ShardPlan plan_;       // the whole model, or this tensor-parallel rank's shard
  Tensor token_embd_;          // [vocab, hidden] (this rank's rows), as loaded or converted, uploaded
  Buffer token_embd_storage_;  // token_embd_'s memory when converted or copied to the device
  Linear lm_head_;             // [vocab, hidden] (this rank's rows); a packed copy of token_embd_ when tied
  F32Vector output_norm_;
  std::vector<Layer> layers_;
  F32Vector inv_freq_;           // [head_dim / 2]

  // Device memory: the residual stream [T, hidden], the blocks' scratch, compute_logits' selected
  // hidden rows and logits; under tensor parallelism this rank's logits, padded to vocab_per_rank,
  // and every rank's gathered.
  Buffer x_;
  Workspace ws_;
  Buffer picked_, logits_, picked_logits_, rank_logits_, gathered_logits_;
  std::vector<uint8_t> stream_;  // pipeline parallelism: the residual stream on its way (host)
};

Status DecoderModel::init(const Backend& backend, const ArchitectureSpec& spec, std::optional<QuantMix> mix) {
  WeightLoader w(source_, backend, plan_, std::move(mix));
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
    lm_head_ = make_dense_linear(k_, token_embd_, Buffer());
    lm_head_.set_name("output.weight");
  }
  if (token_embd_.data != nullptr) {  // the table the embedding reads, in the device's memory
    Buffer uploaded;
    token_embd_ = k_.upload(token_embd_, &uploaded);
    if (uploaded.size() > 0) token_embd_storage_ = std::move(uploaded);
  }
  if (last && !cfg_.tie_word_embeddings) {
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
  const std::vector<float> inv_freq = rope_inv_freq(cfg_);
  inv_freq_.data = k_.allocate(inv_freq.size() * sizeof(float));
  k_.copy_to_device(inv_freq_.data.data(), inv_freq.data(), inv_freq.size() * sizeof(float));
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
  float* x = device_floats(k_, x_, n * hidden);
  ws_.ensure(k_, n, plan_.local);
  const int64_t stream_bytes = n * hidden * static_cast<int64_t>(sizeof(float));
  if (!plan_.first_stage()) {
    // The residual stream as the previous stage left it (host bytes over the communicator).
    stream_.resize(static_cast<size_t>(stream_bytes));
    if (Status st = plan_.pp.comm->recv(stream_.data(), stream_bytes, plan_.pp.prev); !st.ok()) {
      throw std::runtime_error("pipeline stage " + std::to_string(plan_.pp.stage) + " receiving from rank " +
                               std::to_string(plan_.pp.prev) + ": " + st.message());
    }
    k_.copy_to_device(x, stream_.data(), stream_.size());
  } else {
    // Vocabulary-parallel: each rank looks up the tokens in its rows (the others' rows are zeros)
    // and the all-reduce puts every row together.
    k_.embedding(token_embd_, batch.token_ids.data(), n, plan_.vocab.begin, x);
    all_reduce_or_throw(k_, plan_.tp, x, n * hidden);
  }
  for (size_t li = 0; li < layers_.size(); ++li) {
    const Layer& l = layers_[li];
    l.attention.forward(k_, batch, kv.layer(static_cast<int64_t>(li)), inv_freq_.ptr(), x, ws_);
    l.feed_forward->forward(k_, n, x, ws_);
  }
  if (!plan_.last_stage()) {
    // On to the next stage (queued: this stage goes on with the next step meanwhile).
    std::vector<uint8_t> bytes(static_cast<size_t>(stream_bytes));
    k_.copy_to_host(bytes.data(), x, bytes.size());
    if (Status st = plan_.pp.sender->post(plan_.pp.next, std::move(bytes)); !st.ok()) {
      throw std::runtime_error("pipeline stage " + std::to_string(plan_.pp.stage) + " sending to rank " +
                               std::to_string(plan_.pp.next) + ": " + st.message());
    }
    return Tensor();
  }
  float* h = ws_.h.as<float>();
  k_.rms_norm(x, output_norm_.ptr(), n, hidden, static_cast<float>(cfg_.rms_norm_eps), h);
  return Tensor(h, DType::kF32, {n, hidden});
}

void DecoderModel::compute_logits(const Tensor& hidden, const int64_t* rows, int64_t num_rows, float* logits) {
  const int64_t dim = cfg_.hidden_size, vocab = cfg_.vocab_size;
  for (int64_t i = 0; i < num_rows; ++i) PAGODA_CHECK(rows[i] >= 0 && rows[i] < hidden.dim(0));
  float* picked = device_floats(k_, picked_, num_rows * dim);
  k_.gather_rows(hidden.as<float>(), rows, num_rows, dim, picked);
  float* out = device_floats(k_, logits_, num_rows * vocab);
  if (!plan_.sharded()) {
    lm_head_.apply(k_, picked, num_rows, out);
  } else {
    // Vocabulary-parallel: each rank's rows of the vocabulary, padded to vocab_per_rank, gathered.
    const int64_t per = plan_.vocab_per_rank, mine = plan_.vocab.size(), ranks = plan_.tp.size;
    float* rank_logits = device_floats(k_, rank_logits_, num_rows * per);
    float* gathered = device_floats(k_, gathered_logits_, ranks * num_rows * per);
    k_.zero(rank_logits, static_cast<size_t>(num_rows * per) * sizeof(float));
    if (mine > 0) {
      float* picked_logits = device_floats(k_, picked_logits_, num_rows * mine);
      lm_head_.apply(k_, picked, num_rows, picked_logits);
      k_.copy_rows(rank_logits, per, picked_logits, mine, num_rows, mine);
    }
    const int64_t bytes = num_rows * per * static_cast<int64_t>(sizeof(float));
    if (Status st = k_.all_gather(*plan_.tp.comm, rank_logits, bytes, gathered); !st.ok()) {
      throw std::runtime_error("tensor-parallel all-gather of the logits: " + st.message());
    }
    for (int64_t r = 0; r < ranks; ++r) {
      const int64_t begin = r * per, width = std::clamp<int64_t>(vocab - begin, 0, per);
      if (width > 0) k_.copy_rows(out + begin, vocab, gathered + r * num_rows * per, per, num_rows, width);
    }
  }
  k_.copy_to_host(logits, out, static_cast<size_t>(num_rows * vocab) * sizeof(float));
}

}  // namespace

Result<std::unique_ptr<Model>> create_decoder_model(ModelSource source, const Backend& backend,
                                                    const ArchitectureSpec& spec, const TensorParallel& tp,
                                                    const PipelineParallel& pp, std::optional<QuantMix> mix) {
  PAGODA_RETURN_IF_ERROR(source.config.validate(source.path));
  PAGODA_ASSIGN_OR_RETURN(ShardPlan plan, plan_shard(source.config, tp, source.path, pp));
  auto model = std::make_unique<DecoderModel>(std::move(source), backend, std::move(plan));
  PAGODA_RETURN_IF_ERROR(model->init(backend, spec, std::move(mix)));
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace pagoda
