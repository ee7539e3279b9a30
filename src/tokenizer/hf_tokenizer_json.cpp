// load_hf_tokenizer: a Hugging Face tokenizer.json (+ tokenizer_config.json,
// generation_config.json) turned into an SpmTokenizer or a BpeTokenizer.
//
// Supported: model "BPE"; byte-level vocabularies (ByteLevel pre-tokenizer or decoder) with
// Split/ByteLevel/Digits pre-tokenizers, and SentencePiece-style vocabularies (Prepend/Replace
// normalizers or a Metaspace pre-tokenizer, byte fallback); TemplateProcessing post-processors;
// added tokens. Anything else fails with kUnimplemented rather than tokenizing differently from
// the reference. NFC normalization uses libunistring.
#include <algorithm>
#include <filesystem>
#include <limits>

#include <nlohmann/json.hpp>

#include "base/mapped_file.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/spm_tokenizer.h"
#include "tokenizer/unicode.h"

namespace pagoda {
namespace {

using json = nlohmann::json;

// Larger ids than this are taken for corruption, not allocated for.
constexpr int64_t kMaxTokenId = (int64_t{1} << 24) - 1;

// Parses a JSON file; an absent optional file gives a null value.
Result<json> read_json(const std::string& path, bool optional) {
  std::error_code ec;
  if (optional && !std::filesystem::exists(path, ec)) return json();
  PAGODA_ASSIGN_OR_RETURN(std::string text, read_file(path));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return data_loss(path + ": not valid JSON");
  return j;
}

// A tokenizer_config.json token field: "text" or {"content": "text", ...}.
std::optional<std::string> config_token(const json& config, const char* key) {
  if (!config.is_object()) return std::nullopt;
  auto it = config.find(key);
  if (it == config.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto content = it->find("content");
    if (content != it->end() && content->is_string()) return content->get<std::string>();
  }
  return std::nullopt;
}

std::optional<bool> config_bool(const json& config, const char* key) {
  if (!config.is_object()) return std::nullopt;
  auto it = config.find(key);
  if (it == config.end() || !it->is_boolean()) return std::nullopt;
  return it->get<bool>();
}

// The objects of a component that may be a "Sequence" of components. Nesting deeper than a
// real file ever does is refused (false), so a hostile file cannot exhaust the stack.
bool flatten(const json& component, const char* list_key, std::vector<const json*>& out,
             int depth = 0) {
  if (!component.is_object()) return true;
  if (depth > 8) return false;
  auto type = component.find("type");
  if (type != component.end() && *type == "Sequence") {
    auto list = component.find(list_key);
    if (list != component.end() && list->is_array()) {
      for (const json& item : *list) {
        if (!flatten(item, list_key, out, depth + 1)) return false;
      }
    }
    return true;
  }
  out.push_back(&component);
  return true;
}

std::string type_of(const json& component) {
  auto it = component.find("type");
  return it != component.end() && it->is_string() ? it->get<std::string>() : std::string();
}

bool get_bool(const json& obj, const char* key, bool fallback) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

std::string get_string(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// A Split/Replace "pattern": {"Regex": "..."} or {"String": "..."}.
struct Pattern {
  std::string text;
  bool literal = false;
};
std::optional<Pattern> get_pattern(const json& obj) {
  auto it = obj.find("pattern");
  if (it == obj.end() || !it->is_object()) return std::nullopt;
  if (auto r = it->find("Regex"); r != it->end() && r->is_string()) {
    return Pattern{r->get<std::string>(), false};
  }
  if (auto s = it->find("String"); s != it->end() && s->is_string()) {
    return Pattern{s->get<std::string>(), true};
  }
  return std::nullopt;
}

class HfLoader {
 public:
  explicit HfLoader(std::string dir) : dir_(std::move(dir)), path_(dir_ + "/tokenizer.json") {}

  Result<std::unique_ptr<Tokenizer>> load() {
    PAGODA_ASSIGN_OR_RETURN(json root, read_json(path_, false));
    PAGODA_ASSIGN_OR_RETURN(config_, read_json(dir_ + "/tokenizer_config.json", true));
    PAGODA_ASSIGN_OR_RETURN(generation_, read_json(dir_ + "/generation_config.json", true));
    try {
      return build(root);
    } catch (const json::exception& e) {
      // The explicit checks below should leave nothing for nlohmann to throw on; this is the
      // backstop that keeps a malformed file from escaping as an exception.
      return data_loss(path_ + ": " + e.what());
    }
  }

 private:
  Status fail(const std::string& what) const { return data_loss(path_ + ": " + what); }
  Status unsupported(const std::string& what) const {
    return unimplemented(path_ + ": " + what + " is not supported");
  }

  Result<std::unique_ptr<Tokenizer>> build(const json& root) {
    if (!root.is_object()) return fail("the top level is not an object");
    auto model_it = root.find("model");
    if (model_it == root.end() || !model_it->is_object()) return fail("no \"model\" object");
    const json& model = *model_it;
    const std::string model_type = type_of(model);
    if (!model_type.empty() && model_type != "BPE") {
      return unsupported("model type \"" + model_type + "\"");
    }
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      if (!get_string(model, key).empty()) return unsupported(std::string("model.") + key);
    }

    PAGODA_RETURN_IF_ERROR(read_vocab(model, root));
    const json null_json;
    const json& normalizer = root.contains("normalizer") ? root["normalizer"] : null_json;
    const json& pre_tokenizer = root.contains("pre_tokenizer") ? root["pre_tokenizer"] : null_json;
    const json& decoder = root.contains("decoder") ? root["decoder"] : null_json;
    std::vector<const json*> normalizers, pre_tokenizers, decoders;
    if (!flatten(normalizer, "normalizers", normalizers) ||
        !flatten(pre_tokenizer, "pretokenizers", pre_tokenizers) ||
        !flatten(decoder, "decoders", decoders)) {
      return fail("a Sequence nests too deeply");
    }

    bool byte_level = false;
    for (const auto* list : {&pre_tokenizers, &decoders}) {
      for (const json* c : *list) byte_level = byte_level || type_of(*c) == "ByteLevel";
    }
    PAGODA_RETURN_IF_ERROR(read_post_processor(root));
    PAGODA_RETURN_IF_ERROR(read_special_ids(model));

    std::unique_ptr<VocabTokenizer> tokenizer;
    if (byte_level) {
      PAGODA_ASSIGN_OR_RETURN(tokenizer, build_byte_level(model, normalizers, pre_tokenizers));
    } else {
      PAGODA_ASSIGN_OR_RETURN(tokenizer, build_spm(model, normalizers, pre_tokenizers, decoders));
    }
    return std::unique_ptr<Tokenizer>(std::move(tokenizer));
  }

  // model.vocab and added_tokens -> spec_.texts / kinds / literals.
  Status read_vocab(const json& model, const json& root) {
    auto vocab_it = model.find("vocab");
    if (vocab_it == model.end() || !vocab_it->is_object()) return fail("no \"model.vocab\" object");
    const json& vocab = *vocab_it;
    int64_t max_id = -1;
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      if (!it.value().is_number_integer()) {
        return fail("model.vocab entry \"" + it.key() + "\" has a non-integer id");
      }
      const int64_t id = it.value().get<int64_t>();
      if (id < 0 || id > kMaxTokenId) {
        return fail("model.vocab entry \"" + it.key() + "\" has id " + std::to_string(id) +
                    " out of range");
      }
      max_id = std::max(max_id, id);
    }
    struct Added {
      int64_t id;
      std::string content;
      bool special;
    };
    std::vector<Added> added;
    if (auto it = root.find("added_tokens"); it != root.end() && !it->is_null()) {
      if (!it->is_array()) return fail("\"added_tokens\" is not an array");
      for (const json& t : *it) {
        if (!t.is_object()) return fail("an added token is not an object");
        auto id = t.find("id");
        auto content = t.find("content");
        if (id == t.end() || !id->is_number_integer() || content == t.end() ||
            !content->is_string()) {
          return fail("an added token lacks an integer \"id\" or a string \"content\"");
        }
        const int64_t value = id->get<int64_t>();
        if (value < 0 || value > kMaxTokenId) {
          return fail("added token id " + std::to_string(value) + " out of range");
        }
        max_id = std::max(max_id, value);
        added.push_back({value, content->get<std::string>(), get_bool(t, "special", false)});
      }
    }
    if (max_id < 0) return fail("the vocabulary is empty");
    // Real vocabularies number their tokens densely; a few stray huge ids in a small file must
    // not make us allocate gigabytes.
    const int64_t entries = static_cast<int64_t>(vocab.size() + added.size());
    if (max_id >= 4 * entries + 1024) {
      return fail("token id " + std::to_string(max_id) + " is far beyond the " +
                  std::to_string(entries) + " tokens listed");
    }
    const auto n = static_cast<size_t>(max_id + 1);
    spec_.source = path_;
    spec_.texts.assign(n, std::string());
    spec_.kinds.assign(n, TokenKind::kUnused);  // ids no entry names stay unused
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      const auto id = static_cast<size_t>(it.value().get<int64_t>());
      if (spec_.kinds[id] != TokenKind::kUnused) {
        return fail("id " + std::to_string(id) + " appears twice in model.vocab");
      }
      spec_.texts[id] = it.key();
      spec_.kinds[id] = TokenKind::kNormal;
    }
    is_added_.assign(n, false);
    for (const Added& a : added) {
      const auto id = static_cast<size_t>(a.id);
      spec_.texts[id] = a.content;  // HF looks added tokens up first
      spec_.kinds[id] = a.special ? TokenKind::kControl : TokenKind::kUserDefined;
      if (!is_added_[id]) spec_.literals.push_back(static_cast<TokenId>(id));
      is_added_[id] = true;
    }
    return {};
  }

