// The threading half of the AVX2 matmul, built with baseline flags (see x86_kernels.h for why it
// is apart from matmul_avx2.cpp).
#include <algorithm>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/x86/x86_kernels.h"
#include "backend/kernels.h"
#include "base/check.h"
#include "base/thread_pool.h"
#include "tensor/quant_blocks.h"
#include "tensor/tensor.h"

namespace pagoda::cpu {
namespace {

// Below this many multiply-adds (tens of microseconds of work) waking the workers costs more
// than it saves.
constexpr int64_t kMinParallelMacs = int64_t{1} << 18;

// The activations quantized once per call (split by rows when there are many) and shared by every
// thread, with each block's sum when `with_sums`. Buffers of the calling thread, reused (calls
// are per layer, sizes repeat): two of them, `slot` 0 and 1, for a call that needs the codes both
// ways.
struct QuantizedInput {
  const BlockQ8Act* blocks;
  const int32_t* sums;  // nullptr unless asked for
};

// unsigned_codes: each code + 128 as an unsigned byte (its XOR 0x80), for a leaf that takes them
// so; the sums stay those of the signed codes.
QuantizedInput quantize_input(const float* x, int64_t m, int64_t k, bool with_sums, bool parallel,
                              ThreadPool* pool, bool unsigned_codes = false, int slot = 0) {
  PAGODA_CHECK(k % kQuantBlock == 0);
  thread_local std::vector<BlockQ8Act> xq_slots[2];
  thread_local std::vector<int32_t> sums_slots[2];
  std::vector<BlockQ8Act>& xq = xq_slots[slot];
  std::vector<int32_t>& sums = sums_slots[slot];
  const int64_t nb = k / kQuantBlock;
  xq.resize(static_cast<size_t>(m * nb));
  if (with_sums) sums.resize(static_cast<size_t>(m * nb));
  BlockQ8Act* xq_data = xq.data();
  int32_t* sums_data = with_sums ? sums.data() : nullptr;
  auto rows = [&](int64_t begin, int64_t end) {
    quantize_activation_rows_avx2(x + begin * k, end - begin, k, xq_data + begin * nb);
    if (with_sums) {
      activation_block_sums_avx2(xq_data + begin * nb, (end - begin) * nb, sums_data + begin * nb);
    }
    if (unsigned_codes) {
      for (int64_t b = begin * nb; b < end * nb; ++b) {
        for (int8_t& q : xq_data[b].qs) q = static_cast<int8_t>(static_cast<uint8_t>(q) ^ 0x80);
      }
    }
  };
  if (parallel && m >= 2 * pool->num_threads()) {
    pool->parallel_for(m, rows);
  } else {
    rows(0, m);
  }
  return {xq_data, sums_data};
}

// The sums of the two 16-element halves of each of num_blocks activation blocks (the mins of the
// types that have them are multiplied by these), in a buffer of the calling thread.
const int32_t* activation_half_sums(const BlockQ8Act* x, int64_t num_blocks) {
  thread_local std::vector<int32_t> sums;
  sums.resize(static_cast<size_t>(2 * num_blocks));
  for (int64_t b = 0; b < num_blocks; ++b) {
    int32_t lo = 0, hi = 0;
    for (int j = 0; j < kQuantBlock / 2; ++j) {
      lo += x[b].qs[j];
      hi += x[b].qs[j + kQuantBlock / 2];
    }
    sums[static_cast<size_t>(2 * b)] = lo;
    sums[static_cast<size_t>(2 * b + 1)] = hi;
  }
  return sums.data();
}

// The work is split by panels, kPanelsPerChunk (32 output rows) at a time: small enough that
// even a 256-row projection spreads over 8 chunks.
constexpr int64_t kPanelsPerChunk = 4;

// The leaves of a table: the float ones are matmul_packed_rows_avx2 in every table, but for
// batched products (m > 1) where float_batched is set.
struct MatmulLeaves {
  decltype(&matmul_packed_q8act_avx2) q8act;
  decltype(&matmul_q4_k_panels_avx2) q4_k, q5_k;            // take the blocks' sums
  decltype(&matmul_q6_k_panels_avx2) q2_k, q3_k, q6_k;      // take the blocks' half sums
  decltype(&matmul_q8act_batched_avx512vnni) q8act_batched = nullptr;  // m > 1; q8_0's codes unsigned
  decltype(&matmul_float_batched_avx512) float_batched = nullptr;      // m > 1
  decltype(&matmul_bf16_rows_avx512bf16) half_bf16 = nullptr;          // f16 / bf16 weights, every m
};
constexpr MatmulLeaves kAvx2Leaves{matmul_packed_q8act_avx2, matmul_q4_k_panels_avx2, matmul_q5_k_panels_avx2,
                                   matmul_q2_k_panels_avx2,  matmul_q3_k_panels_avx2, matmul_q6_k_panels_avx2};
constexpr MatmulLeaves kAvxVnniLeaves{matmul_packed_q8act_avxvnni, matmul_q4_k_panels_avxvnni,
                                      matmul_q5_k_panels_avxvnni,  matmul_q2_k_panels_avxvnni,
                                      matmul_q3_k_panels_avxvnni,  matmul_q6_k_panels_avxvnni};
// The avx512 table (no VNNI): the AVX2 leaves but the batched float products.
constexpr MatmulLeaves kAvx512Leaves{matmul_packed_q8act_avx2, matmul_q4_k_panels_avx2, matmul_q5_k_panels_avx2,
                                     matmul_q2_k_panels_avx2,  matmul_q3_k_panels_avx2, matmul_q6_k_panels_avx2,
                                     nullptr,                  matmul_float_batched_avx512};
// The AVX-512 VNNI tables: the block types' 256-bit leaves on EVEX vpdpbusd (no AVX-VNNI needed).
constexpr MatmulLeaves kAvx512VnniLeaves{matmul_packed_q8act_avx512vl, matmul_q4_k_panels_avx512vl,
                                         matmul_q5_k_panels_avx512vl,  matmul_q2_k_panels_avx512vl,
                                         matmul_q3_k_panels_avx512vl,  matmul_q6_k_panels_avx512vl,
                                         matmul_q8act_batched_avx512vnni, matmul_float_batched_avx512};
constexpr MatmulLeaves kAvx512Bf16Leaves{matmul_packed_q8act_avx512vl,    matmul_q4_k_panels_avx512vl,
                                         matmul_q5_k_panels_avx512vl,     matmul_q2_k_panels_avx512vl,
                                         matmul_q3_k_panels_avx512vl,     matmul_q6_k_panels_avx512vl,
                                         matmul_q8act_batched_avx512vnni, matmul_float_batched_avx512,
                                         matmul_bf16_rows_avx512bf16};

// The input rows rounded to bf16 for the half_bf16 leaf, once per call (split by rows when there
// are many), row i at x_bf16 + i * ld with ld = k rounded up to 16. A buffer of the calling thread.
const uint16_t* bf16_input(const float* x, int64_t m, int64_t k, int64_t ld, bool parallel, ThreadPool* pool) {
  thread_local std::vector<uint16_t> xb;
  xb.resize(static_cast<size_t>(m * ld));
  uint16_t* data = xb.data();
  auto rows = [&](int64_t begin, int64_t end) {
    convert_rows_bf16_avx512bf16(x + begin * k, end - begin, k, ld, data + begin * ld);
  };
  if (parallel && m >= 2 * pool->num_threads()) {
    pool->parallel_for(m, rows);
  } else {
    rows(0, m);
  }
  return data;
}

// A piece of a call's work: panels [p0, p1) of group g's weight; cost_begin is the work (rows x
// panels) of the pieces before it.
struct MatmulPiece {
  int g;
  int64_t p0, p1;
  int64_t cost_begin;
};

// Every table's matmul: for each group, g.y = x[g.row, g.row + g.m) g.w^T on weights from
// pack_matmul_weight_avx2, by `leaves` (matmul is one group, matmul_many groups that share their
// rows, matmul_grouped any). The weights share dtype and row length; the input is converted once
// for all groups. The work goes in pieces of kPanelsPerChunk panels of one weight, and each
// thread takes the pieces that start in its share of the total cost (rows x panels): groups of
// one expert's few tokens and of another's many split evenly; a thread's run of one weight's
// pieces is one leaf call. Each output's value does not depend on the other groups or on where
// the split falls (the leaves compute each panel alone).
void matmul_packed_pooled(const float* x, const MatmulGroup* groups, int count, ThreadPool* pool,
                          const MatmulLeaves& leaves) {
  PAGODA_CHECK(count >= 1);
  const Tensor& w0 = *groups[0].w;
  const int64_t k = w0.row_len();
  const DType type = w0.dtype;
  int64_t rows = 0, macs = 0, total_pieces = 0;
  bool any_single = false, any_batched = false;
  for (int g = 0; g < count; ++g) {
    const MatmulGroup& grp = groups[g];
    PAGODA_CHECK(grp.w->layout == TensorLayout::kBackendPacked &&
                 "the x86 matmul takes weights from pack_matmul_weight_avx2");
    PAGODA_CHECK(grp.w->dtype == type && grp.w->row_len() == k && "one call's weights share their type and k");
    PAGODA_CHECK(grp.row >= 0 && grp.m >= 0);
    if (grp.m == 0 || grp.w->num_rows() == 0) continue;
    rows = std::max(rows, grp.row + grp.m);
    macs += grp.m * grp.w->num_rows() * k;
    const int64_t panels = (grp.w->num_rows() + kPanelRows - 1) / kPanelRows;
    total_pieces += (panels + kPanelsPerChunk - 1) / kPanelsPerChunk;
    (grp.m == 1 ? any_single : any_batched) = true;
  }
  if (rows == 0) return;
  const bool parallel = pool != nullptr && pool->num_threads() > 1 && total_pieces > 1 && macs >= kMinParallelMacs;
  // leaf(g, p0, p1): the outputs of panels [p0, p1) of group g's weight.
  auto split = [&](auto&& leaf) {
    if (!parallel) {
      for (int g = 0; g < count; ++g) {
        if (groups[g].m > 0) leaf(groups[g], 0, (groups[g].w->num_rows() + kPanelRows - 1) / kPanelRows);
      }
      return;
    }
    // The calling thread's list, reached by the workers through this reference.
    thread_local std::vector<MatmulPiece> pieces_buffer;
    std::vector<MatmulPiece>& pieces = pieces_buffer;
    pieces.clear();
    int64_t cost = 0;
    for (int g = 0; g < count; ++g) {
      if (groups[g].m == 0) continue;
      const int64_t panels = (groups[g].w->num_rows() + kPanelRows - 1) / kPanelRows;
      for (int64_t p = 0; p < panels; p += kPanelsPerChunk) {
        const int64_t p1 = std::min(panels, p + kPanelsPerChunk);
        pieces.push_back({g, p, p1, cost});
        cost += groups[g].m * (p1 - p);
      }
    }
    const int64_t threads = pool->num_threads();
    pool->parallel_for(threads, [&](int64_t begin, int64_t end) {
      // Shares [begin, end) of `threads`: the pieces whose cost_begin is in [lo, hi), a group's
      // consecutive pieces as one leaf call (decode reads a call's panels as a few long streams).
      const int64_t lo = cost * begin / threads, hi = cost * end / threads;
      auto it = std::lower_bound(pieces.begin(), pieces.end(), lo,
                                 [](const MatmulPiece& piece, int64_t c) { return piece.cost_begin < c; });
      while (it != pieces.end() && it->cost_begin < hi) {
        const MatmulPiece& run = *it;
        int64_t p1 = run.p1;
        while (++it != pieces.end() && it->cost_begin < hi && it->g == run.g) p1 = it->p1;
        leaf(groups[run.g], run.p0, p1);
      }
    });
  };
  if ((type == DType::kF16 || type == DType::kBF16) && leaves.half_bf16 != nullptr) {
    const int64_t ld = (k + 15) / 16 * 16;
    const uint16_t* xb = bf16_input(x, rows, k, ld, parallel, pool);
    split([&](const MatmulGroup& g, int64_t p0, int64_t p1) {
      const Tensor& w = *g.w;
      leaves.half_bf16(xb + g.row * ld, ld, g.m, k, w.dtype, w.data, w.num_rows(), g.y, w.num_rows(), p0, p1);
    });
    return;
  }
  if (!is_quantized(type)) {
    split([&](const MatmulGroup& g, int64_t p0, int64_t p1) {
      const Tensor& w = *g.w;
      if (g.m > 1 && leaves.float_batched != nullptr) {
        leaves.float_batched(x + g.row * k, g.m, k, w.dtype, w.data, w.num_rows(), g.y, w.num_rows(), p0, p1);
      } else {
        matmul_packed_rows_avx2(x + g.row * k, g.m, k, w.dtype, w.data, w.num_rows(), g.y, w.num_rows(), p0, p1);
      }
    });
    return;
  }
  const int64_t nb = k / kQuantBlock;
  const bool nibbles = type == DType::kQ4_0 || type == DType::kQ4_1 || type == DType::kQ5_0 || type == DType::kQ5_1;
  const bool with_sums = nibbles || type == DType::kQ4_K || type == DType::kQ5_K;
  if (type == DType::kQ8_0 || nibbles) {
    // The batched leaf (m > 1, where the table has one) takes q8_0's codes unsigned: a call with
    // groups of one row and of more quantizes the input both ways.
    const bool batched_leaf = leaves.q8act_batched != nullptr && any_batched;
    const bool unsigned_batched = batched_leaf && type == DType::kQ8_0;
    QuantizedInput xq{}, xu{};
    if (!unsigned_batched || any_single) xq = quantize_input(x, rows, k, with_sums, parallel, pool);
    xu = unsigned_batched ? quantize_input(x, rows, k, with_sums, parallel, pool, /*unsigned_codes=*/true, /*slot=*/1)
                          : xq;
    split([&](const MatmulGroup& g, int64_t p0, int64_t p1) {
      const Tensor& w = *g.w;
      const bool batched = g.m > 1 && batched_leaf;
      const QuantizedInput& in = batched ? xu : xq;
      const int32_t* sums = in.sums != nullptr ? in.sums + g.row * nb : nullptr;
      (batched ? leaves.q8act_batched : leaves.q8act)(in.blocks + g.row * nb, sums, g.m, k, w.dtype, w.data,
                                                      w.num_rows(), g.y, w.num_rows(), p0, p1);
    });
    return;
  }
  const QuantizedInput xq = quantize_input(x, rows, k, with_sums, parallel, pool);
  if (type == DType::kQ4_K || type == DType::kQ5_K) {
    auto* leaf = type == DType::kQ4_K ? leaves.q4_k : leaves.q5_k;
    split([&](const MatmulGroup& g, int64_t p0, int64_t p1) {
      leaf(xq.blocks + g.row * nb, xq.sums + g.row * nb, g.m, k, g.w->data, g.w->num_rows(), g.y, g.w->num_rows(),
           p0, p1);
    });
    return;
  }
  if (type == DType::kQ2_K || type == DType::kQ3_K || type == DType::kQ6_K) {
    const int32_t* half_sums = activation_half_sums(xq.blocks, rows * nb);
    auto* leaf = type == DType::kQ2_K ? leaves.q2_k : type == DType::kQ3_K ? leaves.q3_k : leaves.q6_k;
    split([&](const MatmulGroup& g, int64_t p0, int64_t p1) {
      leaf(xq.blocks + g.row * nb, half_sums + 2 * g.row * nb, g.m, k, g.w->data, g.w->num_rows(), g.y,
           g.w->num_rows(), p0, p1);
    });
    return;
  }
  PAGODA_CHECK(false && "the AVX2 matmul has no kernel for this block type");
}

// matmul_many: count groups over the same m rows.
void matmul_packed_pooled(const float* x, int64_t m, const Tensor* const* ws, float* const* ys, int count,
                          ThreadPool* pool, const MatmulLeaves& leaves) {
  constexpr int kMax = 8;
  PAGODA_CHECK(count >= 1 && count <= kMax);
  MatmulGroup groups[kMax];
  for (int i = 0; i < count; ++i) groups[i] = MatmulGroup{0, m, ws[i], ys[i]};
  matmul_packed_pooled(x, groups, count, pool, leaves);
}

void matmul_packed_pooled(const float* x, int64_t m, const Tensor& w, float* y, ThreadPool* pool,
                          const MatmulLeaves& leaves) {
  const MatmulGroup group{0, m, &w, y};
  matmul_packed_pooled(x, &group, 1, pool, leaves);
}

}  // namespace

void matmul_avx2_pooled(const float* x, int64_t m, const Tensor& w, float* y, ThreadPool* pool) {
  matmul_packed_pooled(x, m, w, y, pool, kAvx2Leaves);
}

void matmul_avxvnni_pooled(const float* x, int64_t m, const Tensor& w, float* y, ThreadPool* pool) {
  matmul_packed_pooled(x, m, w, y, pool, kAvxVnniLeaves);
}

void matmul_avxvnni(const ExecContext& ctx, const float* x, int64_t m, const Tensor& w, float* y) {
  matmul_avxvnni_pooled(x, m, w, y, &pool_of(ctx));
}

void matmul_avx512vnni_pooled(const float* x, int64_t m, const Tensor& w, float* y, ThreadPool* pool) {
  matmul_packed_pooled(x, m, w, y, pool, kAvx512VnniLeaves);
}

void matmul_avx512vnni(const ExecContext& ctx, const float* x, int64_t m, const Tensor& w, float* y) {
  matmul_avx512vnni_pooled(x, m, w, y, &pool_of(ctx));
}

void matmul_avx512_pooled(const float* x, int64_t m, const Tensor& w, float* y, ThreadPool* pool) {
  matmul_packed_pooled(x, m, w, y, pool, kAvx512Leaves);
}

void matmul_avx512(const ExecContext& ctx, const float* x, int64_t m, const Tensor& w, float* y) {
  matmul_avx512_pooled(x, m, w, y, &pool_of(ctx));
}

void matmul_avx512bf16_pooled(const float* x, int64_t m, const Tensor& w, float* y, ThreadPool* pool) {
  matmul_packed_pooled(x, m, w, y, pool, kAvx512Bf16Leaves);
}

void matmul_avx512bf16(const ExecContext& ctx, const float* x, int64_t m, const Tensor& w, float* y) {
  matmul_avx512bf16_pooled(x, m, w, y, &pool_of(ctx));
}

void matmul_avx2(const ExecContext& ctx, const float* x, int64_t m, const Tensor& w, float* y) {
  matmul_avx2_pooled(x, m, w, y, &pool_of(ctx));
}

void matmul_avx2_many(const ExecContext& ctx, const float* x, int64_t m, const Tensor* const* w, float* const* y, int count) {
  matmul_packed_pooled(x, m, w, y, count, &pool_of(ctx), kAvx2Leaves);
}

void matmul_avxvnni_many(const ExecContext& ctx, const float* x, int64_t m, const Tensor* const* w, float* const* y, int count) {
  matmul_packed_pooled(x, m, w, y, count, &pool_of(ctx), kAvxVnniLeaves);
}

void matmul_avx512_many(const ExecContext& ctx, const float* x, int64_t m, const Tensor* const* w, float* const* y, int count) {
  matmul_packed_pooled(x, m, w, y, count, &pool_of(ctx), kAvx512Leaves);
}

void matmul_avx512vnni_many(const ExecContext& ctx, const float* x, int64_t m, const Tensor* const* w, float* const* y, int count) {
  matmul_packed_pooled(x, m, w, y, count, &pool_of(ctx), kAvx512VnniLeaves);
}

void matmul_avx512bf16_many(const ExecContext& ctx, const float* x, int64_t m, const Tensor* const* w, float* const* y, int count) {
  matmul_packed_pooled(x, m, w, y, count, &pool_of(ctx), kAvx512Bf16Leaves);
}

void matmul_avx2_grouped(const ExecContext& ctx, const float* x, const MatmulGroup* groups, int count) {
  matmul_packed_pooled(x, groups, count, &pool_of(ctx), kAvx2Leaves);
}

void matmul_avxvnni_grouped(const ExecContext& ctx, const float* x, const MatmulGroup* groups, int count) {
  matmul_packed_pooled(x, groups, count, &pool_of(ctx), kAvxVnniLeaves);
}

void matmul_avx512_grouped(const ExecContext& ctx, const float* x, const MatmulGroup* groups, int count) {
  matmul_packed_pooled(x, groups, count, &pool_of(ctx), kAvx512Leaves);
}

void matmul_avx512vnni_grouped(const ExecContext& ctx, const float* x, const MatmulGroup* groups, int count) {
  matmul_packed_pooled(x, groups, count, &pool_of(ctx), kAvx512VnniLeaves);
}

void matmul_avx512bf16_grouped(const ExecContext& ctx, const float* x, const MatmulGroup* groups, int count) {
  matmul_packed_pooled(x, groups, count, &pool_of(ctx), kAvx512Bf16Leaves);
}

namespace {

using IntPanelsFn = void (*)(const int8_t* xq, const float* s_x, const int32_t* xsum, int64_t m, int64_t kp,
                             int64_t group, int bits, const void* codes, const float* scales, const int32_t* zeros,
                             int64_t n, float* y, int64_t ldy, int64_t panel_begin, int64_t panel_end);

// unsigned_int8: the leaf takes int8 codes' activations as code + 128, unsigned (the avx512vnni
// one); the group sums stay those of the signed codes.
void matmul_int_pooled(const float* x, int64_t m, const IntWeight& w, float* y, ThreadPool* pool,
                       IntPanelsFn panels_leaf, bool unsigned_int8 = false) {
  PAGODA_CHECK(w.layout == TensorLayout::kBackendPacked && "matmul_int takes codes from pack_int_weight_avx2");
  if (m <= 0 || w.n <= 0) return;
  const int64_t kp = (w.k + 7) / 8 * 8;
  const int64_t group = w.group_size == w.k ? kp : w.group_size;
  const int64_t num_panels = (w.n + kPanelRows - 1) / kPanelRows;
  const int64_t num_chunks = (num_panels + kPanelsPerChunk - 1) / kPanelsPerChunk;
  const bool parallel =
      pool != nullptr && pool->num_threads() > 1 && num_chunks > 1 && m * w.n * w.k >= kMinParallelMacs;
  // The calling thread's buffers, reached by the workers through these pointers (a thread_local
  // named inside the lambdas would be each worker's own).
  thread_local std::vector<int8_t> xq_buffer;
  thread_local std::vector<float> s_x_buffer;
  thread_local std::vector<int32_t> xsum_buffer;
  const int64_t groups = kp / group;
  xq_buffer.resize(static_cast<size_t>(m * kp));
  s_x_buffer.resize(static_cast<size_t>(m));
  // Each group's input sum, for the zero points (int4: the implied 8 where the weight has none).
  const bool with_sums = w.zero_points != nullptr || w.bits == 4;
  if (with_sums) xsum_buffer.resize(static_cast<size_t>(m * groups));
  int8_t* xq = xq_buffer.data();
  float* s_x = s_x_buffer.data();
  int32_t* xsum = with_sums ? xsum_buffer.data() : nullptr;
  auto quantize = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      s_x[i] = quantize_activation_row_int8_avx2(x + i * w.k, w.k, kp, w.input_scale, xq + i * kp);
      if (xsum != nullptr) {
        for (int64_t g = 0; g < groups; ++g) {
          int32_t sum = 0;
          for (int64_t t = g * group; t < (g + 1) * group; ++t) sum += xq[i * kp + t];
          xsum[i * groups + g] = sum;
        }
      }
      if (unsigned_int8 && w.bits == 8) {
        auto* u = reinterpret_cast<uint8_t*>(xq + i * kp);
        for (int64_t t = 0; t < kp; ++t) u[t] ^= 0x80;
      }
    }
  };
  if (parallel && m >= 2 * pool->num_threads()) {
    pool->parallel_for(m, quantize);
  } else {
    quantize(0, m);
  }
  auto leaf = [&](int64_t p0, int64_t p1) {
    panels_leaf(xq, s_x, xsum, m, kp, group, w.bits, w.codes, w.scales, w.zero_points, w.n, y, w.n, p0, p1);
  };
  if (!parallel) return leaf(0, num_panels);
  pool->parallel_for(num_chunks, [&](int64_t begin, int64_t end) {
    leaf(begin * kPanelsPerChunk, std::min(num_panels, end * kPanelsPerChunk));
  });
}

}  // namespace

