// The full forward pass against a plain float64 implementation written here, on small
// random-weight models covering every architecture feature: several layers, GQA, both RoPE
// layouts, llama3 rope scaling, Qwen2 biases with tied embeddings, Qwen3 q/k norms with a
// head_dim that is not hidden/heads, and a sliding window. The engine side runs the sequence in
// chunks through a paged cache with a shuffled block table, so the cache path is covered too.
// Then the fast CPU kernels against the scalar reference kernels at the model level: the real
// stories260K and TinyLlama-shaped random models in every weight type. And a GGUF file in
// llama-quantize's Q4_K_M mix against the same weights dequantized to f32.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <numbers>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/scalar/reference_kernels.h"
#include "loader/gguf_writer.h"
#include "loader/model_source.h"
#include "model/quant/quant_method.h"
#include "model/quant/quant_mix.h"
#include "tensor/convert.h"
#include "tensor/half.h"
#include "support/small_config.h"
#include "support/test_data.h"
#include "model/layers/linear.h"
#include "model/layers/moe.h"
#include "model/layers/weight_loader.h"
#include "model/model.h"

namespace pagoda {
namespace {

using Mat = std::vector<double>;  // row-major

struct RefMlp {
  Mat gate, up, down;
};
struct RefLayer {
  Mat attn_norm, ffn_norm, wq, wk, wv, wo, bq, bk, bv, q_norm, k_norm, gate, up, down;
  // A sparse layer (ModelConfig::is_sparse_layer): the router [experts, hidden], the experts,
  // and the shared expert with its gate [1, hidden] where the config has one.
  bool sparse = false;
  Mat router, shared_gate;
  std::vector<RefMlp> experts;
  RefMlp shared;
};
struct RefWeights {
  Mat embd, out, out_norm;
  std::vector<RefLayer> layers;
};

class ModelBuilder {
 public:
  ModelBuilder(ModelConfig cfg, uint32_t seed) : rng_(seed) { src_.config = cfg; src_.path = "test"; }

  // A random f32 tensor registered under `name`; returns its values as doubles.
  Mat add(const std::string& name, std::vector<int64_t> shape, double scale, double offset = 0) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    auto buf = std::make_shared<Buffer>(static_cast<size_t>(n) * 4);
    std::uniform_real_distribution<float> dist(-1, 1);
    Mat values(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      float v = static_cast<float>(offset + scale * dist(rng_));
      buf->as<float>()[i] = v;
      values[static_cast<size_t>(i)] = v;
    }
    Tensor t;
    t.data = buf->data();
    t.dtype = DType::kF32;
    for (auto d : shape) t.shape[t.ndim++] = d;
    src_.weights.add(name, t);
    src_.weights.keep_alive(buf);
    return values;
  }

  RefWeights build_all() {
    const ModelConfig& c = src_.config;
    const int64_t h = c.hidden_size, hd = c.head_dim, qd = c.num_heads * hd, kvd = c.num_kv_heads * hd;
    const double ws = 1.0 / std::sqrt(static_cast<double>(h));
    RefWeights w;
    w.embd = add("token_embd.weight", {c.vocab_size, h}, 1.0);
    w.out = c.tie_word_embeddings ? w.embd : add("output.weight", {c.vocab_size, h}, ws);
    w.out_norm = add("output_norm.weight", {h}, 0.2, 1.0);
    for (int64_t i = 0; i < c.num_layers; ++i) {
      std::string p = "blk." + std::to_string(i) + ".";
      RefLayer l;
      l.attn_norm = add(p + "attn_norm.weight", {h}, 0.2, 1.0);
      l.ffn_norm = add(p + "ffn_norm.weight", {h}, 0.2, 1.0);
      l.wq = add(p + "attn_q.weight", {qd, h}, ws);
      l.wk = add(p + "attn_k.weight", {kvd, h}, ws);
      l.wv = add(p + "attn_v.weight", {kvd, h}, ws);
      l.wo = add(p + "attn_output.weight", {h, qd}, 1.0 / std::sqrt(static_cast<double>(qd)));
      if (c.attention_bias) {
        l.bq = add(p + "attn_q.bias", {qd}, 0.3);
        l.bk = add(p + "attn_k.bias", {kvd}, 0.3);
        l.bv = add(p + "attn_v.bias", {kvd}, 0.3);
      }
      if (c.qk_norm) {
        l.q_norm = add(p + "attn_q_norm.weight", {hd}, 0.2, 1.0);
        l.k_norm = add(p + "attn_k_norm.weight", {hd}, 0.2, 1.0);
      }
      auto mlp = [&](const std::string& gate, const std::string& up, const std::string& down, int64_t inter) {
        RefMlp m;
        m.gate = add(p + gate, {inter, h}, ws);
        m.up = add(p + up, {inter, h}, ws);
        m.down = add(p + down, {h, inter}, 1.0 / std::sqrt(static_cast<double>(inter)));
        return m;
      };
      l.sparse = c.is_sparse_layer(i);
      if (!l.sparse) {
        RefMlp m = mlp("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight", c.intermediate_size);
        l.gate = std::move(m.gate), l.up = std::move(m.up), l.down = std::move(m.down);
      } else {
        l.router = add(p + "ffn_gate_inp.weight", {c.num_experts, h}, 4 * ws);  // spread: clear winners
        for (int64_t e = 0; e < c.num_experts; ++e) {
          const std::string x = "." + std::to_string(e) + ".weight";
          l.experts.push_back(mlp("ffn_gate" + x, "ffn_up" + x, "ffn_down" + x, c.moe_intermediate_size));
        }
        if (c.shared_expert_intermediate_size > 0) {
          l.shared = mlp("ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight",
                         c.shared_expert_intermediate_size);
          l.shared_gate = add(p + "ffn_gate_inp_shexp.weight", {1, h}, ws);
        }
      }
      w.layers.push_back(std::move(l));
    }
    return w;
  }

