#include "sample/sampler.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <limits>

#include "base/check.h"

namespace pagoda {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Shortest round-trip form ("1.5", "nan", "inf"), so a message echoes what the client sent.
std::string fmt(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return ec == std::errc() ? std::string(buf, end) : std::to_string(v);
}
std::string fmt(int64_t v) { return std::to_string(v); }

bool in_closed(double v, double lo, double hi) { return v >= lo && v <= hi; }  // false for NaN

std::string vocab_range(int64_t vocab_size) { return "[0, " + fmt(vocab_size) + ")"; }

// Lowest id among the maxima; 0 when every logit is -inf.
TokenId argmax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (x[i] > x[best]) best = i;
  }
  return static_cast<TokenId>(best);
}

float max_of(const float* x, int64_t n) { return *std::max_element(x, x + n); }

void check_id(TokenId id, int64_t vocab_size) { PAGODA_CHECK(id >= 0 && id < vocab_size); }

// Steps 1-3 of the header's pipeline, in place on one row.
void apply_bias_and_penalties(float* x, int64_t vocab_size, const SamplingRow& row,
                              std::vector<int32_t>& counts) {
  const SamplingParams& p = *row.params;
  for (const auto& [id, bias] : p.logit_bias) {
    check_id(id, vocab_size);
    x[id] += bias;
  }
  bool suppress = true;
  if (!row.allowed.empty()) {
    PAGODA_CHECK(row.allowed.size() * 64 >= static_cast<size_t>(vocab_size));
    suppress = false;  // unless some allowed id is not suppressed
    for (int64_t w = 0; w * 64 < vocab_size; ++w) {
      uint64_t bits = row.allowed[static_cast<size_t>(w)];
      if (w * 64 + 64 > vocab_size) bits &= (uint64_t{1} << (vocab_size - w * 64)) - 1;
      for (uint64_t left = bits; left != 0 && !suppress; left &= left - 1) {
        const TokenId id = static_cast<TokenId>(w * 64 + std::countr_zero(left));
        suppress = std::find(row.suppressed.begin(), row.suppressed.end(), id) == row.suppressed.end();
      }
      if (bits == ~uint64_t{0}) continue;
      const int64_t end = std::min<int64_t>(vocab_size, w * 64 + 64);
      for (int64_t id = w * 64; id < end; ++id) {
        if (!((bits >> (id - w * 64)) & 1)) x[id] = kNegInf;
      }
    }
  }
  if (suppress) {
    for (TokenId id : row.suppressed) {
      check_id(id, vocab_size);
      x[id] = kNegInf;
    }
  }
  // counts is all zero on entry and on exit; only the touched ids are reset, so the cost is
  // O(history), not O(vocab).
  if (p.repetition_penalty != 1.0) {
    const double r = p.repetition_penalty;
    auto penalize_once = [&](TokenId id) {
      check_id(id, vocab_size);
      if (counts[id] != 0) return;
      counts[id] = 1;
      x[id] = static_cast<float>(x[id] > 0 ? x[id] / r : x[id] * r);
    };
    for (TokenId id : row.prompt_tokens) penalize_once(id);
    for (TokenId id : row.output_tokens) penalize_once(id);
    for (TokenId id : row.prompt_tokens) counts[id] = 0;
    for (TokenId id : row.output_tokens) counts[id] = 0;
  }
  if (p.frequency_penalty != 0.0 || p.presence_penalty != 0.0) {
    for (TokenId id : row.output_tokens) {
      check_id(id, vocab_size);
      ++counts[id];
    }
    for (TokenId id : row.output_tokens) {
      if (counts[id] == 0) continue;  // already applied for this id
      x[id] = static_cast<float>(x[id] - (p.frequency_penalty * counts[id] + p.presence_penalty));
      counts[id] = 0;
    }
  }
}

}  // namespace