void matmul_int_avx2_pooled(const float* x, int64_t m, const IntWeight& w, float* y, ThreadPool* pool) {
  matmul_int_pooled(x, m, w, y, pool, matmul_int_packed_avx2);
}

void matmul_int_avx2(const ExecContext& ctx, const float* x, int64_t m, const IntWeight& w, float* y) {
  matmul_int_avx2_pooled(x, m, w, y, &pool_of(ctx));
}

void matmul_int_avxvnni_pooled(const float* x, int64_t m, const IntWeight& w, float* y, ThreadPool* pool) {
  matmul_int_pooled(x, m, w, y, pool, matmul_int_packed_avxvnni);
}

void matmul_int_avxvnni(const ExecContext& ctx, const float* x, int64_t m, const IntWeight& w, float* y) {
  matmul_int_avxvnni_pooled(x, m, w, y, &pool_of(ctx));
}

void matmul_int_avx512vnni_pooled(const float* x, int64_t m, const IntWeight& w, float* y, ThreadPool* pool) {
  matmul_int_pooled(x, m, w, y, pool, matmul_int_packed_avx512vnni, /*unsigned_int8=*/true);
}

void matmul_int_avx512vnni(const ExecContext& ctx, const float* x, int64_t m, const IntWeight& w, float* y) {
  matmul_int_avx512vnni_pooled(x, m, w, y, &pool_of(ctx));
}

}  // namespace pagoda::cpu