  // Replaces the f32 weight `name` ([rows, cols], values `ref`) by a W8A8 checkpoint's form, as
  // compressed-tensors stores it: int8 codes and a bf16 weight_scale [rows, 1] (per_tensor: [1]),
  // scale = max|w| / 127 over the channel (tensor), code = round(w / scale); and `ref` by the
  // values they stand for, scale (as bf16) * code. input_scale > 0 adds a static activation scale.
  void quantize_w8a8(const std::string& name, Mat* ref, int64_t rows, int64_t cols, bool per_tensor,
                     float input_scale = 0) {
    auto codes = std::make_shared<Buffer>(static_cast<size_t>(rows * cols));
    const int64_t num_scales = per_tensor ? 1 : rows;
    auto scales = std::make_shared<Buffer>(static_cast<size_t>(num_scales) * 2);
    for (int64_t s = 0; s < num_scales; ++s) {
      const int64_t r0 = per_tensor ? 0 : s, r1 = per_tensor ? rows : s + 1;
      double amax = 0;
      for (int64_t i = r0 * cols; i < r1 * cols; ++i) amax = std::max(amax, std::fabs((*ref)[static_cast<size_t>(i)]));
      const uint16_t scale_bf16 = f32_to_bf16(static_cast<float>(amax / 127));
      scales->as<uint16_t>()[s] = scale_bf16;
      const double scale = bf16_to_f32(scale_bf16);
      for (int64_t i = r0 * cols; i < r1 * cols; ++i) {
        const double code = std::clamp(std::nearbyint((*ref)[static_cast<size_t>(i)] / scale), -127.0, 127.0);
        codes->as<int8_t>()[i] = static_cast<int8_t>(code);
        (*ref)[static_cast<size_t>(i)] = code * scale;
      }
    }
    src_.weights.add(name, Tensor(codes->data(), DType::kI8, {rows, cols}));
    const std::string base = name.substr(0, name.size() - 6);
    src_.weights.add(base + "weight_scale", per_tensor ? Tensor(scales->data(), DType::kBF16, {1})
                                                       : Tensor(scales->data(), DType::kBF16, {rows, 1}));
    if (input_scale > 0) {
      auto in = std::make_shared<Buffer>(4);
      *in->as<float>() = input_scale;
      src_.weights.add(base + "input_scale", Tensor(in->data(), DType::kF32, {1}));
      src_.weights.keep_alive(in);
    }
    src_.weights.keep_alive(codes);
    src_.weights.keep_alive(scales);
  }
  // Replaces the f32 weight `name` ([rows, cols], values `ref`) by a packed checkpoint's tensors,
  // packed here as shared/docs/quantization-formats.md 2-4 describe (independently of the
  // loader's decoder), and `ref` by the values they stand for, scale * (code - zero):
  //  - "awq": 4-bit asymmetric in groups: s = (max - min) / 15 (as f16), z = round(-min / s),
  //    qweight [cols, rows / 8] with outputs interleaved 0, 2, 4, 6, 1, 3, 5, 7 in a word;
  //  - "gptq": as awq but qweight [cols / 8, rows] along the inputs, qzeros stored minus one (v1),
  //    and with act_order a shuffled g_idx (groups of scattered inputs);
  //  - "gptq8": 8-bit symmetric per channel, zeros 0x7F (128 after v1's plus one);
  //  - "ct": compressed-tensors pack-quantized W4A16: symmetric, s = max|w| / 7.5 (bf16), codes
  //    stored + 8 in weight_packed [rows, cols / 8], weight_scale [rows, groups], weight_shape.
  void quantize_packed(const std::string& name, Mat* ref, int64_t rows, int64_t cols, const std::string& format,
                       int64_t group, bool act_order = false) {
    const bool gptq8 = format == "gptq8";
    const int bits = gptq8 ? 8 : 4;
    if (gptq8) group = cols;
    const int64_t groups = cols / group, per_word = 32 / bits;
    // The group of each input: t / group, or a shuffle of that (act-order).
    std::vector<int32_t> g_idx(static_cast<size_t>(cols));
    for (int64_t t = 0; t < cols; ++t) g_idx[static_cast<size_t>(t)] = static_cast<int32_t>(t / group);
    if (act_order) std::shuffle(g_idx.begin(), g_idx.end(), rng_);
    std::vector<uint32_t> q(static_cast<size_t>(rows * cols)), z(static_cast<size_t>(rows * groups));
    std::vector<float> scale(static_cast<size_t>(rows * groups));
    for (int64_t j = 0; j < rows; ++j) {
      for (int64_t g = 0; g < groups; ++g) {
        double lo = 0, hi = 0, amax = 0;
        for (int64_t t = 0; t < cols; ++t) {
          if (g_idx[static_cast<size_t>(t)] != g) continue;
          const double w = (*ref)[static_cast<size_t>(j * cols + t)];
          lo = std::min(lo, w);
          hi = std::max(hi, w);
          amax = std::max(amax, std::fabs(w));
        }
        double s, zero;
        const size_t jg = static_cast<size_t>(j * groups + g);
        if (format == "ct") {
          s = bf16_to_f32(f32_to_bf16(static_cast<float>(amax / 7.5)));
          zero = 8;
        } else if (gptq8) {
          s = fp16_to_f32(f32_to_fp16(static_cast<float>(amax / 127)));
          zero = 128;
        } else {
          s = fp16_to_f32(f32_to_fp16(static_cast<float>((hi - lo) / 15)));
          zero = std::clamp(std::nearbyint(-lo / s), 1.0, 15.0);  // >= 1: v1 stores zero - 1
        }
        scale[jg] = static_cast<float>(s);
        z[jg] = static_cast<uint32_t>(zero);
        const double top = gptq8 ? 255 : 15;
        for (int64_t t = 0; t < cols; ++t) {
          if (g_idx[static_cast<size_t>(t)] != g) continue;
          double& w = (*ref)[static_cast<size_t>(j * cols + t)];
          const double code = std::clamp(std::nearbyint(w / s) + zero, 0.0, top);
          q[static_cast<size_t>(j * cols + t)] = static_cast<uint32_t>(code);
          w = s * (code - zero);
        }
      }
    }
    const std::string base = name.substr(0, name.size() - 6);
    auto words = [&](const std::string& n, std::initializer_list<int64_t> shape, const std::vector<uint32_t>& v) {
      auto buf = std::make_shared<Buffer>(v.size() * 4);
      std::memcpy(buf->data(), v.data(), v.size() * 4);
      src_.weights.add(base + n, Tensor(buf->data(), DType::kI32, shape));
      src_.weights.keep_alive(buf);
    };
    auto halves = [&](const std::string& n, DType t, std::initializer_list<int64_t> shape, const std::vector<float>& v) {
      auto buf = std::make_shared<Buffer>(v.size() * 2);
      for (size_t i = 0; i < v.size(); ++i) {
        buf->as<uint16_t>()[i] = t == DType::kF16 ? f32_to_fp16(v[i]) : f32_to_bf16(v[i]);
      }
      src_.weights.add(base + n, Tensor(buf->data(), t, shape));
      src_.weights.keep_alive(buf);
    };
    std::vector<float> by_group(static_cast<size_t>(rows * groups));  // [groups, rows]
    for (int64_t j = 0; j < rows; ++j) {
      for (int64_t g = 0; g < groups; ++g) by_group[static_cast<size_t>(g * rows + j)] = scale[static_cast<size_t>(j * groups + g)];
    }
    if (format == "awq") {
      static constexpr int kSlotOf[8] = {0, 4, 1, 5, 2, 6, 3, 7};  // output 8p + c sits in slot kSlotOf[c]
      std::vector<uint32_t> qw(static_cast<size_t>(cols * rows / 8)), qz(static_cast<size_t>(groups * rows / 8));
      for (int64_t t = 0; t < cols; ++t) {
        for (int64_t j = 0; j < rows; ++j) qw[static_cast<size_t>(t * rows / 8 + j / 8)] |= q[static_cast<size_t>(j * cols + t)] << (4 * kSlotOf[j % 8]);
      }
      for (int64_t g = 0; g < groups; ++g) {
        for (int64_t j = 0; j < rows; ++j) qz[static_cast<size_t>(g * rows / 8 + j / 8)] |= z[static_cast<size_t>(j * groups + g)] << (4 * kSlotOf[j % 8]);
      }
      words("qweight", {cols, rows / 8}, qw);
      words("qzeros", {groups, rows / 8}, qz);
      halves("scales", DType::kF16, {groups, rows}, by_group);
    } else if (format == "gptq" || gptq8) {
      std::vector<uint32_t> qw(static_cast<size_t>(cols / per_word * rows)), qz(static_cast<size_t>(groups * rows / per_word));
      for (int64_t t = 0; t < cols; ++t) {
        for (int64_t j = 0; j < rows; ++j) qw[static_cast<size_t>((t / per_word) * rows + j)] |= q[static_cast<size_t>(j * cols + t)] << (bits * (t % per_word));
      }
      for (int64_t g = 0; g < groups; ++g) {
        for (int64_t j = 0; j < rows; ++j) {
          qz[static_cast<size_t>(g * rows / per_word + j / per_word)] |= (z[static_cast<size_t>(j * groups + g)] - 1) << (bits * (j % per_word));
        }
      }
      words("qweight", {cols / per_word, rows}, qw);
      words("qzeros", {groups, rows / per_word}, qz);
      halves("scales", DType::kF16, {groups, rows}, by_group);
      words("g_idx", {cols}, std::vector<uint32_t>(g_idx.begin(), g_idx.end()));
    } else {
      std::vector<uint32_t> qw(static_cast<size_t>(rows * cols / 8));
      for (int64_t j = 0; j < rows; ++j) {
        for (int64_t t = 0; t < cols; ++t) qw[static_cast<size_t>(j * cols / 8 + t / 8)] |= q[static_cast<size_t>(j * cols + t)] << (4 * (t % 8));
      }
      words("weight_packed", {rows, cols / 8}, qw);
      halves("weight_scale", DType::kBF16, {rows, groups}, scale);
      auto shape = std::make_shared<Buffer>(16);
      shape->as<int64_t>()[0] = rows;
      shape->as<int64_t>()[1] = cols;
      src_.weights.add(base + "weight_shape", Tensor(shape->data(), DType::kI64, {2}));
      src_.weights.keep_alive(shape);
    }
    // The float weight is gone: the checkpoint holds only the packed form. The old map (and its
    // buffers) stays alive through the new one.
    auto old = std::make_shared<WeightMap>(std::move(src_.weights));
    WeightMap fresh;
    for (const auto& [n, t] : old->all()) {
      if (n != name) fresh.add(n, t);
    }
    fresh.set_source(old->source());
    fresh.keep_alive(old);
    src_.weights = std::move(fresh);
  }

  ModelSource& source() { return src_; }

  ModelSource take() { return std::move(src_); }

