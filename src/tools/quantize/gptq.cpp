#include "tools/quantize/gptq.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <memory>
#include <optional>

#include "base/check.h"
#include "tensor/convert.h"
#include "tensor/gguf_blocks.h"
#include "tensor/half.h"
#include "tensor/quant_blocks.h"

namespace pagoda {
namespace {

// Rows a thread sweeps together, so that each row of U is read once for all of them.
constexpr int64_t kSweepRows = 8;

// The inverse factor works on panels of this many columns; below kParallelWork multiply-adds a
// panel's update runs on the caller alone.
constexpr int64_t kPanel = 16;
constexpr int64_t kParallelWork = 1 << 16;

// sum of a[p] * b[p] over [0, n), in four interleaved partial sums (always the same order).
double dot(const double* a, const double* b, int64_t n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t p = 0;
  for (; p + 4 <= n; p += 4) {
    s0 += a[p] * b[p];
    s1 += a[p + 1] * b[p + 1];
    s2 += a[p + 2] * b[p + 2];
    s3 += a[p + 3] * b[p + 3];
  }
  for (; p < n; ++p) s0 += a[p] * b[p];
  return (s0 + s1) + (s2 + s3);
}

// clamp(nearbyint(x), lo, hi) for integer bounds, as the rounders compute it: clamped first (the
// same result), then rounded to nearest even by adding and taking off 1.5 * 2^23, inline where
// nearbyint is a library call on baseline x86-64 (no SSE4.1 roundps).
inline float round_code(float x, int lo, int hi) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  const float c = std::clamp(x, static_cast<float>(lo), static_cast<float>(hi));
  return (c + kMagic) - kMagic;
}

// The codes q_i of scale s for v (all 0 where s is 0 or not finite: an f16 out of range), as
// sum imp v q and sum imp q^2: with vv = sum imp v^2, these codes' error at any scale t, sum imp
// (v - t q)^2, is vv - 2 t vq + t^2 qq, least at t = vq / qq.
struct CodeSums {
  double vq = 0, qq = 0;
  double error(double vv, double t) const { return vv - 2 * t * vq + t * t * qq; }
  double ls_scale() const { return qq > 0 ? vq / qq : 0.0; }
};
CodeSums code_sums(const float* v, const double* imp, int64_t n, int lo, int hi, float s) {
  CodeSums sums;
  if (s == 0 || !std::isfinite(s)) return sums;
  const float inv = 1.0f / s;  // a multiply per element (the rounders divide: a tie may round the
                               // other way here, which only steers the search)
  for (int64_t i = 0; i < n; ++i) {
    const float q = round_code(v[i] * inv, lo, hi);
    sums.vq += imp[i] * v[i] * q;
    sums.qq += imp[i] * q * q;
  }
  return sums;
}

// A GGUF block: the type's quantizer chooses the block's scales from the values at begin() (a
// type with one scale then searches it: gptq_group_scale; Q4_1 / Q5_1 their scale and offset:
// gptq_group_affine); each element is then rounded on the grid those scales give ((d * sc) * q -
// dmin * mn) and stored.
class BlockRounder final : public GptqGroupRounder {
 public:
  BlockRounder(DType type, uint8_t* out, int64_t row_bytes)
      : traits_(dtype_traits(type)), out_(out), row_bytes_(row_bytes), elems_(traits_.block_elems),
        bytes_(traits_.block_bytes), block_(static_cast<size_t>(bytes_)),
        chunks_(static_cast<size_t>(elems_ / kQuantBlock)) {
    PAGODA_CHECK(traits_.set_code != nullptr && "gptq: not a GGUF block type");
  }

  void begin(int64_t row, int64_t group, const float* values, const double* importance) override {
    dst_ = out_ + row * row_bytes_ + group * bytes_;
    quantize_row(traits_.type, values, block_.data(), elems_);
    if (const int64_t at = traits_.scale_offset; at >= 0) {
      uint16_t d = 0;
      std::memcpy(&d, block_.data() + at, sizeof d);
      d = f32_to_fp16(gptq_group_scale(values, importance, elems_, traits_.code_lo, traits_.code_hi, fp16_to_f32(d),
                                       true, true));
      std::memcpy(block_.data() + at, &d, sizeof d);
    } else if (traits_.affine_d_offset >= 0) {
      const int64_t at_d = traits_.affine_d_offset, at_m = traits_.affine_m_offset;
      uint16_t d = 0, m = 0;
      std::memcpy(&d, block_.data() + at_d, sizeof d);
      std::memcpy(&m, block_.data() + at_m, sizeof m);
      const AffineScale best =
          gptq_group_affine(values, importance, elems_, traits_.code_hi, {fp16_to_f32(d), fp16_to_f32(m)});
      d = f32_to_fp16(best.d);
      m = f32_to_fp16(best.m);
      std::memcpy(block_.data() + at_d, &d, sizeof d);
      std::memcpy(block_.data() + at_m, &m, sizeof m);
    }
    traits_.decode_chunks(block_.data(), chunks_.data());
  }

