// llama.cpp's tokenizer test vectors (shared/models/vocab/*.inp, *.out) on the real vocabularies,
// plus decode round trips and incremental detokenization on the same strings.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "base/mapped_file.h"
#include "loader/gguf_file.h"
#include "loader/gguf_writer.h"
#include "support/test_data.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace pagoda {
namespace {

struct Vectors {
  std::vector<std::string> inputs;
  std::vector<std::vector<TokenId>> ids;
};

// Splits the .inp file on "\n__ggml_vocab_test__\n"; line k of .out holds the ids of input k.
Vectors read_vectors(const std::string& inp_path, const std::string& out_path) {
  Vectors v;
  std::string inp = *read_file(inp_path);
  const std::string sep = "\n__ggml_vocab_test__\n";
  size_t pos = 0;
  for (size_t next; (next = inp.find(sep, pos)) != std::string::npos; pos = next + sep.size()) {
    v.inputs.push_back(inp.substr(pos, next - pos));
  }
  Result<std::string> out_text = read_file(out_path);
  std::istringstream out(out_text.ok() ? *out_text : std::string());
  std::string line;
  while (std::getline(out, line)) {
    std::istringstream fields(line);
    std::vector<TokenId> ids;
    for (TokenId id; fields >> id;) ids.push_back(id);
    v.ids.push_back(std::move(ids));
  }
  return v;
}

// Loaded once per process: the big tokenizer.json files take a while in Debug builds.
struct Loaded {
  std::unique_ptr<GgufFile> gguf;
  std::unique_ptr<Tokenizer> tokenizer;
  double seconds = 0;
};

const Loaded& load_gguf(const std::string& path) {
  static std::mutex mu;
  static std::map<std::string, Loaded> cache;
  std::lock_guard<std::mutex> lock(mu);
  Loaded& l = cache[path];
  if (!l.tokenizer) {
    auto gguf = GgufFile::open(path);
    EXPECT_TRUE(gguf.ok()) << gguf.status().message();
    if (!gguf.ok()) return l;
    l.gguf = std::move(gguf).value();
    auto start = std::chrono::steady_clock::now();
    auto tok = load_gguf_tokenizer(*l.gguf);
    l.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_TRUE(tok.ok()) << tok.status().message();
    if (tok.ok()) l.tokenizer = std::move(tok).value();
  }
  return l;
}

const Loaded& load_hf(const std::string& dir) {
  static std::mutex mu;
  static std::map<std::string, Loaded> cache;
  std::lock_guard<std::mutex> lock(mu);
  Loaded& l = cache[dir];
  if (!l.tokenizer) {
    auto start = std::chrono::steady_clock::now();
    auto tok = load_hf_tokenizer(dir);
    l.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_TRUE(tok.ok()) << tok.status().message();
    if (tok.ok()) l.tokenizer = std::move(tok).value();
    std::printf("[ load     ] %s: %.3f s\n", dir.c_str(), l.seconds);
  }
  return l;
}

std::string dir_of(const std::string& file) { return file.substr(0, file.rfind('/')); }

std::string show(const std::vector<TokenId>& ids) {
  std::string s;
  for (TokenId id : ids) {
    if (!s.empty()) s.push_back(' ');
    s.append(std::to_string(id));
  }
  return s;
}

std::string incremental_decode(const Tokenizer& tok, const std::vector<TokenId>& ids,
                               bool skip_special) {
  IncrementalDetokenizer detok(tok, skip_special);
  std::string out;
  for (TokenId id : ids) {
    std::string piece = detok.push(id);
    EXPECT_TRUE(unicode::is_valid_utf8(piece));  // complete characters only
    out += piece;
  }
  return out + detok.flush();
}

// Every vector: exact ids, exact round trip, incremental == full decode.
void check_vectors(const Tokenizer& tok, const Vectors& v) {
  ASSERT_EQ(v.inputs.size(), 46u);
  ASSERT_EQ(v.ids.size(), v.inputs.size());
  for (size_t k = 0; k < v.inputs.size(); ++k) {
    const std::string& text = v.inputs[k];
    std::vector<TokenId> ids = tok.encode(text, /*add_special=*/false);
    EXPECT_EQ(show(ids), show(v.ids[k])) << "input " << k << ": \"" << text << "\"";
    EXPECT_EQ(tok.decode(v.ids[k], true), text) << "input " << k;
    EXPECT_EQ(incremental_decode(tok, v.ids[k], true), text) << "input " << k;
    EXPECT_EQ(incremental_decode(tok, v.ids[k], false), tok.decode(v.ids[k], false));
  }
}

TEST(TokenizerVectors, LlamaSpmGguf) {
  PAGODA_TEST_FILE(gguf, "vocab/ggml-vocab-llama-spm.gguf");
  PAGODA_TEST_FILE(inp, "vocab/ggml-vocab-llama-spm.gguf.inp");
  PAGODA_TEST_FILE(out, "vocab/ggml-vocab-llama-spm.gguf.out");
  const Loaded& l = load_gguf(gguf);
  ASSERT_TRUE(l.tokenizer);
  check_vectors(*l.tokenizer, read_vectors(inp, out));
}

TEST(TokenizerVectors, Gpt2Gguf) {
  PAGODA_TEST_FILE(gguf, "vocab/ggml-vocab-gpt-2.gguf");
  PAGODA_TEST_FILE(inp, "vocab/ggml-vocab-gpt-2.gguf.inp");
  PAGODA_TEST_FILE(out, "vocab/ggml-vocab-gpt-2.gguf.out");
  const Loaded& l = load_gguf(gguf);
  ASSERT_TRUE(l.tokenizer);
  check_vectors(*l.tokenizer, read_vectors(inp, out));
}

TEST(TokenizerFiles, MistralJsonAddsBos) {
  PAGODA_TEST_FILE(json, "tokenizers/mistral-7b-v0.1/tokenizer.json");
  const Loaded& l = load_hf(dir_of(json));
  ASSERT_TRUE(l.tokenizer);
  const Tokenizer& tok = *l.tokenizer;
  EXPECT_EQ(tok.encode("Hello", true), (std::vector<TokenId>{1, 22557}));
  EXPECT_EQ(tok.encode("Hello", false), (std::vector<TokenId>{22557}));
  EXPECT_EQ(tok.encode("", true), (std::vector<TokenId>{1}));
  EXPECT_EQ(tok.encode("", false), (std::vector<TokenId>{}));
  EXPECT_EQ(tok.token_text(22557), "▁Hello");
  EXPECT_EQ(tok.token_bytes(22557), " Hello");
  EXPECT_EQ(tok.decode(std::vector<TokenId>{1, 22557}, true), "Hello");
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_EQ(tok.stop_ids(), std::vector<TokenId>{2});
  EXPECT_TRUE(tok.is_special(1));
  EXPECT_FALSE(tok.is_special(22557));
  // Special tokens written in the text; each stretch of text gets its own "▁" (HF's Prepend
  // normalizer runs on every stretch between added tokens).
  std::vector<TokenId> ids = tok.encode("<s>Hello</s>", false);
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 22557);
  EXPECT_EQ(ids[2], 2);
  // Every test string round-trips (the dummy prefix's space is dropped again by decode).
  if (std::string inp = testing::find_test_file("vocab/ggml-vocab-llama-spm.gguf.inp"); !inp.empty()) {
    for (const std::string& s : read_vectors(inp, inp + ".missing").inputs) {
      std::vector<TokenId> ids = tok.encode(s, true);
      EXPECT_EQ(tok.decode(ids, true), s);
      EXPECT_EQ(incremental_decode(tok, ids, true), s);
    }
  }
  // Byte fallback: a character outside the vocabulary becomes its bytes, and decodes back.
  const std::string text = "I like 🦙 and ☃ and \x7f.";
  EXPECT_EQ(tok.decode(tok.encode(text, true), true), text);
  EXPECT_EQ(incremental_decode(tok, tok.encode(text, true), true), text);
}

