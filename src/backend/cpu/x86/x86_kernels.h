// The x86 SIMD kernels of the CPU backend. Each is checked against the reference kernels
// (../scalar) and chosen at start-up from cpu_features(); calling one on a CPU without
// its features is a bug (SIGILL). Stateless apart from the thread pool they are handed:
// thread-safe.
//
// Layout of the AVX2 kernels: matmul_avx2.cpp, attention_avx2.cpp and elementwise_avx2.cpp hold
// only the leaf loops and are the files compiled with -mavx2 -mfma (-mf16c). They deliberately use no inline function or
// template from a shared header (no Tensor, std::vector, std::function, tensor/half.h, <cmath>):
// the out-of-line copy such a file emits would carry AVX2 instructions, and the linker may keep
// that copy for the whole program, which must run on CPUs without AVX2. The threading drivers
// (*_driver.cpp) and the weight packing (packed_weights.cpp) are baseline code.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace pagoda {
struct BlockQ8Act;
struct Tensor;
class Buffer;
class ThreadPool;
struct AttentionSeq;
struct AttentionParams;
struct KvLayerView;
struct IntWeight;
struct MatmulGroup;
class ExecContext;
}  // namespace pagoda

namespace pagoda::cpu {

// AVX2. Quantizes the m rows of x ([m, k] f32, k % 32 == 0) to m * k / 32 BlockQ8Act, bit for
// bit as quantize_activation_row does.
void quantize_activation_rows_avx2(const float* x, int64_t m, int64_t k, BlockQ8Act* out);

// ---- Packed weights (packed_weights.cpp): the layout the AVX2 matmul is fastest on ----
//
// The n rows of a weight [n, k] go in panels of kPanelRows consecutive rows (the last one padded
// with zero rows), panel p at data + p * packed_panel_bytes(type, k), so that the 8 lanes of a
// vector are 8 outputs:
//  - f32 / f16 / bf16: column-major within the panel: element (row c, column t) at index
//    t * 8 + c, in the weight's own type.
//  - q8_0 / q4_0 / q4_1 / q5_0 / q5_1: the panel's k / 32 blocks one after another, each: the 8
//    rows' fp16 d (16 bytes), for q4_1 / q5_1 their fp16 m (16 bytes), for q5_0 / q5_1 their
//    fifth bits (32 bytes: row c's 4 bytes at 4c, byte j holding element 4h + j's bit at bit 2h
//    and element 16 + 4h + j's at bit 2h + 1, h < 4), then their weights in groups of 4 bytes per
//    row: q8_0: 8 x 32 bytes, group g = rows 0..7's int8 weights [4g, 4g + 4); the others: 4 x 32
//    bytes, group h = rows 0..7's qs bytes [4h, 4h + 4) (nibbles of elements 4h.. low, 16 + 4h..
//    high).
//  - q4_k: the panel's super-blocks one after another, each kQ4KPanelBlockBytes (1184, for 8 x
//    144 stored): the nibbles in lane order, chunk pair p (chunks 2p, 2p + 1) at 256 p, group g
//    (columns [4g, 4g + 4) of both chunks) at 32 g, row c's 4 bytes at 4 c, each byte the
//    stored qs byte (chunk 2p's code in the low nibble, 2p + 1's in the high one); then the
//    8 chunks' 6-bit scales (uint8, chunk s row c at 1024 + 8 s + c) and mins (at 1088 + ...),
//    then the rows' d and dmin (fp16, at 1152 + 2 c and 1168 + 2 c): the 6-bit unpacking and
//    the transposes done once at load; matmul_q4_k_panels_avx2 multiplies them as they lie.
//  - q5_k: as q4_k with the qh run in lane order (group g at 1024 + 32 g, row c's qh bytes
//    [4g, 4g + 4) at 4 c) between the nibbles and the scales, which move 256 bytes on:
//    kQ5KPanelBlockBytes (1440, for 8 x 176 stored).
//  - q6_k: the panel's super-blocks one after another, each 8 x 210 bytes: for each half h (768
//    bytes at 768 h) the three 32-byte runs the half's codes come from (ql [64h, 64h + 32),
//    ql [64h + 32, 64h + 64), qh [32h, 32h + 32)), 256 bytes each, in lane order (group g at 32 g,
//    row c's 4 bytes at 4 c); then the 16 int8 scales (scale i of row c at 1536 + 8 i + c) and
//    the rows' d (fp16 at 1664 + 2 c).
//    matmul_q6_k_panels_avx2 multiplies them as they lie.
//  - q2_k / q3_k: the panel's super-blocks one after another, each: the two 32-byte runs of qs in
//    lane order (run a's group g at 256 a + 32 g, row c's bytes [32 a + 4 g, + 4) at 4 c); for
//    q3_k the hmask likewise (group g at 512 + 32 g); then the 16 sub-block scales, sub-block j
//    of row c at + 8 j + c: q2_k's bytes as stored (scale low nibble, min high; at 512), q3_k's
//    6-bit scales unpacked to int8 (at 768); then the rows' fp16 d (q2_k at 640, then dmin at
//    656; q3_k at 896). kQ2KPanelBlockBytes (672, 8 x 84 stored) and kQ3KPanelBlockBytes (912,
//    for 8 x 110).
// Same bytes per row as the stored types (q4_k: 148 for 144, q5_k: 180 for 176, q3_k: 114 for
// 110); only the order changes.
inline constexpr int64_t kQ6KPanelBlockBytes = 1680;
inline constexpr int64_t kPanelRows = 8;
inline constexpr int64_t kQ4KPanelBlockBytes = 1184;
inline constexpr int64_t kQ5KPanelBlockBytes = 1440;
inline constexpr int64_t kQ2KPanelBlockBytes = 672;
inline constexpr int64_t kQ3KPanelBlockBytes = 912;
// Where a q4_0 / q4_1 / q5_0 / q5_1 panel's block keeps what (matmul_avx2.cpp's NibblePanel
// describes it): the rows' fp16 d at 0, m at kMinAt (q4_1 / q5_1), the fifth bits at kFifthAt
// (q5_0 / q5_1), the codes at kCodesAt.
template <bool kMin, bool kFifth>
struct NibblePanelLayout {
  static constexpr int64_t kMinAt = 16;
  static constexpr int64_t kFifthAt = kMinAt + (kMin ? 16 : 0);
  static constexpr int64_t kCodesAt = kFifthAt + (kFifth ? 32 : 0);
  static constexpr int64_t kBlockBytes = kCodesAt + 4 * 32;
};
int64_t packed_panel_bytes(DType type, int64_t k);

// The Kernels::pack_matmul_weight entry of the AVX2 table: every type packs (w must be
// row-major), and the AVX2 matmul takes only packed weights. Split over pool_of(ctx).
Tensor pack_matmul_weight_avx2(const ExecContext& ctx, const Tensor& w, Buffer* storage);
// The avx512bf16 table's: the same panels, but an f16 weight's values are stored as their bf16
// roundings (nearest even, denormals to zero: the rounding its vdpbf16ps leaf gives them anyway),
// so that its loops only load them. The tensor keeps its f16 dtype; only this table's matmul
// reads such panels.
Tensor pack_matmul_weight_avx512bf16(const ExecContext& ctx, const Tensor& w, Buffer* storage);

// AVX2 + FMA + F16C. y[i, j] = sum_t x[i, t] * w[j, t] for i < m and the rows j of panels
// [panel_begin, panel_end) that exist (j < n), from f32 / f16 / bf16 panels; x is [m, k] f32,
// y is [m, ldy]. Each output is one FMA chain in t order, whatever m: batch-invariant.
void matmul_packed_rows_avx2(const float* x, int64_t m, int64_t k, DType w_type,
                             const void* panels, int64_t n, float* y, int64_t ldy,
                             int64_t panel_begin, int64_t panel_end);

// AVX2 + F16C. The same for q8_0 / q4_0 / q4_1 / q5_0 / q5_1 panels against activations
// quantized by quantize_activation_rows_avx2 (row i at x + i * k / 32); all but q8_0 also take
// each block's sum of quantized values (activation_block_sums_avx2, same indexing; unused for
// q8_0). Bit for bit the reference kernel's result.
void matmul_packed_q8act_avx2(const BlockQ8Act* x, const int32_t* x_sums, int64_t m, int64_t k,
                              DType w_type, const void* panels, int64_t n, float* y, int64_t ldy,
                              int64_t panel_begin, int64_t panel_end);

// AVX2. The same for q4_k (q5_k) panels, multiplied as they lie: x as for
// matmul_packed_q8act_avx2, with each block's sum (x_sums). Bit for bit the reference.
void matmul_q4_k_panels_avx2(const BlockQ8Act* x, const int32_t* x_sums, int64_t m, int64_t k, const void* panels,
                             int64_t n, float* y, int64_t ldy, int64_t panel_begin, int64_t panel_end);
void matmul_q5_k_panels_avx2(const BlockQ8Act* x, const int32_t* x_sums, int64_t m, int64_t k, const void* panels,
                             int64_t n, float* y, int64_t ldy, int64_t panel_begin, int64_t panel_end);
// AVX2. The same for q6_k panels, with the sums of each block's two 16-element halves
// (x_half_sums + 2 * block).
void matmul_q6_k_panels_avx2(const BlockQ8Act* x, const int32_t* x_half_sums, int64_t m, int64_t k, const void* panels,
                             int64_t n, float* y, int64_t ldy, int64_t panel_begin, int64_t panel_end);

// AVX-VNNI (the avxvnni table; suffix avxvnni) and AVX-512 VNNI + VL (the AVX-512 tables; suffix
// avx512vl): matmul_packed_q8act_avx2 and the K-quant leaves with their 4-byte groups on the
// 256-bit vpdpbusd, VEX or EVEX; the same bits.
#define PAGODA_DECLARE_VNNI_BLOCK_LEAVES(suffix)                                                                   \
  void matmul_packed_q8act_##suffix(const BlockQ8Act* x, const int32_t* x_sums, int64_t m, int64_t k,              \
                                    DType w_type, const void* panels, int64_t n, float* y, int64_t ldy,           \
                                    int64_t panel_begin, int64_t panel_end);                                       \
  void matmul_q6_k_panels_##suffix(const BlockQ8Act* x, const int32_t* x_half_sums, int64_t m, int64_t k,         \
                                   const void* panels, int64_t n, float* y, int64_t ldy, int64_t panel_begin,     \
                                   int64_t panel_end);                                                             \
  void matmul_q4_k_panels_##suffix(const BlockQ8Act* x, const int32_t* x_sums, int64_t m, int64_t k,              \
                                   const void* panels, int64_t n, float* y, int64_t ldy, int64_t panel_begin,     \
                                   int64_t panel_end);                                                             \
  void matmul_q5_k_panels_##suffix(const BlockQ8Act* x, const int32_t* x_sums, int64_t m, int64_t k,              \
                                   const void* panels, int64_t n, float* y, int64_t ldy, int64_t panel_begin,     \
                                   int64_t panel_end);                                                             \
  void matmul_q2_k_panels_##suffix(const BlockQ8Act* x, const int32_t* x_half_sums, int64_t m, int64_t k,         \
                                   const void* panels, int64_t n, float* y, int64_t ldy, int64_t panel_begin,     \
                                   int64_t panel_end);                                                             \
  void matmul_q3_k_panels_##suffix(const BlockQ8Act* x, const int32_t* x_half_sums, int64_t m, int64_t k,         \
                                   const void* panels, int64_t n, float* y, int64_t ldy, int64_t panel_begin,     \
                                   int64_t panel_end)