 private:
  std::mt19937 rng_;
  ModelSource src_;
};

// ---- float64 reference ----

Mat matvec(const Mat& w, const Mat& x, int64_t rows, int64_t cols) {
  Mat y(static_cast<size_t>(rows), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) y[r] += w[r * cols + c] * x[c];
  return y;
}

void rmsnorm(double* x, const double* w, int64_t n, double eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  double inv = 1 / std::sqrt(ss / n + eps);
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] * inv * w[i];
}

double ref_inv_freq(const ModelConfig& c, int64_t i) {
  const RopeScaling& s = c.rope_scaling;
  const double d = static_cast<double>(c.head_dim);
  if (s.type == RopeScaling::Type::kDynamic) {
    // NTK-aware: theta' = theta * (factor * L / L0 - (factor - 1))^(d / (d - 2)) at L = factor * L0.
    const double theta = c.rope_theta * std::pow(s.factor * s.factor - s.factor + 1, d / (d - 2));
    return 1.0 / std::pow(theta, 2.0 * i / d);
  }
  double f = 1.0 / std::pow(c.rope_theta, 2.0 * i / c.head_dim);
  if (s.type == RopeScaling::Type::kYarn) {
    // Dimension pair i turns L0 * f / (2 pi) times over the original context: kept (extrapolated)
    // above beta_fast turns, interpolated below beta_slow, a linear blend between, the bounds
    // taken as dimension indices (floor / ceil), as in the YaRN paper's reference code.
    const double L0 = static_cast<double>(s.original_max_position_embeddings);
    auto dim_at = [&](double turns) { return d * std::log(L0 / (turns * 2 * std::numbers::pi)) / (2 * std::log(c.rope_theta)); };
    const double lo = std::max(0.0, std::floor(dim_at(s.beta_fast)));
    double hi = std::min(d - 1, std::ceil(dim_at(s.beta_slow)));
    if (hi == lo) hi += 0.001;
    const double ramp = std::min(1.0, std::max(0.0, (i - lo) / (hi - lo)));
    return f * (1 - ramp) + f / s.factor * ramp;
  }
  if (s.type == RopeScaling::Type::kLinear) return f / s.factor;
  if (s.type != RopeScaling::Type::kLlama3) return f;
  double wavelen = 2 * std::numbers::pi / f, orig = s.original_max_position_embeddings;
  if (wavelen < orig / s.high_freq_factor) return f;
  if (wavelen > orig / s.low_freq_factor) return f / s.factor;
  double smooth = (orig / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  return (1 - smooth) * f / s.factor + smooth * f;
}

// YaRN's cos and sin are multiplied by 0.1 ln(factor) + 1 (or the attention_factor given), so
// q.k by its square.
double attention_mscale2(const ModelConfig& c) {
  const RopeScaling& s = c.rope_scaling;
  if (s.type != RopeScaling::Type::kYarn) return 1.0;
  const double m = s.attention_factor > 0 ? s.attention_factor : 0.1 * std::log(s.factor) + 1;
  return m * m;
}

void ref_rope(double* v, const ModelConfig& c, int64_t pos) {
  for (int64_t i = 0; i < c.head_dim / 2; ++i) {
    double ang = pos * ref_inv_freq(c, i);
    int64_t a = c.rope_interleaved ? 2 * i : i, b = c.rope_interleaved ? 2 * i + 1 : i + c.head_dim / 2;
    double x0 = v[a], x1 = v[b];
    v[a] = x0 * std::cos(ang) - x1 * std::sin(ang);
    v[b] = x0 * std::sin(ang) + x1 * std::cos(ang);
  }
}

// Logits [T, vocab] for every position of `tokens`.
std::vector<Mat> reference_logits(const ModelConfig& c, const RefWeights& w, const std::vector<TokenId>& tokens) {
  const int64_t T = static_cast<int64_t>(tokens.size()), h = c.hidden_size, hd = c.head_dim;
  const int64_t nh = c.num_heads, nkv = c.num_kv_heads, qd = nh * hd, kvd = nkv * hd;
  std::vector<Mat> x(T);
  for (int64_t t = 0; t < T; ++t) x[t] = Mat(w.embd.begin() + tokens[t] * h, w.embd.begin() + (tokens[t] + 1) * h);
  for (const RefLayer& l : w.layers) {
    std::vector<Mat> q(T), k(T), v(T);
    for (int64_t t = 0; t < T; ++t) {
      Mat hn = x[t];
      rmsnorm(hn.data(), l.attn_norm.data(), h, c.rms_norm_eps);
      q[t] = matvec(l.wq, hn, qd, h);
      k[t] = matvec(l.wk, hn, kvd, h);
      v[t] = matvec(l.wv, hn, kvd, h);
      if (c.attention_bias) {
        for (int64_t i = 0; i < qd; ++i) q[t][i] += l.bq[i];
        for (int64_t i = 0; i < kvd; ++i) k[t][i] += l.bk[i], v[t][i] += l.bv[i];
      }
      for (int64_t hh = 0; hh < nh; ++hh) {
        if (c.qk_norm) rmsnorm(&q[t][hh * hd], l.q_norm.data(), hd, c.rms_norm_eps);
        ref_rope(&q[t][hh * hd], c, t);
      }
      for (int64_t hh = 0; hh < nkv; ++hh) {
        if (c.qk_norm) rmsnorm(&k[t][hh * hd], l.k_norm.data(), hd, c.rms_norm_eps);
        ref_rope(&k[t][hh * hd], c, t);
      }
    }
    for (int64_t t = 0; t < T; ++t) {
      Mat att(static_cast<size_t>(qd), 0.0);
      int64_t first = c.sliding_window > 0 ? std::max<int64_t>(0, t - c.sliding_window + 1) : 0;
      for (int64_t hh = 0; hh < nh; ++hh) {
        int64_t kvh = hh / (nh / nkv);
        std::vector<double> s;
        double mx = -1e300, sum = 0;
        for (int64_t u = first; u <= t; ++u) {
          double d = 0;
          for (int64_t i = 0; i < hd; ++i) d += q[t][hh * hd + i] * k[u][kvh * hd + i];
          s.push_back(d * attention_mscale2(c) / std::sqrt(static_cast<double>(hd)));
          mx = std::max(mx, s.back());
        }
        for (auto& e : s) sum += (e = std::exp(e - mx));
        for (int64_t u = first; u <= t; ++u)
          for (int64_t i = 0; i < hd; ++i) att[hh * hd + i] += s[u - first] / sum * v[u][kvh * hd + i];
      }
      Mat o = matvec(l.wo, att, h, qd);
      for (int64_t i = 0; i < h; ++i) x[t][i] += o[i];
      Mat hn = x[t];
      rmsnorm(hn.data(), l.ffn_norm.data(), h, c.rms_norm_eps);
      auto mlp = [&](const Mat& gate, const Mat& up, const Mat& down, int64_t inter) {
        Mat g = matvec(gate, hn, inter, h), u = matvec(up, hn, inter, h);
        for (int64_t i = 0; i < inter; ++i) g[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
        return matvec(down, g, h, inter);
      };
      if (!l.sparse) {
        Mat d = mlp(l.gate, l.up, l.down, c.intermediate_size);
        for (int64_t i = 0; i < h; ++i) x[t][i] += d[i];
        continue;
      }
      // Softmax over every expert's logit, the top k (ties: the lower expert), their
      // probabilities, renormalised where the config says.
      const Mat logit = matvec(l.router, hn, c.num_experts, h);
      std::vector<int64_t> order(static_cast<size_t>(c.num_experts));
      for (int64_t e = 0; e < c.num_experts; ++e) order[e] = e;
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return logit[a] > logit[b]; });
      double total = 0, chosen = 0;
      for (double v : logit) total += std::exp(v - logit[order[0]]);
      std::vector<double> weight(static_cast<size_t>(c.num_experts_per_tok));
      for (int64_t j = 0; j < c.num_experts_per_tok; ++j) {
        chosen += weight[j] = std::exp(logit[order[j]] - logit[order[0]]) / total;
      }
      for (int64_t j = 0; j < c.num_experts_per_tok; ++j) {
        const RefMlp& e = l.experts[order[j]];
        const Mat d = mlp(e.gate, e.up, e.down, c.moe_intermediate_size);
        const double wgt = c.norm_topk_prob ? weight[j] / chosen : weight[j];
        for (int64_t i = 0; i < h; ++i) x[t][i] += wgt * d[i];
      }
      if (c.shared_expert_intermediate_size > 0) {
        const Mat d = mlp(l.shared.gate, l.shared.up, l.shared.down, c.shared_expert_intermediate_size);
        const double g = 1 / (1 + std::exp(-matvec(l.shared_gate, hn, 1, h)[0]));
        for (int64_t i = 0; i < h; ++i) x[t][i] += g * d[i];
      }
    }
  }
  std::vector<Mat> logits(T);
  for (int64_t t = 0; t < T; ++t) {
    rmsnorm(x[t].data(), w.out_norm.data(), h, c.rms_norm_eps);
    logits[t] = matvec(w.out, x[t], c.vocab_size, h);
  }
  return logits;
}