std::optional<InvalidParam> SamplingParams::check(int64_t vocab_size, int64_t max_logprobs) const {
  PAGODA_CHECK(vocab_size > 0);
  if (n < 1 || n > kMaxN) return InvalidParam{"n", "n must be in [1, " + fmt(kMaxN) + "], got " + fmt(n)};
  if (!(temperature >= 0) || !std::isfinite(temperature)) {
    return InvalidParam{"temperature", "temperature must be a finite number >= 0, got " + fmt(temperature)};
  }
  if (!(top_p > 0 && top_p <= 1)) return InvalidParam{"top_p", "top_p must be in (0, 1], got " + fmt(top_p)};
  if (top_k < -1) return InvalidParam{"top_k", "top_k must be -1 or >= 0 (-1 and 0 mean no limit), got " + fmt(top_k)};
  if (!in_closed(min_p, 0, 1)) return InvalidParam{"min_p", "min_p must be in [0, 1], got " + fmt(min_p)};
  if (!in_closed(presence_penalty, -kMaxAbsPenalty, kMaxAbsPenalty)) {
    return InvalidParam{"presence_penalty", "presence_penalty must be in [-2, 2], got " + fmt(presence_penalty)};
  }
  if (!in_closed(frequency_penalty, -kMaxAbsPenalty, kMaxAbsPenalty)) {
    return InvalidParam{"frequency_penalty", "frequency_penalty must be in [-2, 2], got " + fmt(frequency_penalty)};
  }
  if (!(repetition_penalty > 0) || !std::isfinite(repetition_penalty)) {
    return InvalidParam{"repetition_penalty", "repetition_penalty must be a finite number > 0, got " + fmt(repetition_penalty)};
  }
  for (const auto& [id, bias] : logit_bias) {
    if (id < 0 || id >= vocab_size) {
      return InvalidParam{"logit_bias", "logit_bias token id " + fmt(int64_t{id}) + " is outside the vocabulary " +
                              vocab_range(vocab_size)};
    }
    if (!in_closed(bias, -kMaxAbsLogitBias, kMaxAbsLogitBias)) {
      return InvalidParam{"logit_bias", "logit_bias value for token " + fmt(int64_t{id}) + " must be in [-100, 100], got " +
                              fmt(double{bias})};
    }
  }
  if (max_tokens < 1) return InvalidParam{"max_tokens", "max_tokens must be >= 1, got " + fmt(max_tokens)};
  if (min_tokens < 0 || min_tokens > max_tokens) {
    return InvalidParam{"min_tokens", "min_tokens must be in [0, max_tokens = " + fmt(max_tokens) + "], got " +
                            fmt(min_tokens)};
  }
  if (stop.size() > kMaxStop) {
    return InvalidParam{"stop", "stop may hold at most " + fmt(static_cast<int64_t>(kMaxStop)) + " strings, got " +
                            fmt(static_cast<int64_t>(stop.size()))};
  }
  for (size_t i = 0; i < stop.size(); ++i) {
    if (stop[i].empty()) {
      return InvalidParam{"stop", "stop strings must be non-empty (stop[" + fmt(static_cast<int64_t>(i)) + "] is empty)"};
    }
  }
  for (size_t i = 0; i < stop_token_ids.size(); ++i) {
    const TokenId id = stop_token_ids[i];
    if (id < 0 || id >= vocab_size) {
      return InvalidParam{"stop_token_ids", "stop_token_ids[" + fmt(static_cast<int64_t>(i)) + "] = " + fmt(int64_t{id}) +
                              " is outside the vocabulary " + vocab_range(vocab_size)};
    }
  }
  if (logprobs && (*logprobs < 0 || *logprobs > max_logprobs)) {
    return InvalidParam{"logprobs", "logprobs must be in [0, " + fmt(max_logprobs) + "], got " + fmt(*logprobs)};
  }
  if (prompt_logprobs && (*prompt_logprobs < 0 || *prompt_logprobs > max_logprobs)) {
    return InvalidParam{"prompt_logprobs", "prompt_logprobs must be in [0, " + fmt(max_logprobs) + "], got " + fmt(*prompt_logprobs)};
  }
  return std::nullopt;
}

Status SamplingParams::validate(int64_t vocab_size, int64_t max_logprobs) const {
  std::optional<InvalidParam> bad = check(vocab_size, max_logprobs);
  return bad ? invalid_argument(bad->message) : Status::ok_status();
}

SampledToken compute_logprobs(const float* logits, int64_t vocab_size, TokenId token, int64_t num_top) {
  PAGODA_CHECK(vocab_size > 0);
  check_id(token, vocab_size);
  const double m = max_of(logits, vocab_size);
  double log_z = m;  // every logit -inf: every logprob is -inf too
  if (std::isfinite(m)) {
    double sum = 0;
    for (int64_t i = 0; i < vocab_size; ++i) sum += std::exp(static_cast<double>(logits[i]) - m);
    log_z = m + std::log(sum);
  }
  auto logprob = [&](int64_t id) { return static_cast<float>(static_cast<double>(logits[id]) - log_z); };

  SampledToken out{token, logprob(token), {}};
  // Top-N in one pass with a small sorted list: O(V) plus O(N) per insertion, and insertions are
  // rare once the list holds the N best. Ids arrive in increasing order, so a new entry goes after
  // equal logits, which keeps "lowest id first" on ties.
  const size_t n = static_cast<size_t>(std::clamp<int64_t>(num_top, 0, vocab_size));
  std::vector<TokenId> top;
  top.reserve(n + 1);
  for (int64_t i = 0; i < vocab_size && n > 0; ++i) {
    const float v = logits[i];
    if (top.size() == n && !(v > logits[top.back()])) continue;
    auto pos = std::find_if(top.begin(), top.end(), [&](TokenId t) { return logits[t] < v; });
    top.insert(pos, static_cast<TokenId>(i));
    if (top.size() > n) top.pop_back();
  }
  out.top.reserve(top.size());
  for (TokenId id : top) out.top.push_back({id, logprob(id)});
  return out;
}