PAGODA_DECLARE_VNNI_BLOCK_LEAVES(avxvnni);
PAGODA_DECLARE_VNNI_BLOCK_LEAVES(avx512vl);
#undef PAGODA_DECLARE_VNNI_BLOCK_LEAVES

// AVX2. The same for q2_k / q3_k panels, with the input's half sums as for q6_k.
void matmul_q2_k_panels_avx2(const BlockQ8Act* x, const int32_t* x_half_sums, int64_t m, int64_t k, const void* panels,
                             int64_t n, float* y, int64_t ldy, int64_t panel_begin, int64_t panel_end);
void matmul_q3_k_panels_avx2(const BlockQ8Act* x, const int32_t* x_half_sums, int64_t m, int64_t k, const void* panels,
                             int64_t n, float* y, int64_t ldy, int64_t panel_begin, int64_t panel_end);

// AVX2. sums[b] = the sum of x[b].qs, for b < num_blocks.
void activation_block_sums_avx2(const BlockQ8Act* x, int64_t num_blocks, int32_t* sums);

// ---- IntWeight (Kernels::matmul_int): int8 / int4 codes with f32 scales per group ----
//
// Packed layout: rows padded to kp = k rounded up to a multiple of 8 (zero codes); panels of 8
// rows (the last padded with zero rows), panel p at codes + p * 8 * kp * bits / 8:
//  - int8: per 4 columns [4u, 4u + 4): 32 bytes, rows 0..7's 4 codes;
//  - int4: per 8 columns [8u, 8u + 8): 32 bytes, row c's 4 bytes at 4c, byte j holding column
//    8u + j (low nibble) and 8u + 4 + j (high nibble), each the code + 8 (0..15, unsigned: the
//    first operand of vpmaddubsw as it is), with the zero points + 8 to match where the weight
//    has them, and a zero point of 8 implied where it has none (code - zero is unchanged).
// The scales follow all the panels: panel p's at p * 8 * groups floats, group g's 8 rows at g * 8;
// the zero points (where the weight has them) follow the scales, int32, laid out as they are.
// A per-channel weight (group_size == k) has one group of kp columns.
IntWeight pack_int_weight_avx2(const ExecContext& ctx, const IntWeight& w, Buffer* storage);