  float round(int64_t i, float v) override {
    const QuantChunk& c = chunks_[static_cast<size_t>(i / kQuantBlock)];
    const int half = static_cast<int>(i % kQuantBlock) / 16;
    const float step = c.d * static_cast<float>(c.sc[half]);
    const float offset = c.dmin * static_cast<float>(c.mn[half]);
    int q = std::clamp(0, traits_.code_lo, traits_.code_hi);
    if (step != 0) {
      q = static_cast<int>(std::clamp(std::nearbyint((v + offset) / step), static_cast<float>(traits_.code_lo),
                                      static_cast<float>(traits_.code_hi)));
    }
    traits_.set_code(block_.data(), static_cast<int>(i), q);
    return step * static_cast<float>(q) - offset;
  }

  void end() override { std::memcpy(dst_, block_.data(), static_cast<size_t>(bytes_)); }

 private:
  const DTypeTraits& traits_;
  uint8_t* out_;
  int64_t row_bytes_, elems_, bytes_;
  std::vector<uint8_t> block_;
  std::vector<QuantChunk> chunks_;
  uint8_t* dst_ = nullptr;
};

// A group of symmetric integer codes: the scale gptq_group_scale chooses for the values at begin()
// (from quantize_weight_row_symmetric's), each element then code * scale.
class IntRounder final : public GptqGroupRounder {
 public:
  IntRounder(int bits, int64_t cols, int64_t group, int8_t* codes, float* scales)
      : bits_(bits), cols_(cols), group_(group), codes_(codes), scales_(scales),
        scratch_(static_cast<size_t>(group)) {}

  void begin(int64_t row, int64_t group, const float* values, const double* importance) override {
    dst_ = codes_ + row * cols_ + group * group_;
    float* scale = scales_ + row * (cols_ / group_) + group;
    quantize_weight_row_symmetric(values, group_, bits_, group_, scratch_.data(), scale);
    *scale = gptq_group_scale(values, importance, group_, lo_, hi_, *scale, false, false);
    scale_ = *scale;
  }

  float round(int64_t i, float v) override {
    const float q = scale_ != 0 ? std::clamp(std::nearbyint(v / scale_), static_cast<float>(lo_), static_cast<float>(hi_))
                                : 0.0f;
    dst_[i] = static_cast<int8_t>(q);
    return q * scale_;
  }

  void end() override {}

 private:
  int bits_;
  int lo_ = bits_ == 8 ? -127 : -8, hi_ = bits_ == 8 ? 127 : 7;  // int8: -128 never (vpmaddubsw pairs)
  int64_t cols_, group_;
  int8_t* codes_;
  float* scales_;
  std::vector<int8_t> scratch_;
  int8_t* dst_ = nullptr;
  float scale_ = 0;
};

}  // namespace

