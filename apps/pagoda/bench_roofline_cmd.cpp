// `pagoda bench roofline`: the machine's limits (memory read bandwidth, peak f32 FMA, int8 and
// bf16 dot-product rates) measured here, and what they imply for each built-in model shape and
// weight type: the weight bytes one decode step reads, hence the decode ceiling in tokens/s of a
// single sequence (bandwidth / bytes), and the prefill ceiling (peak FLOP/s / 2 FLOPs per weight).
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "apps/pagoda/commands.h"
#include "backend/cpu/cpu_thread_pool.h"
#include "backend/cpu/machine_limits.h"
#include "loader/model_source.h"
#include "tensor/dtype.h"

namespace pagoda::app {

int64_t decode_weight_bytes(const ModelConfig& c, DType type) {
  // Every matrix a token uses is read once per step: the layers' projections and the LM head
  // (the embedding table only for one row, which is negligible; norms are tiny f32 vectors and
  // left out). A sparse layer: the router, the token's num_experts_per_tok experts and the shared
  // expert with its gate (one sequence: the bytes of the active parameters).
  const int64_t h = c.hidden_size, q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim;
  int64_t weights = c.vocab_size * h;
  for (int64_t layer = 0; layer < c.num_layers; ++layer) {
    weights += h * (q + 2 * kv) + q * h;
    if (!c.is_sparse_layer(layer)) {
      weights += 3 * h * c.intermediate_size;
      continue;
    }
    weights += c.num_experts * h + c.num_experts_per_tok * 3 * h * c.moe_intermediate_size;
    if (c.shared_expert_intermediate_size > 0) weights += 3 * h * c.shared_expert_intermediate_size + h;
  }
  return weights * block_bytes(type) / block_elems(type);
}

int run_bench_roofline(const BenchRooflineFlags& f) {
  if (f.threads < 0 || !(f.seconds > 0)) return fail(invalid_argument("--threads must be >= 0 and --seconds > 0"));
  auto bytes = parse_byte_size(f.buffer);
  if (!bytes.ok()) return fail(bytes.status());
  const int threads = f.threads > 0 ? static_cast<int>(f.threads) : cpu::physical_cores();
  const cpu::MachineLimits m = cpu::measure_machine_limits(threads, *bytes, f.seconds);
  const std::string cpu = cpu::cpu_model_name();
  std::printf("CPU: %s, %d threads\n", cpu.c_str(), m.threads);
  std::printf("Memory read bandwidth:  %8.2f GB/s\n", m.read_gbps);
  std::printf("f32 FMA peak (%s): %8.2f GFLOP/s\n", m.f32_isa.c_str(), m.f32_fma_gflops);
  if (m.int8_dot_gops > 0) std::printf("int8 dot peak (%s): %8.2f GOP/s\n", m.int8_isa.c_str(), m.int8_dot_gops);
  if (m.bf16_dot_gflops > 0) std::printf("bf16 dot peak:          %8.2f GFLOP/s\n", m.bf16_dot_gflops);
  std::printf("\n%-16s %-6s %14s %22s %24s\n", "model", "type", "bytes/decode", "decode ceiling (tok/s)",
              "f32 prefill ceiling (tok/s)");
  nlohmann::json ceilings = nlohmann::json::array();
  for (const std::string& name : dummy_presets()) {
    const auto config = dummy_preset(name);
    if (!config) continue;
    for (const DTypeTraits& traits : all_dtypes()) {
      if (!traits.dense_matmul) continue;  // i8 codes: see w8a8 (its scales add little)
      const DType t = traits.type;
      const int64_t b = decode_weight_bytes(*config, t);
      const double decode = m.read_gbps * 1e9 / static_cast<double>(b);
      // Two FLOPs per weight per token; the same weights without the LM head's rows beyond one.
      const double flops_per_token = 2.0 * static_cast<double>(decode_weight_bytes(*config, DType::kF32)) / 4.0;
      const double prefill = m.f32_fma_gflops * 1e9 / flops_per_token;
      std::printf("%-16s %-6s %14lld %22.1f %24.1f\n", name.c_str(), std::string(dtype_name(t)).c_str(), static_cast<long long>(b), decode,
                  prefill);
      ceilings.push_back({{"model", name}, {"type", std::string(dtype_name(t))}, {"bytes_per_decode_step", b},
                          {"decode_ceiling_tokens_per_s", decode}, {"prefill_ceiling_tokens_per_s", prefill}});
    }
  }
  if (!f.output_json.empty()) {
    nlohmann::json j = {{"cpu", cpu},
                        {"threads", m.threads},
                        {"read_gbps", m.read_gbps},
                        {"f32_fma_gflops", m.f32_fma_gflops},
                        {"f32_isa", m.f32_isa},
                        {"int8_dot_gops", m.int8_dot_gops},
                        {"int8_isa", m.int8_isa},
                        {"bf16_dot_gflops", m.bf16_dot_gflops},
                        {"ceilings", ceilings}};
    std::ofstream out(f.output_json);
    out << j.dump(2) << "\n";
    if (!out) return fail(Status(StatusCode::kIoError, f.output_json + ": cannot write"));
  }
  return 0;
}

}  // namespace pagoda::app