TEST(TokenizerFiles, LlamaSpmGgufSpecials) {
  PAGODA_TEST_FILE(gguf, "vocab/ggml-vocab-llama-spm.gguf");
  const Loaded& l = load_gguf(gguf);
  ASSERT_TRUE(l.tokenizer);
  const Tokenizer& tok = *l.tokenizer;
  EXPECT_EQ(tok.vocab_size(), 32000);
  EXPECT_EQ(tok.encode("Hello world", true), (std::vector<TokenId>{1, 15043, 3186}));
  EXPECT_EQ(tok.encode("", true), (std::vector<TokenId>{1}));
  // llama.cpp with parse_special: control tokens in the text are those tokens, and the text
  // after one gets the dummy prefix again.
  EXPECT_EQ(tok.encode("<s>Hello</s>", false), (std::vector<TokenId>{1, 15043, 2}));
  EXPECT_EQ(tok.decode(std::vector<TokenId>{1, 15043, 3186, 2}, true), "Hello world");
  EXPECT_EQ(tok.decode(std::vector<TokenId>{1, 15043, 3186, 2}, false), "<s> Hello world</s>");
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_EQ(tok.token_text(13), "<0x0A>");
  EXPECT_EQ(tok.token_bytes(13), "\n");
  EXPECT_TRUE(tok.decode_strips_leading_space());
}