// AVX2. One activation row of k floats to int8 codes q[0, kp) (zeros past k), bit for bit as
// quantize_activation_row_int8 (tensor/convert.h); returns the row's scale.
float quantize_activation_row_int8_avx2(const float* x, int64_t k, int64_t kp, float static_scale, int8_t* q);

// AVX2. y[i, 8p + c] for i < m, the rows of panels [panel_begin, panel_end) that exist (< n):
// xq [m, kp] int8 with per-row scales s_x, against packed codes, scales and zero points (groups
// of `group` columns, kp / group of them; zeros nullptr: none, or int4's implied 8); xsum [m, kp /
// group] holds each row's sum of xq over each group, for int4 codes or zero points (else unused).
// Bit for bit the reference's matmul_int.
void matmul_int_packed_avx2(const int8_t* xq, const float* s_x, const int32_t* xsum, int64_t m, int64_t kp,
                            int64_t group, int bits, const void* codes, const float* scales, const int32_t* zeros,
                            int64_t n, float* y, int64_t ldy, int64_t panel_begin, int64_t panel_end);

// AVX-VNNI (the avxvnni table): as matmul_int_packed_avx2, the 4-column steps on vpdpbusd; the
// same bits.
void matmul_int_packed_avxvnni(const int8_t* xq, const float* s_x, const int32_t* xsum, int64_t m, int64_t kp,
                               int64_t group, int bits, const void* codes, const float* scales, const int32_t* zeros,
                               int64_t n, float* y, int64_t ldy, int64_t panel_begin, int64_t panel_end);

