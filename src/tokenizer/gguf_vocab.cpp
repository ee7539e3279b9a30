// load_gguf_tokenizer: the tokenizer.ggml.* metadata of a GGUF file turned into an
// SpmTokenizer ("llama") or a BpeTokenizer ("gpt2"), following llama.cpp's reading of the keys
// and its defaults.
#include <algorithm>

#include "loader/gguf_file.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/spm_tokenizer.h"
#include "tokenizer/unicode.h"

namespace pagoda {
namespace {

constexpr std::string_view kPrefix = "tokenizer.ggml.";

std::string key(std::string_view name) { return std::string(kPrefix) + std::string(name); }

class GgufVocabLoader {
 public:
  explicit GgufVocabLoader(const GgufFile& gguf) : gguf_(gguf), path_(gguf.path()) {}

  Result<std::unique_ptr<Tokenizer>> load() {
    PAGODA_ASSIGN_OR_RETURN(const std::string model, gguf_.get_string(key("model")));
    if (model != "llama" && model != "gpt2") {
      return unimplemented(path_ + ": tokenizer model \"" + model + "\" is not supported");
    }
    PAGODA_RETURN_IF_ERROR(read_tokens());
    const bool spm = model == "llama";
    std::string pre = "default";
    if (gguf_.find(key("pre"))) {
      PAGODA_ASSIGN_OR_RETURN(pre, gguf_.get_string(key("pre")));
    }

    // llama.cpp's defaults where a key is absent: Llama's <unk>=0, <s>=1, </s>=2 and BOS
    // added; for byte-level BPE no BOS unless the file or the pre-tokenizer (Llama 3) says so.
    const bool llama3 = pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3";
    PAGODA_ASSIGN_OR_RETURN(spec_.bos, optional_id("bos_token_id", spm ? 1 : -1));
    PAGODA_ASSIGN_OR_RETURN(spec_.eos, optional_id("eos_token_id", spm ? 2 : -1));
    PAGODA_ASSIGN_OR_RETURN(spec_.unk, optional_id("unknown_token_id", spm ? 0 : -1));
    PAGODA_ASSIGN_OR_RETURN(bool add_bos, optional_bool("add_bos_token", spm || llama3));
    PAGODA_ASSIGN_OR_RETURN(bool add_eos, optional_bool("add_eos_token", false));
    if (add_bos && spec_.bos) spec_.prefix.push_back(*spec_.bos);
    if (add_eos && spec_.eos) spec_.suffix.push_back(*spec_.eos);
    if (spec_.eos) spec_.stop_ids.push_back(*spec_.eos);
    for (const char* name : {"eot_token_id", "eom_token_id"}) {
      PAGODA_ASSIGN_OR_RETURN(std::optional<TokenId> id, optional_id(name, -1));
      if (id && std::find(spec_.stop_ids.begin(), spec_.stop_ids.end(), *id) == spec_.stop_ids.end()) {
        spec_.stop_ids.push_back(*id);
      }
    }
    add_known_stop_tokens(spec_, spec_.stop_ids);
    return spm ? load_spm() : load_bpe(pre, llama3);
  }

 private:
  Status fail(const std::string& what) const { return data_loss(path_ + ": " + what); }

  Status read_tokens() {
    PAGODA_ASSIGN_OR_RETURN(std::vector<std::string_view> tokens, gguf_.get_string_array(key("tokens")));
    const size_t n = tokens.size();
    if (n == 0) return fail(key("tokens") + " is empty");
    spec_.source = path_;
    spec_.texts.assign(tokens.begin(), tokens.end());
    spec_.kinds.assign(n, TokenKind::kNormal);
    if (gguf_.find(key("token_type"))) {
      PAGODA_ASSIGN_OR_RETURN(std::vector<int64_t> types, gguf_.get_int_array(key("token_type")));
      if (types.size() != n) {
        return fail(key("token_type") + " has " + std::to_string(types.size()) + " entries for " +
                    std::to_string(n) + " tokens");
      }
      for (size_t id = 0; id < n; ++id) {
        const int64_t t = types[id];
        if (t < 0 || t > static_cast<int64_t>(TokenKind::kByte)) {
          return fail("token " + std::to_string(id) + " has invalid token_type " + std::to_string(t));
        }
        // 0 is llama.cpp's "undefined", read as normal.
        spec_.kinds[id] = t == 0 ? TokenKind::kNormal : static_cast<TokenKind>(t);
      }
    }
    // llama.cpp with parse_special: control, user-defined and unknown tokens written in the
    // text are those tokens.
    for (size_t id = 0; id < n; ++id) {
      const TokenKind k = spec_.kinds[id];
      if (k == TokenKind::kControl || k == TokenKind::kUserDefined || k == TokenKind::kUnknown) {
        spec_.literals.push_back(static_cast<TokenId>(id));
      }
    }
    return {};
  }

