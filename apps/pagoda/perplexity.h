// The arithmetic of `pagoda perplexity` (llama.cpp's llama-perplexity, by the same definitions):
// scoring each predicted token from its logits, the KL divergence of those predictions from a
// saved base run, and the file that base run is saved in. Plain values; not thread-safe.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/types.h"

namespace pagoda::app {

// log-softmax of logits[0, vocab) in double, written as f32 into out.
void log_softmax(std::span<const float> logits, std::span<float> out);

// Running statistics over the scored positions of a run.
class PerplexityStats {
 public:
  // One position: log-probabilities over the vocabulary (log_softmax of its logits) and the
  // token that came next. With `base` (the same position's log-probabilities in the base run):
  // also KL(base || this), whether both put the same token first, and the base's NLL.
  void add(std::span<const float> logprobs, TokenId next, std::span<const float> base = {});

  int64_t count() const { return static_cast<int64_t>(nll_.size()); }
  double mean_nll() const;
  double ppl() const;         // exp(mean NLL)
  double ppl_stderr() const;  // ppl * the standard error of the mean NLL (as llama.cpp prints it)
  bool has_base() const { return !kld_.empty(); }
  double base_ppl() const;
  // ln(ppl / base ppl), the mean over positions of NLL - base NLL, and that mean's standard error:
  // both runs score the same tokens, so the ratio is known far better than either perplexity.
  double ln_ppl_ratio() const;
  double ln_ppl_ratio_stderr() const;
  double mean_kld() const;
  double kld_stderr() const;
  double kld_quantile(double q) const;  // q in [0, 1]: 0.5 median, 0.99 the 99th percentile
  double max_kld() const;
  double top1_agreement() const;  // fraction of positions whose most likely token agrees

 private:
  std::vector<double> nll_, base_nll_, kld_;
  int64_t same_top_ = 0;
};

// The file --save-logits writes and --kl-base reads: a header (magic, version, vocab, ctx,
// chunks, positions scored per chunk), every chunk's token ids (int32), then each scored
// position's log-probabilities (f32, vocab of them), chunk by chunk. The base run and the run
// compared with it must score the same tokens with the same vocabulary and context.
struct LogitsFileHeader {
  int64_t vocab = 0;
  int64_t ctx = 0;
  int64_t chunks = 0;
  int64_t scored_per_chunk = 0;
};

class LogitsWriter {
 public:
  // Creates `path` and writes the header and the tokens ([chunks * ctx]).
  static Result<std::unique_ptr<LogitsWriter>> create(const std::string& path, const LogitsFileHeader& header,
                                                      std::span<const TokenId> tokens);
  ~LogitsWriter();
  Status write(std::span<const float> logprobs);  // one position
  Status close();

 private:
  LogitsWriter(std::FILE* f, std::string path) : f_(f), path_(std::move(path)) {}
  std::FILE* f_;
  std::string path_;
};

class LogitsReader {
 public:
  // Opens `path` and checks it is a logits file whose header and tokens equal `want` and
  // `tokens`; fails naming the file and what differs.
  static Result<std::unique_ptr<LogitsReader>> open(const std::string& path, const LogitsFileHeader& want,
                                                    std::span<const TokenId> tokens);
  ~LogitsReader();
  // The next position's log-probabilities into out (vocab floats).
  Status read(std::span<float> out);

 private:
  LogitsReader(std::FILE* f, std::string path) : f_(f), path_(std::move(path)) {}
  std::FILE* f_;
  std::string path_;
};

}  // namespace pagoda::app
