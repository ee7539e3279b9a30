#include "sample/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace pagoda {

Status SamplingParams::validate() const {
  if (!(temperature >= 0) || !std::isfinite(temperature)) {
    return invalid_argument("temperature must be a finite number >= 0");
  }
  if (!(top_p > 0 && top_p <= 1)) return invalid_argument("top_p must be in (0, 1]");
  if (top_k < -1) return invalid_argument("top_k must be -1, 0 (no limit) or positive");
  if (!(min_p >= 0 && min_p <= 1)) return invalid_argument("min_p must be in [0, 1]");
  return Status::ok_status();
}

TokenId sample_token(const float* logits, int64_t vocab_size, const SamplingParams& p,
                     SamplerRng& rng) {
  if (p.temperature == 0) {
    return static_cast<TokenId>(std::max_element(logits, logits + vocab_size) - logits);
  }
  // Candidates sorted by logit, highest first (ties: lower id first, for determinism).
  std::vector<TokenId> ids(static_cast<size_t>(vocab_size));
  std::iota(ids.begin(), ids.end(), 0);
  auto by_logit = [&](TokenId a, TokenId b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  };
  size_t keep = ids.size();
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < keep) {
    keep = static_cast<size_t>(p.top_k);
    std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(keep), ids.end(), by_logit);
  } else {
    std::sort(ids.begin(), ids.end(), by_logit);
  }
  std::vector<double> probs(keep);
  const double max_logit = logits[ids[0]];
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) {
    probs[i] = std::exp((logits[ids[i]] - max_logit) / p.temperature);
    sum += probs[i];
  }
  // Nucleus: the smallest prefix whose mass reaches top_p (always at least one token).
  size_t cut = keep;
  if (p.top_p < 1) {
    double mass = 0;
    for (size_t i = 0; i < keep; ++i) {
      mass += probs[i] / sum;
      if (mass >= p.top_p) {
        cut = i + 1;
        break;
      }
    }
  }
  if (p.min_p > 0) {  // drop tokens less likely than min_p times the most likely one
    size_t i = 1;
    while (i < cut && probs[i] >= p.min_p * probs[0]) ++i;
    cut = i;
  }
  std::discrete_distribution<size_t> pick(probs.begin(), probs.begin() + static_cast<std::ptrdiff_t>(cut));
  return ids[pick(rng)];
}

}  // namespace pagoda
