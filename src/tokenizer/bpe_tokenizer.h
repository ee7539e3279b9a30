// BpeTokenizer: byte-level BPE (GPT-2, Llama 3, Qwen2/3, ...).
//
// Each stretch of plain text is cut into pre-tokens by the model's regexes (Hugging Face's
// Split "Isolated", applied in order), each pre-token's bytes are mapped to GPT-2's printable
// code points (one symbol per byte), and symbols are merged by merge rank. With ignore_merges
// (Llama 3) a pre-token that is itself a vocabulary entry is emitted directly. Decoding maps
// the code points back to bytes; added tokens decode to their literal text. Immutable after
// loading: thread-safe.
#pragma once

#include <array>
#include <memory>
#include <vector>

#include "tokenizer/bpe_merges.h"
#include "tokenizer/regex.h"
#include "tokenizer/vocab_tokenizer.h"

namespace pagoda {

class BpeTokenizer final : public VocabTokenizer {
 public:
  struct Options {
    std::vector<Regex> splits;      // pre-tokenizer regexes, applied one after the other
    bool add_prefix_space = false;  // ByteLevel(add_prefix_space): " " before unspaced text
    bool ignore_merges = false;     // a pre-token found in the vocabulary is one token
    bool nfc = false;               // NFC normalizer (Qwen): compose text before splitting
  };

  // Fails (naming spec.source) on an invalid spec. The caller then fills merges() (ids from
  // find()) before sharing the tokenizer.
  static Result<std::unique_ptr<BpeTokenizer>> create(VocabSpec spec, Options options);

  // The merge table; only to be filled while loading.
  BpeMerges& merges() { return merges_; }
  const BpeMerges& merges() const { return merges_; }

  // The pre-tokens of a stretch of plain text (for tests and debugging).
  std::vector<std::string_view> pre_tokenize(std::string_view text, std::string& storage) const;

  // A byte string in GPT-2's byte-to-code-point form, e.g. " the" -> "Ġthe".
  static std::string bytes_to_token_text(std::string_view bytes);
  // The inverse; false when `text` has a code point outside the table.
  static bool token_text_to_bytes(std::string_view text, std::string& bytes);

 protected:
  void encode_text(std::string_view text, bool at_start, std::vector<TokenId>& out) const override;

 private:
  BpeTokenizer(VocabSpec spec, Options options);
  void encode_word(std::string_view word, std::vector<TokenId>& out) const;

  Options options_;
  BpeMerges merges_;
  std::array<TokenId, 256> byte_ids_{};  // the one-symbol token of each byte, -1 when missing
};

// The pre-tokenizer regexes llama.cpp uses for a GGUF tokenizer.ggml.pre value, or an empty
// list when the name is unknown.
std::vector<std::string> pre_tokenizer_patterns(std::string_view pre);

// GPT-2's pre-tokenizer regex (also Hugging Face ByteLevel's use_regex).
extern const char* const kGpt2Pattern;

}  // namespace pagoda