// ---- the engine side: chunks through a paged cache with a shuffled block table ----

std::vector<std::vector<float>> engine_logits(Model& model, const std::vector<TokenId>& tokens,
                                              const std::vector<int64_t>& chunks) {
  const int64_t bs = 4;
  const int64_t T = static_cast<int64_t>(tokens.size());
  const int64_t nblocks = (T + bs - 1) / bs;
  auto kv = KvCacheTensors::allocate(model.kernels(), model.config(), nblocks + 3, bs);
  EXPECT_TRUE(kv.ok());
  std::vector<BlockId> table;
  for (int64_t b = 0; b < nblocks; ++b) table.push_back(static_cast<BlockId>((b * 5 + 2) % (nblocks + 3)));
  std::vector<std::vector<float>> out;
  int64_t done = 0;
  for (int64_t n : chunks) {
    std::vector<int32_t> pos;
    std::vector<int64_t> slots;
    for (int64_t i = done; i < done + n; ++i) {
      pos.push_back(static_cast<int32_t>(i));
      slots.push_back(table[i / bs] * bs + i % bs);
    }
    AttentionSeq seq{0, n, done + n, table.data()};
    ForwardBatch batch{std::span<const TokenId>(tokens).subspan(done, n), pos, slots, {&seq, 1}};
    Tensor hidden = model.forward(batch, *kv);
    std::vector<int64_t> rows(n);
    for (int64_t i = 0; i < n; ++i) rows[i] = i;
    std::vector<float> logits(n * model.config().vocab_size);
    model.compute_logits(hidden, rows.data(), n, logits.data());
    for (int64_t i = 0; i < n; ++i) {
      out.emplace_back(logits.begin() + i * model.config().vocab_size,
                       logits.begin() + (i + 1) * model.config().vocab_size);
    }
    done += n;
  }
  return out;
}

// The largest |got - want| over every logit, as a fraction of its position's largest |want|.
double largest_relative_difference(const std::vector<std::vector<float>>& want,
                                   const std::vector<std::vector<float>>& got) {
  EXPECT_EQ(got.size(), want.size());
  double worst = 0;
  for (size_t t = 0; t < want.size() && t < got.size(); ++t) {
    double scale = 0;
    for (float v : want[t]) scale = std::max(scale, std::fabs(double{v}));
    EXPECT_EQ(got[t].size(), want[t].size());
    for (size_t i = 0; i < want[t].size() && i < got[t].size(); ++i) {
      worst = std::max(worst, std::fabs(double{got[t][i]} - want[t][i]) / scale);
    }
  }
  return worst;
}

ModelConfig base_config() { return testing::small_llama_config(); }

void expect_matches_reference(const ModelConfig& cfg, uint32_t seed) {
  ModelBuilder builder(cfg, seed);
  RefWeights ref_w = builder.build_all();
  auto backend_ptr = cpu::CpuBackend::create();
  ASSERT_TRUE(backend_ptr.ok());
  cpu::CpuBackend& backend = **backend_ptr;
  auto model = create_model(builder.take(), backend);
  ASSERT_TRUE(model.ok()) << model.status().message();
  std::vector<TokenId> tokens = {1, 17, 5, 60, 33, 2, 41, 8, 8, 19, 0};
  auto want = reference_logits(cfg, ref_w, tokens);
  auto got = engine_logits(**model, tokens, {5, 1, 3, 1, 1});  // prefill chunks and decodes
  ASSERT_EQ(got.size(), want.size());
  for (size_t t = 0; t < want.size(); ++t) {
    double scale = 0;
    for (double v : want[t]) scale = std::max(scale, std::fabs(v));
    for (int64_t i = 0; i < cfg.vocab_size; ++i) {
      ASSERT_NEAR(got[t][i], want[t][i], 1e-4 * scale) << "position " << t << " logit " << i;
    }
  }
}

TEST(ModelReference, LlamaInterleavedRope) {
  ModelConfig c = base_config();
  c.rope_interleaved = true;
  expect_matches_reference(c, 1);
}

TEST(ModelReference, LlamaRotateHalfWithLlama3Scaling) {
  ModelConfig c = base_config();
  c.rope_theta = 500000;
  c.rope_scaling.type = RopeScaling::Type::kLlama3;
  c.rope_scaling.factor = 8.0;
  c.rope_scaling.low_freq_factor = 1.0;
  c.rope_scaling.high_freq_factor = 4.0;
  c.rope_scaling.original_max_position_embeddings = 16;
  expect_matches_reference(c, 2);
}

// YaRN over an original context of 16 positions (so the ramp crosses the head's dimensions), with
// the default attention factor and with a given one; and dynamic NTK.
TEST(ModelReference, YarnAndDynamicNtkScaling) {
  ModelConfig c = base_config();
  c.rope_theta = 10000;
  c.rope_scaling.type = RopeScaling::Type::kYarn;
  c.rope_scaling.factor = 4.0;
  c.rope_scaling.original_max_position_embeddings = 16;
  expect_matches_reference(c, 14);
  c.rope_scaling.attention_factor = 1.3;
  c.rope_scaling.beta_fast = 8;
  c.rope_scaling.beta_slow = 2;
  expect_matches_reference(c, 15);
  ModelConfig d = base_config();
  d.rope_scaling.type = RopeScaling::Type::kDynamic;
  d.rope_scaling.factor = 3.0;
  expect_matches_reference(d, 16);
}

TEST(ModelReference, Qwen2BiasTiedEmbeddings) {
  ModelConfig c = base_config();
  c.architecture = "qwen2";
  c.attention_bias = true;
  c.tie_word_embeddings = true;
  c.num_kv_heads = 1;
  expect_matches_reference(c, 3);
}

TEST(ModelReference, Qwen3QkNormWideHeads) {
  ModelConfig c = base_config();
  c.architecture = "qwen3";
  c.qk_norm = true;
  c.head_dim = 16;  // heads * head_dim = 64 != hidden 32
  c.tie_word_embeddings = true;
  expect_matches_reference(c, 4);
}

TEST(ModelReference, SlidingWindowAndLinearScaling) {
  ModelConfig c = base_config();
  c.sliding_window = 4;
  c.rope_scaling.type = RopeScaling::Type::kLinear;
  c.rope_scaling.factor = 2.0;
  expect_matches_reference(c, 5);
}

// The mixtures of experts: 8 experts of width 24, top 3 renormalised (Qwen3-MoE, q/k norms);
// 6 experts, top 2 not renormalised, a shared expert of width 40, the middle layer dense
// (Qwen2-MoE's mlp_only_layers, Q/K/V biases); 4 experts top 2 (Mixtral, interleaved RoPE and a
// sliding window). The chunks of 5 and 3 tokens group several tokens per expert.
ModelConfig moe_config(const std::string& arch) {
  ModelConfig c = base_config();
  c.architecture = arch;
  c.moe_intermediate_size = 24;
  if (arch == "qwen3_moe") {
    c.qk_norm = true;
    c.num_experts = 8, c.num_experts_per_tok = 3, c.norm_topk_prob = true;
  } else if (arch == "qwen2_moe") {
    c.attention_bias = true;
    c.num_experts = 6, c.num_experts_per_tok = 2, c.norm_topk_prob = false;
    c.shared_expert_intermediate_size = 40;
    c.mlp_only_layers = {1};
  } else {
    c.rope_interleaved = true;
    c.sliding_window = 6;
    c.num_experts = 4, c.num_experts_per_tok = 2, c.norm_topk_prob = true;
  }
  return c;
}