// AVX-512 VNNI (the avx512vnni table): as matmul_int_packed_avxvnni on 512-bit vectors, two panels
// per vector, except that for int8 codes xq holds each code + 128 as an unsigned byte (the XOR
// 0x80 of the int8 code); int4 codes take xq signed, as the others. The same bits.
void matmul_int_packed_avx512vnni(const int8_t* xq, const float* s_x, const int32_t* xsum, int64_t m, int64_t kp,
                                  int64_t group, int bits, const void* codes, const float* scales,
                                  const int32_t* zeros, int64_t n, float* y, int64_t ldy, int64_t panel_begin,
                                  int64_t panel_end);

// The Kernels::matmul_int entries: activations quantized per row, panels split over
// cpu_thread_pool() (the pooled forms take the pool, nullptr: the calling thread), multiplied by
// matmul_int_packed_avx2, _avxvnni or _avx512vnni. All take pack_int_weight_avx2's layout.
void matmul_int_avx2_pooled(const float* x, int64_t m, const IntWeight& w, float* y, ThreadPool* pool);
void matmul_int_avx2(const ExecContext& ctx, const float* x, int64_t m, const IntWeight& w, float* y);
void matmul_int_avxvnni_pooled(const float* x, int64_t m, const IntWeight& w, float* y, ThreadPool* pool);
void matmul_int_avxvnni(const ExecContext& ctx, const float* x, int64_t m, const IntWeight& w, float* y);
void matmul_int_avx512vnni_pooled(const float* x, int64_t m, const IntWeight& w, float* y, ThreadPool* pool);
void matmul_int_avx512vnni(const ExecContext& ctx, const float* x, int64_t m, const IntWeight& w, float* y);

