// Unit tests on small hand-made vocabularies, the byte tokenizer, and malformed files.
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <fstream>

#include "loader/gguf_file.h"
#include "loader/gguf_writer.h"
#include "support/test_data.h"
#include "tokenizer/bpe_merges.h"
#include "tokenizer/regex.h"

namespace pagoda {
namespace {

// ---- byte tokenizer ----------------------------------------------------------------------

TEST(ByteTokenizer, RoundTripsBytes) {
  auto tok = make_byte_tokenizer();
  EXPECT_EQ(tok->vocab_size(), 258);
  EXPECT_EQ(tok->bos_id(), 256);
  EXPECT_EQ(tok->eos_id(), 257);
  EXPECT_EQ(tok->stop_ids(), std::vector<TokenId>{257});
  EXPECT_EQ(tok->encode("Hi", true), (std::vector<TokenId>{256, 'H', 'i'}));
  EXPECT_EQ(tok->encode("Hi", false), (std::vector<TokenId>{'H', 'i'}));
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  std::vector<TokenId> ids = tok->encode(all, false);
  ASSERT_EQ(ids.size(), 256u);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(ids[static_cast<size_t>(b)], b);
  const std::string text = "héllo 🦙 world";
  EXPECT_EQ(tok->decode(tok->encode(text, true), true), text);
  EXPECT_EQ(tok->decode(tok->encode(text, true), false), "<s>" + text);
  EXPECT_TRUE(tok->is_special(256));
  EXPECT_FALSE(tok->is_special(255));
  EXPECT_EQ(tok->encode("a</s>", false), (std::vector<TokenId>{'a', 257}));
  // Invalid UTF-8 decodes to U+FFFD; unknown ids are skipped.
  EXPECT_EQ(tok->decode(std::vector<TokenId>{0xE2, 0x82, 'A', 999, -1}, false), "\xEF\xBF\xBD" "A");
  EXPECT_FALSE(tok->decode_strips_leading_space());
}

TEST(ByteTokenizer, VerbatimRangesKeepSpecialTextAsBytes) {
  auto tok = make_byte_tokenizer();
  EXPECT_EQ(tok->special_token_texts(), (std::vector<std::string>{"<s>", "</s>"}));
  const std::string text = "a<s>b</s>";
  EXPECT_EQ(tok->encode(text, false, {}), tok->encode(text, false));
  EXPECT_EQ(tok->encode(text, true, {}), tok->encode(text, true));
  const std::vector<TextRange> first = {{1, 4}};
  EXPECT_EQ(tok->encode(text, false, first), (std::vector<TokenId>{'a', '<', 's', '>', 'b', 257}));
  // Overlapping the token by one byte is enough; touching it is not.
  const std::vector<TextRange> touch_one = {{3, 5}};
  EXPECT_EQ(tok->encode(text, false, touch_one), (std::vector<TokenId>{'a', '<', 's', '>', 'b', 257}));
  const std::vector<TextRange> adjacent = {{0, 1}, {4, 5}};
  EXPECT_EQ(tok->encode(text, false, adjacent), (std::vector<TokenId>{'a', 256, 'b', 257}));
  const std::vector<TextRange> empty_range = {{2, 2}};
  EXPECT_EQ(tok->encode(text, false, empty_range), tok->encode(text, false));
  const std::vector<TextRange> past_end = {{100, 200}};
  EXPECT_EQ(tok->encode(text, true, past_end), tok->encode(text, true));
}

TEST(ByteTokenizer, IncrementalHoldsSplitCharacters) {
  auto tok = make_byte_tokenizer();
  IncrementalDetokenizer detok(*tok, /*skip_special=*/true);
  EXPECT_EQ(detok.push(256), "");
  EXPECT_EQ(detok.push('a'), "a");
  EXPECT_EQ(detok.push(0xF0), "");
  EXPECT_EQ(detok.push(0x9F), "");
  EXPECT_EQ(detok.push(0xA6), "");
  EXPECT_EQ(detok.push(0x99), "🦙");
  EXPECT_EQ(detok.push(0xE2), "");
  EXPECT_EQ(detok.push('b'), "\xEF\xBF\xBD" "b");  // the held byte can never complete
  EXPECT_EQ(detok.push(0xC3), "");
  EXPECT_EQ(detok.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(detok.flush(), "");
}

// ---- merges and regex --------------------------------------------------------------------

TEST(BpeMerges, LowestRankFirstLeftmostOnTies) {
  BpeMerges merges;
  // ids: a=0 b=1 ab=2 aa=3 aab=4
  merges.add(0, 1, 2, 0);  // a b -> ab
  merges.add(0, 0, 3, 1);  // a a -> aa
  merges.add(3, 1, 4, 2);  // aa b -> aab (never reached: ab is merged first)
  std::vector<TokenId> s{0, 0, 1};
  merges.apply(s);
  EXPECT_EQ(s, (std::vector<TokenId>{0, 2}));
  s = {0, 0, 0};
  merges.apply(s);
  EXPECT_EQ(s, (std::vector<TokenId>{3, 0}));
  s = {0, 0, 0, 0, 0};
  merges.apply(s);
  EXPECT_EQ(s, (std::vector<TokenId>{3, 3, 0}));
  s = {};
  merges.apply(s);
  EXPECT_TRUE(s.empty());
}

TEST(BpeMerges, LongRunIsNotQuadratic) {
  BpeMerges merges;
  merges.add(0, 0, 1, 0);
  merges.add(1, 1, 2, 1);
  std::vector<TokenId> s(1 << 18, 0);
  merges.apply(s);
  EXPECT_EQ(s.size(), size_t{1} << 16);
  for (TokenId id : s) ASSERT_EQ(id, 2);
}

TEST(Regex, SplitsIsolated) {
  auto regex = Regex::compile(R"( ?\p{L}+|\p{N})");
  ASSERT_TRUE(regex.ok()) << regex.status().message();
  std::vector<std::string_view> pieces;
  EXPECT_TRUE(split_isolated(*regex, "Hi there 42!", pieces));
  EXPECT_EQ(pieces, (std::vector<std::string_view>{"Hi", " there", " ", "4", "2", "!"}));
  EXPECT_FALSE(Regex::compile("(unclosed").ok());
  // Invalid UTF-8 is tolerated: the bad byte lands between matches.
  pieces.clear();
  EXPECT_TRUE(split_isolated(*regex, "ab\xFF" "cd", pieces));
  EXPECT_EQ(pieces, (std::vector<std::string_view>{"ab", "\xFF", "cd"}));
  auto literal = Regex::compile("a.b", /*literal=*/true);
  ASSERT_TRUE(literal.ok());
  pieces.clear();
  EXPECT_TRUE(split_isolated(*literal, "xa.byaxb", pieces));
  EXPECT_EQ(pieces, (std::vector<std::string_view>{"x", "a.b", "yaxb"}));
}

// ---- hand-made tokenizer.json files -----------------------------------------------------

std::string write_dir(const std::string& tokenizer_json, const std::string& config = "") {
  std::string dir = testing::make_temp_dir();
  std::ofstream(dir + "/tokenizer.json") << tokenizer_json;
  if (!config.empty()) std::ofstream(dir + "/tokenizer_config.json") << config;
  return dir;
}

// A tiny byte-level BPE: the 256 byte symbols, plus "Ġh", "Ġhi", and <|end|>.
std::string tiny_byte_level_json(const std::string& extra_model = "") {
  std::string vocab;
  for (int b = 0; b < 256; ++b) {
    // GPT-2's table for the bytes a JSON string can hold verbatim; others use \u escapes.
    static const auto to_text = [](int byte) {
      int cp = byte;
      if (!((byte >= 0x21 && byte <= 0x7E) || (byte >= 0xA1 && byte <= 0xAC) || byte >= 0xAE)) {
        int n = 0;
        for (int x = 0; x < byte; ++x) {
          if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE)) ++n;
        }
        cp = 256 + n;
      }
      char buf[16];
      std::snprintf(buf, sizeof(buf), "\\u%04X", cp);
      return std::string(buf);
    };
    vocab.append("\"").append(to_text(b)).append("\": ").append(std::to_string(b)).append(",");
  }
  vocab += "\"\\u0120h\": 256, \"\\u0120hi\": 257";
  return R"({"version": "1.0", "added_tokens": [{"id": 258, "content": "<|end|>", "special": true}],
    "normalizer": null,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
    "post_processor": null, "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", )" +
         extra_model + R"("vocab": {)" + vocab + R"(}, "merges": ["\u0120 h", "\u0120h i"]}})";
}

