// GrammarCompiler: structured-output constraints compiled against one model's vocabulary, each
// distinct constraint once. It keeps the last `capacity` TokenGrammars by key, so that the
// requests of an application that sends the same schema every time compile it on the first only.
//
// Compiling runs in the caller's thread (a server's request thread, not the engine's loop), and
// two threads asking for the same new key both compile it (the first to finish is kept). The
// vocabulary may be made on first use (a server that never sees a constraint never pays for its
// trie). Thread-safe.
#pragma once

#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "base/status.h"
#include "structured/grammar.h"
#include "structured/token_grammar.h"
#include "structured/token_vocabulary.h"

namespace pagoda::structured {

class GrammarCompiler {
 public:
  explicit GrammarCompiler(std::shared_ptr<const TokenVocabulary> vocabulary, size_t capacity = 64,
                           int64_t max_work = TokenGrammar::kDefaultMaxWork)
      : vocabulary_(std::move(vocabulary)), capacity_(capacity), max_work_(max_work) {}
  explicit GrammarCompiler(std::function<std::shared_ptr<const TokenVocabulary>()> make_vocabulary,
                           size_t capacity = 64, int64_t max_work = TokenGrammar::kDefaultMaxWork)
      : make_vocabulary_(std::move(make_vocabulary)), capacity_(capacity), max_work_(max_work) {}

  // The constraint named `key` (one key, one constraint: the caller makes it from everything that
  // shapes the grammar), its Grammar made by `make` when it is not kept. Fails with make's error or
  // TokenGrammar::compile's.
  Result<std::shared_ptr<const TokenGrammar>> get(const std::string& key, const std::function<Result<Grammar>()>& make);

  // For a model's tokenizer and vocabulary (the logits' length), the vocabulary made on first use.
  static std::unique_ptr<GrammarCompiler> for_model(std::shared_ptr<const Tokenizer> tokenizer, int64_t vocab_size);

  const std::shared_ptr<const TokenVocabulary>& vocabulary();
  // Compiles done and kept grammars found, for tests and metrics.
  int64_t num_compiled() const;
  int64_t num_hits() const;

 private:
  using Entry = std::pair<std::string, std::shared_ptr<const TokenGrammar>>;
  std::shared_ptr<const TokenVocabulary> vocabulary_;  // set once (vocabulary_made_)
  std::function<std::shared_ptr<const TokenVocabulary>()> make_vocabulary_;
  std::once_flag vocabulary_made_;
  size_t capacity_;
  int64_t max_work_;
  mutable std::mutex mu_;
  std::list<Entry> recent_;  // most recent first; guarded by mu_
  std::unordered_map<std::string, std::list<Entry>::iterator> by_key_;  // guarded by mu_
  int64_t compiled_ = 0, hits_ = 0;                                      // guarded by mu_
};

}  // namespace pagoda::structured