std::vector<SampledToken> Sampler::sample(float* logits, int64_t vocab_size, std::span<const SamplingRow> rows) {
  PAGODA_CHECK(vocab_size > 0);
  if (counts_.size() != static_cast<size_t>(vocab_size)) counts_.assign(static_cast<size_t>(vocab_size), 0);
  std::vector<SampledToken> out;
  out.reserve(rows.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    const SamplingRow& row = rows[r];
    PAGODA_CHECK(row.params != nullptr);
    const SamplingParams& p = *row.params;
    float* x = logits + static_cast<int64_t>(r) * vocab_size;
    if (p.logprobs) raw_.assign(x, x + vocab_size);
    apply_bias_and_penalties(x, vocab_size, row, counts_);
    TokenId token;
    if (p.greedy()) {
      token = argmax(x, vocab_size);
    } else {
      PAGODA_CHECK(row.rng != nullptr);
      token = draw(x, vocab_size, p, *row.rng);
    }
    out.push_back(p.logprobs ? compute_logprobs(raw_.data(), vocab_size, token, *p.logprobs)
                             : SampledToken{token, 0.0f, {}});
  }
  return out;
}

TokenId Sampler::draw(const float* x, int64_t vocab_size, const SamplingParams& p, SamplerRng& rng) {
  double total = 0;
  if (!collect(x, vocab_size, p, &total)) return argmax(x, vocab_size);  // nothing left to draw from
  // 4. One 64-bit draw per sampled token, mapped to [0, 1) with 53 bits; the walk follows the
  //    candidates' order, which depends only on this row.
  const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53 * total;
  double acc = 0;
  TokenId last = candidates_.front().id;
  for (const Candidate& cand : candidates_) {
    if (cand.weight <= 0) continue;
    acc += cand.weight;
    last = cand.id;
    if (u < acc) return cand.id;
  }
  return last;  // rounding put u at the very end
}

std::vector<TokenProb> Sampler::distribution(float* logits, int64_t vocab_size, const SamplingRow& row) {
  PAGODA_CHECK(vocab_size > 0 && row.params != nullptr);
  if (counts_.size() != static_cast<size_t>(vocab_size)) counts_.assign(static_cast<size_t>(vocab_size), 0);
  apply_bias_and_penalties(logits, vocab_size, row, counts_);
  double total = 0;
  if (row.params->greedy() || !collect(logits, vocab_size, *row.params, &total)) {
    return {{argmax(logits, vocab_size), 1.0}};
  }
  std::vector<TokenProb> out;
  out.reserve(candidates_.size());
  for (const Candidate& cand : candidates_) {
    if (cand.weight > 0) out.push_back({cand.id, cand.weight / total});
  }
  return out;
}

bool Sampler::collect(const float* x, int64_t vocab_size, const SamplingParams& p, double* total_out) {
  const float m = max_of(x, vocab_size);
  if (!std::isfinite(m)) return false;
  const double temperature = p.temperature;
  // min_p in logit space: p_i >= min_p * p_max  <=>  logit_i >= max + T * ln(min_p).
  const double min_p_floor = p.min_p > 0 ? m + temperature * std::log(p.min_p) : -HUGE_VAL;
  const bool use_top_p = p.top_p < 1;
  auto better = [](const Candidate& a, const Candidate& b) {
    return a.logit != b.logit ? a.logit > b.logit : a.id < b.id;
  };

  // 1. Collect the candidates. min_p only compares against the maximum, which no cut removes, so
  //    it commutes with top_k and filters first; with top_p it must wait, since top_p's mass is
  //    that of the whole top_k distribution.
  std::vector<Candidate>& c = candidates_;
  c.clear();
  const double floor = use_top_p ? -HUGE_VAL : min_p_floor;
  const size_t top_k = p.top_k > 0 ? static_cast<size_t>(p.top_k) : SIZE_MAX;
  if (top_k < static_cast<size_t>(vocab_size)) {
    // A heap of the k best seen so far, worst on top: O(V) compares, and in a shuffled row only
    // about k * ln(V / k) insertions. Ids arrive in increasing order, so an equal logit never
    // displaces (lower ids win ties).
    c.reserve(top_k);
    for (int64_t i = 0; i < vocab_size; ++i) {
      const float v = x[i];
      if (!(v > kNegInf && v >= floor)) continue;
      if (c.size() < top_k) {
        c.push_back({0.0f, v, static_cast<TokenId>(i)});
        std::push_heap(c.begin(), c.end(), better);
      } else if (v > c.front().logit) {
        std::pop_heap(c.begin(), c.end(), better);
        c.back() = {0.0f, v, static_cast<TokenId>(i)};
        std::push_heap(c.begin(), c.end(), better);
      }
    }
  } else {
    for (int64_t i = 0; i < vocab_size; ++i) {
      if (x[i] > kNegInf && x[i] >= floor) c.push_back({0.0f, x[i], static_cast<TokenId>(i)});
    }
  }
  // 2. Weights relative to the maximum (so the best is exactly 1); float is ample for drawing and
  //    the sums run in double.
  const float inv_t = static_cast<float>(1.0 / temperature);
  double total = 0;
  for (Candidate& cand : c) {
    cand.weight = std::exp((cand.logit - m) * inv_t);
    total += cand.weight;
  }
  // 3. top_p, then min_p.
  if (use_top_p) {
    const double target = p.top_p * total;
    bool nucleus_inside = true;
    if (min_p_floor > -HUGE_VAL) {
      auto end = std::partition(c.begin(), c.end(), [&](const Candidate& a) { return a.logit >= min_p_floor; });
      c.erase(end, c.end());
      double kept = 0;
      for (const Candidate& cand : c) kept += cand.weight;
      nucleus_inside = kept >= target;  // otherwise the nucleus reaches past it: min_p decides
    }
    if (nucleus_inside) keep_nucleus(target);
    total = 0;
    for (const Candidate& cand : c) total += cand.weight;
  }
  *total_out = total;
  return true;
}