TEST(HfTokenizerJson, TinyByteLevel) {
  std::string dir = write_dir(tiny_byte_level_json(), R"({"eos_token": "<|end|>"})");
  auto tok = load_hf_tokenizer(dir);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ((*tok)->vocab_size(), 259);
  EXPECT_EQ((*tok)->encode("hi hi<|end|>", true), (std::vector<TokenId>{'h', 'i', 257, 258}));
  EXPECT_EQ((*tok)->eos_id(), 258);
  EXPECT_EQ((*tok)->stop_ids(), std::vector<TokenId>{258});
  EXPECT_EQ((*tok)->decode(std::vector<TokenId>{'h', 257, 258}, false), "h hi<|end|>");
  EXPECT_EQ((*tok)->decode(std::vector<TokenId>{'h', 257, 258}, true), "h hi");
  EXPECT_EQ((*tok)->token_text(256), "Ġh");
  EXPECT_EQ((*tok)->token_bytes(256), " h");
}

// Special added tokens are not matched inside verbatim ranges; the text around them is then
// tokenized as one stretch. Non-special added tokens still match there.
TEST(HfTokenizerJson, VerbatimRangesSkipOnlySpecialTokens) {
  std::string json = tiny_byte_level_json();
  const std::string added = R"({"id": 258, "content": "<|end|>", "special": true})";
  const size_t at = json.find(added);
  ASSERT_NE(at, std::string::npos);
  json.insert(at + added.size(), R"(, {"id": 259, "content": "<|en", "special": false},
                                    {"id": 260, "content": "<x>", "special": false})");
  auto loaded = load_hf_tokenizer(write_dir(json, R"({"eos_token": "<|end|>"})"));
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  const Tokenizer& tok = **loaded;
  EXPECT_EQ(tok.special_token_texts(), std::vector<std::string>{"<|end|>"});
  const std::string text = "hi<|end|> hi<x>";
  EXPECT_EQ(tok.encode(text, false), (std::vector<TokenId>{'h', 'i', 258, 257, 260}));
  EXPECT_EQ(tok.encode(text, false, {}), tok.encode(text, false));
  // The whole text verbatim: <|end|> is refused, so the longest other added token at that
  // position ("<|en", not special) is taken; <x> is not special and stays one token.
  const std::vector<TextRange> all = {{0, text.size()}};
  EXPECT_EQ(tok.encode(text, false, all), (std::vector<TokenId>{'h', 'i', 259, 'd', '|', '>', 257, 260}));
  // Only the bytes of <|end|> verbatim: the same, and " hi" after it still merges to "Ġhi".
  const std::vector<TextRange> token_only = {{2, 9}};
  EXPECT_EQ(tok.encode(text, false, token_only), tok.encode(text, false, all));
  const std::vector<TextRange> elsewhere = {{9, 12}};
  EXPECT_EQ(tok.encode(text, false, elsewhere), tok.encode(text, false));
}

