// Calibration for offline quantization (quantize.h, --calibration-file texts.jsonl): a model runs over calibration texts with an
// observer on every projection's input (model/layers/linear.h). What is gathered:
//  - ChannelMax: the largest |x| of each input channel (static activation scales, SmoothQuant);
//  - InputHessians: H = sum x x^T of each distinct projection input, for GPTQ (gptq.h).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "base/status.h"
#include "loader/model_source.h"
#include "model/layers/linear.h"
#include "tokenizer/tokenizer.h"
#include "tools/quantize/gptq.h"
#include "tools/quantize/quantize.h"

namespace pagoda {

// The calibration texts: one JSON value per line, an object with "text" (or "prompt") or a
// string; at most `limit` of them.
Result<std::vector<std::string>> read_calibration(const std::string& path, int64_t limit);

// The calibration texts of options.calibration_file, tokenized (options.tokenizer, default the
// input's), and
// a CPU backend to run models over them.
class Calibration {
 public:
  static Result<Calibration> open(const QuantizeOptions& options);

  // Builds the model of `source` and runs it over every text (each from position 0, at most
  // options.max_seq_len tokens and the model's context), through the LM head at every position, with
  // `observer` installed. Returns the number of tokens run.
  Result<int64_t> run(const ModelSource& source, LinearInputObserver* observer) const;

  int64_t num_texts() const { return static_cast<int64_t>(ids_.size()); }

 private:
  std::vector<std::vector<TokenId>> ids_;
  int64_t max_seq_len_ = 0;
  std::unique_ptr<Backend> backend_;
};

// Per projection (by canonical weight name): the largest |x| seen in each input channel.
class ChannelMax final : public LinearInputObserver {
 public:
  void observe(const std::string& name, const float* x, int64_t m, int64_t k) override;
  std::map<std::string, std::vector<float>>& max() { return max_; }

 private:
  std::map<std::string, std::vector<float>> max_;
};

// One Hessian per distinct input: attn_k and attn_v read attn_q's input, ffn_up ffn_gate's, so
// they share its H (kept under attn_q's / ffn_gate's name). The LM head's is "output.weight"'s.
class InputHessians final : public LinearInputObserver {
 public:
  // Only weights whose names start with `prefix` ("blk.3.", "output.weight"; "" for all).
  explicit InputHessians(std::string prefix = "") : prefix_(std::move(prefix)) {}
  void observe(const std::string& name, const float* x, int64_t m, int64_t k) override;
  // The Hessian of the input `weight_name` multiplies (nullptr if calibration never saw it).
  const GptqHessian* find(const std::string& weight_name) const;
  // The name whose Hessian `weight_name` shares: itself, or attn_q / ffn_gate.
  static std::string input_key(const std::string& weight_name);

 private:
  std::string prefix_;
  std::map<std::string, std::unique_ptr<GptqHessian>> h_;
};

// GPTQ's factors (gptq.h, damping 1% of the mean diagonal, as GPTQ's reference uses), each
// computed once per input and kept while weights of the same layer ask for it: a weight of
// another layer ("blk.N.") drops them (a 5632-wide factor takes 254 MB).
class GptqFactors {
 public:
  // act_order: sweeps in gptq_act_order's column order, else in the stored one.
  GptqFactors(ThreadPool* pool, bool act_order) : pool_(pool), act_order_(act_order) {}
  // The column order a sweep of `weight_name` in groups of group_len takes (empty: the stored
  // one), and its factor.
  struct Factor {
    std::vector<int64_t> order;
    std::vector<double> u;
  };
  // Of the input `weight_name` multiplies; an error if calibration never saw it.
  Result<const Factor*> get(const InputHessians& hessians, const std::string& weight_name, int64_t group_len);

 private:
  ThreadPool* pool_;
  bool act_order_;
  std::string layer_;
  std::map<std::pair<std::string, int64_t>, Factor> factors_;  // by input and group length
};

}  // namespace pagoda