// y[m, n] = x[m, k] * w[n, k]^T (the Kernels::matmul contract) for w from
// pack_matmul_weight_avx2, its panels split over `pool` in chunks (pool == nullptr, or a small
// product: the calling thread only).
void matmul_avx2_pooled(const float* x, int64_t m, const Tensor& w, float* y, ThreadPool* pool);

// The Kernels::matmul entry: matmul_avx2_pooled over pool_of(ctx).
void matmul_avx2(const ExecContext& ctx, const float* x, int64_t m, const Tensor& w, float* y);

// AVX-512 VNNI (the avx512vnni table): matmul_packed_q8act_avx2 for m > 1, two panels per 512-bit
// vector; for q8_0 the input codes come unsigned (each code + 128: the XOR 0x80 of
// quantize_activation_rows_avx2's), for the others as they are. Bit for bit the reference.
void matmul_q8act_batched_avx512vnni(const BlockQ8Act* x, const int32_t* x_sums, int64_t m, int64_t k, DType type,
                                     const void* panels, int64_t n, float* y, int64_t ldy, int64_t panel_begin,
                                     int64_t panel_end);

// AVX-512 (the avx512vnni table): matmul_packed_rows_avx2 for m > 1, four panels' k slice
// converted to f32 at a time and two panels per 512-bit vector. The same bits: each output is one
// FMA chain in t order.
void matmul_float_batched_avx512(const float* x, int64_t m, int64_t k, DType type, const void* panels, int64_t n,
                                 float* y, int64_t ldy, int64_t panel_begin, int64_t panel_end);

// AVX-512 BF16 (the avx512bf16 table). x's m rows of k floats to bf16, rounded to nearest even
// (denormals to zero), row i at out + i * ld, zeros from k to the next multiple of 16 (ld must
// reach it).
void convert_rows_bf16_avx512bf16(const float* x, int64_t m, int64_t k, int64_t ld, uint16_t* out);
// The count fp16 values at words to bf16 in place, rounded as convert_rows_bf16_avx512bf16 does.
void convert_f16_to_bf16_avx512bf16(uint16_t* words, int64_t count);
// y[i, j] for the rows j of panels [panel_begin, panel_end) from pack_matmul_weight_avx512bf16 (bf16
// values whether type is f16 or bf16), against the bf16 rows xb (from convert_rows_bf16_avx512bf16,
// ldx apart), on vdpbf16ps: each output the sum over column pairs u in order of
// acc = (acc + xb[2u+1] wb[2u+1]) + xb[2u] wb[2u] (matmul_bf16_avx512.cpp), whatever m.
void matmul_bf16_rows_avx512bf16(const uint16_t* xb, int64_t ldx, int64_t m, int64_t k, DType type,
                                 const void* panels, int64_t n, float* y, int64_t ldy, int64_t panel_begin,
                                 int64_t panel_end);