TEST(HfTokenizerJson, MalformedFilesFailWithoutCrashing) {
  const std::string good = tiny_byte_level_json();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"not json", "{\"model\": "},
      {"array at top", "[1, 2, 3]"},
      {"no model", R"({"added_tokens": []})"},
      {"model not object", R"({"model": 5})"},
      {"no vocab", R"({"model": {"type": "BPE", "merges": []}})"},
      {"vocab wrong type", R"({"model": {"type": "BPE", "vocab": [1, 2]}})"},
      {"id not integer", R"({"model": {"type": "BPE", "vocab": {"a": "x"}}})"},
      {"negative id", R"({"model": {"type": "BPE", "vocab": {"a": -4}}})"},
      {"huge id", R"({"model": {"type": "BPE", "vocab": {"a": 4000000000000}}})"},
      {"sparse id", R"({"model": {"type": "BPE", "vocab": {"a": 10000000}}})"},
      {"duplicate id", R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 0}},
                           "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}})"},
      {"unigram", R"({"model": {"type": "Unigram", "vocab": [["a", 0.0]]}})"},
      {"added not array", R"({"model": {"type": "BPE", "vocab": {"a": 0}}, "added_tokens": 7})"},
      {"added bad id", R"({"model": {"type": "BPE", "vocab": {"a": 0}},
                           "added_tokens": [{"id": "x", "content": "<s>"}]})"},
      {"merges not array", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": 3},
                               "decoder": {"type": "ByteLevel"}})"},
      {"merge missing token", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]},
                                  "decoder": {"type": "ByteLevel"}})"},
      {"merge not a pair", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["ab"]},
                               "decoder": {"type": "ByteLevel"}})"},
      {"merge wrong type", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [[1, 2]]},
                               "decoder": {"type": "ByteLevel"}})"},
      {"bad regex", R"({"model": {"type": "BPE", "vocab": {"a": 0}},
                        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(a"}, "behavior": "Isolated"},
                        "decoder": {"type": "ByteLevel"}})"},
      {"unknown pre-tokenizer", R"({"model": {"type": "BPE", "vocab": {"a": 0}},
                                    "pre_tokenizer": {"type": "Whitespace"}, "decoder": {"type": "ByteLevel"}})"},
      {"neither byte-level nor spm", R"({"model": {"type": "BPE", "vocab": {"a": 0}}})"},
      {"template undefined token", R"({"model": {"type": "BPE", "vocab": {"a": 0}},
          "decoder": {"type": "ByteLevel"},
          "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}}]}})"},
      {"truncated", good.substr(0, good.size() / 2)},
      {"deep nesting", std::string(100000, '[') + std::string(100000, ']')},
      {"deep sequences", [] {
         std::string pre = R"({"type": "ByteLevel"})";
         for (int i = 0; i < 50; ++i) pre = R"({"type": "Sequence", "pretokenizers": [)" + pre + "]}";
         return R"({"model": {"type": "BPE", "vocab": {"a": 0}}, "pre_tokenizer": )" + pre + "}";
       }()},
  };
  for (const auto& [name, text] : cases) {
    auto tok = load_hf_tokenizer(write_dir(text));
    ASSERT_FALSE(tok.ok()) << name;
    EXPECT_NE(tok.status().message().find("tokenizer.json"), std::string::npos)
        << name << ": " << tok.status().message();
  }
  // A config naming a token the vocabulary lacks, and a missing directory.
  auto bad_config = load_hf_tokenizer(write_dir(good, R"({"eos_token": "<|nope|>"})"));
  ASSERT_FALSE(bad_config.ok());
  EXPECT_NE(bad_config.status().message().find("tokenizer_config.json"), std::string::npos);
  auto bad_config_json = load_hf_tokenizer(write_dir(good, "{oops"));
  ASSERT_FALSE(bad_config_json.ok());
  EXPECT_NE(bad_config_json.status().message().find("tokenizer_config.json"), std::string::npos);
  auto missing = load_hf_tokenizer("/nonexistent/pagoda/tokenizer");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/pagoda/tokenizer"), std::string::npos);
}