float gptq_group_scale(const float* v, const double* imp, int64_t n, int lo, int hi, float rtn_scale, bool f16_scale,
                       bool negative_ok) {
  PAGODA_CHECK(lo < 0 && hi > 0);
  float amax = 0, extreme = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::fabs(v[i]) > amax) {
      amax = std::fabs(v[i]);
      extreme = v[i];
    }
  }
  if (amax == 0) return 0;
  auto stored = [f16_scale](float s) { return f16_scale ? fp16_to_f32(f32_to_fp16(s)) : s; };
  auto usable = [](float s) { return s != 0 && std::isfinite(s); };  // f16 may lose a tiny or huge one
  double vv = 0;
  for (int64_t i = 0; i < n; ++i) vv += imp[i] * v[i] * v[i];
  float best = rtn_scale;
  double best_error = code_sums(v, imp, n, lo, hi, rtn_scale).error(vv, rtn_scale);
  auto take = [&](float s, double e) {
    if (e < best_error) {
      best_error = e;
      best = s;
    }
  };
  for (const float sign : {1.0f, -1.0f}) {
    if (sign < 0 && !negative_ok) break;
    // The code the extreme value takes at the end of the range on its side.
    const int end = (extreme > 0) == (sign > 0) ? hi : -lo;
    for (int percent = -25; percent <= 30; ++percent) {
      const float codes = static_cast<float>(end) * (1.0f + 0.01f * static_cast<float>(percent));
      const float s = stored(sign * amax / codes);
      if (!usable(s)) continue;
      const CodeSums sums = code_sums(v, imp, n, lo, hi, s);
      take(s, sums.error(vv, s));
      // The least-squares scale of these codes (as stored): their error at it bounds its own, as
      // its nearest codes can only do better.
      const float ls = stored(static_cast<float>(sums.ls_scale()));
      if (usable(ls)) take(ls, sums.error(vv, ls));
    }
  }
  // The best's own codes (its recorded error may be a bound), and their least-squares scale.
  const CodeSums sums = code_sums(v, imp, n, lo, hi, best);
  best_error = sums.error(vv, best);
  const float ls = stored(static_cast<float>(sums.ls_scale()));
  if (usable(ls)) take(ls, sums.error(vv, ls));
  return best;
}

AffineScale gptq_group_affine(const float* v, const double* imp, int64_t n, int hi, AffineScale rtn) {
  PAGODA_CHECK(hi > 0);
  float lo_v = v[0], hi_v = v[0];
  for (int64_t i = 1; i < n; ++i) {
    lo_v = std::min(lo_v, v[i]);
    hi_v = std::max(hi_v, v[i]);
  }
  auto stored = [](float x) { return fp16_to_f32(f32_to_fp16(x)); };
  auto usable = [](AffineScale s) { return std::isfinite(s.d) && std::isfinite(s.m); };
  // The sums of imp over v^2, v, 1 give the error of any codes at any (d, m) from their own sums.
  double vv = 0, sv = 0, sw = 0;
  for (int64_t i = 0; i < n; ++i) {
    vv += imp[i] * v[i] * v[i];
    sv += imp[i] * v[i];
    sw += imp[i];
  }
  struct Sums {
    double vq = 0, q = 0, qq = 0;
  };
  auto codes = [&](AffineScale s) {  // the nearest codes of (d, m), as the rounder takes them
    Sums c;
    for (int64_t i = 0; i < n; ++i) {
      const float q = s.d != 0 ? round_code((v[i] - s.m) / s.d, 0, hi) : 0.0f;
      c.vq += imp[i] * v[i] * q;
      c.q += imp[i] * q;
      c.qq += imp[i] * q * q;
    }
    return c;
  };
  auto error = [&](const Sums& c, AffineScale s) {
    const double d = s.d, m = s.m;
    return vv - 2 * d * c.vq - 2 * m * sv + d * d * c.qq + 2 * d * m * c.q + m * m * sw;
  };
  // The least-squares (d, m) of these codes (as stored): the 2 x 2 normal equations.
  auto fit = [&](const Sums& c) -> std::optional<AffineScale> {
    const double det = c.qq * sw - c.q * c.q;
    if (!(det > 0)) return std::nullopt;
    const AffineScale s{stored(static_cast<float>((c.vq * sw - c.q * sv) / det)),
                        stored(static_cast<float>((c.qq * sv - c.q * c.vq) / det))};
    return usable(s) ? std::optional(s) : std::nullopt;
  };
  AffineScale best = rtn;
  double best_error = usable(rtn) ? error(codes(rtn), rtn) : INFINITY;
  auto take = [&](AffineScale s, double e) {
    if (e < best_error) {
      best_error = e;
      best = s;
    }
  };
  if (hi_v > lo_v) {
    for (int percent = -25; percent <= 30; ++percent) {
      // The range [lo_v, hi_v] over hi codes, stretched or shrunk, from the smallest value, to the
      // largest, or about the middle (a shrunk range clips the bottom, the top, or both).
      const float d = (hi_v - lo_v) / (static_cast<float>(hi) * (1.0f + 0.01f * static_cast<float>(percent)));
      for (const float m : {lo_v, hi_v - d * static_cast<float>(hi), 0.5f * (lo_v + hi_v - d * static_cast<float>(hi))}) {
        const AffineScale s{stored(d), stored(m)};
        if (!usable(s) || s.d == 0) continue;
        const Sums c = codes(s);
        take(s, error(c, s));
        if (const auto ls = fit(c)) take(*ls, error(c, *ls));
      }
    }
  }
  if (!usable(best)) return rtn;
  const Sums c = codes(best);  // the best's own codes (its recorded error may be a bound)
  best_error = error(c, best);
  if (const auto ls = fit(c)) take(*ls, error(c, *ls));
  return best;
}

