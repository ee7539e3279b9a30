#include "model/arch/registry.h"

namespace pagoda {
namespace {

constexpr ArchitectureSpec kArchitectures[] = {
    {"llama", "Llama 2/3, TinyLlama, Mistral", GatedMlp::load},
    {"qwen2", "Qwen2, Qwen2.5 (Q/K/V biases)", GatedMlp::load},
    {"qwen3", "Qwen3 (per-head q/k norms)", GatedMlp::load},
};

}  // namespace

std::span<const ArchitectureSpec> architectures() { return kArchitectures; }

const ArchitectureSpec* find_architecture(std::string_view name) {
  for (const ArchitectureSpec& a : kArchitectures) {
    if (a.name == name) return &a;
  }
  return nullptr;
}

}  // namespace pagoda