TEST(ModelReference, Qwen3MoeTopKRenormalised) { expect_matches_reference(moe_config("qwen3_moe"), 11); }
TEST(ModelReference, Qwen2MoeSharedExpertAndDenseLayer) { expect_matches_reference(moe_config("qwen2_moe"), 12); }
TEST(ModelReference, MixtralTopTwo) { expect_matches_reference(moe_config("mixtral"), 13); }

// Routing: the top k by logit, equal logits in expert order (the same choice in every batch),
// weights the softmax over all experts, renormalised over the chosen ones on request.
TEST(Routing, TopKTiesAndWeights) {
  const float logits[] = {1.0f, 3.0f, 3.0f, 0.5f, 3.0f,   // a three-way tie for the top
                          -2.0f, 0.0f, 4.0f, 4.0f, 1.0f};
  int32_t experts[4];
  float weights[4];
  const Kernels k = cpu::cpu_kernels(cpu::reference_kernels());
  k.moe_route(logits, 2, 5, 2, false, experts, weights);
  EXPECT_EQ(experts[0], 1);
  EXPECT_EQ(experts[1], 2);
  EXPECT_EQ(experts[2], 7 - 5);
  EXPECT_EQ(experts[3], 8 - 5);
  double total = 0;
  for (int e = 0; e < 5; ++e) total += std::exp(double{logits[e]} - 3.0);
  EXPECT_NEAR(weights[0], 1.0 / total, 1e-6);
  EXPECT_NEAR(weights[1], 1.0 / total, 1e-6);
  k.moe_route(logits, 2, 5, 2, true, experts, weights);
  EXPECT_FLOAT_EQ(weights[0], 0.5f);
  EXPECT_FLOAT_EQ(weights[3], 0.5f);
  // The second token alone routes as it did beside the first.
  int32_t alone[2];
  float alone_w[2];
  k.moe_route(logits + 5, 1, 5, 2, true, alone, alone_w);
  EXPECT_EQ(alone[0], experts[2]);
  EXPECT_EQ(alone[1], experts[3]);
  EXPECT_EQ(alone_w[0], weights[2]);
}

TEST(ModelReference, MissingTensorAndUnknownArchitectureFail) {
  ModelConfig c = base_config();
  ModelBuilder builder(c, 6);
  builder.build_all();
  ModelSource src = builder.take();
  src.config.attention_bias = true;  // asks for biases that are not there
  auto backend_ptr = cpu::CpuBackend::create();
  ASSERT_TRUE(backend_ptr.ok());
  cpu::CpuBackend& backend = **backend_ptr;
  auto r = create_model(std::move(src), backend);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("attn_q.bias"), std::string::npos) << r.status().message();

  ModelBuilder b2(c, 7);
  b2.build_all();
  ModelSource src2 = b2.take();
  src2.config.architecture = "gpt2";
  auto r2 = create_model(std::move(src2), backend);
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.status().message().find("gpt2"), std::string::npos);
}

// ---- Fast kernels against the scalar reference kernels, whole models ----

std::unique_ptr<cpu::CpuBackend> cpu_backend(const std::string& isa) {
  auto b = cpu::CpuBackend::create(cpu::CpuBackendOptions{.isa = isa});
  EXPECT_TRUE(b.ok()) << b.status().message();
  return b.ok() ? std::move(*b) : nullptr;
}

// Logits of `tokens` (run in `chunks`) on the scalar and the best kernels: every logit within
// `tol` x the position's largest magnitude, and the same argmax at every position unless the
// top two are closer than the tolerance allows telling apart.
void expect_fast_matches_scalar(const std::function<Result<ModelSource>()>& load,
                                const std::vector<TokenId>& tokens,
                                const std::vector<int64_t>& chunks, double tol,
                                const std::string& what, std::optional<QuantMix> mix = std::nullopt) {
  auto scalar = cpu_backend("scalar");
  auto fast = cpu_backend("auto");
  ASSERT_TRUE(scalar && fast);
  // One load for both: a WeightMap is immutable and shares its memory (model_source.h), and
  // quantizing the dummy weights was half this test's time under ASan.
  auto src = load();
  ASSERT_TRUE(src.ok()) << what;
  auto m_scalar = create_model(ModelSource(*src), *scalar, {}, {}, mix);
  auto m_fast = create_model(std::move(*src), *fast, {}, {}, mix);
  ASSERT_TRUE(m_scalar.ok() && m_fast.ok()) << what;
  const auto want = engine_logits(**m_scalar, tokens, chunks);
  const auto got = engine_logits(**m_fast, tokens, chunks);
  ASSERT_EQ(got.size(), want.size());
  double worst = 0;
  for (size_t t = 0; t < want.size(); ++t) {
    double scale = 0;
    for (float v : want[t]) scale = std::max(scale, std::fabs(double{v}));
    for (size_t i = 0; i < want[t].size(); ++i) {
      const double err = std::fabs(double{got[t][i]} - want[t][i]) / scale;
      worst = std::max(worst, err);
      ASSERT_LE(err, tol) << what << ": position " << t << " logit " << i << " = " << got[t][i]
                          << ", scalar " << want[t][i];
    }
    const auto top = std::max_element(want[t].begin(), want[t].end()) - want[t].begin();
    const auto top_fast = std::max_element(got[t].begin(), got[t].end()) - got[t].begin();
    if (top != top_fast) {
      EXPECT_LE(std::fabs(double{want[t][top]} - want[t][top_fast]), 2 * tol * scale)
          << what << ": position " << t << " argmax " << top_fast << ", scalar " << top;
    }
  }
  std::printf("%s: largest logit difference %.2e of the position's largest logit\n", what.c_str(), worst);
}

TEST(FastKernels, Stories260KLogitsMatchScalarKernels) {
  PAGODA_TEST_FILE(path, "stories260K/stories260K.gguf");
  PAGODA_TEST_FILE(ids_path, "stories260K/greedy-bos-256.ids");
  // BOS and the model's own first 24 greedy tokens: a prefill chunk, decodes, another chunk.
  std::vector<TokenId> tokens = {1};
  std::ifstream ids(ids_path);
  for (TokenId id; tokens.size() < 25 && ids >> id;) tokens.push_back(id);
  ASSERT_EQ(tokens.size(), 25u);
  expect_fast_matches_scalar([&] { return load_model(path, LoadOptions{}); }, tokens,
                             {10, 1, 1, 13}, 1e-4, "stories260K");
}

// Every weight type of a TinyLlama-1.1B-shaped model (hidden 2048, 32/4 heads of 64,
// intermediate 5632, vocab 32000; 2 of its 22 layers to keep the scalar side quick).
TEST(FastKernels, TinyLlamaShapedLogitsMatchScalarKernels) {
  ModelConfig cfg = *dummy_preset("tinyllama-1.1b");
  cfg.num_layers = 2;
  std::vector<TokenId> tokens = {1, 450, 4996, 17354, 1701, 432, 17204, 975, 278, 17366, 11203};
  // Float weights: only the summation order differs (measured 3e-6). Quantized weights meet
  // activations quantized to int8 per block on both sides: wherever the two sides' f32 inputs
  // (equal to ~1e-6) straddle a rounding step, one activation moves by a whole step (max|x| / 127)
  // and the random, untrained layers carry that on (measured 7.5e-3 for q8_0, 1.0e-2 for q4_0;
  // the int8 rounding itself moves logits by about 1e-2 of their spread). A kernel bug moves them
  // by O(1). q4_k / q6_k: the K-quants' decoded-chunk path, with and without mins. Where the best
  // table is avx512bf16, f16 / bf16 weights meet activations rounded to bf16 (8 significant bits,
  // about 2^-9 of each value, as the int8 rounding is about 2^-8 of a block's largest): measured
  // 6.2e-3 for f16 and 4.1e-3 for bf16 on a Zen 5.
  std::string best_table = "reference";
  for (const cpu::CpuKernelTable& t : cpu::cpu_kernel_tables()) {
    if (t.supported(cpu::cpu_features())) {
      best_table = t.name;
      break;
    }
  }
  const double half_tol = best_table == "avx512bf16" ? 3e-2 : 1e-4;
  for (auto [stored, tol] : {std::pair{DType::kF16, half_tol}, std::pair{DType::kBF16, half_tol},
                             std::pair{DType::kQ8_0, 3e-2}, std::pair{DType::kQ4_0, 3e-2},
                             std::pair{DType::kQ4_K, 3e-2}, std::pair{DType::kQ6_K, 3e-2}}) {
    const DType type = stored;  // not a structured binding: clang 14's lambdas cannot capture one
    auto load = [&]() -> Result<ModelSource> {
      PAGODA_ASSIGN_OR_RETURN(WeightMap w, make_dummy_weights(cfg, type, 3, "tinyllama-shaped"));
      return ModelSource{"tinyllama-shaped", LoadFormat::kDummy, cfg, std::move(w)};
    };
    expect_fast_matches_scalar(load, tokens, {7, 1, 1, 2}, tol,
                               "tinyllama-shaped " + std::string(dtype_name(type)));
  }
  // W8A8 / W4A8 from bf16 weights at load: int8 activations per token on both sides (the same
  // straddled-rounding effect as above). The LM head stays bf16 under them: a 4,000-token
  // vocabulary keeps the scalar side quick.
  ModelConfig small_vocab = cfg;
  small_vocab.vocab_size = 4000;
  std::vector<TokenId> small_tokens;
  for (TokenId t : tokens) small_tokens.push_back(t % 4000);
  for (const char* scheme : {"w8a8", "w4a8"}) {
    auto load = [&]() -> Result<ModelSource> {
      PAGODA_ASSIGN_OR_RETURN(WeightMap w, make_dummy_weights(small_vocab, DType::kBF16, 3, "tinyllama-shaped"));
      return ModelSource{"tinyllama-shaped", LoadFormat::kDummy, small_vocab, std::move(w)};
    };
    expect_fast_matches_scalar(load, small_tokens, {7, 1, 1, 2}, 3e-2, std::string("tinyllama-shaped ") + scheme,
                               int_codes_mix(scheme));
  }
}