// The avxvnni table's: the same, with every block type's product on its _avxvnni leaf.
void matmul_avxvnni_pooled(const float* x, int64_t m, const Tensor& w, float* y, ThreadPool* pool);
void matmul_avxvnni(const ExecContext& ctx, const float* x, int64_t m, const Tensor& w, float* y);
// The avx512vnni table's: the avxvnni one on the _avx512vl leaves (EVEX vpdpbusd), with batched
// products (m > 1) of q8_0, q4_0, q4_1, q5_0 and q5_1 on matmul_q8act_batched_avx512vnni, of f32,
// f16 and bf16 on matmul_float_batched_avx512.
void matmul_avx512vnni_pooled(const float* x, int64_t m, const Tensor& w, float* y, ThreadPool* pool);
void matmul_avx512vnni(const ExecContext& ctx, const float* x, int64_t m, const Tensor& w, float* y);
// The avx512 table's: the avx2 one, with batched products (m > 1) of f32, f16 and bf16 on
// matmul_float_batched_avx512.
void matmul_avx512_pooled(const float* x, int64_t m, const Tensor& w, float* y, ThreadPool* pool);
void matmul_avx512(const ExecContext& ctx, const float* x, int64_t m, const Tensor& w, float* y);
// The avx512bf16 table's: the avx512vnni one, with f16 and bf16 weights (every m) on
// matmul_bf16_rows_avx512bf16.
void matmul_avx512bf16_pooled(const float* x, int64_t m, const Tensor& w, float* y, ThreadPool* pool);
void matmul_avx512bf16(const ExecContext& ctx, const float* x, int64_t m, const Tensor& w, float* y);
// The Kernels::matmul_many entries of the tables above: their matmuls of several weights (one
// dtype and k) over cpu_thread_pool() in one parallel step.
void matmul_avx2_many(const ExecContext& ctx, const float* x, int64_t m, const Tensor* const* w, float* const* y, int count);
void matmul_avxvnni_many(const ExecContext& ctx, const float* x, int64_t m, const Tensor* const* w, float* const* y, int count);
void matmul_avx512_many(const ExecContext& ctx, const float* x, int64_t m, const Tensor* const* w, float* const* y, int count);
void matmul_avx512vnni_many(const ExecContext& ctx, const float* x, int64_t m, const Tensor* const* w, float* const* y, int count);
void matmul_avx512bf16_many(const ExecContext& ctx, const float* x, int64_t m, const Tensor* const* w, float* const* y, int count);
// The Kernels::matmul_grouped entries: products of different rows of one input with different
// weights (one dtype and k), over cpu_thread_pool() in one parallel step.
void matmul_avx2_grouped(const ExecContext& ctx, const float* x, const MatmulGroup* groups, int count);
void matmul_avxvnni_grouped(const ExecContext& ctx, const float* x, const MatmulGroup* groups, int count);
void matmul_avx512_grouped(const ExecContext& ctx, const float* x, const MatmulGroup* groups, int count);
void matmul_avx512vnni_grouped(const ExecContext& ctx, const float* x, const MatmulGroup* groups, int count);
void matmul_avx512bf16_grouped(const ExecContext& ctx, const float* x, const MatmulGroup* groups, int count);

// One kv head's rows of a paged KV cache of a 16- or 8-bit dtype (KvCacheDtype's names), as
// kv_rows_to_f32_avx2 reads them.
enum class KvRowFormat : uint8_t { kF16, kBF16, kFp8E4M3, kFp8E5M2, kInt8 };
struct KvRowSource {
  KvRowFormat format;
  const void* data;            // the cache's keys or values
  const float* scales;         // int8: one per (slot, kv head) row; else unused
  int64_t num_kv_heads;
  int64_t head_dim;
  int64_t block_size;
  int64_t kv_head;
  const int32_t* block_table;  // the sequence's
};

// AVX2 + F16C. out[t - first][0, head_dim) = the row of the sequence's position t, for t in
// [first, first + count), as f32: read_kv_row's values bit for bit, whatever the thread's
// denormal mode (a NaN stays a NaN; its payload is not part of the contract). What the attention
// of a non-f32 cache reads.
void kv_rows_to_f32_avx2(const KvRowSource& rows, int64_t first, int64_t count, float* out);

// Key positions per tile of the attention kernels (aligned to absolute positions).
inline constexpr int64_t kAttentionKeyTile = 16;