  // The id of the entry with text `text`; added tokens first, as HF looks them up.
  std::optional<TokenId> find_text(const std::string& text) const {
    for (TokenId id : spec_.literals) {
      if (spec_.texts[static_cast<size_t>(id)] == text) return id;
    }
    for (size_t id = 0; id < spec_.texts.size(); ++id) {
      if (spec_.kinds[id] != TokenKind::kUnused && spec_.texts[id] == text) {
        return static_cast<TokenId>(id);
      }
    }
    return std::nullopt;
  }

  // TemplateProcessing (possibly inside a Sequence) -> prefix/suffix ids.
  Status read_post_processor(const json& root) {
    auto it = root.find("post_processor");
    if (it == root.end() || it->is_null()) return {};
    std::vector<const json*> processors;
    if (!flatten(*it, "processors", processors)) return fail("a Sequence nests too deeply");
    for (const json* p : processors) {
      if (type_of(*p) != "TemplateProcessing") continue;
      auto single = p->find("single");
      if (single == p->end() || !single->is_array()) {
        return fail("TemplateProcessing has no \"single\" list");
      }
      const json empty_object = json::object();
      const json& special_tokens = p->contains("special_tokens") ? (*p)["special_tokens"] : empty_object;
      bool after_sequence = false;
      for (const json& item : *single) {
        if (!item.is_object()) return fail("TemplateProcessing item is not an object");
        if (item.contains("Sequence")) {
          after_sequence = true;
          continue;
        }
        auto special = item.find("SpecialToken");
        if (special == item.end() || !special->is_object()) {
          return fail("TemplateProcessing item is neither Sequence nor SpecialToken");
        }
        const std::string name = get_string(*special, "id");
        auto entry = special_tokens.is_object() ? special_tokens.find(name) : special_tokens.end();
        if (entry == special_tokens.end() || !entry->is_object() || !entry->contains("ids") ||
            !(*entry)["ids"].is_array()) {
          return fail("TemplateProcessing names an undefined special token \"" + name + "\"");
        }
        for (const json& id : (*entry)["ids"]) {
          if (!id.is_number_integer()) return fail("TemplateProcessing id is not an integer");
          const int64_t value = id.get<int64_t>();
          if (value < 0 || static_cast<size_t>(value) >= spec_.texts.size()) {
            return fail("TemplateProcessing id " + std::to_string(value) + " out of range");
          }
          (after_sequence ? spec_.suffix : spec_.prefix).push_back(static_cast<TokenId>(value));
        }
      }
      has_template_ = true;
      break;
    }
    return {};
  }

