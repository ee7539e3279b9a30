#include "structured/grammar_compiler.h"

namespace pagoda::structured {

std::unique_ptr<GrammarCompiler> GrammarCompiler::for_model(std::shared_ptr<const Tokenizer> tokenizer,
                                                            int64_t vocab_size) {
  return std::make_unique<GrammarCompiler>(std::function<std::shared_ptr<const TokenVocabulary>()>(
      [tokenizer = std::move(tokenizer), vocab_size] { return TokenVocabulary::of(*tokenizer, vocab_size); }));
}

const std::shared_ptr<const TokenVocabulary>& GrammarCompiler::vocabulary() {
  std::call_once(vocabulary_made_, [this] {
    if (!vocabulary_) vocabulary_ = make_vocabulary_();
  });
  return vocabulary_;
}

Result<std::shared_ptr<const TokenGrammar>> GrammarCompiler::get(const std::string& key,
                                                                 const std::function<Result<Grammar>()>& make) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = by_key_.find(key); it != by_key_.end()) {
      recent_.splice(recent_.begin(), recent_, it->second);
      ++hits_;
      return it->second->second;
    }
  }
  Result<Grammar> grammar = make();
  if (!grammar.ok()) return grammar.status();
  auto compiled = TokenGrammar::compile(std::make_shared<const CompiledGrammar>(std::move(*grammar)), vocabulary(),
                                        max_work_);
  if (!compiled.ok()) return compiled.status();
  std::lock_guard<std::mutex> lock(mu_);
  ++compiled_;
  if (auto it = by_key_.find(key); it != by_key_.end()) return it->second->second;  // another thread's
  recent_.emplace_front(key, *compiled);
  by_key_[key] = recent_.begin();
  while (recent_.size() > capacity_) {
    by_key_.erase(recent_.back().first);
    recent_.pop_back();
  }
  return *compiled;
}

int64_t GrammarCompiler::num_compiled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return compiled_;
}

int64_t GrammarCompiler::num_hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hits_;
}

}  // namespace pagoda::structured
