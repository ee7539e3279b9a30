#include "model/quant/quant_mix.h"

#include "loader/model_source.h"

#include <charconv>

namespace pagoda {
namespace {

struct FileType {
  std::string_view name;
  DType base;
  QuantMixRule rule;
  uint32_t llama_ftype;  // include/llama.h's LLAMA_FTYPE_MOSTLY_*
};

constexpr FileType kFileTypes[] = {
    {"q8_0", DType::kQ8_0, QuantMixRule::kFileType, 7},  {"q4_0", DType::kQ4_0, QuantMixRule::kFileType, 2},
    {"q4_1", DType::kQ4_1, QuantMixRule::kFileType, 3},  {"q5_0", DType::kQ5_0, QuantMixRule::kFileType, 8},
    {"q5_1", DType::kQ5_1, QuantMixRule::kFileType, 9},  {"q6_k", DType::kQ6_K, QuantMixRule::kFileType, 18},
    {"q2_k", DType::kQ2_K, QuantMixRule::kQ2_K, 10},     {"q3_k_m", DType::kQ3_K, QuantMixRule::kQ3_K_M, 12},
    {"q4_k_m", DType::kQ4_K, QuantMixRule::kQ4_K_M, 15}, {"q5_k_m", DType::kQ5_K, QuantMixRule::kQ5_K_M, 17},
};

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// The N of "blk.N.", or -1.
int64_t layer_of(std::string_view name) {
  if (name.substr(0, 4) != "blk.") return -1;
  int64_t layer = -1;
  const char* begin = name.data() + 4;
  const auto [end, ec] = std::from_chars(begin, name.data() + name.size(), layer);
  return ec == std::errc() && end != begin && *end == '.' ? layer : -1;
}

// llama-quantize's use_more_bits(i, n): the first and last eighth of the layers and every third
// one between them.
bool use_more_bits(int64_t i, int64_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

DType mix_rule_type(const QuantMix& mix, const WeightSlot& slot) {
  const std::string_view name = slot.name;
  if (mix.rule == QuantMixRule::kUniform) return mix.base;
  if (name == "output.weight") return mix.base == DType::kQ8_0 ? DType::kQ8_0 : DType::kQ6_K;
  const int64_t i = layer_of(name), n = slot.num_layers;
  const bool attn_v = ends_with(name, ".attn_v.weight");
  // Every down projection: a dense layer's, each expert's (blk.N.ffn_down.E.weight) and a shared
  // expert's, as llama-quantize matches "ffn_down" in stacked and per-expert names alike.
  const bool ffn_down = name.find(".ffn_down") != std::string_view::npos;
  const bool attn_output = ends_with(name, ".attn_output.weight");
  if (i < 0 || !(attn_v || ffn_down || attn_output)) return mix.base;
  switch (mix.rule) {
    case QuantMixRule::kQ2_K:
      if (attn_v) return slot.gqa_group >= 4 ? DType::kQ4_K : DType::kQ3_K;
      return DType::kQ3_K;  // ffn_down, attn_output
    case QuantMixRule::kQ3_K_M:
      if (attn_v) return i < 2 ? DType::kQ5_K : DType::kQ4_K;
      if (ffn_down) return i < n / 16 ? DType::kQ5_K : DType::kQ4_K;
      return DType::kQ4_K;
    case QuantMixRule::kQ4_K_M:
      if (attn_output) return DType::kQ4_K;
      return use_more_bits(i, n) ? DType::kQ6_K : DType::kQ4_K;
    case QuantMixRule::kQ5_K_M:
      if (attn_output) return DType::kQ5_K;
      return use_more_bits(i, n) ? DType::kQ6_K : DType::kQ5_K;
    case QuantMixRule::kUniform:
    case QuantMixRule::kFileType:
    case QuantMixRule::kIntCodes:
      break;
  }
  return mix.base;
}

}  // namespace

QuantMix uniform_mix(DType t) { return {std::string(dtype_name(t)), t, QuantMixRule::kUniform}; }

std::optional<QuantMix> llama_file_type_mix(std::string_view name) {
  for (const FileType& f : kFileTypes) {
    if (f.name == name) return QuantMix{std::string(f.name), f.base, f.rule, 0, 0, f.llama_ftype};
  }
  return std::nullopt;
}

std::vector<std::string> llama_file_type_names() {
  std::vector<std::string> out;
  for (const FileType& f : kFileTypes) out.emplace_back(f.name);
  return out;
}

std::optional<QuantMix> int_codes_mix(std::string_view name) {
  if (name == "w8a8") return QuantMix{"w8a8", DType::kF32, QuantMixRule::kIntCodes, 8, 0};
  if (name == "w4a8") return QuantMix{"w4a8", DType::kF32, QuantMixRule::kIntCodes, 4, 128};
  return std::nullopt;
}

bool quant_mix_int_codes(const QuantMix& mix, const WeightSlot& slot) {
  return mix.rule == QuantMixRule::kIntCodes && layer_of(slot.name) >= 0 && !is_expert_router(slot.name);
}

int64_t quant_mix_int_group(const QuantMix& mix, int64_t row_len) {
  return mix.int_group_size > 0 && row_len % mix.int_group_size == 0 ? mix.int_group_size : row_len;
}

DType quant_mix_type(const QuantMix& mix, const WeightSlot& slot, int64_t row_len) {
  if (is_expert_router(slot.name)) return DType::kF32;
  return dtype_for_rows(mix_rule_type(mix, slot), row_len);
}

}  // namespace pagoda