  // BOS/EOS/UNK, add_bos/add_eos and stop ids from tokenizer_config / generation_config.
  Status read_special_ids(const json& model) {
    const auto lookup = [&](const std::optional<std::string>& text,
                            const char* what) -> Result<std::optional<TokenId>> {
      if (!text) return std::optional<TokenId>();
      auto id = find_text(*text);
      if (!id) {
        return data_loss(dir_ + "/tokenizer_config.json: " + what + " \"" + *text +
                         "\" is not in the vocabulary");
      }
      return std::optional<TokenId>(*id);
    };
    PAGODA_ASSIGN_OR_RETURN(spec_.bos, lookup(config_token(config_, "bos_token"), "bos_token"));
    PAGODA_ASSIGN_OR_RETURN(spec_.eos, lookup(config_token(config_, "eos_token"), "eos_token"));
    if (std::string unk = get_string(model, "unk_token"); !unk.empty()) {
      auto id = find_text(unk);
      if (!id) return fail("model.unk_token \"" + unk + "\" is not in the vocabulary");
      spec_.unk = *id;
      if (spec_.kinds[static_cast<size_t>(*id)] == TokenKind::kNormal) {
        spec_.kinds[static_cast<size_t>(*id)] = TokenKind::kUnknown;
      }
    }

    // transformers rebuilds the template from add_bos_token/add_eos_token when the config sets
    // them, so they win over the file's post-processor.
    const std::optional<bool> add_bos = config_bool(config_, "add_bos_token");
    const std::optional<bool> add_eos = config_bool(config_, "add_eos_token");
    if (add_bos) {
      spec_.prefix.clear();
      if (*add_bos && spec_.bos) spec_.prefix.push_back(*spec_.bos);
    } else if (!has_template_ && spec_.bos &&
               spec_.texts[static_cast<size_t>(*spec_.bos)] == "<|begin_of_text|>") {
      // Early Llama 3 tokenizer.json files lack the template that adds BOS; the model still
      // expects it (llama.cpp hard-codes add_bos for this vocabulary as well).
      spec_.prefix.push_back(*spec_.bos);
    }
    if (add_eos) {
      spec_.suffix.clear();
      if (*add_eos && spec_.eos) spec_.suffix.push_back(*spec_.eos);
    }

    if (spec_.eos) spec_.stop_ids.push_back(*spec_.eos);
    if (generation_.is_object() && generation_.contains("eos_token_id")) {
      const json& ids = generation_["eos_token_id"];
      std::vector<json> list = ids.is_array() ? ids.get<std::vector<json>>() : std::vector<json>{ids};
      for (const json& id : list) {
        if (!id.is_number_integer()) continue;
        const int64_t value = id.get<int64_t>();
        if (value < 0 || static_cast<size_t>(value) >= spec_.texts.size()) {
          return data_loss(dir_ + "/generation_config.json: eos_token_id " +
                           std::to_string(value) + " is outside the vocabulary");
        }
        if (std::find(spec_.stop_ids.begin(), spec_.stop_ids.end(), value) ==
            spec_.stop_ids.end()) {
          spec_.stop_ids.push_back(static_cast<TokenId>(value));
        }
      }
    }
    add_known_stop_tokens(spec_, spec_.stop_ids);
    return {};
  }

