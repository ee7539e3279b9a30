// Packing of matmul weights into the panel layout of the AVX2 kernels (x86_kernels.h describes
// it). Plain byte moves, built with baseline flags.
#include <algorithm>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/x86/x86_kernels.h"
#include "base/check.h"
#include "backend/kernels.h"
#include "base/thread_pool.h"
#include "tensor/gguf_blocks.h"
#include "tensor/quant_blocks.h"
#include "tensor/tensor.h"

namespace pagoda::cpu {
namespace {

// Row c's 32-byte run `src` in lane order (x86_kernels.h): its bytes [4g, 4g + 4) at 32 g + 4 c of
// the 256 bytes at dst.
void lane_order_run(const uint8_t* src, int64_t c, uint8_t* dst) {
  for (int g = 0; g < 8; ++g) std::memcpy(dst + 32 * g + 4 * c, src + 4 * g, 4);
}

// Scales and weight groups of row c of a panel, one quantized block at a time.
template <class Block, int kGroups>
void pack_quant_row(const uint8_t* src, int64_t nb, int64_t c, uint8_t* panel) {
  constexpr int64_t kPanelBlockBytes = kPanelRows * static_cast<int64_t>(sizeof(Block));
  for (int64_t b = 0; b < nb; ++b) {
    Block blk;
    std::memcpy(&blk, src + b * static_cast<int64_t>(sizeof(Block)), sizeof blk);
    uint8_t* dst = panel + b * kPanelBlockBytes;
    std::memcpy(dst + 2 * c, &blk.d, 2);
    for (int g = 0; g < kGroups; ++g) {
      std::memcpy(dst + 16 + 32 * g + 4 * c, reinterpret_cast<const uint8_t*>(blk.qs) + 4 * g, 4);
    }
  }
}

// Row c of a q4_1 / q5_0 / q5_1 panel (x86_kernels.h): d, then m and the fifth bits where the
// type has them (the bits regrouped so that byte j of the row's word holds, at bit 2h, element
// 4h + j's and, at bit 2h + 1, element 16 + 4h + j's), then the qs bytes as q4_0's.
template <class Block, bool kMin, bool kFifth>
void pack_nibble_row(const uint8_t* src, int64_t nb, int64_t c, uint8_t* panel) {
  constexpr int64_t kPanelBlockBytes = kPanelRows * static_cast<int64_t>(sizeof(Block));
  constexpr int64_t kFifthAt = 16 + (kMin ? 16 : 0), kCodesAt = kFifthAt + (kFifth ? 32 : 0);
  for (int64_t b = 0; b < nb; ++b) {
    Block blk;
    std::memcpy(&blk, src + b * static_cast<int64_t>(sizeof(Block)), sizeof blk);
    uint8_t* dst = panel + b * kPanelBlockBytes;
    std::memcpy(dst + 2 * c, &blk.d, 2);
    if constexpr (kMin) std::memcpy(dst + 16 + 2 * c, &blk.m, 2);
    if constexpr (kFifth) {
      const uint32_t qh = static_cast<uint32_t>(blk.qh[0]) | static_cast<uint32_t>(blk.qh[1]) << 8 |
                          static_cast<uint32_t>(blk.qh[2]) << 16 | static_cast<uint32_t>(blk.qh[3]) << 24;
      for (int j = 0; j < 4; ++j) {
        uint8_t byte = 0;
        for (int h = 0; h < 4; ++h) {
          byte = static_cast<uint8_t>(byte | ((qh >> (4 * h + j)) & 1) << (2 * h) |
                                      ((qh >> (16 + 4 * h + j)) & 1) << (2 * h + 1));
        }
        dst[kFifthAt + 4 * c + j] = byte;
      }
    }
    for (int g = 0; g < 4; ++g) std::memcpy(dst + kCodesAt + 32 * g + 4 * c, blk.qs + 4 * g, 4);
  }
}

// Row c of a panel of a plain type: its k elements of elem_bytes, 8 elements apart.
void pack_plain_row(const uint8_t* src, int64_t k, int64_t elem_bytes, int64_t c, uint8_t* panel) {
  for (int64_t t = 0; t < k; ++t) {
    std::memcpy(panel + (t * kPanelRows + c) * elem_bytes, src + t * elem_bytes,
                static_cast<size_t>(elem_bytes));
  }
}

// Row c of a q4_k / q5_k panel (x86_kernels.h): nibbles (and q5_k's qh) in lane order, 6-bit
// scales and mins unpacked.
template <class Block, bool kFifth>
void pack_k4_row(const uint8_t* src, int64_t nb, int64_t c, uint8_t* panel) {
  constexpr int64_t kBlockBytes = kFifth ? kQ5KPanelBlockBytes : kQ4KPanelBlockBytes;
  constexpr int64_t kScalesAt = kFifth ? 1280 : 1024;
  for (int64_t b = 0; b < nb; ++b) {
    Block blk;
    std::memcpy(&blk, src + b * static_cast<int64_t>(sizeof blk), sizeof blk);
    uint8_t* dst = panel + b * kBlockBytes;
    for (int p = 0; p < 4; ++p) lane_order_run(blk.qs + 32 * p, c, dst + 256 * p);
    if constexpr (kFifth) lane_order_run(blk.qh, c, dst + 1024);
    QuantChunk chunks[8];  // the table's decoder: its sub-block scales and mins (6 bits each)
    dtype_traits(kFifth ? DType::kQ5_K : DType::kQ4_K).decode_chunks(&blk, chunks);
    for (int s = 0; s < 8; ++s) {
      dst[kScalesAt + 8 * s + c] = static_cast<uint8_t>(chunks[s].sc[0]);
      dst[kScalesAt + 64 + 8 * s + c] = static_cast<uint8_t>(chunks[s].mn[0]);
    }
    std::memcpy(dst + kScalesAt + 128 + 2 * c, &blk.d, 2);
    std::memcpy(dst + kScalesAt + 144 + 2 * c, &blk.dmin, 2);
  }
}

// Row c of a q2_k / q3_k panel (x86_kernels.h): the code runs (and q3_k's hmask) in lane order,
// then the sub-block scales (q2_k's bytes as stored; q3_k's unpacked to int8), d (and dmin).
template <class Block, bool kQ3>
void pack_k16_row(const uint8_t* src, int64_t nb, int64_t c, uint8_t* panel) {
  constexpr int64_t kBlockBytes = kQ3 ? kQ3KPanelBlockBytes : kQ2KPanelBlockBytes;
  constexpr int64_t kScalesAt = kQ3 ? 768 : 512, kDAt = kQ3 ? 896 : 640;
  for (int64_t b = 0; b < nb; ++b) {
    Block blk;
    std::memcpy(&blk, src + b * static_cast<int64_t>(sizeof blk), sizeof blk);
    uint8_t* dst = panel + b * kBlockBytes;
    for (int a = 0; a < 2; ++a) lane_order_run(blk.qs + 32 * a, c, dst + 256 * a);
    if constexpr (kQ3) {
      lane_order_run(blk.hmask, c, dst + 512);
      QuantChunk chunks[8];  // the table's decoder: the 6-bit scales, signed
      decode_chunks_q3_k(&blk, chunks);
      for (int j = 0; j < 16; ++j) dst[kScalesAt + 8 * j + c] = static_cast<uint8_t>(static_cast<int8_t>(chunks[j / 2].sc[j % 2]));
    } else {
      for (int j = 0; j < 16; ++j) dst[kScalesAt + 8 * j + c] = blk.scales[j];
      std::memcpy(dst + 656 + 2 * c, &blk.dmin, 2);
    }
    std::memcpy(dst + kDAt + 2 * c, &blk.d, 2);
  }
}

// Row c of a q6_k panel (x86_kernels.h): the code bytes in lane order, the scales per row.
void pack_q6_k_row(const uint8_t* src, int64_t nb, int64_t c, uint8_t* panel) {
  for (int64_t b = 0; b < nb; ++b) {
    BlockQ6_K blk;
    std::memcpy(&blk, src + b * static_cast<int64_t>(sizeof blk), sizeof blk);
    uint8_t* dst = panel + b * kQ6KPanelBlockBytes;
    for (int h = 0; h < 2; ++h) {
      const uint8_t* runs[3] = {blk.ql + 64 * h, blk.ql + 64 * h + 32, blk.qh + 32 * h};
      for (int a = 0; a < 3; ++a) lane_order_run(runs[a], c, dst + 768 * h + 256 * a);
    }
    for (int i = 0; i < 16; ++i) dst[1536 + 8 * i + c] = static_cast<uint8_t>(blk.scales[i]);
    std::memcpy(dst + 1664 + 2 * c, &blk.d, 2);
  }
}

}  // namespace

int64_t packed_panel_bytes(DType type, int64_t k) {
  if (type == DType::kQ4_K) return (k / block_elems(type)) * kQ4KPanelBlockBytes;
  if (type == DType::kQ5_K) return (k / block_elems(type)) * kQ5KPanelBlockBytes;
  if (type == DType::kQ3_K) return (k / block_elems(type)) * kQ3KPanelBlockBytes;
  return kPanelRows * (k / block_elems(type)) * block_bytes(type);
}

Tensor pack_matmul_weight_avx2(const ExecContext& ctx, const Tensor& w, Buffer* storage) {
  PAGODA_CHECK(w.layout == TensorLayout::kRowMajor);
  const int64_t n = w.num_rows();
  const int64_t k = w.row_len();
  Tensor packed = w;
  packed.layout = TensorLayout::kBackendPacked;
  if (n == 0) return packed;  // nothing to read; the matmul returns before looking
  const int64_t num_panels = (n + kPanelRows - 1) / kPanelRows;
  const int64_t panel_bytes = packed_panel_bytes(w.dtype, k);
  *storage = ctx.allocate(static_cast<size_t>(num_panels * panel_bytes));  // zero: padding rows
  auto* out = storage->as<uint8_t>();
  const DType type = w.dtype;
  pool_of(ctx).parallel_for(num_panels, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      uint8_t* panel = out + p * panel_bytes;
      for (int64_t c = 0; c < kPanelRows && p * kPanelRows + c < n; ++c) {
        const uint8_t* src = w.row(p * kPanelRows + c);
        switch (type) {
          case DType::kQ8_0:
            pack_quant_row<BlockQ8_0, 8>(src, k / kQuantBlock, c, panel);
            break;
          case DType::kQ4_0:
            pack_quant_row<BlockQ4_0, 4>(src, k / kQuantBlock, c, panel);
            break;
          case DType::kQ4_1:
            pack_nibble_row<BlockQ4_1, true, false>(src, k / kQuantBlock, c, panel);
            break;
          case DType::kQ5_0:
            pack_nibble_row<BlockQ5_0, false, true>(src, k / kQuantBlock, c, panel);
            break;
          case DType::kQ5_1:
            pack_nibble_row<BlockQ5_1, true, true>(src, k / kQuantBlock, c, panel);
            break;
          case DType::kQ2_K:
            pack_k16_row<BlockQ2_K, false>(src, k / block_elems(type), c, panel);
            break;
          case DType::kQ3_K:
            pack_k16_row<BlockQ3_K, true>(src, k / block_elems(type), c, panel);
            break;
          case DType::kQ4_K:
            pack_k4_row<BlockQ4_K, false>(src, k / block_elems(type), c, panel);
            break;
          case DType::kQ5_K:
            pack_k4_row<BlockQ5_K, true>(src, k / block_elems(type), c, panel);
            break;
          case DType::kQ6_K:
            pack_q6_k_row(src, k / block_elems(type), c, panel);
            break;
          default:
            PAGODA_CHECK(!is_quantized(type) && "every block type has its panel layout above");
            pack_plain_row(src, k, block_bytes(type), c, panel);
            break;
        }
      }
    }
  });
  packed.data = out;
  return packed;
}