TEST(TokenizerFiles, Gpt2GgufAddsNothing) {
  PAGODA_TEST_FILE(gguf, "vocab/ggml-vocab-gpt-2.gguf");
  const Loaded& l = load_gguf(gguf);
  ASSERT_TRUE(l.tokenizer);
  const Tokenizer& tok = *l.tokenizer;
  EXPECT_EQ(tok.encode("Hello world", true), tok.encode("Hello world", false));
  EXPECT_EQ(tok.encode("Hello world", false), (std::vector<TokenId>{15496, 995}));
  EXPECT_EQ(tok.eos_id(), 50256);
  EXPECT_EQ(tok.encode("a<|endoftext|>b", false), (std::vector<TokenId>{64, 50256, 65}));
  EXPECT_EQ(tok.token_text(995), "Ġworld");
  EXPECT_EQ(tok.token_bytes(995), " world");
}

// Writes a byte-level tokenizer's vocabulary as a GGUF "gpt2" vocabulary, the way llama.cpp's
// converter does, so that the GGUF path runs the llama-bpe and qwen2 vectors too (their vocab
// GGUFs are not in the test data).
std::string convert_to_gguf(const Tokenizer& tokenizer, const std::string& pre,
                            std::optional<uint32_t> bos = std::nullopt) {
  const auto* tok = dynamic_cast<const BpeTokenizer*>(&tokenizer);
  EXPECT_NE(tok, nullptr);
  if (tok == nullptr) return {};
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  for (TokenId id = 0; id < tok->vocab_size(); ++id) {
    tokens.push_back(tok->token_text(id));
    types.push_back(static_cast<int32_t>(tok->kind(id)));
  }
  std::vector<std::string> merges;
  for (const auto& [left, right] : tok->merges().pairs_by_rank()) {
    merges.push_back(tok->token_text(left) + " " + tok->token_text(right));
  }
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_string("tokenizer.ggml.model", "gpt2");
  w.add_string("tokenizer.ggml.pre", pre);
  w.add_string_array("tokenizer.ggml.tokens", tokens);
  w.add_i32_array("tokenizer.ggml.token_type", types);
  w.add_string_array("tokenizer.ggml.merges", merges);
  if (bos) w.add_u32("tokenizer.ggml.bos_token_id", *bos);
  std::string path = testing::make_temp_dir() + "/" + pre + ".gguf";
  EXPECT_TRUE(w.write(path).ok());
  return path;
}

