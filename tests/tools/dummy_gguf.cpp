// pagoda_dummy_gguf PRESET TYPE OUT.gguf: writes the deterministic random weights of a built-in
// config (tinyllama-1.1b, ...) as a llama GGUF file of TYPE (f32, f16, bf16, q8_0, q4_0; norms
// stay f32, as converters keep them), without a vocabulary (pair it with --tokenizer). For
// measuring what depends on a real file on disk, such as the start-up time of `pagoda serve`
// (scripts/bench-startup); its text is noise.
#include <cstdio>
#include <string>

#include "loader/gguf_writer.h"
#include "loader/model_source.h"

int main(int argc, char** argv) {
  using namespace pagoda;
  if (argc != 4) {
    std::fprintf(stderr, "usage: pagoda_dummy_gguf PRESET TYPE OUT.gguf\n");
    return 2;
  }
  const auto type = dtype_from_name(argv[2]);
  if (!type) {
    std::fprintf(stderr, "pagoda_dummy_gguf: unknown type '%s'\n", argv[2]);
    return 2;
  }
  LoadOptions options;
  options.format = LoadFormat::kDummy;
  options.dummy_dtype = *type;
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
  for (const auto& [name, tensor] : source->weights.all()) g.add_tensor(name, tensor);
  const Status st = g.write(argv[3]);
  if (!st.ok()) {
    std::fprintf(stderr, "pagoda_dummy_gguf: %s\n", st.message().c_str());
    return 1;
  }
  return 0;
}
