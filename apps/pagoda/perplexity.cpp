#include "apps/pagoda/perplexity.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>

#include "base/check.h"

namespace pagoda::app {
namespace {

constexpr char kMagic[8] = {'P', 'G', 'L', 'O', 'G', 'P', 'R', 'B'};
constexpr uint32_t kVersion = 1;

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

// The standard error of the mean of v.
double stderr_of_mean(const std::vector<double>& v) {
  if (v.size() < 2) return 0;
  const double m = mean(v);
  double sq = 0;
  for (double x : v) sq += (x - m) * (x - m);
  const double n = static_cast<double>(v.size());
  return std::sqrt(sq / (n - 1) / n);
}

// a[i] - b[i], element by element.
std::vector<double> differences(const std::vector<double>& a, const std::vector<double>& b) {
  PAGODA_CHECK(a.size() == b.size());
  std::vector<double> d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

size_t argmax(std::span<const float> v) {
  return static_cast<size_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

struct FileHeader {
  char magic[8];
  uint32_t version;
  uint32_t reserved;
  int64_t vocab, ctx, chunks, scored_per_chunk;
};
static_assert(sizeof(FileHeader) == 48);

}  // namespace

void log_softmax(std::span<const float> logits, std::span<float> out) {
  PAGODA_CHECK(out.size() == logits.size() && !logits.empty());
  const double max = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - max);
  const double lse = max + std::log(sum);
  for (size_t i = 0; i < logits.size(); ++i) out[i] = static_cast<float>(static_cast<double>(logits[i]) - lse);
}

void PerplexityStats::add(std::span<const float> logprobs, TokenId next, std::span<const float> base) {
  PAGODA_CHECK(next >= 0 && static_cast<size_t>(next) < logprobs.size());
  nll_.push_back(-static_cast<double>(logprobs[static_cast<size_t>(next)]));
  if (base.empty()) return;
  PAGODA_CHECK(base.size() == logprobs.size());
  base_nll_.push_back(-static_cast<double>(base[static_cast<size_t>(next)]));
  double kld = 0;
  for (size_t i = 0; i < base.size(); ++i) {
    const double lb = base[i];
    if (lb == -std::numeric_limits<double>::infinity()) continue;  // p = 0 adds nothing
    kld += std::exp(lb) * (lb - static_cast<double>(logprobs[i]));
  }
  kld_.push_back(std::max(kld, 0.0));  // >= 0 in exact arithmetic; rounding may dip below
  if (argmax(base) == argmax(logprobs)) ++same_top_;
}

double PerplexityStats::mean_nll() const { return mean(nll_); }
double PerplexityStats::ppl() const { return std::exp(mean_nll()); }
double PerplexityStats::ppl_stderr() const { return ppl() * stderr_of_mean(nll_); }
double PerplexityStats::base_ppl() const { return std::exp(mean(base_nll_)); }
double PerplexityStats::mean_kld() const { return mean(kld_); }

double PerplexityStats::ln_ppl_ratio() const { return mean(differences(nll_, base_nll_)); }
double PerplexityStats::ln_ppl_ratio_stderr() const { return stderr_of_mean(differences(nll_, base_nll_)); }
double PerplexityStats::kld_stderr() const { return stderr_of_mean(kld_); }
double PerplexityStats::max_kld() const { return kld_.empty() ? 0 : *std::max_element(kld_.begin(), kld_.end()); }

double PerplexityStats::kld_quantile(double q) const {
  if (kld_.empty()) return 0;
  std::vector<double> sorted = kld_;
  std::sort(sorted.begin(), sorted.end());
  // Linear interpolation between the closest ranks.
  const double pos = std::clamp(q, 0.0, 1.0) * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (pos - static_cast<double>(lo)) * (sorted[hi] - sorted[lo]);
}

double PerplexityStats::top1_agreement() const {
  return kld_.empty() ? 0 : static_cast<double>(same_top_) / static_cast<double>(kld_.size());
}

Result<std::unique_ptr<LogitsWriter>> LogitsWriter::create(const std::string& path, const LogitsFileHeader& h,
                                                           std::span<const TokenId> tokens) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return io_error(path + ": cannot create: " + std::strerror(errno));
  std::unique_ptr<LogitsWriter> w(new LogitsWriter(f, path));
  FileHeader fh{};
  std::memcpy(fh.magic, kMagic, sizeof kMagic);
  fh.version = kVersion;
  fh.vocab = h.vocab;
  fh.ctx = h.ctx;
  fh.chunks = h.chunks;
  fh.scored_per_chunk = h.scored_per_chunk;
  std::vector<int32_t> ids(tokens.begin(), tokens.end());
  if (std::fwrite(&fh, sizeof fh, 1, f) != 1 ||
      std::fwrite(ids.data(), sizeof(int32_t), ids.size(), f) != ids.size()) {
    return io_error(path + ": write failed: " + std::strerror(errno));
  }
  return w;
}

LogitsWriter::~LogitsWriter() {
  if (f_ != nullptr) std::fclose(f_);
}

Status LogitsWriter::write(std::span<const float> logprobs) {
  if (std::fwrite(logprobs.data(), sizeof(float), logprobs.size(), f_) != logprobs.size()) {
    return io_error(path_ + ": write failed: " + std::strerror(errno));
  }
  return Status::ok_status();
}

Status LogitsWriter::close() {
  const int rc = std::fclose(f_);
  f_ = nullptr;
  if (rc != 0) return io_error(path_ + ": write failed: " + std::strerror(errno));
  return Status::ok_status();
}

Result<std::unique_ptr<LogitsReader>> LogitsReader::open(const std::string& path, const LogitsFileHeader& want,
                                                         std::span<const TokenId> tokens) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return not_found(path + ": cannot open: " + std::strerror(errno));
  std::unique_ptr<LogitsReader> r(new LogitsReader(f, path));
  FileHeader fh{};
  if (std::fread(&fh, sizeof fh, 1, f) != 1 || std::memcmp(fh.magic, kMagic, sizeof kMagic) != 0) {
    return data_loss(path + ": not a logits file written by pagoda perplexity --save-logits");
  }
  if (fh.version != kVersion) {
    return data_loss(path + ": logits file version " + std::to_string(fh.version) + ", expected " +
                     std::to_string(kVersion));
  }
  auto differs = [&](const char* what, int64_t got, int64_t expected) {
    return invalid_argument(path + ": the base run has " + what + " " + std::to_string(got) + ", this run " +
                            std::to_string(expected) + " (same model vocabulary, text, --ctx and --chunks needed)");
  };
  if (fh.vocab != want.vocab) return differs("vocabulary size", fh.vocab, want.vocab);
  if (fh.ctx != want.ctx) return differs("--ctx", fh.ctx, want.ctx);
  if (fh.chunks != want.chunks) return differs("chunk count", fh.chunks, want.chunks);
  if (fh.scored_per_chunk != want.scored_per_chunk) {
    return differs("scored positions per chunk", fh.scored_per_chunk, want.scored_per_chunk);
  }
  std::vector<int32_t> ids(tokens.size());
  if (std::fread(ids.data(), sizeof(int32_t), ids.size(), f) != ids.size()) {
    return data_loss(path + ": truncated (in its token ids)");
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] != tokens[i]) {
      return invalid_argument(path + ": the base run scored other tokens (the first difference at token " +
                              std::to_string(i) + "): same text and tokenizer needed");
    }
  }
  return r;
}

LogitsReader::~LogitsReader() {
  if (f_ != nullptr) std::fclose(f_);
}

Status LogitsReader::read(std::span<float> out) {
  if (std::fread(out.data(), sizeof(float), out.size(), f_) != out.size()) {
    return data_loss(path_ + ": truncated (in its log-probabilities)");
  }
  return Status::ok_status();
}

}  // namespace pagoda::app