// quantize_int_linear against its definition: per-group symmetric scales max|w| / 127 (int8) or
// / 7 (int4), every weight within half a step of its code, and the product equal to the float64
// product of the codes' values with the activations as quantized per token.
TEST(Linear, QuantizeIntFollowsItsDefinition) {
  const Kernels kern = cpu::cpu_kernels(cpu::reference_kernels());
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const int64_t n = 6, k = 256, m = 3;
  std::vector<float> wf(static_cast<size_t>(n * k)), x(static_cast<size_t>(m * k));
  for (auto& v : wf) v = dist(rng);
  for (auto& v : x) v = dist(rng);
  const Tensor w(wf.data(), DType::kF32, {n, k});
  for (auto [bits, group] : {std::pair{8, int64_t{256}}, std::pair{4, int64_t{64}}}) {
    const Linear l = quantize_int_linear(kern, w, bits, group);
    EXPECT_TRUE(l.is_int());
    EXPECT_EQ(l.out_features(), n);
    EXPECT_EQ(l.in_features(), k);
    EXPECT_EQ(l.weight_bytes(), n * k * bits / 8 + n * (k / group) * 4);
    EXPECT_EQ(l.type_name(), bits == 8 ? "w8a8" : "w4a8 g64");
    // Read the product back one basis vector at a time: x = e_t gives s_x = 1 / 127 and code
    // 127 at t, so y[j] = scale(j, g) * code(j, t).
    const double qmax = bits == 8 ? 127 : 7;
    std::vector<float> e(static_cast<size_t>(k)), col(static_cast<size_t>(n));
    for (int64_t t = 0; t < k; t += 37) {
      std::fill(e.begin(), e.end(), 0.0f);
      e[static_cast<size_t>(t)] = 1;
      l.apply(kern, e.data(), 1, col.data());
      for (int64_t j = 0; j < n; ++j) {
        double amax = 0;
        for (int64_t u = t / group * group; u < (t / group + 1) * group; ++u) {
          amax = std::max(amax, std::fabs(double{wf[static_cast<size_t>(j * k + u)]}));
        }
        const double step = amax / qmax;
        const double value = double{col[static_cast<size_t>(j)]};  // = step * code, as float
        EXPECT_NEAR(value, wf[static_cast<size_t>(j * k + t)], step / 2 * 1.0001) << bits << " (" << j << ", " << t << ")";
        EXPECT_NEAR(value / step, std::nearbyint(value / step), 1e-3) << "a whole number of steps";
      }
    }
  }
}

// --dtype on weights from a file: stories260K's f32 matmul weights converted at load. Rounding a
// weight to f16 moves it by at most 2^-11 of itself, to bf16 by 2^-8: the logits move by about
// that fraction of their spread (measured below), far less than a wrong conversion would. The
// logits must move, though: the conversion happened.
// A projection the loader copies (packs, converts or quantizes) is released from the source, and
// a dummy tensor's memory with it, so a dummy load peaks at the weights' size, not twice it (a
// 17 GB Qwen3-30B-A3B in q4_0 on a 24 GiB machine). Where the kernels read the stored tensor
// (scalar: no packing) it stays.
TEST(WeightLoader, ReleasesEachDummyTensorItCopied) {
  ModelConfig c = base_config();
  const std::string name = "blk.0.attn_q.weight";
  auto loads = [&](const std::string& isa, const char* mix) {
    ModelSource src;
    src.config = c;
    src.path = "dummy";
    auto weights = make_dummy_weights(c, DType::kF32, 1, "dummy");
    EXPECT_TRUE(weights.ok());
    src.weights = std::move(*weights);
    std::optional<QuantMix> weight_mix;
    if (std::string_view(mix) == "q8_0") weight_mix = uniform_mix(DType::kQ8_0);
    if (std::string_view(mix) == "w8a8") weight_mix = int_codes_mix("w8a8");
    auto backend = cpu_backend(isa);
    const Tensor* t = src.weights.find(name);
    EXPECT_NE(t, nullptr);
    WeightLoader w(src, *backend, unsharded(c), weight_mix);
    auto l = w.linear(name, c.num_heads * c.head_dim, c.hidden_size);
    EXPECT_TRUE(l.ok()) << l.status().message();
    return src.weights.find(name) != nullptr;
  };
  EXPECT_TRUE(loads("scalar", "")) << "the scalar kernels read the stored tensor";
  EXPECT_FALSE(loads("scalar", "q8_0")) << "converted: a copy";
  EXPECT_FALSE(loads("scalar", "w8a8")) << "quantized to codes: a copy";
  if (cpu::cpu_features().has("avx2")) {
    EXPECT_FALSE(loads("avx2", "")) << "packed: a copy";
  }
}

TEST(MatmulDtype, ConvertsFileWeightsAtLoad) {
  PAGODA_TEST_FILE(path, "stories260K/stories260K.gguf");
  auto backend = cpu_backend("scalar");
  ASSERT_TRUE(backend);
  const std::vector<TokenId> tokens = {1, 403, 261, 378, 275, 55, 300, 99};  // vocabulary: 512
  auto logits_with = [&](std::optional<DType> t) {
    std::optional<QuantMix> mix;
    if (t) mix = uniform_mix(*t);
    auto src = load_model(path, LoadOptions{});
    EXPECT_TRUE(src.ok());
    auto model = create_model(std::move(*src), *backend, {}, {}, mix);
    EXPECT_TRUE(model.ok()) << model.status().message();
    return engine_logits(**model, tokens, {5, 1, 1, 1});
  };
  const auto f32 = logits_with(std::nullopt);
  EXPECT_EQ(logits_with(DType::kF32), f32);  // already f32: nothing converted
  for (auto [type, tol] : {std::pair{DType::kF16, 5e-3}, std::pair{DType::kBF16, 4e-2}}) {
    const double worst = largest_relative_difference(f32, logits_with(type));
    EXPECT_LE(worst, tol) << dtype_name(type);
    EXPECT_GT(worst, 0) << dtype_name(type) << ": logits unchanged, the weights were not converted";
    std::printf("stories260K --dtype %s: largest logit change %.2e of the position's largest\n",
                std::string(dtype_name(type)).c_str(), worst);
  }
  // Its feed-forward width, 172, is not a whole number of 32-element blocks: ffn_down falls back
  // to f16 under q8_0, as llama-quantize would write it; every other matrix (rows of 64) is q8_0.
  // The model's weight bytes say which types it holds.
  auto src = load_model(path, LoadOptions{});
  ASSERT_TRUE(src.ok());
  int64_t want_bytes = 0;
  for (const auto& [name, t] : src->weights.all()) {
    if (t.ndim == 1) {
      want_bytes += t.numel() * 4;
    } else if (name.find("ffn_down") != std::string::npos) {
      want_bytes += t.numel() * 2;
    } else {
      want_bytes += t.numel() / 32 * 34;
    }
  }
  auto q8 = create_model(std::move(*src), *backend, {}, {}, uniform_mix(DType::kQ8_0));
  ASSERT_TRUE(q8.ok()) << q8.status().message();
  EXPECT_EQ((*q8)->weight_bytes(), want_bytes);
}