GptqHessian::GptqHessian(int64_t cols) : cols_(cols), upper_(static_cast<size_t>(cols * cols), 0.0f) {}

void GptqHessian::add(const float* x, int64_t m) {
  for (int64_t r = 0; r < m; ++r) {
    const float* xr = x + r * cols_;
    for (int64_t i = 0; i < cols_; ++i) {
      const float xi = xr[i];
      if (xi == 0) continue;
      float* h = upper_.data() + i * cols_;
      for (int64_t j = i; j < cols_; ++j) h[j] += xi * xr[j];
    }
  }
  tokens_ += m;
}

double GptqHessian::at(int64_t i, int64_t j) const {
  return i <= j ? upper_[static_cast<size_t>(i * cols_ + j)] : upper_[static_cast<size_t>(j * cols_ + i)];
}

Result<std::vector<double>> gptq_inverse_factor(const GptqHessian& h, double damp, ThreadPool* pool,
                                                const std::vector<int64_t>& order) {
  const int64_t k = h.cols();
  PAGODA_CHECK(order.empty() || static_cast<int64_t>(order.size()) == k);
  auto stored = [&order](int64_t p) { return order.empty() ? p : order[static_cast<size_t>(p)]; };
  auto at = [k](std::vector<double>& a, int64_t i, int64_t j) -> double& { return a[static_cast<size_t>(i * k + j)]; };
  std::vector<double> u(static_cast<size_t>(k * k), 0.0);
  double mean = 0;
  for (int64_t i = 0; i < k; ++i) mean += h.at(i, i);
  mean /= static_cast<double>(std::max<int64_t>(k, 1));
  if (!(mean > 0)) {
    if (!std::isfinite(mean)) return invalid_argument("gptq: the calibration inputs hold NaN or infinity");
    for (int64_t i = 0; i < k; ++i) at(u, i, i) = 1;  // no inputs seen: round to nearest
    return u;
  }
  // U^T U = H^-1 with U upper triangular is U = P L^-1 P, where P reverses the order and L L^T =
  // P H P (the Cholesky factor of H with its rows and columns reversed): then U^T U = P L^-T L^-1 P
  // = (P L L^T P)^-1 = H^-1, and reversing a lower-triangular matrix makes it upper.
  // Blocked by panels of kPanel columns, so that each row of L is read from memory once per panel
  // rather than once per column: first the panel's columns less what every column before the
  // panel contributes (rows split among the threads), then the panel column by column.
  std::vector<double> l(static_cast<size_t>(k * k), 0.0);
  auto a = [&](int64_t i, int64_t j) { return h.at(stored(k - 1 - i), stored(k - 1 - j)) + (i == j ? damp * mean : 0.0); };
  for (int64_t j0 = 0; j0 < k; j0 += kPanel) {
    const int64_t jb = std::min(kPanel, k - j0);
    auto update = [&](int64_t begin, int64_t end) {
      for (int64_t i = j0 + begin; i < j0 + end; ++i) {
        const double* li = &at(l, i, 0);
        for (int64_t jj = j0; jj < j0 + jb && jj <= i; ++jj) at(l, i, jj) = a(i, jj) - dot(li, &at(l, jj, 0), j0);
      }
    };
    if (pool == nullptr || (k - j0) * j0 * jb < kParallelWork) {
      update(0, k - j0);
    } else {
      pool->parallel_for(k - j0, update);
    }
    for (int64_t jj = j0; jj < j0 + jb; ++jj) {
      const double* panel_jj = &at(l, jj, j0);
      const double s = at(l, jj, jj) - dot(panel_jj, panel_jj, jj - j0);
      if (!(s > 0)) return invalid_argument("gptq: the inputs' Hessian is not positive definite (NaN in the inputs?)");
      const double d = std::sqrt(s);
      at(l, jj, jj) = d;
      for (int64_t i = jj + 1; i < k; ++i) at(l, i, jj) = (at(l, i, jj) - dot(&at(l, i, j0), panel_jj, jj - j0)) / d;
    }
  }
  // Column c of L^-1 solves L m = e_c (forward substitution); its element r is U(k-1-r, k-1-c).
  // Columns are independent: a panel of kPanel of them walks the rows of L once, and thread t of
  // T takes panels t, t + T, ... (the panel from c costs about (k - c)^2 / 2 per column).
  const int64_t panels = (k + kPanel - 1) / kPanel;
  auto solve_panels = [&](int64_t first, int64_t step) {
    std::vector<double> m(static_cast<size_t>(kPanel * k));
    for (int64_t p = first; p < panels; p += step) {
      const int64_t c0 = p * kPanel, cb = std::min(kPanel, k - c0);
      for (int64_t r = c0; r < k; ++r) {
        const double* lr = &at(l, r, 0);
        for (int64_t q = 0; q < cb && c0 + q <= r; ++q) {
          const int64_t c = c0 + q;
          double* mq = m.data() + q * k;
          mq[r] = r == c ? 1.0 / lr[r] : -dot(lr + c, mq + c, r - c) / lr[r];
        }
      }
      for (int64_t q = 0; q < cb; ++q) {
        const int64_t c = c0 + q;
        for (int64_t r = c; r < k; ++r) at(u, k - 1 - r, k - 1 - c) = m[static_cast<size_t>(q * k + r)];
      }
    }
  };
  const int64_t threads = pool == nullptr ? 1 : std::min<int64_t>(pool->num_threads(), panels);
  if (threads == 1) {
    solve_panels(0, 1);
  } else {
    pool->parallel_for(threads, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) solve_panels(t, threads);
    });
  }
  return u;
}