// Llama 3 tokenizer.json: vectors, BOS, stop ids, chat tokens, and the same vocabulary as a
// GGUF (pre-tokenizer "llama-bpe"). One test, so the 9 MB file is parsed once per process.
TEST(TokenizerVectors, Llama3Json) {
  PAGODA_TEST_FILE(json, "tokenizers/llama3/tokenizer.json");
  PAGODA_TEST_FILE(inp, "vocab/ggml-vocab-llama-bpe.gguf.inp");
  PAGODA_TEST_FILE(out, "vocab/ggml-vocab-llama-bpe.gguf.out");
  const Loaded& l = load_hf(dir_of(json));
  ASSERT_TRUE(l.tokenizer);
  check_vectors(*l.tokenizer, read_vectors(inp, out));
  {
    const Tokenizer& tok = *l.tokenizer;
    std::vector<TokenId> ids = tok.encode("Hello world", true);
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(ids[0], 128000);
    EXPECT_EQ(std::vector<TokenId>(ids.begin() + 1, ids.end()), tok.encode("Hello world", false));
    EXPECT_EQ(tok.bos_id(), 128000);
    EXPECT_EQ(tok.eos_id(), 128001);
    std::vector<TokenId> stops = tok.stop_ids();
    EXPECT_NE(std::find(stops.begin(), stops.end(), 128001), stops.end());
    EXPECT_NE(std::find(stops.begin(), stops.end(), 128009), stops.end());
    EXPECT_EQ(tok.vocab_size(), 128256);
    // A chat prompt: header tokens are single ids, and decode(skip_special) drops them.
    const std::string chat =
        "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|><|start_header_id|>assistant";
    ids = tok.encode(chat, false);
    EXPECT_EQ(ids.front(), 128006);
    EXPECT_NE(std::find(ids.begin(), ids.end(), 128009), ids.end());
    EXPECT_EQ(tok.decode(ids, false), chat);
    EXPECT_EQ(tok.decode(ids, true), "user\n\nHi!assistant");
    EXPECT_TRUE(tok.is_special(128009));
  }
  {
    const Loaded& g = load_gguf(convert_to_gguf(*l.tokenizer, "llama-bpe", 128000));
    ASSERT_TRUE(g.tokenizer);
    check_vectors(*g.tokenizer, read_vectors(inp, out));
    // llama.cpp adds BOS for this pre-tokenizer even without an add_bos_token key.
    EXPECT_EQ(g.tokenizer->encode("Hi", true).front(), 128000);
    std::vector<TokenId> stops = g.tokenizer->stop_ids();
    EXPECT_NE(std::find(stops.begin(), stops.end(), 128009), stops.end());
  }
}