// The largest logit difference, relative to the position's largest logit, between the model
// built from a copy of builder's weights on `isa` (a fixed prompt through the paged cache in
// chunks) and the float64 reference of `ref`; infinity when the model does not load.
double difference_from_reference(const ModelConfig& cfg, const ModelBuilder& builder, const RefWeights& ref,
                                 const std::string& isa) {
  ModelBuilder copy = builder;
  auto backend = cpu_backend(isa);
  if (!backend) return std::numeric_limits<double>::infinity();
  auto model = create_model(copy.take(), *backend);
  EXPECT_TRUE(model.ok()) << model.status().message();
  if (!model.ok()) return std::numeric_limits<double>::infinity();
  const std::vector<TokenId> tokens = {1, 17, 5, 60, 33, 2, 41, 8, 8, 19, 0};
  const auto want = reference_logits(cfg, ref, tokens);
  const auto got = engine_logits(**model, tokens, {5, 1, 3, 1, 1});
  std::vector<std::vector<float>> want_f(want.size());
  for (size_t t = 0; t < want.size(); ++t) want_f[t].assign(want[t].begin(), want[t].end());
  return largest_relative_difference(want_f, got);
}

// A W8A8 checkpoint (int8 codes with channel or tensor scales, one projection with a static
// activation scale; the LM head left in float, as compressed-tensors' "ignore" leaves it)
// computes, through the engine's paged cache, what the float64 reference computes from the
// values its codes stand for: the only difference is the activations' int8 rounding per token
// (about 1% of a logit's scale here). A misread layout or scale moves the logits by O(1).
TEST(ModelReference, W8A8CheckpointComputesItsCodesValues) {
  const ModelConfig cfg = base_config();
  ModelBuilder builder(cfg, 31);
  RefWeights ref = builder.build_all();
  const int64_t h = cfg.hidden_size, qd = cfg.num_heads * cfg.head_dim, kvd = cfg.num_kv_heads * cfg.head_dim;
  for (int64_t i = 0; i < cfg.num_layers; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    RefLayer& l = ref.layers[static_cast<size_t>(i)];
    builder.quantize_w8a8(p + "attn_q.weight", &l.wq, qd, h, false, i == 1 ? 0.05f : 0.0f);
    builder.quantize_w8a8(p + "attn_k.weight", &l.wk, kvd, h, /*per_tensor=*/true);
    builder.quantize_w8a8(p + "attn_v.weight", &l.wv, kvd, h, false);
    builder.quantize_w8a8(p + "attn_output.weight", &l.wo, h, qd, false);
    builder.quantize_w8a8(p + "ffn_gate.weight", &l.gate, cfg.intermediate_size, h, false);
    builder.quantize_w8a8(p + "ffn_up.weight", &l.up, cfg.intermediate_size, h, false);
    builder.quantize_w8a8(p + "ffn_down.weight", &l.down, h, cfg.intermediate_size, false);
  }
  for (const char* isa : {"scalar", "auto"}) {
    const double worst = difference_from_reference(cfg, builder, ref, isa);
    EXPECT_LE(worst, 3e-2);
    EXPECT_GT(worst, 0);  // the activations were quantized
    std::printf("W8A8 checkpoint: largest logit difference %.2e of the position's largest\n", worst);
  }
}

// AWQ (GEMM), GPTQ (4-bit act-order v1 in groups, 8-bit symmetric per channel) and
// compressed-tensors pack-quantized checkpoints, packed by the test from the formats' descriptions
// (the LM head left in float), compute through the paged cache what the float64 reference
// computes from the values their codes stand for; as vLLM's CPU path runs them, the activations
// are rounded to int8 per token (about 1% of a logit's scale here). A misread interleave, zero
// point or column order moves the logits by O(1).
TEST(ModelReference, PackedCheckpointsComputeTheirCodesValues) {
  const ModelConfig base = base_config();
  const struct {
    std::string format, method;
    int bits;
    int64_t group;
    bool act_order;
  } kCases[] = {
      {"awq", "awq", 4, 16, false},
      {"gptq", "gptq", 4, 16, true},
      {"gptq8", "gptq", 8, 0, false},
      {"ct", "compressed-tensors", 4, 16, false},
  };
  for (const auto& c : kCases) {
    ModelConfig cfg = base;
    cfg.quantization.method = c.method;
    cfg.quantization.format = c.format == "ct" ? "pack-quantized" : "";
    cfg.quantization.bits = c.bits;
    cfg.quantization.group_size = c.group;
    cfg.quantization.symmetric = c.format == "ct" || c.format == "gptq8";
    cfg.quantization.act_order = c.act_order;
    cfg.quantization.zeros_minus_one = c.method == "gptq";
    ModelBuilder builder(cfg, 41);
    RefWeights ref = builder.build_all();
    const int64_t h = cfg.hidden_size, qd = cfg.num_heads * cfg.head_dim, kvd = cfg.num_kv_heads * cfg.head_dim;
    for (int64_t i = 0; i < cfg.num_layers; ++i) {
      const std::string p = "blk." + std::to_string(i) + ".";
      RefLayer& l = ref.layers[static_cast<size_t>(i)];
      const int64_t g = c.group;
      builder.quantize_packed(p + "attn_q.weight", &l.wq, qd, h, c.format, g, c.act_order);
      builder.quantize_packed(p + "attn_k.weight", &l.wk, kvd, h, c.format, g, c.act_order);
      builder.quantize_packed(p + "attn_v.weight", &l.wv, kvd, h, c.format, g, c.act_order);
      builder.quantize_packed(p + "attn_output.weight", &l.wo, h, qd, c.format, g, c.act_order);
      builder.quantize_packed(p + "ffn_gate.weight", &l.gate, cfg.intermediate_size, h, c.format, g, c.act_order);
      builder.quantize_packed(p + "ffn_up.weight", &l.up, cfg.intermediate_size, h, c.format, g, c.act_order);
      builder.quantize_packed(p + "ffn_down.weight", &l.down, h, cfg.intermediate_size, c.format, g, c.act_order);
    }
    ASSERT_TRUE(check_weights(cfg, builder.source().weights).ok());
    for (const char* isa : {"scalar", "auto"}) {
      const double worst = difference_from_reference(cfg, builder, ref, isa);
      EXPECT_LE(worst, 3e-2) << c.format;
      EXPECT_GT(worst, 0) << c.format;
      std::printf("%s checkpoint: largest logit difference %.2e of the position's largest\n", c.format.c_str(), worst);
    }
  }
}

// What a W8A8 checkpoint can get wrong is refused naming the file and the tensor.
TEST(ModelReference, W8A8CheckpointErrorsNameTheTensor) {
  const ModelConfig cfg = base_config();
  auto backend = cpu_backend("scalar");
  ASSERT_TRUE(backend);
  auto broken = [&](const std::function<void(ModelSource&)>& edit) {
    ModelBuilder builder(cfg, 5);
    RefWeights ref = builder.build_all();
    builder.quantize_w8a8("blk.0.attn_q.weight", &ref.layers[0].wq, cfg.num_heads * cfg.head_dim, cfg.hidden_size, false);
    edit(builder.source());
    auto model = create_model(builder.take(), *backend);
    EXPECT_FALSE(model.ok());
    return model.ok() ? std::string() : model.status().message();
  };
  const std::string missing = broken([](ModelSource& s) {
    // The same tensors but the scale, in a map that keeps the old one (and its buffers) alive.
    auto old = std::make_shared<WeightMap>(std::move(s.weights));
    WeightMap fresh;
    for (const auto& [n, t] : old->all()) {
      if (n != "blk.0.attn_q.weight_scale") fresh.add(n, t);
    }
    fresh.set_source(old->source());
    fresh.keep_alive(old);
    s.weights = std::move(fresh);
  });
  EXPECT_NE(missing.find("blk.0.attn_q.weight holds int8 codes but blk.0.attn_q.weight_scale is missing"),
            std::string::npos) << missing;
  auto odd = std::make_shared<Buffer>(12);
  const std::string shape = broken([&](ModelSource& s) {
    s.weights.add("blk.0.attn_q.weight_scale", Tensor(odd->data(), DType::kF32, {3}));
    s.weights.keep_alive(odd);
  });
  EXPECT_NE(shape.find("blk.0.attn_q.weight_scale [3] f32 is not a float scale per output channel [32, 1]"),
            std::string::npos) << shape;
  auto negative = std::make_shared<Buffer>(4);
  *negative->as<float>() = -1;
  const std::string sign = broken([&](ModelSource& s) {
    s.weights.add("blk.0.attn_q.weight_scale", Tensor(negative->data(), DType::kF32, {1}));
    s.weights.keep_alive(negative);
  });
  EXPECT_NE(sign.find("negative or not finite"), std::string::npos) << sign;
}