TEST(HfTokenizerJson, SpmStyleMetaspaceFirst) {
  // "▁" = 0, "a" = 1, "b" = 2, "▁a" = 3, "ab" = 4, <0x63> = 5 ('c'), <s> = 6.
  const std::string json = R"({"model": {"type": "BPE", "byte_fallback": true, "unk_token": null,
      "vocab": {"▁": 0, "a": 1, "b": 2, "▁a": 3, "ab": 4, "<0x63>": 5, "<s>": 6},
      "merges": ["▁ a", "a b"]},
    "added_tokens": [{"id": 6, "content": "<s>", "special": true}],
    "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": false},
    "decoder": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first"}})";
  auto tok = load_hf_tokenizer(write_dir(json, R"({"bos_token": "<s>", "add_bos_token": true})"));
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ((*tok)->encode("ab", true), (std::vector<TokenId>{6, 3, 2}));
  // Only the start of the input gets the prefix; a stretch after <s> does not.
  EXPECT_EQ((*tok)->encode("ab<s>ab", false), (std::vector<TokenId>{3, 2, 6, 4}));
  // Text already starting with a space gets no second marker.
  EXPECT_EQ((*tok)->encode(" ab", false), (std::vector<TokenId>{3, 2}));
  EXPECT_EQ((*tok)->encode("c", false), (std::vector<TokenId>{0, 5}));  // byte fallback
  EXPECT_EQ((*tok)->decode(std::vector<TokenId>{6, 3, 2, 5}, true), "abc");
}

// ---- hand-made GGUF vocabularies ---------------------------------------------------------

Result<std::unique_ptr<Tokenizer>> load_written(const GgufWriter& w, std::unique_ptr<GgufFile>* keep) {
  std::string path = testing::make_temp_dir() + "/vocab.gguf";
  PAGODA_RETURN_IF_ERROR(w.write(path));
  PAGODA_ASSIGN_OR_RETURN(*keep, GgufFile::open(path));
  return load_gguf_tokenizer(**keep);
}

GgufWriter spm_writer(const std::vector<std::string>& tokens, const std::vector<float>& scores,
                      const std::vector<int32_t>& types) {
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_string("tokenizer.ggml.model", "llama");
  w.add_string_array("tokenizer.ggml.tokens", tokens);
  w.add_f32_array("tokenizer.ggml.scores", scores);
  w.add_i32_array("tokenizer.ggml.token_type", types);
  return w;
}