  // The merges list, as id pairs via `find`. Accepts "a b" strings and ["a", "b"] pairs.
  template <typename Find>
  Status read_merges(const json& model, BpeMerges& merges, Find find) {
    auto it = model.find("merges");
    if (it == model.end() || it->is_null()) return {};
    if (!it->is_array()) return fail("\"model.merges\" is not an array");
    merges.reserve(it->size());
    int32_t rank = 0;
    std::string left, right;
    for (const json& m : *it) {
      if (m.is_string()) {
        const std::string& s = m.get_ref<const std::string&>();
        const size_t space = s.find(' ', 1);
        if (space == std::string::npos) return fail("merge \"" + s + "\" is not \"a b\"");
        left.assign(s, 0, space);
        right.assign(s, space + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        left = m[0].get<std::string>();
        right = m[1].get<std::string>();
      } else {
        return fail("merge " + std::to_string(rank) + " is neither \"a b\" nor [a, b]");
      }
      auto l = find(left), r = find(right), merged = find(left + right);
      if (!l || !r || !merged) {
        return fail("merge " + std::to_string(rank) + " (\"" + left + "\" \"" + right +
                    "\") names a token missing from the vocabulary");
      }
      merges.add(*l, *r, *merged, rank++);
    }
    return {};
  }

  Result<std::unique_ptr<VocabTokenizer>> build_byte_level(
      const json& model, const std::vector<const json*>& normalizers,
      const std::vector<const json*>& pre_tokenizers) {
    BpeTokenizer::Options options;
    for (const json* n : normalizers) {
      if (type_of(*n) != "NFC") return unsupported("normalizer \"" + type_of(*n) + "\"");
      options.nfc = true;
    }
    options.ignore_merges = get_bool(model, "ignore_merges", false);
    for (size_t i = 0; i < pre_tokenizers.size(); ++i) {
      const json& p = *pre_tokenizers[i];
      const std::string type = type_of(p);
      if (type == "ByteLevel") {
        if (get_bool(p, "add_prefix_space", false)) {
          if (i != 0) return unsupported("ByteLevel(add_prefix_space) after other pre-tokenizers");
          options.add_prefix_space = true;
        }
        if (get_bool(p, "use_regex", true)) {
          PAGODA_ASSIGN_OR_RETURN(Regex regex, Regex::compile(kGpt2Pattern));
          options.splits.push_back(std::move(regex));
        }
      } else if (type == "Split") {
        auto pattern = get_pattern(p);
        if (!pattern) return fail("Split pre-tokenizer without a pattern");
        if (get_string(p, "behavior") != "Isolated" || get_bool(p, "invert", false)) {
          return unsupported("Split behavior \"" + get_string(p, "behavior") + "\"");
        }
        auto regex = Regex::compile(pattern->text, pattern->literal);
        if (!regex.ok()) return regex.status().with_context(path_);
        options.splits.push_back(std::move(regex).value());
      } else if (type == "Digits") {
        const bool individual = get_bool(p, "individual_digits", false);
        PAGODA_ASSIGN_OR_RETURN(Regex regex, Regex::compile(individual ? "\\p{N}" : "\\p{N}+"));
        options.splits.push_back(std::move(regex));
      } else {
        return unsupported("pre-tokenizer \"" + type + "\"");
      }
    }

    // Byte-level vocabulary entries are stored in GPT-2's printable form; added tokens are text.
    spec_.bytes.resize(spec_.texts.size());
    for (size_t id = 0; id < spec_.texts.size(); ++id) {
      if (is_added_[id] || !BpeTokenizer::token_text_to_bytes(spec_.texts[id], spec_.bytes[id])) {
        spec_.bytes[id] = spec_.texts[id];
      }
    }
    PAGODA_ASSIGN_OR_RETURN(auto tokenizer, BpeTokenizer::create(std::move(spec_), std::move(options)));
    BpeTokenizer* tok = tokenizer.get();
    PAGODA_RETURN_IF_ERROR(
        read_merges(model, tok->merges(), [&](const std::string& s) { return tok->find(s); }));
    return std::unique_ptr<VocabTokenizer>(std::move(tokenizer));
  }

  Result<std::unique_ptr<VocabTokenizer>> build_spm(const json& model,
                                                    const std::vector<const json*>& normalizers,
                                                    const std::vector<const json*>& pre_tokenizers,
                                                    const std::vector<const json*>& decoders) {
    SpmTokenizer::Options options;
    options.prefix = SpmTokenizer::Prefix::kNever;
    options.byte_fallback = get_bool(model, "byte_fallback", false);
    options.fuse_unk = get_bool(model, "fuse_unk", false);
    bool replaces_spaces = false;
    for (const json* n : normalizers) {
      const std::string type = type_of(*n);
      if (type == "Prepend" && get_string(*n, "prepend") == unicode::kSpaceMarker) {
        options.prefix = SpmTokenizer::Prefix::kAlways;
      } else if (type == "Replace") {
        auto pattern = get_pattern(*n);
        if (!pattern || !pattern->literal || pattern->text != " " ||
            get_string(*n, "content") != unicode::kSpaceMarker) {
          return unsupported("a Replace normalizer other than \" \" -> \"▁\"");
        }
        replaces_spaces = true;
      } else {
        return unsupported("normalizer \"" + type + "\"");
      }
    }
    for (const json* p : pre_tokenizers) {
      const std::string type = type_of(*p);
      if (type != "Metaspace") return unsupported("pre-tokenizer \"" + type + "\"");
      const std::string replacement = get_string(*p, "replacement");
      if (!replacement.empty() && replacement != unicode::kSpaceMarker) {
        return unsupported("a Metaspace replacement other than \"▁\"");
      }
      replaces_spaces = true;
      options.split_words = get_bool(*p, "split", false);
      std::string scheme = get_string(*p, "prepend_scheme");
      if (scheme.empty()) scheme = get_bool(*p, "add_prefix_space", true) ? "always" : "never";
      if (scheme == "always") {
        options.prefix = SpmTokenizer::Prefix::kUnlessMarked;
      } else if (scheme == "first") {
        options.prefix = SpmTokenizer::Prefix::kFirstUnlessMarked;
      } else if (scheme != "never") {
        return unsupported("Metaspace prepend_scheme \"" + scheme + "\"");
      }
    }
    if (!replaces_spaces) {
      return unsupported("a BPE model that is neither byte-level nor SentencePiece-style");
    }
    // The decoder drops the dummy prefix's space: Strip(" ", 1, 0) or Metaspace.
    spec_.strip_leading_space = options.prefix != SpmTokenizer::Prefix::kNever;
    for (const json* d : decoders) {
      const std::string type = type_of(*d);
      if (type == "Strip") {
        spec_.strip_leading_space = get_string(*d, "content") == " " &&
                                    d->contains("start") && (*d)["start"].is_number_integer() &&
                                    (*d)["start"].get<int64_t>() >= 1;
      }
    }

    spec_.bytes.resize(spec_.texts.size());
    for (size_t id = 0; id < spec_.texts.size(); ++id) {
      const std::string& text = spec_.texts[id];
      const int byte = parse_byte_token(text);
      if (byte >= 0 && options.byte_fallback && spec_.kinds[id] == TokenKind::kNormal) {
        spec_.kinds[id] = TokenKind::kByte;
      }
      if (byte >= 0 && options.byte_fallback) {
        spec_.bytes[id] = std::string(1, static_cast<char>(byte));
      } else {
        spec_.bytes[id] = unicode::spm_piece_to_bytes(text);
      }
    }
    PAGODA_ASSIGN_OR_RETURN(auto tokenizer, SpmTokenizer::create_ranked(std::move(spec_), options));
    SpmTokenizer* tok = tokenizer.get();
    PAGODA_RETURN_IF_ERROR(
        read_merges(model, tok->merges(), [&](const std::string& s) { return tok->find(s); }));
    return std::unique_ptr<VocabTokenizer>(std::move(tokenizer));
  }

  std::string dir_;
  std::string path_;
  json config_;
  json generation_;
  VocabSpec spec_;
  std::vector<bool> is_added_;
  bool has_template_ = false;
};

}  // namespace

Result<std::unique_ptr<Tokenizer>> load_hf_tokenizer(const std::string& dir) {
  return HfLoader(dir).load();
}

}  // namespace pagoda
