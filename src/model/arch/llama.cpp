#include "model/arch/llama.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "base/log.h"
#include "loader/packed_linear.h"
#include "loader/quant_mix.h"
#include "model/layers/linear.h"
#include "model/layers/rope_freqs.h"
#include "tensor/convert.h"

namespace pagoda {
namespace {

// A small tensor (norm weight, bias) converted to f32 once at load.
struct F32Vector {
  Buffer data;
  const float* ptr() const { return data.as<float>(); }
};

struct LayerWeights {
  F32Vector attn_norm, ffn_norm;
  Linear wq, wk, wv, wo;            // [out, in]
  F32Vector bq, bk, bv;             // Qwen2 only
  F32Vector q_norm, k_norm;         // Qwen3 only, [head_dim]
  Linear w_gate, w_up, w_down;
};

class LlamaModel final : public Model {
 public:
  LlamaModel(ModelSource source, const Backend& backend)
      : source_(std::move(source)), cfg_(source_.config), k_(backend.kernels()) {}

  Status init(const Backend& backend);

  const ModelConfig& config() const override { return cfg_; }
  int64_t weight_bytes() const override;
  Tensor forward(const ForwardBatch& batch, const KvCacheTensors& kv) override;
  void compute_logits(const Tensor& hidden, const int64_t* rows, int64_t num_rows,
                      float* logits) override;

 private:
  Result<Tensor> matrix(const std::string& name, int64_t rows, int64_t cols);
  // t (the tensor `name`) converted to the type source_.weight_mix gives it, into *storage;
  // float weights only (quantized ones stay as stored), and t itself without a mix. The mix's
  // rules see `slot_name` (a tied LM head is output.weight).
  Result<Tensor> convert(const std::string& name, const std::string& slot_name, Tensor t, Buffer* storage);
  // A projection: the tensor `name` converted as above, or quantized to integer codes under an
  // int-codes mix, or a checkpoint's packed codes (AWQ, GPTQ, ...), in the backend's packed layout
  // where it has one.
  Result<Linear> linear(const std::string& name, int64_t rows, int64_t cols, const std::string& slot_name = {});
  // A projection stored as int8 codes (i8) with its scales beside it (a W8A8 checkpoint).
  Result<Linear> int8_linear(const std::string& name, const Tensor& codes);
  Result<F32Vector> vector(const std::string& name, int64_t len);
  void add_bias(float* x, int64_t rows, const F32Vector& bias, int64_t len);
  void ensure_workspace(int64_t num_tokens);

  ModelSource source_;
  const ModelConfig& cfg_;
  const Kernels k_;  // a copy: function pointers, so the Backend object need not outlive the model
  const Backend* backend_ = nullptr;  // set during init() only; the model keeps a copy of k_
  Tensor token_embd_;   // [vocab, hidden], as loaded or converted (the embedding reads its rows)
  Buffer token_embd_storage_;  // token_embd_'s memory when converted
  Linear lm_head_;      // [vocab, hidden]; a packed copy of token_embd_ when tied
  F32Vector output_norm_;
  std::vector<LayerWeights> layers_;
  std::vector<float> inv_freq_;  // [head_dim / 2]