std::vector<int64_t> gptq_act_order(const GptqHessian& h, int64_t group_len) {
  const int64_t cols = h.cols();
  PAGODA_CHECK(group_len > 0 && cols % group_len == 0);
  std::vector<int64_t> groups(static_cast<size_t>(cols / group_len));
  std::vector<double> group_sum(groups.size(), 0.0);
  for (int64_t j = 0; j < cols; ++j) group_sum[static_cast<size_t>(j / group_len)] += h.at(j, j);
  for (size_t g = 0; g < groups.size(); ++g) groups[g] = static_cast<int64_t>(g);
  std::stable_sort(groups.begin(), groups.end(), [&](int64_t a, int64_t b) {
    return group_sum[static_cast<size_t>(a)] > group_sum[static_cast<size_t>(b)];
  });
  std::vector<int64_t> order;
  order.reserve(static_cast<size_t>(cols));
  for (const int64_t g : groups) {
    const auto first = static_cast<std::ptrdiff_t>(order.size());
    for (int64_t e = 0; e < group_len; ++e) order.push_back(g * group_len + e);
    std::stable_sort(order.begin() + first, order.end(), [&](int64_t a, int64_t b) { return h.at(a, a) > h.at(b, b); });
  }
  return order;
}

void gptq_sweep(float* w, int64_t rows, int64_t cols, int64_t group_len, const std::vector<double>& u,
                const std::function<std::unique_ptr<GptqGroupRounder>()>& make_rounder, ThreadPool* pool,
                const std::vector<int64_t>& order) {
  PAGODA_CHECK(group_len > 0 && cols % group_len == 0);
  PAGODA_CHECK(static_cast<int64_t>(u.size()) == cols * cols);
  // at[p]: the stored column swept p-th. Each group's columns must stay together.
  PAGODA_CHECK(order.empty() || static_cast<int64_t>(order.size()) == cols);
  std::vector<int64_t> at(static_cast<size_t>(cols));
  for (int64_t p = 0; p < cols; ++p) at[static_cast<size_t>(p)] = order.empty() ? p : order[static_cast<size_t>(p)];
  std::vector<bool> seen(static_cast<size_t>(cols), false);
  for (int64_t p = 0; p < cols; ++p) {
    const int64_t c = at[static_cast<size_t>(p)];
    PAGODA_CHECK(c >= 0 && c < cols && !seen[static_cast<size_t>(c)]);
    PAGODA_CHECK(c / group_len == at[static_cast<size_t>(p - p % group_len)] / group_len);
    seen[static_cast<size_t>(c)] = true;
  }
  const int64_t batches = (rows + kSweepRows - 1) / kSweepRows;
  std::vector<double> importance(static_cast<size_t>(cols));  // by sweep position
  for (int64_t j = 0; j < cols; ++j) {
    const double d = u[static_cast<size_t>(j * cols + j)];
    importance[static_cast<size_t>(j)] = 1.0 / (d * d);
  }
  auto sweep = [&](int64_t first, int64_t last) {
    std::vector<std::unique_ptr<GptqGroupRounder>> rounders;
    for (int64_t i = 0; i < kSweepRows; ++i) rounders.push_back(make_rounder());
    std::vector<double> err(kSweepRows);
    std::vector<float> work(static_cast<size_t>(kSweepRows * cols));  // the batch's rows in sweep order
    std::vector<float> values(static_cast<size_t>(group_len));        // a group in stored order
    std::vector<double> group_importance(static_cast<size_t>(group_len));
    for (int64_t batch = first; batch < last; ++batch) {
      const int64_t r0 = batch * kSweepRows, n = std::min(kSweepRows, rows - r0);
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t p = 0; p < cols; ++p) work[static_cast<size_t>(r * cols + p)] = w[(r0 + r) * cols + at[static_cast<size_t>(p)]];
      }
      for (int64_t j = 0; j < cols; ++j) {
        const int64_t stored = at[static_cast<size_t>(j)], group = stored / group_len, in_group = stored % group_len;
        const bool group_begins = j % group_len == 0, group_ends = j % group_len == group_len - 1;
        if (group_begins) {
          for (int64_t e = 0; e < group_len; ++e) {
            group_importance[static_cast<size_t>(at[static_cast<size_t>(j + e)] % group_len)] = importance[static_cast<size_t>(j + e)];
          }
        }
        const double* uj = u.data() + j * cols;
        for (int64_t r = 0; r < n; ++r) {
          float* wr = work.data() + r * cols;
          GptqGroupRounder& rounder = *rounders[static_cast<size_t>(r)];
          if (group_begins) {
            for (int64_t e = 0; e < group_len; ++e) values[static_cast<size_t>(at[static_cast<size_t>(j + e)] % group_len)] = wr[j + e];
            rounder.begin(r0 + r, group, values.data(), group_importance.data());
          }
          const float y = rounder.round(in_group, wr[j]);
          err[static_cast<size_t>(r)] = (static_cast<double>(wr[j]) - y) / uj[j];
          wr[j] = y;
          if (group_ends) rounder.end();
        }
        for (int64_t r = 0; r < n; ++r) {
          const double e = err[static_cast<size_t>(r)];
          if (e == 0) continue;
          float* wr = work.data() + r * cols;
          for (int64_t t = j + 1; t < cols; ++t) wr[t] = static_cast<float>(wr[t] - e * uj[t]);
        }
      }
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t p = 0; p < cols; ++p) w[(r0 + r) * cols + at[static_cast<size_t>(p)]] = work[static_cast<size_t>(r * cols + p)];
      }
    }
  };
  if (pool == nullptr) {
    sweep(0, batches);
  } else {
    pool->parallel_for(batches, sweep);
  }
}

