// Deterministic random weights for --load-format dummy, and the built-in dummy configs.
#include <cmath>
#include <new>
#include <vector>

#include "loader/model_source.h"
#include "tensor/convert.h"

namespace pagoda {

namespace {

// SplitMix64: a tiny, fast, well-mixed 64-bit generator; one stream per tensor.
struct SplitMix64 {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
};

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

// Fills `out` with uniform values in [center - a, center + a); two values per 64 random bits.
void fill_uniform(SplitMix64& rng, float center, float a, float* out, int64_t n) {
  constexpr float kScale = 2.0f / 16777216.0f;  // 24-bit integer -> [0, 2)
  int64_t i = 0;
  for (; i + 1 < n; i += 2) {
    uint64_t r = rng.next();
    out[i] = center + a * (static_cast<float>(r >> 40) * kScale - 1.0f);
    out[i + 1] = center + a * (static_cast<float>(r & 0xffffff) * kScale - 1.0f);
  }
  if (i < n) out[i] = center + a * (static_cast<float>(rng.next() >> 40) * kScale - 1.0f);
}

}  // namespace

Result<WeightMap> make_dummy_weights(const ModelConfig& config, DType dtype, uint64_t seed,
                                     const std::string& source) {
  PAGODA_RETURN_IF_ERROR(config.validate(source));
  std::vector<WeightSpec> specs = expected_weights(config);
  WeightMap map;
  map.set_source(source);
  std::vector<float> row;
  for (const WeightSpec& s : specs) {
    // Norms, biases and routers stay f32, as GGUF stores them; matrices take the requested type,
    // or its shape fallback where their rows are not whole blocks of it (as llama-quantize
    // writes them).
    DType t = s.kind == WeightSpec::Kind::kMatrix && !is_expert_router(s.name) ? dtype_for_rows(dtype, s.shape.back())
                                                                             : DType::kF32;
    Tensor tensor;
    tensor.dtype = t;
    tensor.ndim = static_cast<int>(s.shape.size());
    for (int d = 0; d < tensor.ndim; ++d) tensor.shape[d] = s.shape[d];
    std::shared_ptr<Buffer> buffer;
    try {
      buffer = std::make_shared<Buffer>(static_cast<size_t>(tensor.nbytes()));
    } catch (const std::bad_alloc&) {
      return resource_exhausted(source + ": out of memory for dummy tensor " + s.name + " (" +
                                std::to_string(tensor.nbytes()) + " bytes)");
    }
    tensor.data = buffer->data();
    SplitMix64 rng{seed ^ fnv1a(s.name)};
    rng.next();  // decorrelate nearby seeds
    int64_t row_len = tensor.row_len();
    row.resize(static_cast<size_t>(row_len));
    float center = 0.0f, a = 0.0f;
    switch (s.kind) {
      case WeightSpec::Kind::kMatrix:
        // Keep activations O(1): each output sums row_len terms of size ~1/sqrt(row_len).
        a = 1.0f / std::sqrt(static_cast<float>(row_len));
        break;
      case WeightSpec::Kind::kNorm: center = 1.0f; a = 0.1f; break;
      case WeightSpec::Kind::kBias: a = 0.02f; break;
    }
    for (int64_t r = 0; r < tensor.num_rows(); ++r) {
      fill_uniform(rng, center, a, row.data(), row_len);
      quantize_row(t, row.data(), const_cast<uint8_t*>(tensor.row(r)), row_len);
    }
    map.add(s.name, tensor, std::move(buffer));
  }
  return map;
}

std::vector<std::string> dummy_presets() {
  return {"demo-random", "llama-110m",    "tinyllama-1.1b",    "qwen2.5-0.5b", "qwen3-0.6b",
          "llama-3.2-1b", "qwen3-30b-a3b", "qwen1.5-moe-a2.7b", "mixtral-8x7b"};
}

std::optional<ModelConfig> dummy_preset(const std::string& name) {
  ModelConfig c;
  c.architecture = "llama";
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  if (name == "demo-random") {
    // Byte tokenizer: 256 bytes + BOS 256 + EOS 257.
    c.vocab_size = 258;
    c.hidden_size = 64;
    c.intermediate_size = 176;
    c.num_layers = 2;
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.max_position_embeddings = 2048;
  } else if (name == "llama-110m") {  // the shape of llama2.c's stories110M
    c.vocab_size = 32000;
    c.hidden_size = 768;
    c.intermediate_size = 2048;
    c.num_layers = 12;
    c.num_heads = 12;
    c.num_kv_heads = 12;
    c.max_position_embeddings = 1024;
  } else if (name == "tinyllama-1.1b") {
    c.vocab_size = 32000;
    c.hidden_size = 2048;
    c.intermediate_size = 5632;
    c.num_layers = 22;
    c.num_heads = 32;
    c.num_kv_heads = 4;
    c.max_position_embeddings = 2048;
  } else if (name == "qwen2.5-0.5b") {
    c.architecture = "qwen2";
    c.vocab_size = 151936;
    c.hidden_size = 896;
    c.intermediate_size = 4864;
    c.num_layers = 24;
    c.num_heads = 14;
    c.num_kv_heads = 2;
    c.max_position_embeddings = 32768;
    c.rms_norm_eps = 1e-6;
    c.rope_theta = 1e6;
    c.tie_word_embeddings = true;
    c.attention_bias = true;
  } else if (name == "qwen3-0.6b") {
    c.architecture = "qwen3";
    c.vocab_size = 151936;
    c.hidden_size = 1024;
    c.intermediate_size = 3072;
    c.num_layers = 28;
    c.num_heads = 16;
    c.num_kv_heads = 8;
    c.head_dim = 128;
    c.max_position_embeddings = 40960;
    c.rms_norm_eps = 1e-6;
    c.rope_theta = 1e6;
    c.tie_word_embeddings = true;
    c.qk_norm = true;
  } else if (name == "llama-3.2-1b") {
    c.vocab_size = 128256;
    c.hidden_size = 2048;
    c.intermediate_size = 8192;
    c.num_layers = 16;
    c.num_heads = 32;
    c.num_kv_heads = 8;
    c.max_position_embeddings = 131072;
    c.rope_theta = 500000.0;
    c.rope_scaling.type = RopeScaling::Type::kLlama3;
    c.rope_scaling.factor = 32.0;
    c.rope_scaling.low_freq_factor = 1.0;
    c.rope_scaling.high_freq_factor = 4.0;
    c.rope_scaling.original_max_position_embeddings = 8192;
    c.tie_word_embeddings = true;
  } else if (name == "qwen3-30b-a3b") {  // 30.5B parameters, 3.3B a token
    c.architecture = "qwen3_moe";
    c.vocab_size = 151936;
    c.hidden_size = 2048;
    c.intermediate_size = 6144;
    c.num_layers = 48;
    c.num_heads = 32;
    c.num_kv_heads = 4;
    c.head_dim = 128;
    c.max_position_embeddings = 40960;
    c.rms_norm_eps = 1e-6;
    c.rope_theta = 1e6;
    c.qk_norm = true;
    c.num_experts = 128;
    c.num_experts_per_tok = 8;
    c.moe_intermediate_size = 768;
    c.norm_topk_prob = true;
  } else if (name == "qwen1.5-moe-a2.7b") {  // 14.3B parameters, 2.7B a token
    c.architecture = "qwen2_moe";
    c.vocab_size = 151936;
    c.hidden_size = 2048;
    c.intermediate_size = 5632;
    c.num_layers = 24;
    c.num_heads = 16;
    c.num_kv_heads = 16;
    c.max_position_embeddings = 8192;
    c.rms_norm_eps = 1e-6;
    c.rope_theta = 1e6;
    c.attention_bias = true;
    c.num_experts = 60;
    c.num_experts_per_tok = 4;
    c.moe_intermediate_size = 1408;
    c.shared_expert_intermediate_size = 5632;
  } else if (name == "mixtral-8x7b") {  // 46.7B parameters, 12.9B a token
    c.architecture = "mixtral";
    c.vocab_size = 32000;
    c.hidden_size = 4096;
    c.intermediate_size = 14336;
    c.num_layers = 32;
    c.num_heads = 32;
    c.num_kv_heads = 8;
    c.max_position_embeddings = 32768;
    c.rope_theta = 1e6;
    c.num_experts = 8;
    c.num_experts_per_tok = 2;
    c.moe_intermediate_size = 14336;
    c.norm_topk_prob = true;
  } else {
    return std::nullopt;
  }
  if (c.head_dim == 0) c.head_dim = c.hidden_size / c.num_heads;
  return c;
}

int64_t dummy_weight_bytes(const ModelConfig& config, DType dtype) {
  int64_t bytes = 0;
  for (const WeightSpec& s : expected_weights(config)) {
    const DType t = s.kind == WeightSpec::Kind::kMatrix && !is_expert_router(s.name) ? dtype_for_rows(dtype, s.shape.back())
                                                                                   : DType::kF32;
    int64_t rows = 1;
    for (size_t d = 0; d + 1 < s.shape.size(); ++d) rows *= s.shape[d];
    bytes += rows * (s.shape.back() / block_elems(t)) * block_bytes(t);
  }
  return bytes;
}

}  // namespace pagoda
