// SpmTokenizer: SentencePiece-style BPE with byte fallback (Llama 2, Mistral, TinyLlama, ...).
//
// Each stretch of plain text has its spaces replaced by "▁" and, with a dummy prefix, one "▁"
// put in front; it is then split into characters, which are merged pairwise:
//  - scored (GGUF "llama" vocabularies, llama.cpp's algorithm): merge the adjacent pair whose
//    concatenation is a vocabulary entry with the highest score, leftmost on ties;
//  - ranked (tokenizer.json): merge by the rank of the merges list, as Hugging Face does.
// Characters left that are not in the vocabulary become their UTF-8 bytes as <0xXX> tokens
// (or <unk> when the vocabulary has no byte tokens). Decoding turns "▁" back into spaces and
// drops the one leading space of the output. Immutable after loading: thread-safe.
#pragma once

#include <array>
#include <memory>
#include <vector>

#include "tokenizer/bpe_merges.h"
#include "tokenizer/vocab_tokenizer.h"

namespace pagoda {

class SpmTokenizer final : public VocabTokenizer {
 public:
  // When a stretch of plain text gets a "▁" in front.
  enum class Prefix {
    kNever,
    kAlways,            // every stretch (llama.cpp, HF normalizer Prepend("▁"))
    kUnlessMarked,      // unless it already starts with "▁" (HF Metaspace "always")
    kFirstUnlessMarked, // only at the start of the input, and unless it starts with "▁"
  };
  struct Options {
    Prefix prefix = Prefix::kAlways;
    bool split_words = false;      // HF Metaspace(split): merges never cross a "▁" boundary
    bool byte_fallback = true;     // unknown characters -> <0xXX> tokens (else <unk>)
    bool fuse_unk = false;         // consecutive <unk> become one (ranked mode)
  };

  // Scored mode; `scores` has one entry per token. Fails (naming spec.source) on an invalid
  // spec or a scores array of the wrong length.
  static Result<std::unique_ptr<SpmTokenizer>> create_scored(VocabSpec spec,
                                                             std::vector<float> scores,
                                                             Options options);
  // Ranked mode; the caller then fills merges() (ids from find()) before sharing the tokenizer.
  static Result<std::unique_ptr<SpmTokenizer>> create_ranked(VocabSpec spec, Options options);

  // The merge table of ranked mode; only to be filled while loading.
  BpeMerges& merges() { return merges_; }

  // SentencePiece's space handling: ' ' -> "▁", and the dummy prefix as the options say.
  std::string escape_spaces(std::string_view text, bool at_start) const;

 protected:
  void encode_text(std::string_view text, bool at_start, std::vector<TokenId>& out) const override;

 private:
  SpmTokenizer(VocabSpec spec, Options options);
  void encode_scored(const std::string& text, std::vector<TokenId>& out) const;
  void encode_ranked(const std::string& text, std::vector<TokenId>& out) const;
  // Appends the byte-fallback tokens for `piece` (or <unk>), as the mode requires.
  void append_fallback(std::string_view piece, std::vector<TokenId>& out) const;

  Options options_;
  bool scored_ = false;
  std::vector<float> scores_;             // scored mode, per id
  BpeMerges merges_;                      // ranked mode
  std::array<TokenId, 256> byte_ids_{};   // id of <0xXX> per byte, -1 when missing
};

// The byte a "<0xXX>" token text stands for, or -1 when `text` is not of that form.
int parse_byte_token(std::string_view text);

}  // namespace pagoda
