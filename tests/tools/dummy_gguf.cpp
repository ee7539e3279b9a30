// pagoda_dummy_gguf PRESET TYPE OUT.gguf [THROUGH] [--vocab VOCAB.gguf]: writes the deterministic
// random weights of a built-in config (tinyllama-1.1b, ...) as a llama GGUF file of TYPE (f32,
// f16, bf16, q8_0, q4_0; norms stay f32, as converters keep them), without a vocabulary (pair it
// with --tokenizer). With THROUGH, the weight matrices are first rounded to that type, then stored
// as TYPE: `f16 OUT q4_0` is the q4_0 file's weights in f16 (an f16 model with a q4_0 copy of
// itself, the pairing of a speculative-decoding target and its draft). With --vocab, the
// tokenizer.* entries of VOCAB.gguf (one of llama.cpp's ggml-vocab-*.gguf files, whose size must
// be the preset's vocab_size) are copied in, so that programs that need the vocabulary in the file
// (llama.cpp's llama-bench) load it. For measuring what depends on a real file on disk, such as
// the start-up time of `pagoda serve` (scripts/bench-startup), and for running other engines on
// the same weights; its text is noise.
#include <cstdio>
#include <string>

#include <memory>
#include <vector>

#include "loader/gguf_file.h"
#include "loader/gguf_writer.h"
#include "loader/model_source.h"
#include "tensor/convert.h"

int main(int argc, char** argv) {
  using namespace pagoda;
  std::string vocab_path;
  if (argc >= 3 && std::string(argv[argc - 2]) == "--vocab") {
    vocab_path = argv[argc - 1];
    argc -= 2;
  }
  if (argc != 4 && argc != 5) {
    std::fprintf(stderr, "usage: pagoda_dummy_gguf PRESET TYPE OUT.gguf [THROUGH] [--vocab VOCAB.gguf]\n");
    return 2;
  }
  const auto type = dtype_from_name(argv[2]);
  const auto through = dtype_from_name(argc == 5 ? argv[4] : argv[2]);
  if (!type || !through) {
    std::fprintf(stderr, "pagoda_dummy_gguf: unknown type '%s'\n", !type ? argv[2] : argv[4]);
    return 2;
  }
  LoadOptions options;
  options.format = LoadFormat::kDummy;
  options.dummy_dtype = *through;
  auto source = load_model(argv[1], options);
  if (!source.ok()) {
    std::fprintf(stderr, "pagoda_dummy_gguf: %s\n", source.status().message().c_str());
    return 1;
  }
  const ModelConfig& c = source->config;
  if (c.architecture != "llama") {
    std::fprintf(stderr, "pagoda_dummy_gguf: only llama-architecture presets are written\n");
    return 1;
  }
  GgufWriter g;
  const std::string a = "llama.";
  g.add_string("general.architecture", "llama");
  g.add_u32(a + "vocab_size", static_cast<uint32_t>(c.vocab_size));
  g.add_u32(a + "embedding_length", static_cast<uint32_t>(c.hidden_size));
  g.add_u32(a + "feed_forward_length", static_cast<uint32_t>(c.intermediate_size));
  g.add_u32(a + "block_count", static_cast<uint32_t>(c.num_layers));
  g.add_u32(a + "attention.head_count", static_cast<uint32_t>(c.num_heads));
  g.add_u32(a + "attention.head_count_kv", static_cast<uint32_t>(c.num_kv_heads));
  g.add_u32(a + "context_length", static_cast<uint32_t>(c.max_position_embeddings));
  g.add_f32(a + "attention.layer_norm_rms_epsilon", static_cast<float>(c.rms_norm_eps));
  g.add_f32(a + "rope.freq_base", static_cast<float>(c.rope_theta));
  if (!vocab_path.empty()) {
    auto vocab = GgufFile::open(vocab_path);
    if (!vocab.ok()) {
      std::fprintf(stderr, "pagoda_dummy_gguf: %s\n", vocab.status().message().c_str());
      return 1;
    }
    int64_t tokens = -1;
    for (const auto& [key, value] : (*vocab)->metadata()) {
      if (key.rfind("tokenizer.", 0) != 0) continue;
      if (key == "tokenizer.ggml.tokens") tokens = static_cast<int64_t>(value.count);
      if (!g.add_value(key, value)) {
        std::fprintf(stderr, "pagoda_dummy_gguf: %s: %s cannot be copied\n", vocab_path.c_str(), key.c_str());
        return 1;
      }
    }
    if (tokens != c.vocab_size) {
      std::fprintf(stderr, "pagoda_dummy_gguf: %s has %lld tokens, %s has a vocabulary of %lld\n", vocab_path.c_str(),
                   static_cast<long long>(tokens), argv[1], static_cast<long long>(c.vocab_size));
      return 1;
    }
  }
  std::vector<std::shared_ptr<Buffer>> converted;
  for (const auto& [name, tensor] : source->weights.all()) {
    if (tensor.dtype == *type || tensor.dtype == DType::kF32) {
      g.add_tensor(name, tensor);
      continue;
    }
    Tensor t = tensor;
    t.dtype = *type;
    converted.push_back(std::make_shared<Buffer>(static_cast<size_t>(t.nbytes())));
    t.data = converted.back()->data();
    std::vector<float> row(static_cast<size_t>(t.row_len()));
    for (int64_t r = 0; r < t.num_rows(); ++r) {
      dequantize_row(tensor.dtype, tensor.row(r), row.data(), t.row_len());
      quantize_row(t.dtype, row.data(), const_cast<uint8_t*>(t.row(r)), t.row_len());
    }
    g.add_tensor(name, t);
  }
  const Status st = g.write(argv[3]);
  if (!st.ok()) {
    std::fprintf(stderr, "pagoda_dummy_gguf: %s\n", st.message().c_str());
    return 1;
  }
  return 0;
}