// One unit of paged-attention work for attention_tile_avx2: query rows [first row, + num_rows) of
// one sequence (consecutive positions first_pos, first_pos + 1, ...), and the num_group_heads
// query heads that read one kv head. Plain data, filled by the driver; the fields without a
// default are always set.
struct AttentionTile {
  const float* q;        // query row 0, first head of the group; row r at q + r * row_stride
  float* out;            // same layout as q
  int64_t row_stride;    // floats between query rows (num_heads * head_dim)
  int64_t num_rows;
  int64_t num_group_heads;
  int64_t head_dim;
  int64_t first_pos;     // position of row 0
  const float* key;      // the cache's keys, already offset to this kv head
  const float* value;    // likewise for values
  int64_t kv_slot_stride;  // floats between cache slots (num_kv_heads * head_dim)
  const int32_t* block_table;
  int64_t block_size;
  float scale;
  int64_t sliding_window;  // 0 = full causal
  float* scratch;          // see the kernel taking the tile
  // A cache of another dtype than f32, read through kv_rows_to_f32_avx2 one key tile at a time
  // (then key, value and block_table are unused), into converted: 2 * kAttentionKeyTile *
  // head_dim floats.
  // nullptr: the rows are f32 at key / value.
  const KvRowSource* key_rows = nullptr;
  const KvRowSource* value_rows = nullptr;
  float* converted = nullptr;
  // nullptr, or where row r's head g log-sum-exp goes: lse[r * lse_row_stride + g] (the maximum
  // scaled score plus the log of the denominator; -inf for a vector with no keys).
  float* lse = nullptr;
  int64_t lse_row_stride = 0;
};

// AVX2 + FMA. Causal softmax attention of the tile's query vectors over their sequence's cache
// (keys at positions <= their own, within the sliding window). Runs on the calling thread.
// attention_tile_avx2 computes one query vector at a time with the head dimension across the
// lanes (scratch: 2 * num_vectors floats); attention_tile_lanes_avx2 puts 8 query vectors in the
// lanes (scratch: ceil(num_vectors / 8) * (16 * head_dim + 16) floats, num_vectors <=
// 8 * kMaxLaneGroups), which pays when a kv head's group has 4 or more query heads. The two round
// differently: a model must use one of them for every tile (the driver picks by group size).
void attention_tile_avx2(const AttentionTile& tile);
inline constexpr int64_t kMaxLaneGroups = 8;
void attention_tile_lanes_avx2(const AttentionTile& tile);
// AVX-512 F. The lanes kernel on 16 lanes (scratch: ceil(num_vectors / 16) * (32 * head_dim + 32)
// floats): the same bits as attention_tile_lanes_avx2 (attention_lanes.h).
void attention_tile_lanes_avx512(const AttentionTile& tile);

// The Kernels::paged_attention entry: the work split into AttentionTiles (per sequence, kv head
// and group of query rows) over `pool` (nullptr: the calling thread only).
void paged_attention_avx2_pooled(const float* q, const AttentionSeq* seqs, int64_t num_seqs,
                                 const KvLayerView& cache, const AttentionParams& params,
                                 float* out, float* lse, ThreadPool* pool);
void paged_attention_avx2(const ExecContext& ctx, const float* q, const AttentionSeq* seqs, int64_t num_seqs,
                          const KvLayerView& cache, const AttentionParams& params, float* out, float* lse);
// The same with attention_tile_lanes_avx512 for the groups of 4 or more (AVX-512 F; a tile of at
// most 8 query vectors, a decode step's, keeps the 8-lane kernel): the same bits as the AVX2 entry.
void paged_attention_avx512_pooled(const float* q, const AttentionSeq* seqs, int64_t num_seqs,
                                   const KvLayerView& cache, const AttentionParams& params, float* out, float* lse,
                                   ThreadPool* pool);
void paged_attention_avx512(const ExecContext& ctx, const float* q, const AttentionSeq* seqs, int64_t num_seqs,
                            const KvLayerView& cache, const AttentionParams& params, float* out, float* lse);

// AVX2 + FMA element-wise leaves, on the calling thread, with the Kernels contracts of rms_norm,
// silu_mul (over [0, n)) and add. Each element's value does not depend on n or its place in the
// buffer. The *_avx2 entries without a suffix split large calls over pool_of(ctx).
void rms_norm_rows_avx2(const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
                        float* y);
void silu_mul_range_avx2(const float* gate, const float* up, int64_t n, float* out);
void add_range_avx2(float* y, const float* x, int64_t n);
void rms_norm_avx2(const ExecContext& ctx, const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
                   float* y);
void silu_mul_avx2(const ExecContext& ctx, const float* gate, const float* up, int64_t n, float* out);
void add_avx2(const ExecContext& ctx, float* y, const float* x, int64_t n);

}  // namespace pagoda::cpu