  // The id under `name`, or `fallback` (none when < 0 or outside the vocabulary) when absent.
  Result<std::optional<TokenId>> optional_id(const char* name, int64_t fallback) const {
    const std::string k = key(name);
    const int64_t n = static_cast<int64_t>(spec_.texts.size());
    if (!gguf_.find(k)) {
      if (fallback < 0 || fallback >= n) return std::optional<TokenId>();
      return std::optional<TokenId>(static_cast<TokenId>(fallback));
    }
    PAGODA_ASSIGN_OR_RETURN(int64_t id, gguf_.get_int(k));
    // Some converters write -1 (or the maximal uint32) for "none".
    if (id == -1 || id == 0xFFFFFFFFll) return std::optional<TokenId>();
    if (id < 0 || id >= n) {
      return fail(k + " = " + std::to_string(id) + " is outside the vocabulary of " +
                  std::to_string(n) + " tokens");
    }
    return std::optional<TokenId>(static_cast<TokenId>(id));
  }

  Result<bool> optional_bool(const char* name, bool fallback) const {
    const std::string k = key(name);
    if (!gguf_.find(k)) return fallback;
    return gguf_.get_bool(k);
  }

  Result<std::unique_ptr<Tokenizer>> load_spm() {
    const size_t n = spec_.texts.size();
    std::vector<float> scores(n, 0.0f);
    if (gguf_.find(key("scores"))) {
      PAGODA_ASSIGN_OR_RETURN(scores, gguf_.get_float_array(key("scores")));
      if (scores.size() != n) {
        return fail(key("scores") + " has " + std::to_string(scores.size()) + " entries for " +
                    std::to_string(n) + " tokens");
      }
    }
    SpmTokenizer::Options options;
    PAGODA_ASSIGN_OR_RETURN(bool space_prefix, optional_bool("add_space_prefix", true));
    options.prefix = space_prefix ? SpmTokenizer::Prefix::kAlways : SpmTokenizer::Prefix::kNever;
    options.byte_fallback = true;
    spec_.strip_leading_space = space_prefix;
    spec_.bytes.resize(n);
    for (size_t id = 0; id < n; ++id) {
      const std::string& text = spec_.texts[id];
      const int byte = spec_.kinds[id] == TokenKind::kByte ? parse_byte_token(text) : -1;
      if (byte >= 0) {
        spec_.bytes[id] = std::string(1, static_cast<char>(byte));
      } else if (spec_.kinds[id] == TokenKind::kControl) {
        spec_.bytes[id] = text;
      } else {
        spec_.bytes[id] = unicode::spm_piece_to_bytes(text);
      }
    }
    PAGODA_ASSIGN_OR_RETURN(auto tokenizer,
                            SpmTokenizer::create_scored(std::move(spec_), std::move(scores), options));
    return std::unique_ptr<Tokenizer>(std::move(tokenizer));
  }

  Result<std::unique_ptr<Tokenizer>> load_bpe(const std::string& pre, bool llama3) {
    BpeTokenizer::Options options;
    options.ignore_merges = llama3;
    const std::vector<std::string> patterns = pre_tokenizer_patterns(pre);
    if (patterns.empty()) {
      return unimplemented(path_ + ": pre-tokenizer \"" + pre + "\" is not supported");
    }
    for (const std::string& pattern : patterns) {
      PAGODA_ASSIGN_OR_RETURN(Regex regex, Regex::compile(pattern));
      options.splits.push_back(std::move(regex));
    }
    const size_t n = spec_.texts.size();
    spec_.bytes.resize(n);
    for (size_t id = 0; id < n; ++id) {
      const TokenKind k = spec_.kinds[id];
      const bool literal = k == TokenKind::kControl || k == TokenKind::kUserDefined;
      if (literal || !BpeTokenizer::token_text_to_bytes(spec_.texts[id], spec_.bytes[id])) {
        spec_.bytes[id] = spec_.texts[id];
      }
    }
    PAGODA_ASSIGN_OR_RETURN(std::vector<std::string_view> merges, gguf_.get_string_array(key("merges")));
    PAGODA_ASSIGN_OR_RETURN(auto tokenizer, BpeTokenizer::create(std::move(spec_), std::move(options)));
    BpeTokenizer& tok = *tokenizer;
    tok.merges().reserve(merges.size());
    std::string joined;
    for (size_t rank = 0; rank < merges.size(); ++rank) {
      const std::string_view m = merges[rank];
      const size_t space = m.find(' ', 1);
      if (space == std::string_view::npos) {
        return fail("merge " + std::to_string(rank) + " \"" + std::string(m) + "\" is not \"a b\"");
      }
      const std::string_view left = m.substr(0, space), right = m.substr(space + 1);
      joined.assign(left);
      joined.append(right);
      auto l = tok.find(left), r = tok.find(right), merged = tok.find(joined);
      if (!l || !r || !merged) {
        return fail("merge " + std::to_string(rank) + " \"" + std::string(m) +
                    "\" names a token missing from the vocabulary");
      }
      tok.merges().add(*l, *r, *merged, static_cast<int32_t>(rank));
    }
    return std::unique_ptr<Tokenizer>(std::move(tokenizer));
  }

  const GgufFile& gguf_;
  std::string path_;
  VocabSpec spec_;
};

}  // namespace

Result<std::unique_ptr<Tokenizer>> load_gguf_tokenizer(const GgufFile& gguf) {
  return GgufVocabLoader(gguf).load();
}

}  // namespace pagoda