// Qwen3 tokenizer.json (same base vocabulary as Qwen2): vectors, chat tokens, and the GGUF
// form (pre-tokenizer "qwen2").
TEST(TokenizerVectors, Qwen3Json) {
  PAGODA_TEST_FILE(json, "tokenizers/qwen3/tokenizer.json");
  PAGODA_TEST_FILE(inp, "vocab/ggml-vocab-qwen2.gguf.inp");
  PAGODA_TEST_FILE(out, "vocab/ggml-vocab-qwen2.gguf.out");
  const Loaded& l = load_hf(dir_of(json));
  ASSERT_TRUE(l.tokenizer);
  check_vectors(*l.tokenizer, read_vectors(inp, out));
  {
    const Tokenizer& tok = *l.tokenizer;
    std::vector<TokenId> ids = tok.encode("<|im_start|>user\nHello<|im_end|>", true);
    ASSERT_GE(ids.size(), 3u);
    EXPECT_EQ(ids.front(), 151644);
    EXPECT_EQ(ids.back(), 151645);
    EXPECT_EQ(tok.encode("Hi", true), tok.encode("Hi", false));  // no BOS for Qwen
    EXPECT_FALSE(tok.bos_id().has_value());
    EXPECT_EQ(tok.eos_id(), 151645);
    std::vector<TokenId> stops = tok.stop_ids();
    EXPECT_NE(std::find(stops.begin(), stops.end(), 151645), stops.end());
    EXPECT_NE(std::find(stops.begin(), stops.end(), 151643), stops.end());
    // <think> is an added token that is not special: one id, kept by decode(skip_special).
    ids = tok.encode("<think>\nok</think>", false);
    EXPECT_EQ(ids.front(), 151667);
    EXPECT_FALSE(tok.is_special(151667));
    EXPECT_EQ(tok.decode(ids, true), "<think>\nok</think>");
    // The NFC normalizer composes "e" + U+0301 into U+00E9 before splitting and merging.
    const std::string composed = "Caf\xC3\xA9 na\xC3\xAFve", decomposed = "Cafe\xCC\x81 nai\xCC\x88ve";
    EXPECT_EQ(tok.encode(decomposed, false), tok.encode(composed, false));
    EXPECT_EQ(tok.decode(tok.encode(decomposed, false), false), composed);
  }
  {
    const Loaded& g = load_gguf(convert_to_gguf(*l.tokenizer, "qwen2"));
    ASSERT_TRUE(g.tokenizer);
    check_vectors(*g.tokenizer, read_vectors(inp, out));
    EXPECT_EQ(g.tokenizer->encode("<|im_start|>user", true).front(), 151644);
  }
}