// A compressed-tensors weight_shape that disagrees with the projection is refused with both
// shapes in the message, whatever integers it holds (a float round trip once made a huge one
// undefined behaviour; packed_linear_fuzz found it).
TEST(ModelReference, PackedCheckpointShapeErrorsNameBothShapes) {
  ModelConfig cfg = base_config();
  cfg.quantization.method = "compressed-tensors";
  cfg.quantization.format = "pack-quantized";
  cfg.quantization.bits = 4;
  cfg.quantization.group_size = 16;
  cfg.quantization.symmetric = true;
  auto backend = cpu_backend("scalar");
  ASSERT_TRUE(backend);
  auto with_shape = [&](DType type, int64_t rows, int64_t cols) {
    ModelBuilder builder(cfg, 7);
    RefWeights ref = builder.build_all();
    builder.quantize_packed("blk.0.attn_q.weight", &ref.layers[0].wq, cfg.num_heads * cfg.head_dim, cfg.hidden_size, "ct", 16, false);
    auto shape = std::make_shared<Buffer>(16);
    if (type == DType::kI64) {
      shape->as<int64_t>()[0] = rows;
      shape->as<int64_t>()[1] = cols;
    } else {
      shape->as<int32_t>()[0] = static_cast<int32_t>(rows);
      shape->as<int32_t>()[1] = static_cast<int32_t>(cols);
    }
    builder.source().weights.add("blk.0.attn_q.weight_shape", Tensor(shape->data(), type, {2}));
    builder.source().weights.keep_alive(shape);
    auto model = create_model(builder.take(), *backend);
    return model.ok() ? std::string("loaded") : model.status().message();
  };
  const std::string rows = std::to_string(cfg.num_heads * cfg.head_dim), cols = std::to_string(cfg.hidden_size);
  EXPECT_EQ(with_shape(DType::kI64, cfg.num_heads * cfg.head_dim, cfg.hidden_size), "loaded");
  EXPECT_EQ(with_shape(DType::kI32, cfg.num_heads * cfg.head_dim, cfg.hidden_size), "loaded");
  // int64's extremes: as floats they round to 2^63 and -2^63, and the first is past int64.
  const std::string huge = with_shape(DType::kI64, INT64_MAX, INT64_MIN);
  EXPECT_NE(huge.find("blk.0.attn_q.weight_shape (compressed-tensors projection blk.0.attn_q.weight) says [9223372036854775807, "
                      "-9223372036854775808], expected [" + rows + ", " + cols + "]"),
            std::string::npos) << huge;
  const std::string swapped = with_shape(DType::kI32, cfg.hidden_size, cfg.num_heads * cfg.head_dim + 1);
  EXPECT_NE(swapped.find("says [" + cols + ", " + std::to_string(cfg.num_heads * cfg.head_dim + 1) + "], expected [" + rows + ", " + cols + "]"),
            std::string::npos) << swapped;
}

// A GGUF file typed as llama-quantize's Q4_K_M writes a Llama (token_embd and most projections
// Q4_K; attn_v, ffn_down and output Q6_K; a Q5_0 and a Q8_0 projection as its fallbacks for
// other shapes; norms f32) loads as it is and computes what the same weights dequantized to f32
// compute. The quantized side multiplies activations rounded to int8 per block (moving the
// logits by about 1e-2 of their spread, as above); a type read with the wrong layout or id
// moves them by O(1).
TEST(QuantizedGguf, KQuantMixMatchesItsDequantizedWeights) {
  ModelConfig cfg = base_config();
  cfg.vocab_size = 300;
  cfg.hidden_size = 256;
  cfg.intermediate_size = 512;
  cfg.num_layers = 2;
  cfg.num_heads = 4;
  cfg.num_kv_heads = 2;
  cfg.head_dim = 64;
  auto weights = make_dummy_weights(cfg, DType::kF32, 5, "kquant-mix");
  ASSERT_TRUE(weights.ok()) << weights.status().message();
  auto type_of = [](const std::string& name) {
    if (name.find("attn_v") != std::string::npos || name.find("ffn_down") != std::string::npos ||
        name == "output.weight") {
      return DType::kQ6_K;
    }
    if (name == "blk.1.attn_output.weight") return DType::kQ5_0;
    if (name == "blk.1.ffn_gate.weight") return DType::kQ8_0;
    return DType::kQ4_K;
  };
  const std::string dir = testing::make_temp_dir();
  GgufWriter quantized, dequantized;
  std::map<DType, int> seen;
  for (GgufWriter* g : {&quantized, &dequantized}) {
    g->add_string("general.architecture", "llama");
    g->add_u32("llama.vocab_size", static_cast<uint32_t>(cfg.vocab_size));
    g->add_u32("llama.embedding_length", static_cast<uint32_t>(cfg.hidden_size));
    g->add_u32("llama.feed_forward_length", static_cast<uint32_t>(cfg.intermediate_size));
    g->add_u32("llama.block_count", static_cast<uint32_t>(cfg.num_layers));
    g->add_u32("llama.attention.head_count", static_cast<uint32_t>(cfg.num_heads));
    g->add_u32("llama.attention.head_count_kv", static_cast<uint32_t>(cfg.num_kv_heads));
    g->add_u32("llama.context_length", static_cast<uint32_t>(cfg.max_position_embeddings));
    g->add_f32("llama.attention.layer_norm_rms_epsilon", static_cast<float>(cfg.rms_norm_eps));
  }
  for (const auto& [name, t] : weights->all()) {
    if (t.ndim != 2) {
      quantized.add_tensor(name, t);
      dequantized.add_tensor(name, t);
      continue;
    }
    const DType type = type_of(name);
    ++seen[type];
    const int64_t rows = t.num_rows(), cols = t.row_len();
    const int64_t row_bytes = static_cast<int64_t>(*dtype_bytes(type, static_cast<uint64_t>(cols)));
    std::vector<uint8_t> q(static_cast<size_t>(rows * row_bytes));
    std::vector<float> back(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r) {
      quantize_row(type, reinterpret_cast<const float*>(t.row(r)), q.data() + r * row_bytes, cols);
      dequantize_row(type, q.data() + r * row_bytes, back.data() + r * cols, cols);
    }
    quantized.add_tensor(name, type, {rows, cols}, q);
    dequantized.add_tensor(name, DType::kF32, {rows, cols},
                           std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(back.data()), back.size() * 4));
  }
  EXPECT_EQ(seen.size(), 4u);
  ASSERT_TRUE(quantized.write(dir + "/q4_k_m.gguf").ok());
  ASSERT_TRUE(dequantized.write(dir + "/f32.gguf").ok());

  auto backend = cpu_backend("auto");
  ASSERT_TRUE(backend);
  const std::vector<TokenId> tokens = {1, 17, 5, 260, 33, 2, 141, 8, 8, 199, 0};
  auto logits_of = [&](const std::string& file, DType want_output_type) {
    auto src = load_model(dir + "/" + file, LoadOptions{});
    EXPECT_TRUE(src.ok()) << src.status().message();
    EXPECT_EQ(src->weights.find("output.weight")->dtype, want_output_type);
    auto model = create_model(std::move(*src), *backend);
    EXPECT_TRUE(model.ok()) << model.status().message();
    return engine_logits(**model, tokens, {5, 1, 3, 1, 1});
  };
  const double worst = largest_relative_difference(logits_of("f32.gguf", DType::kF32),
                                                   logits_of("q4_k_m.gguf", DType::kQ6_K));
  EXPECT_LE(worst, 3e-2);
  std::printf("Q4_K_M-typed GGUF: largest logit difference %.2e of the position's largest logit\n", worst);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace pagoda