void Sampler::keep_nucleus(double target) {
  // Keeps token j (in best-first order) while the mass strictly before it is < target, without
  // sorting: a quickselect on mass. Invariant: [0, lo) is kept (mass `before`), [hi, end) is
  // dropped, and [lo, hi) is undecided.
  std::vector<Candidate>& c = candidates_;
  auto better = [](const Candidate& a, const Candidate& b) {
    return a.logit != b.logit ? a.logit > b.logit : a.id < b.id;
  };
  // First drop the long tail in one pass: bucket the weights by binary exponent (weights are in
  // [0, 1], so 128 buckets hold them); once the buckets from the top hold `target`, every token in a
  // lower bucket has at least that much mass before it. Usually leaves a few hundred tokens.
  double bucket_mass[128] = {};
  auto bucket = [](float w) { return std::bit_cast<uint32_t>(w) >> 23; };  // biased exponent, <= 127
  for (const Candidate& cand : c) bucket_mass[bucket(cand.weight)] += cand.weight;
  uint32_t lowest = 0;
  double mass = 0;
  for (uint32_t b = 128; b-- > 0;) {
    mass += bucket_mass[b];
    if (mass >= target) {
      lowest = b;
      break;
    }
  }
  if (lowest > 0) {
    c.erase(std::partition(c.begin(), c.end(), [&](const Candidate& a) { return bucket(a.weight) >= lowest; }),
            c.end());
  }

  size_t lo = 0, hi = c.size();
  double before = 0;
  for (int rounds = 0; hi - lo > 32 && rounds < 64; ++rounds) {
    // Median of three (deterministic), swapped to the back of the range.
    const size_t mid_pos = lo + (hi - lo) / 2;
    Candidate* a = &c[lo];
    Candidate* b = &c[mid_pos];
    Candidate* d = &c[hi - 1];
    if (better(*b, *a)) std::swap(a, b);
    if (better(*d, *b)) std::swap(b, d);
    if (better(*b, *a)) std::swap(a, b);
    std::swap(*b, c[hi - 1]);
    const Candidate pivot = c[hi - 1];
    auto split = std::partition(c.begin() + static_cast<std::ptrdiff_t>(lo), c.begin() + static_cast<std::ptrdiff_t>(hi - 1),
                                [&](const Candidate& e) { return better(e, pivot); });
    const size_t mid = static_cast<size_t>(split - c.begin());
    double upper = 0;
    for (size_t i = lo; i < mid; ++i) upper += c[i].weight;
    if (before + upper >= target) {
      hi = mid;  // the pivot and everything worse have at least `target` before them
    } else {
      std::swap(c[mid], c[hi - 1]);  // the pivot is the best of the rest, and kept
      before += upper + pivot.weight;
      lo = mid + 1;
    }
  }
  // What is left is small (or the pivots were unlucky): sort it and walk.
  std::sort(c.begin() + static_cast<std::ptrdiff_t>(lo), c.begin() + static_cast<std::ptrdiff_t>(hi), better);
  while (lo < hi && before < target) before += c[lo++].weight;
  c.resize(lo);
}

}  // namespace pagoda