// Tokenizers are immutable: many threads may encode and decode at once.
TEST(TokenizerFiles, ConcurrentUse) {
  PAGODA_TEST_FILE(gguf, "vocab/ggml-vocab-gpt-2.gguf");
  PAGODA_TEST_FILE(inp, "vocab/ggml-vocab-gpt-2.gguf.inp");
  PAGODA_TEST_FILE(out, "vocab/ggml-vocab-gpt-2.gguf.out");
  const Loaded& l = load_gguf(gguf);
  ASSERT_TRUE(l.tokenizer);
  const Vectors v = read_vectors(inp, out);
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int round = 0; round < 5; ++round) {
        for (size_t k = 0; k < v.inputs.size(); ++k) {
          if (l.tokenizer->encode(v.inputs[k], false) != v.ids[k]) ++mismatches;
          if (l.tokenizer->decode(v.ids[k], false) != v.inputs[k]) ++mismatches;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(mismatches.load(), 0);
}

// The stories260K model's vocabulary: its golden greedy sample decodes to the golden text, and
// re-encoding the text gives the same ids back.
TEST(TokenizerFiles, Stories260kGolden) {
  PAGODA_TEST_FILE(gguf, "stories260K/stories260K.gguf");
  PAGODA_TEST_FILE(ids_path, "stories260K/greedy-bos-256.ids");
  PAGODA_TEST_FILE(txt_path, "stories260K/greedy-bos-256.txt");
  const Loaded& l = load_gguf(gguf);
  ASSERT_TRUE(l.tokenizer);
  std::istringstream fields(*read_file(ids_path));
  std::vector<TokenId> ids;
  for (TokenId id; fields >> id;) ids.push_back(id);
  ASSERT_EQ(ids.size(), 256u);
  std::string text = *read_file(txt_path);
  while (!text.empty() && text.back() == '\n') text.pop_back();  // the file's final newline
  std::string decoded = l.tokenizer->decode(ids, true);
  while (!decoded.empty() && decoded.back() == '\n') decoded.pop_back();
  EXPECT_EQ(decoded, text);
  EXPECT_EQ(incremental_decode(*l.tokenizer, ids, true), l.tokenizer->decode(ids, true));
  EXPECT_EQ(l.tokenizer->encode("Once upon a time", true).front(), 1);
  EXPECT_EQ(l.tokenizer->vocab_size(), 512);
}

// Random bytes (mostly ill-formed UTF-8) round-trip through both GGUF vocabularies: encoding is
// lossless (byte-level, or byte fallback), so decode gives the input with U+FFFD replacements
// (and, for SentencePiece, "▁" read as a space).
TEST(TokenizerFiles, RandomBytesRoundTrip) {
  std::vector<const Tokenizer*> toks;
  for (const char* file : {"vocab/ggml-vocab-llama-spm.gguf", "vocab/ggml-vocab-gpt-2.gguf"}) {
    if (std::string p = testing::find_test_file(file); !p.empty()) {
      toks.push_back(load_gguf(p).tokenizer.get());
    }
  }
  if (toks.empty()) {
    if (testing::test_data_required()) FAIL() << "test data missing under " << testing::test_data_dir();
    GTEST_SKIP() << "test data missing under " << testing::test_data_dir();
  }
  std::mt19937 rng(1234);
  const char alphabet[] = {' ', 'a', 'Z', '3', '\n', '\t', '\'', '\x80', '\xBF', '\xC3', '\xA9',
                           '\xE2', '\x96', '\x81', '\xF0', '\x9F', '\xA6', '\x99', '\xFF', '\0'};
  for (const Tokenizer* tok : toks) {
    ASSERT_NE(tok, nullptr);
    for (int round = 0; round < 300; ++round) {
      std::string text(rng() % 48, ' ');
      for (char& c : text) c = alphabet[rng() % sizeof(alphabet)];
      std::vector<TokenId> ids = tok->encode(text, true);
      std::string expected = unicode::sanitize_utf8(text);
      if (tok->decode_strips_leading_space()) {
        // SentencePiece cannot tell a "▁" in the text from an escaped space: both decode to ' '.
        for (size_t pos; (pos = expected.find("▁")) != std::string::npos;) expected.replace(pos, 3, " ");
      }
      EXPECT_EQ(tok->decode(ids, true), expected);
      EXPECT_EQ(incremental_decode(*tok, ids, true), expected);
    }
  }
}

// Long degenerate inputs (one 20k-character word, 20k spaces, 5k newlines) tokenize and round-trip.
// (How fast is a question for a benchmark, not for a unit test.)
TEST(TokenizerFiles, LongInputsRoundTrip) {
  std::vector<const Tokenizer*> toks;
  if (std::string p = testing::find_test_file("vocab/ggml-vocab-llama-spm.gguf"); !p.empty()) {
    toks.push_back(load_gguf(p).tokenizer.get());
  }
  if (std::string p = testing::find_test_file("vocab/ggml-vocab-gpt-2.gguf"); !p.empty()) {
    toks.push_back(load_gguf(p).tokenizer.get());
  }
  if (std::string p = testing::find_test_file("tokenizers/mistral-7b-v0.1"); !p.empty()) {
    toks.push_back(load_hf(p).tokenizer.get());
  }
  if (toks.empty()) {
    if (testing::test_data_required()) FAIL() << "test data missing under " << testing::test_data_dir();
    GTEST_SKIP() << "test data missing under " << testing::test_data_dir();
  }
  std::string word;
  for (int i = 0; i < 20000; ++i) word.push_back(static_cast<char>('a' + (i * 7919) % 26));
  const std::string texts[] = {word, std::string(20000, ' '), std::string(20000, 'a'),
                               std::string(5000, '\n') + "x"};
  for (const Tokenizer* tok : toks) {
    ASSERT_NE(tok, nullptr);
    for (const std::string& text : texts) {
      std::vector<TokenId> ids = tok->encode(text, false);
      EXPECT_FALSE(ids.empty());
      EXPECT_EQ(tok->decode(ids, false), text);
    }
  }
}

}  // namespace
}  // namespace pagoda
