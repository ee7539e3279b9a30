// A quantized checkpoint's packed projection (AWQ, GPTQ, compressed-tensors pack-quantized) from
// any safetensors bytes: read_packed_linear either decodes codes of exactly the sizes IntCodes
// promises (a column permutation that is one) or fails naming the source. Input: byte 0 picks the
// scheme, bytes 1 and 2 the projection's [out, in] (multiples of 8 up to 64), the rest is the file.
#include <algorithm>
#include <string>
#include <vector>

#include "fuzz_support.h"
#include "loader/model_source.h"
#include "loader/packed_names.h"
#include "loader/safetensors_file.h"
#include "model/quant/packed_linear.h"

using namespace pagoda;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  // Scheme: method, format, bits, group size, symmetric, act-order, v1 zeros.
  struct Scheme {
    const char* method;
    const char* format;
    int bits;
    int64_t group;
    bool symmetric, act_order, minus_one;
  };
  static constexpr Scheme kSchemes[] = {
      {"awq", "", 4, 8, false, false, false},
      {"gptq", "", 4, 8, false, true, true},
      {"gptq", "", 8, 0, true, false, true},
      {"compressed-tensors", "pack-quantized", 4, 16, true, false, false},
      {"compressed-tensors", "pack-quantized", 4, 8, false, true, false},
      {"gptq", "", 4, 16, true, false, false},
  };
  const Scheme& s = kSchemes[data[0] % 6];
  CheckpointQuantization q;
  q.method = s.method;
  q.format = s.format;
  q.bits = s.bits;
  q.group_size = s.group;
  q.symmetric = s.symmetric;
  q.act_order = s.act_order;
  q.zeros_minus_one = s.minus_one;
  const int64_t n = 8 * (1 + data[1] % 8), k = 8 * (1 + data[2] % 8);
  fuzz::MemFile file(data + 3, size - 3);
  auto opened = SafetensorsFile::open(file.path());
  if (!opened.ok()) return 0;  // safetensors_fuzz covers the container
  std::shared_ptr<const SafetensorsFile> st(std::move(opened).value());
  WeightMap weights;
  weights.set_source(file.path());
  for (const SafetensorsTensor& t : st->tensors()) {
    if (auto canonical = canonical_name_from_hf(t.name)) weights.add(*canonical, t.tensor);
  }
  weights.keep_alive(st);
  const std::string name = "blk.0.attn_q.weight";
  if (!has_packed_linear(weights, name, q)) return 0;
  auto codes = read_packed_linear(weights, name, n, k, q);
  if (!codes.ok()) {
    FUZZ_CHECK(codes.status().message().rfind(file.path() + ": tensor ", 0) == 0);
    return 0;
  }
  const IntCodes& c = *codes;
  FUZZ_CHECK(c.n == n && c.k == k && c.group_size > 0 && k % c.group_size == 0);
  FUZZ_CHECK(static_cast<int64_t>(c.codes.size()) == n * (c.bits == 8 ? k : k / 2));
  FUZZ_CHECK(static_cast<int64_t>(c.scales.size()) == n * c.groups());
  FUZZ_CHECK(c.zero_points.empty() || static_cast<int64_t>(c.zero_points.size()) == n * c.groups());
  if (!c.perm.empty()) {
    std::vector<int32_t> sorted = c.perm;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t t = 0; t < k; ++t) FUZZ_CHECK(sorted[static_cast<size_t>(t)] == t);
  }
  return 0;
}
