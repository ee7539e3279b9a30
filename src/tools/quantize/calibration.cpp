#include "tools/quantize/calibration.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "launch/model_loading.h"
#include "model/kv_cache.h"
#include "model/model.h"

namespace pagoda {

using nlohmann::json;

constexpr double kGptqDamp = 0.01;

Result<std::vector<std::string>> read_calibration(const std::string& path, int64_t limit) {
  std::ifstream in(path);
  if (!in) return not_found(path + ": cannot open the calibration file");
  std::vector<std::string> texts;
  std::string line;
  for (int64_t n = 1; std::getline(in, line) && static_cast<int64_t>(texts.size()) < limit; ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    const std::string where = path + ":" + std::to_string(n);
    if (j.is_discarded()) return invalid_argument(where + ": not JSON");
    if (j.is_string()) {
      texts.push_back(j.get<std::string>());
    } else if (j.is_object() && j.contains("text") && j["text"].is_string()) {
      texts.push_back(j["text"].get<std::string>());
    } else if (j.is_object() && j.contains("prompt") && j["prompt"].is_string()) {
      texts.push_back(j["prompt"].get<std::string>());
    } else {
      return invalid_argument(where + ": expected a string or an object with a \"text\" string");
    }
  }
  if (texts.empty()) return invalid_argument(path + ": no calibration texts");
  return texts;
}

Result<Calibration> Calibration::open(const QuantizeOptions& f) {
  PAGODA_ASSIGN_OR_RETURN(std::vector<std::string> texts, read_calibration(f.calibration_file, f.num_calibration_samples));
  app::ModelFlags mf;
  mf.model = f.input;
  mf.tokenizer = f.tokenizer;
  PAGODA_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, app::load_tokenizer(mf));
  Calibration c;
  for (const std::string& text : texts) {
    std::vector<TokenId> ids = tokenizer->encode(text, /*add_special=*/true);
    if (static_cast<int64_t>(ids.size()) > f.max_seq_len) ids.resize(static_cast<size_t>(f.max_seq_len));
    if (!ids.empty()) c.ids_.push_back(std::move(ids));
  }
  if (c.ids_.empty()) return invalid_argument(f.calibration_file + ": every calibration text is empty");
  c.max_seq_len_ = f.max_seq_len;
  PAGODA_ASSIGN_OR_RETURN(c.backend_, create_backend("cpu"));
  return c;
}

Result<int64_t> Calibration::run(const ModelSource& source, LinearInputObserver* observer) const {
  PAGODA_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, create_model(source, *backend_));
  const ModelConfig& config = model->config();
  const int64_t max_len = std::min(max_seq_len_, config.max_position_embeddings);
  constexpr int64_t kBlockSize = 16;
  const int64_t num_blocks = (max_len + kBlockSize - 1) / kBlockSize;
  PAGODA_ASSIGN_OR_RETURN(KvCacheTensors kv, KvCacheTensors::allocate(model->kernels(), config, num_blocks, kBlockSize, KvCacheDtype::kF32));
  std::vector<BlockId> table(static_cast<size_t>(num_blocks));
  for (int64_t b = 0; b < num_blocks; ++b) table[static_cast<size_t>(b)] = static_cast<BlockId>(b);
  for (size_t t = 0; t < ids_.size(); ++t) {  // a --tokenizer larger than the model's vocabulary
    for (TokenId id : ids_[t]) {
      if (id < 0 || id >= config.vocab_size) {
        return invalid_argument("calibration text " + std::to_string(t + 1) + " has token id " + std::to_string(id) +
                                ", outside the model's vocabulary of " + std::to_string(config.vocab_size));
      }
    }
  }
  int64_t tokens = 0;
  std::vector<float> logits;
  const ScopedLinearInputObserver scope(observer);
  for (const std::vector<TokenId>& all : ids_) {
    const std::span<const TokenId> ids(all.data(), static_cast<size_t>(std::min<int64_t>(max_len, std::ssize(all))));
    const auto n = static_cast<int64_t>(ids.size());
    std::vector<int32_t> positions(static_cast<size_t>(n));
    std::vector<int64_t> slots(static_cast<size_t>(n)), rows(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      positions[static_cast<size_t>(i)] = static_cast<int32_t>(i);
      slots[static_cast<size_t>(i)] = i;
      rows[static_cast<size_t>(i)] = i;
    }
    const AttentionSeq seq{0, n, n, table.data()};
    const ForwardBatch batch{ids, positions, slots, {&seq, 1}};
    const Tensor hidden = model->forward(batch, kv);
    logits.resize(static_cast<size_t>(n * config.vocab_size));
    model->compute_logits(hidden, rows.data(), n, logits.data());
    tokens += n;
  }
  return tokens;
}

void ChannelMax::observe(const std::string& name, const float* x, int64_t m, int64_t k) {
  if (name.empty() || name == "output.weight") return;
  std::vector<float>& mx = max_[name];
  mx.resize(static_cast<size_t>(k), 0.0f);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t t = 0; t < k; ++t) mx[static_cast<size_t>(t)] = std::max(mx[static_cast<size_t>(t)], std::fabs(x[i * k + t]));
  }
}

std::string InputHessians::input_key(const std::string& weight_name) {
  for (const auto& [from, to] : {std::pair{".attn_k.weight", ".attn_q.weight"}, std::pair{".attn_v.weight", ".attn_q.weight"},
                                 std::pair{".ffn_up.weight", ".ffn_gate.weight"}}) {
    if (weight_name.ends_with(from)) return weight_name.substr(0, weight_name.size() - std::string(from).size()) + to;
  }
  return weight_name;
}

void InputHessians::observe(const std::string& name, const float* x, int64_t m, int64_t k) {
  // k / v / up: the same input as q / gate.
  if (name.empty() || !name.starts_with(prefix_) || input_key(name) != name) return;
  std::unique_ptr<GptqHessian>& h = h_[name];
  if (h == nullptr) h = std::make_unique<GptqHessian>(k);
  h->add(x, m);
}

const GptqHessian* InputHessians::find(const std::string& weight_name) const {
  auto it = h_.find(input_key(weight_name));
  return it == h_.end() ? nullptr : it->second.get();
}

Result<const GptqFactors::Factor*> GptqFactors::get(const InputHessians& hessians, const std::string& weight_name,
                                                    int64_t group_len) {
  const GptqHessian* h = hessians.find(weight_name);
  if (h == nullptr) return invalid_argument("calibration saw no input of " + weight_name);
  const size_t dot = weight_name.starts_with("blk.") ? weight_name.find('.', 4) : std::string::npos;
  const std::string layer = dot == std::string::npos ? weight_name : weight_name.substr(0, dot);
  if (layer != layer_) {
    factors_.clear();
    layer_ = layer;
  }
  // In stored order every group length shares one factor.
  const std::pair<std::string, int64_t> key{InputHessians::input_key(weight_name), act_order_ ? group_len : 0};
  auto it = factors_.find(key);
  if (it == factors_.end()) {
    Factor factor{act_order_ ? gptq_act_order(*h, group_len) : std::vector<int64_t>{}, {}};
    auto u = gptq_inverse_factor(*h, kGptqDamp, pool_, factor.order);
    if (!u.ok()) return Status(u.status().code(), key.first + ": " + u.status().message());
    factor.u = std::move(*u);
    it = factors_.emplace(key, std::move(factor)).first;
  }
  return &it->second;
}

}  // namespace pagoda
