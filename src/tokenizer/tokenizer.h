// Tokenizer: text <-> token ids, exactly as the model's reference tokenizer does it.
//
// Implementations: SentencePiece-style BPE with byte fallback (Llama 2, Mistral), byte-level BPE
// (GPT-2, Llama 3, Qwen2/3), and the byte tokenizer of the embedded demo model. They are built
// from a GGUF vocabulary, a Hugging Face tokenizer.json (+ tokenizer_config.json), or in code.
// Immutable after construction: encode/decode are thread-safe.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "base/types.h"

namespace pagoda {

class GgufFile;

// A byte range [begin, end) of a text.
struct TextRange {
  size_t begin = 0, end = 0;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Token ids of `text`. Added/special tokens written literally in the text (e.g. "<|im_end|>")
  // are recognized as single tokens, as Hugging Face tokenizers do. With add_special, the
  // model's BOS (and EOS, where the model's rules say so) are added.
  virtual std::vector<TokenId> encode(std::string_view text, bool add_special) const = 0;

  // As encode(text, add_special), except that a special token (is_special() true: BOS, EOS,
  // <|im_start|>, ...) whose text overlaps one of the `verbatim` ranges is not recognized there:
  // that text is tokenized as ordinary text, together with the ordinary text around it. This is
  // how text that came from a user (a chat message) is kept from producing control tokens.
  // Added tokens that are not special (Qwen3's <think>) are still matched everywhere, as Hugging
  // Face does. `verbatim` is sorted and non-overlapping; ranges past the end of `text` are
  // ignored. With no ranges the result equals encode(text, add_special).
  virtual std::vector<TokenId> encode(std::string_view text, bool add_special,
                                      std::span<const TextRange> verbatim) const = 0;

  // The texts of the special tokens that encode() recognizes when written literally in the
  // text (e.g. "<|im_start|>", "<s>"), in no particular order; none is empty.
  virtual std::vector<std::string> special_token_texts() const = 0;

  // The text of `ids`; invalid UTF-8 sequences become U+FFFD. Special tokens (BOS, EOS, ...)
  // are left out when skip_special. Ids outside the vocabulary are skipped.
  virtual std::string decode(std::span<const TokenId> ids, bool skip_special) const = 0;

  // The raw bytes token `id` stands for (for incremental detokenization); "" when out of range.
  // For SentencePiece vocabularies the leading-space marker is already turned into ' '.
  virtual std::string token_bytes(TokenId id) const = 0;
  // The vocabulary entry of `id` as written in the file (e.g. "▁the", "<0x0A>", "Ġthe").
  virtual std::string token_text(TokenId id) const = 0;

  virtual int64_t vocab_size() const = 0;
  virtual std::optional<TokenId> bos_id() const = 0;
  virtual std::optional<TokenId> eos_id() const = 0;
  // Every id that ends generation (EOS plus e.g. <|eot_id|>, <|im_end|> where the files say so).
  virtual std::vector<TokenId> stop_ids() const = 0;
  virtual bool is_special(TokenId id) const = 0;
  // True when decode() drops one leading space of its output (SentencePiece's dummy prefix:
  // "▁Hello" alone decodes to "Hello"). IncrementalDetokenizer follows the same rule.
  virtual bool decode_strips_leading_space() const { return false; }
};

// From the tokenizer.ggml.* metadata of a GGUF file (model "llama" = SentencePiece BPE,
// "gpt2" = byte-level BPE with the pre-tokenizer named by tokenizer.ggml.pre). Fails naming the
// file when the vocabulary is missing, inconsistent (array lengths, special ids out of range),
// or of an unsupported kind.
Result<std::unique_ptr<Tokenizer>> load_gguf_tokenizer(const GgufFile& gguf);

// From a Hugging Face directory's tokenizer.json and (optional) tokenizer_config.json.
Result<std::unique_ptr<Tokenizer>> load_hf_tokenizer(const std::string& dir);

// The embedded demo model's tokenizer: ids 0..255 are bytes, 256 = <s> (BOS), 257 = </s> (EOS).
// encode() adds BOS with add_special, and reads "<s>" / "</s>" in the text as those tokens.
std::unique_ptr<Tokenizer> make_byte_tokenizer();

// Incremental detokenizer: push ids one at a time, get back only complete UTF-8 text (bytes of
// a character split across tokens are held until the character is complete). The pieces of
// push() followed by flush() concatenate to decode(all ids, skip_special), including the
// leading-space rule of decode_strips_leading_space(). One per stream; not thread-safe.
class IncrementalDetokenizer {
 public:
  IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special)
      : tokenizer_(tokenizer), skip_special_(skip_special) {}
  // The ids to come continue text that is already there (a prompt): the leading-space rule does
  // not apply, as decode(prompt + output) minus decode(prompt) keeps that space. (Prompt "Once
  // upon" + "▁a▁time" gives " a time", while after BOS alone it gives "a time".)
  void continue_text() { first_ = false; }
  // The text that `id` completes (possibly empty); ill-formed bytes come out as U+FFFD as soon
  // as no later byte could make them valid.
  std::string push(TokenId id);
  std::string flush();  // whatever is held, with invalid bytes as U+FFFD

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  bool first_ = true;
  std::string pending_;
};

}  // namespace pagoda