Tensor pack_matmul_weight_avx512bf16(const ExecContext& ctx, const Tensor& w, Buffer* storage) {
  Tensor packed = pack_matmul_weight_avx2(ctx, w, storage);
  if (packed.dtype == DType::kF16 && storage->size() > 0) {
    const int64_t words = static_cast<int64_t>(storage->size() / 2);
    constexpr int64_t kChunk = 1 << 16;  // words per piece of the split
    auto* data = storage->as<uint16_t>();
    pool_of(ctx).parallel_for((words + kChunk - 1) / kChunk, [&](int64_t c0, int64_t c1) {
      const int64_t begin = c0 * kChunk, end = std::min(words, c1 * kChunk);
      convert_f16_to_bf16_avx512bf16(data + begin, end - begin);
    });
  }
  return packed;
}

IntWeight pack_int_weight_avx2(const ExecContext& ctx, const IntWeight& w, Buffer* storage) {
  PAGODA_CHECK(w.layout == TensorLayout::kRowMajor && (w.bits == 8 || w.bits == 4));
  PAGODA_CHECK(w.group_size > 0 && w.k % w.group_size == 0 && (w.group_size == w.k || w.group_size % 8 == 0));
  const int64_t n = w.n, k = w.k, kp = (k + 7) / 8 * 8, groups = w.groups();
  const int64_t num_panels = (n + kPanelRows - 1) / kPanelRows;
  const int64_t panel_bytes = kPanelRows * kp * w.bits / 8;
  const int64_t code_bytes = num_panels * panel_bytes;
  const int64_t scale_floats = num_panels * kPanelRows * groups;
  // int4 codes are stored offset by 8 (unsigned, for vpmaddubsw), with the zero points + 8 to
  // match where the weight has them (a weight without them: the kernels take 8 as its zero).
  const int64_t zero_ints = w.zero_points != nullptr ? scale_floats : 0;
  *storage = ctx.allocate(static_cast<size_t>(code_bytes + (scale_floats + zero_ints) * 4));  // zero: padding
  auto* codes = storage->as<uint8_t>();
  auto* scales = reinterpret_cast<float*>(codes + code_bytes);
  auto* zeros = zero_ints > 0 ? reinterpret_cast<int32_t*>(scales + scale_floats) : nullptr;
  const auto* src = static_cast<const uint8_t*>(w.codes);
  pool_of(ctx).parallel_for(num_panels, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      uint8_t* panel = codes + p * panel_bytes;
      for (int64_t c = 0; c < kPanelRows && p * kPanelRows + c < n; ++c) {
        const int64_t j = p * kPanelRows + c;
        const uint8_t* row = src + j * w.row_code_bytes();
        if (w.bits == 8) {
          for (int64_t t = 0; t < k; ++t) panel[(t / 4) * 32 + 4 * c + t % 4] = row[t];
        } else {
          for (int64_t t = 0; t < k; ++t) {
            const uint8_t nibble = ((row[t / 2] >> (4 * (t % 2))) & 0xF) ^ 0x8;  // code + 8
            const int64_t u = t / 8, in = t % 8;
            panel[u * 32 + 4 * c + in % 4] |= static_cast<uint8_t>(nibble << (in < 4 ? 0 : 4));
          }
        }
        for (int64_t g = 0; g < groups; ++g) scales[(p * groups + g) * kPanelRows + c] = w.scales[j * groups + g];
        if (zeros != nullptr) {
          const int32_t offset = w.bits == 4 ? 8 : 0;
          for (int64_t g = 0; g < groups; ++g) {
            zeros[(p * groups + g) * kPanelRows + c] = w.zero_points[j * groups + g] + offset;
          }
        }
      }
    }
  });
  IntWeight out = w;
  out.codes = codes;
  out.scales = scales;
  out.zero_points = zeros;
  out.layout = TensorLayout::kBackendPacked;
  return out;
}

}  // namespace pagoda::cpu