  // Workspace, grown to the largest batch seen: x, h [T, hidden]; q, attn [T, heads*hd];
  // k, v [T, kv_heads*hd]; gate, up [T, inter].
  int64_t capacity_ = 0;
  std::vector<float> x_, h_, q_, k_buf_, v_buf_, attn_, gate_, up_;
  std::vector<float> picked_;  // compute_logits: the selected hidden rows
  std::map<DType, int> converted_types_;  // init, with a weight mix: how many matrices are of each type
  std::map<std::string, int> int_types_;  // and how many became integer codes, by Linear::type_name
};

Result<Tensor> LlamaModel::matrix(const std::string& name, int64_t rows, int64_t cols) {
  PAGODA_ASSIGN_OR_RETURN(Tensor t, source_.weights.get(name, {rows, cols}));
  if (!backend_->supports_weight_type(t.dtype)) {
    return unimplemented(source_.path + ": backend " + backend_->name() +
                         " cannot compute on tensor " + name + " of type " +
                         std::string(dtype_name(t.dtype)));
  }
  return t;
}

Result<Tensor> LlamaModel::convert(const std::string& name, const std::string& slot_name, Tensor t,
                                   Buffer* storage) {
  if (!source_.weight_mix) return t;
  // Under an int-codes mix what is not a layer projection stays as stored (linear() takes those).
  if (is_quantized(t.dtype) || source_.weight_mix->rule == QuantMixRule::kIntCodes) {
    ++converted_types_[t.dtype];
    return t;
  }
  const WeightSlot slot{slot_name, cfg_.num_layers, cfg_.num_heads / std::max<int64_t>(1, cfg_.num_kv_heads)};
  const DType to = quant_mix_type(*source_.weight_mix, slot, t.row_len());
  ++converted_types_[to];
  if (to == t.dtype) return t;
  if (!backend_->supports_weight_type(to)) {
    return unimplemented(source_.path + ": backend " + backend_->name() + " cannot compute on tensor " + name +
                         " converted to " + std::string(dtype_name(to)));
  }
  Tensor out(nullptr, to, {t.num_rows(), t.row_len()});
  *storage = Buffer(static_cast<size_t>(out.nbytes()));
  out.data = storage->data();
  std::vector<float> row(static_cast<size_t>(t.row_len()));
  for (int64_t r = 0; r < t.num_rows(); ++r) {
    dequantize_row(t.dtype, t.row(r), row.data(), t.row_len());
    quantize_row(to, row.data(), storage->as<uint8_t>() + r * out.row_bytes(), t.row_len());
  }
  return out;
}

Result<Linear> LlamaModel::int8_linear(const std::string& name, const Tensor& codes) {
  // The scales beside the codes (compressed-tensors names: "<weight>_scale", "<...>.input_scale").
  const std::string base = name.substr(0, name.size() - 6);  // without "weight"
  const std::string scale_name = base + "weight_scale", input_name = base + "input_scale";
  const Tensor* scale = source_.weights.find(scale_name);
  if (scale == nullptr) {
    return data_loss(source_.path + ": tensor " + name + " holds int8 codes but " + scale_name + " is missing");
  }
  const int64_t rows = codes.num_rows(), cols = codes.row_len();
  const int bits = cfg_.quantization.bits == 4 ? 4 : 8;
  const int64_t group = cfg_.quantization.group_size > 0 ? cfg_.quantization.group_size : cols;
  const int64_t groups = cols % group == 0 ? cols / group : 0;
  const bool per_channel = scale->numel() == rows && (scale->ndim == 1 || (scale->ndim == 2 && scale->dim(1) == 1));
  const bool per_tensor = scale->numel() == 1 && bits == 8;
  const bool per_group = groups > 1 && scale->ndim == 2 && scale->dim(0) == rows && scale->dim(1) == groups;
  if (!(per_channel || per_tensor || per_group) || !dtype_traits(scale->dtype).dense_matmul || is_quantized(scale->dtype)) {
    const std::string want = groups > 1 ? "per group [" + std::to_string(rows) + ", " + std::to_string(groups) + "]"
                                        : "per output channel [" + std::to_string(rows) + ", 1]" +
                                              (bits == 8 ? " or per tensor [1]" : "");
    return data_loss(source_.path + ": tensor " + scale_name + " " + scale->shape_string() + " " +
                     std::string(dtype_name(scale->dtype)) + " is not a float scale " + want + " of " + name + " " +
                     codes.shape_string());
  }
  std::vector<float> values(static_cast<size_t>(scale->numel()));
  dequantize_row(scale->dtype, scale->data, values.data(), scale->numel());
  if (per_tensor) values.assign(static_cast<size_t>(rows), values[0]);
  for (float v : values) {
    if (!(v >= 0) || !std::isfinite(v)) {
      return data_loss(source_.path + ": tensor " + scale_name + " has a scale that is negative or not finite");
    }
  }
  float input_scale = 0;
  if (const Tensor* in = source_.weights.find(input_name)) {
    if (in->numel() != 1 || !dtype_traits(in->dtype).dense_matmul || is_quantized(in->dtype)) {
      return data_loss(source_.path + ": tensor " + input_name + " " + in->shape_string() + " is not one float scale");
    }
    dequantize_row(in->dtype, in->data, &input_scale, 1);
    if (!(input_scale > 0) || !std::isfinite(input_scale)) {
      return data_loss(source_.path + ": tensor " + input_name + " is not a positive finite scale");
    }
  } else if (cfg_.quantization.static_input_scales) {
    return data_loss(source_.path + ": the checkpoint declares static activation scales but " + input_name +
                     " is missing");
  }
  if (bits == 8 && !per_group) {
    ++int_types_["w8a8 (checkpoint)"];
    return Linear::int8_codes(k_, codes, std::move(values), input_scale);
  }
  // int4 codes one per byte (W4A8, as compressed-tensors' int-quantized format stores them), in
  // groups: packed two per byte for the int4 kernel.
  if (bits == 4 && (cols % 2 != 0 || (group != cols && group % 8 != 0))) {
    return data_loss(source_.path + ": tensor " + name + " " + codes.shape_string() + " has rows that are not whole " +
                     "int4 pairs and groups of " + std::to_string(group));
  }
  IntCodes c;
  c.bits = bits;
  c.n = rows;
  c.k = cols;
  c.group_size = per_channel ? cols : group;
  c.method = bits == 4 ? "w4a8" : "w8a8";
  c.input_scale = input_scale;
  c.scales = std::move(values);
  const int64_t row_bytes = bits == 8 ? cols : cols / 2;
  c.codes.assign(static_cast<size_t>(rows * row_bytes), 0);
  for (int64_t j = 0; j < rows; ++j) {
    const auto* in = static_cast<const int8_t*>(codes.data) + j * cols;
    uint8_t* out = c.codes.data() + j * row_bytes;
    for (int64_t t = 0; t < cols; ++t) {
      if (bits == 8) {
        out[t] = static_cast<uint8_t>(in[t]);
      } else if (in[t] < -8 || in[t] > 7) {
        return data_loss(source_.path + ": tensor " + name + " holds " + std::to_string(in[t]) +
                         ", outside the 4-bit range [-8, 7] (row " + std::to_string(j) + ")");
      } else {
        out[t / 2] |= static_cast<uint8_t>((in[t] & 0xF) << (4 * (t % 2)));
      }
    }
  }
  Linear l = Linear::int_codes(k_, std::move(c));
  ++int_types_[l.type_name() + " (checkpoint)"];
  return l;
}

Result<Linear> LlamaModel::linear(const std::string& name, int64_t rows, int64_t cols, const std::string& slot_name) {
  if (source_.weights.find(name) == nullptr && has_packed_linear(source_.weights, name, cfg_.quantization)) {
    PAGODA_ASSIGN_OR_RETURN(IntCodes codes, read_packed_linear(source_.weights, name, rows, cols, cfg_.quantization));
    Linear l = Linear::int_codes(k_, std::move(codes));
    ++int_types_[l.type_name() + " (checkpoint)"];
    l.set_name(name);
    return l;
  }
  if (const Tensor* stored = source_.weights.find(name); stored != nullptr && stored->dtype == DType::kI8) {
    PAGODA_ASSIGN_OR_RETURN(Tensor codes, source_.weights.get(name, {rows, cols}));
    PAGODA_ASSIGN_OR_RETURN(Linear l, int8_linear(name, codes));
    l.set_name(name);
    return l;
  }
  PAGODA_ASSIGN_OR_RETURN(Tensor t, matrix(name, rows, cols));
  const std::string& slot = slot_name.empty() ? name : slot_name;
  if (source_.weight_mix && quant_mix_int_codes(*source_.weight_mix, WeightSlot{slot}) && !is_quantized(t.dtype)) {
    int bits = source_.weight_mix->int_bits;
    const int64_t group = quant_mix_int_group(*source_.weight_mix, cols);
    if (bits == 4 && cols % 2 != 0) bits = 8;  // no whole int4 pairs: int8 per channel
    Linear l = Linear::quantize_int(k_, t, bits, bits == 8 && group != cols ? cols : group);
    ++int_types_[l.type_name()];
    l.set_name(name);
    return l;
  }
  Buffer converted;
  PAGODA_ASSIGN_OR_RETURN(t, convert(name, slot, t, &converted));
  Linear l = Linear::dense(k_, t, std::move(converted));
  l.set_name(name);
  return l;
}

Result<F32Vector> LlamaModel::vector(const std::string& name, int64_t len) {
  PAGODA_ASSIGN_OR_RETURN(Tensor t, source_.weights.get(name, {len}));
  F32Vector v{Buffer(static_cast<size_t>(len) * sizeof(float))};
  dequantize_row(t.dtype, t.data, v.data.as<float>(), len);
  return v;
}

Status LlamaModel::init(const Backend& backend) {
  backend_ = &backend;
  const int64_t hidden = cfg_.hidden_size, hd = cfg_.head_dim;
  const int64_t q_dim = cfg_.num_heads * hd, kv_dim = cfg_.num_kv_heads * hd;
  // Tied embeddings are one tensor, typed as llama-quantize types a tied one: as the output.
  const std::string embd_slot = cfg_.tie_word_embeddings ? "output.weight" : "token_embd.weight";
  PAGODA_ASSIGN_OR_RETURN(token_embd_, matrix("token_embd.weight", cfg_.vocab_size, hidden));
  PAGODA_ASSIGN_OR_RETURN(token_embd_, convert("token_embd.weight", embd_slot, token_embd_, &token_embd_storage_));
  if (cfg_.tie_word_embeddings) {
    // The embedding table as it is now (converted once above), packed for the matmul.
    lm_head_ = Linear::dense(k_, token_embd_, Buffer());
    lm_head_.set_name("output.weight");
  } else {
    PAGODA_ASSIGN_OR_RETURN(lm_head_, linear("output.weight", cfg_.vocab_size, hidden));
  }
  PAGODA_ASSIGN_OR_RETURN(output_norm_, vector("output_norm.weight", hidden));
  layers_.resize(static_cast<size_t>(cfg_.num_layers));
  for (int64_t i = 0; i < cfg_.num_layers; ++i) {
    LayerWeights& l = layers_[static_cast<size_t>(i)];
    const std::string p = "blk." + std::to_string(i) + ".";
    PAGODA_ASSIGN_OR_RETURN(l.attn_norm, vector(p + "attn_norm.weight", hidden));
    PAGODA_ASSIGN_OR_RETURN(l.ffn_norm, vector(p + "ffn_norm.weight", hidden));
    PAGODA_ASSIGN_OR_RETURN(l.wq, linear(p + "attn_q.weight", q_dim, hidden));
    PAGODA_ASSIGN_OR_RETURN(l.wk, linear(p + "attn_k.weight", kv_dim, hidden));
    PAGODA_ASSIGN_OR_RETURN(l.wv, linear(p + "attn_v.weight", kv_dim, hidden));
    PAGODA_ASSIGN_OR_RETURN(l.wo, linear(p + "attn_output.weight", hidden, q_dim));
    if (cfg_.attention_bias) {
      PAGODA_ASSIGN_OR_RETURN(l.bq, vector(p + "attn_q.bias", q_dim));
      PAGODA_ASSIGN_OR_RETURN(l.bk, vector(p + "attn_k.bias", kv_dim));
      PAGODA_ASSIGN_OR_RETURN(l.bv, vector(p + "attn_v.bias", kv_dim));
    }
    if (cfg_.qk_norm) {
      PAGODA_ASSIGN_OR_RETURN(l.q_norm, vector(p + "attn_q_norm.weight", hd));
      PAGODA_ASSIGN_OR_RETURN(l.k_norm, vector(p + "attn_k_norm.weight", hd));
    }
    PAGODA_ASSIGN_OR_RETURN(l.w_gate, linear(p + "ffn_gate.weight", cfg_.intermediate_size, hidden));
    PAGODA_ASSIGN_OR_RETURN(l.w_up, linear(p + "ffn_up.weight", cfg_.intermediate_size, hidden));
    PAGODA_ASSIGN_OR_RETURN(l.w_down, linear(p + "ffn_down.weight", hidden, cfg_.intermediate_size));
  }
  inv_freq_ = rope_inv_freq(cfg_);
  if (source_.weight_mix || !int_types_.empty()) {
    std::string types;
    for (const auto& [t, count] : converted_types_) {
      if (count > 0) types += (types.empty() ? "" : ", ") + std::to_string(count) + " " + std::string(dtype_name(t));
    }
    for (const auto& [name, count] : int_types_) types += (types.empty() ? "" : ", ") + std::to_string(count) + " " + name;
    log_line(LogLevel::kInfo, "model",
             "weights typed by " + (source_.weight_mix ? source_.weight_mix->name : std::string("the checkpoint")) +
                 " at load (float ones converted, quantized ones as stored): " + types);
  }
  backend_ = nullptr;  // the Backend need not outlive the model
  return Status::ok_status();
}

int64_t LlamaModel::weight_bytes() const {
  const auto vec = [](const F32Vector& v) { return static_cast<int64_t>(v.data.size()); };
  // A tied LM head is a separate copy only when packing or conversion made one.
  int64_t bytes = token_embd_.nbytes() + vec(output_norm_);
  if (!cfg_.tie_word_embeddings || lm_head_.dense_weight().data != token_embd_.data) bytes += lm_head_.weight_bytes();
  for (const LayerWeights& l : layers_) {
    for (const Linear* t : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) bytes += t->weight_bytes();
    for (const F32Vector* v : {&l.attn_norm, &l.ffn_norm, &l.bq, &l.bk, &l.bv, &l.q_norm, &l.k_norm}) bytes += vec(*v);
  }
  return bytes;
}

void LlamaModel::ensure_workspace(int64_t n) {
  if (n <= capacity_) return;
  capacity_ = n;
  auto grow = [n](std::vector<float>& v, int64_t width) { v.resize(static_cast<size_t>(n * width)); };
  const int64_t q_dim = cfg_.num_heads * cfg_.head_dim, kv_dim = cfg_.num_kv_heads * cfg_.head_dim;
  grow(x_, cfg_.hidden_size);
  grow(h_, cfg_.hidden_size);
  grow(q_, q_dim);
  grow(attn_, q_dim);
  grow(k_buf_, kv_dim);
  grow(v_buf_, kv_dim);
  grow(gate_, cfg_.intermediate_size);
  grow(up_, cfg_.intermediate_size);
}

void LlamaModel::add_bias(float* x, int64_t rows, const F32Vector& bias, int64_t len) {
  for (int64_t r = 0; r < rows; ++r) k_.add(x + r * len, bias.ptr(), len);
}

Tensor LlamaModel::forward(const ForwardBatch& batch, const KvCacheTensors& kv) {
  const int64_t n = batch.num_tokens();
  const int64_t hidden = cfg_.hidden_size, hd = cfg_.head_dim;
  const int64_t nh = cfg_.num_heads, nkv = cfg_.num_kv_heads;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  ensure_workspace(n);
  float *x = x_.data(), *h = h_.data(), *q = q_.data(), *k = k_buf_.data(), *v = v_buf_.data();
  float *attn = attn_.data(), *gate = gate_.data(), *up = up_.data();

  const AttentionParams attn_params{nh, nkv, hd, static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd))),
                                    cfg_.sliding_window};
  k_.embedding(token_embd_, batch.token_ids.data(), n, x);
  for (size_t li = 0; li < layers_.size(); ++li) {
    const LayerWeights& l = layers_[li];
    const KvLayerView cache = kv.layer(static_cast<int64_t>(li));

    k_.rms_norm(x, l.attn_norm.ptr(), n, hidden, eps, h);
    l.wq.apply(k_, h, n, q);
    l.wk.apply(k_, h, n, k);
    l.wv.apply(k_, h, n, v);
    if (cfg_.attention_bias) {
      add_bias(q, n, l.bq, nh * hd);
      add_bias(k, n, l.bk, nkv * hd);
      add_bias(v, n, l.bv, nkv * hd);
    }
    if (cfg_.qk_norm) {  // every head's vector is one row of the norm
      k_.rms_norm(q, l.q_norm.ptr(), n * nh, hd, eps, q);
      k_.rms_norm(k, l.k_norm.ptr(), n * nkv, hd, eps, k);
    }
    k_.rope(q, n, nh, hd, batch.positions.data(), inv_freq_.data(), cfg_.rope_interleaved);
    k_.rope(k, n, nkv, hd, batch.positions.data(), inv_freq_.data(), cfg_.rope_interleaved);
    k_.store_kv(k, v, batch.slot_mapping.data(), n, cache);
    k_.paged_attention(q, batch.seqs.data(), static_cast<int64_t>(batch.seqs.size()), cache,
                       attn_params, attn);
    l.wo.apply(k_, attn, n, h);
    k_.add(x, h, n * hidden);

    k_.rms_norm(x, l.ffn_norm.ptr(), n, hidden, eps, h);
    l.w_gate.apply(k_, h, n, gate);
    l.w_up.apply(k_, h, n, up);
    k_.silu_mul(gate, up, n * cfg_.intermediate_size, gate);
    l.w_down.apply(k_, gate, n, h);
    k_.add(x, h, n * hidden);
  }
  k_.rms_norm(x, output_norm_.ptr(), n, hidden, eps, h);
  return Tensor(h, DType::kF32, {n, hidden});
}

void LlamaModel::compute_logits(const Tensor& hidden, const int64_t* rows, int64_t num_rows,
                                float* logits) {
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

Result<std::unique_ptr<Model>> create_llama_model(ModelSource source, const Backend& backend) {
  PAGODA_RETURN_IF_ERROR(source.config.validate(source.path));
  auto model = std::make_unique<LlamaModel>(std::move(source), backend);
  PAGODA_RETURN_IF_ERROR(model->init(backend));
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace pagoda