TEST(GgufVocab, TinySpmHighestScoreWins) {
  // "▁ab" could be "▁a"+"b" or "▁"+"ab"; the scores decide which pair merges first.
  const std::vector<std::string> tokens = {"<unk>", "<s>", "</s>", "▁", "a", "b", "▁a", "ab", "<0x21>"};
  const std::vector<int32_t> types = {2, 3, 3, 1, 1, 1, 1, 1, 6};
  std::unique_ptr<GgufFile> keep;
  auto tok = load_written(spm_writer(tokens, {0, 0, 0, -1, -2, -3, -5, -4, 0}, types), &keep);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ((*tok)->encode("ab", true), (std::vector<TokenId>{1, 3, 7}));
  auto tok2 = load_written(spm_writer(tokens, {0, 0, 0, -1, -2, -3, -4, -5, 0}, types), &keep);
  ASSERT_TRUE(tok2.ok()) << tok2.status().message();
  EXPECT_EQ((*tok2)->encode("ab", true), (std::vector<TokenId>{1, 6, 5}));
  // '!' falls back to its byte token; 'z' has none and becomes <unk>.
  EXPECT_EQ((*tok2)->encode("a!z", false), (std::vector<TokenId>{6, 8, 0}));
  EXPECT_EQ((*tok2)->decode(std::vector<TokenId>{1, 6, 8}, true), "a!");
}

TEST(GgufVocab, CorruptVocabulariesFail) {
  const std::vector<std::string> tokens = {"<unk>", "<s>", "</s>", "a"};
  std::unique_ptr<GgufFile> keep;
  {
    auto tok = load_written(spm_writer(tokens, {0, 0, 0}, {2, 3, 3, 1}), &keep);
    ASSERT_FALSE(tok.ok());
    EXPECT_NE(tok.status().message().find("vocab.gguf"), std::string::npos) << tok.status().message();
  }
  {
    auto tok = load_written(spm_writer(tokens, {0, 0, 0, 0}, {2, 3, 3}), &keep);
    ASSERT_FALSE(tok.ok());
    EXPECT_NE(tok.status().message().find("token_type"), std::string::npos) << tok.status().message();
  }
  {
    auto tok = load_written(spm_writer(tokens, {0, 0, 0, 0}, {2, 3, 3, 42}), &keep);
    ASSERT_FALSE(tok.ok());
  }
  {
    GgufWriter w = spm_writer(tokens, {0, 0, 0, 0}, {2, 3, 3, 1});
    w.add_u32("tokenizer.ggml.bos_token_id", 4);
    auto tok = load_written(w, &keep);
    ASSERT_FALSE(tok.ok());
    EXPECT_NE(tok.status().message().find("bos_token_id"), std::string::npos) << tok.status().message();
  }
  {
    GgufWriter w;
    w.add_string("tokenizer.ggml.model", "gpt2");
    w.add_string_array("tokenizer.ggml.tokens", {"a", "b"});
    w.add_string_array("tokenizer.ggml.merges", {"a c"});
    auto tok = load_written(w, &keep);
    ASSERT_FALSE(tok.ok());
    EXPECT_NE(tok.status().message().find("merge"), std::string::npos) << tok.status().message();
  }
  {
    GgufWriter w;
    w.add_string("tokenizer.ggml.model", "gpt2");
    w.add_string_array("tokenizer.ggml.tokens", {"a", "b"});
    auto tok = load_written(w, &keep);
    ASSERT_FALSE(tok.ok());  // no merges
  }
  {
    GgufWriter w;
    w.add_string("tokenizer.ggml.model", "gpt2");
    w.add_string("tokenizer.ggml.pre", "no-such-pre");
    w.add_string_array("tokenizer.ggml.tokens", {"a", "b"});
    w.add_string_array("tokenizer.ggml.merges", {});
    auto tok = load_written(w, &keep);
    ASSERT_FALSE(tok.ok());
    EXPECT_EQ(tok.status().code(), StatusCode::kUnimplemented);
  }
  {
    GgufWriter w;
    w.add_string("tokenizer.ggml.model", "bert");
    w.add_string_array("tokenizer.ggml.tokens", {"a"});
    auto tok = load_written(w, &keep);
    ASSERT_FALSE(tok.ok());
    EXPECT_EQ(tok.status().code(), StatusCode::kUnimplemented);
  }
  {
    GgufWriter w;
    w.add_string("tokenizer.ggml.model", "llama");
    w.add_u32("tokenizer.ggml.tokens", 3);  // wrong type
    auto tok = load_written(w, &keep);
    ASSERT_FALSE(tok.ok());
  }
  {
    GgufWriter w;
    w.add_string("general.architecture", "llama");  // no tokenizer at all
    auto tok = load_written(w, &keep);
    ASSERT_FALSE(tok.ok());
    EXPECT_NE(tok.status().message().find("tokenizer.ggml.model"), std::string::npos);
  }
}

}  // namespace
}  // namespace pagoda