std::vector<uint8_t> gptq_quantize_blocks(DType type, const float* w, int64_t rows, int64_t cols,
                                          const std::vector<double>& u, ThreadPool* pool,
                                          const std::vector<int64_t>& order) {
  const DTypeTraits& tr = dtype_traits(type);
  PAGODA_CHECK(is_quantized(type) && cols % tr.block_elems == 0);
  const int64_t row_bytes = cols / tr.block_elems * tr.block_bytes;
  std::vector<uint8_t> out(static_cast<size_t>(rows * row_bytes));
  std::vector<float> work(w, w + rows * cols);
  gptq_sweep(work.data(), rows, cols, tr.block_elems, u,
             [&] { return std::make_unique<BlockRounder>(type, out.data(), row_bytes); }, pool, order);
  return out;
}

void gptq_quantize_int(const float* w, int64_t rows, int64_t cols, int bits, int64_t group, const std::vector<double>& u,
                       int8_t* codes, float* scales, ThreadPool* pool, const std::vector<int64_t>& order) {
  PAGODA_CHECK((bits == 8 || bits == 4) && group > 0 && cols % group == 0);
  std::vector<float> work(w, w + rows * cols);
  gptq_sweep(work.data(), rows, cols, group, u,
             [&] { return std::make_unique<IntRounder>(bits, cols, group, codes, scales); }, pool, order);
}

}  // namespace pagoda
