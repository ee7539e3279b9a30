// Token masks checked against the definition: at every step of random walks, a token is allowed
// iff its bytes, fed to the byte-level matcher from the current state, leave it alive (and a stop
// token iff the text so far is a whole match). The byte-level matcher is the reference; it is
// tested on its own against hand-written strings (gbnf_test.cpp). Vocabularies: made-up ones that
// put several grammar elements in one token, and the real Llama 3, Qwen3 and stories260K
// tokenizers (byte-level BPE; SentencePiece with byte fallback and the leading-space rule).
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "loader/gguf_file.h"
#include "structured/gbnf.h"
#include "structured/token_grammar.h"
#include "tests/support/test_data.h"
#include "tokenizer/tokenizer.h"

namespace pagoda::structured {
namespace {

// A JSON grammar in GBNF (objects at the root, any whitespace between tokens up to a bound).
constexpr const char* kJsonGbnf = R"(
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= "-"? ([0-9] | [1-9] [0-9]{1,15}) ("." [0-9]+)? ([eE] [-+]? [0-9]{1,3})? ws
ws     ::= ([ \t\n] ws)?
)";

std::shared_ptr<const CompiledGrammar> compile_gbnf(const std::string& text) {
  Result<Grammar> g = parse_gbnf(text);
  EXPECT_TRUE(g.ok()) << g.status().message();
  if (!g.ok()) return nullptr;
  return std::make_shared<const CompiledGrammar>(std::move(*g));
}

bool has(std::span<const uint64_t> mask, int32_t id) { return (mask[static_cast<size_t>(id) / 64] >> (id % 64)) & 1; }

// Walks `steps` tokens from the root, each chosen at random among the allowed ones, and checks
// every mask on the way against the byte-level reference. Returns the text made.
std::string walk_and_check(const std::shared_ptr<const TokenGrammar>& tg, bool starts_text, int steps, uint32_t seed,
                           bool prefer_short = false) {
  const TokenVocabulary& vocab = tg->vocabulary();
  TokenMatcher matcher(tg, starts_text);
  StateSpace ref(tg->grammar());
  int32_t state = ref.root();
  std::vector<uint64_t> mask(vocab.mask_words());
  std::mt19937 rng(seed);
  std::string text;
  for (int step = 0; step < steps; ++step) {
    matcher.fill_mask(mask);
    std::vector<int32_t> allowed;
    int mismatches = 0;
    for (int32_t id = 0; id < vocab.size(); ++id) {
      std::string_view bytes = vocab.bytes(id);
      if (starts_text && step == 0 && vocab.strips_leading_space() && !bytes.empty() && bytes[0] == ' ') {
        bytes.remove_prefix(1);
      }
      const bool is_stop = std::find(vocab.stop_ids().begin(), vocab.stop_ids().end(), id) != vocab.stop_ids().end();
      const bool want = is_stop ? ref.ended(state) : !bytes.empty() && ref.next(state, bytes) != StateSpace::kDead;
      if (want != has(mask, id) && ++mismatches <= 5) {
        ADD_FAILURE() << "step " << step << " after \"" << text << "\": token " << id << " \"" << vocab.bytes(id)
                      << "\" is " << (want ? "valid" : "invalid") << " but the mask says "
                      << (has(mask, id) ? "allowed" : "not allowed");
      }
      if (want && !is_stop) allowed.push_back(id);
    }
    if (mismatches > 0) return text;
    // Never a dead end: something can follow, or the text can end here.
    EXPECT_TRUE(!allowed.empty() || ref.ended(state)) << "dead end after \"" << text << "\"";
    if (allowed.empty()) break;
    int32_t pick = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
    if (prefer_short && rng() % 4 != 0) {
      // Mostly short tokens (punctuation, digits), so that walks close their brackets.
      std::vector<int32_t> short_ones;
      for (int32_t id : allowed) {
        if (vocab.bytes(id).size() <= 2) short_ones.push_back(id);
      }
      if (!short_ones.empty()) pick = short_ones[std::uniform_int_distribution<size_t>(0, short_ones.size() - 1)(rng)];
    }
    std::string_view bytes = vocab.bytes(pick);
    if (starts_text && step == 0 && vocab.strips_leading_space() && bytes[0] == ' ') bytes.remove_prefix(1);
    EXPECT_TRUE(matcher.accept(pick)) << "allowed token " << pick << " refused";
    state = ref.next(state, bytes);
    text += bytes;
  }
  return text;
}

// A vocabulary of every byte plus tokens that cross grammar elements.
std::shared_ptr<const TokenVocabulary> made_up_vocabulary() {
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.emplace_back(1, static_cast<char>(b));
  for (const char* t : {"{\"", "\":", "\",", "\"}", "\"},", "}}", "},{\"", "true", "true}", " true", "false,",
                        "null", "12", "3.", "e+", "-0", "\\u00", "\\n", "\\\"", "ab", "abc\"", "a\":", "\": \"",
                        "\", \"", " \"", "\n", "\n  ", "  ", "[{", "[]", "{}", "é", "\xC3", "\xA9\"", "\"\xC3",
                        "]}", "\"]", "1,", "0}", ", ", "{\n", "\"\n}"}) {
    bytes.emplace_back(t);
  }
  bytes.emplace_back();  // an id without bytes (a special token): never allowed
  bytes.emplace_back();  // the stop token
  const int32_t stop = static_cast<int32_t>(bytes.size()) - 1;
  return std::make_shared<const TokenVocabulary>(std::move(bytes), std::vector<int32_t>{stop}, false);
}

TEST(TokenVocabulary, TrieNodesCoverTheirPrefixes) {
  auto vocab = made_up_vocabulary();
  const auto trie = vocab->trie();
  const auto sorted = vocab->sorted();
  ASSERT_EQ(trie[0].lo, 0);
  ASSERT_EQ(trie[0].hi, static_cast<int32_t>(sorted.size()));
  ASSERT_EQ(trie[0].next, static_cast<int32_t>(trie.size()));
  EXPECT_EQ(sorted.size(), static_cast<size_t>(vocab->size() - 2));  // all but the two without bytes
  // Each node's prefix, rebuilt from the path of bytes, starts exactly the tokens in [lo, hi).
  std::vector<std::string> prefix(1);
  for (size_t i = 1; i < trie.size(); ++i) {
    const auto& node = trie[i];
    ASSERT_GE(node.depth, 1);
    prefix.resize(static_cast<size_t>(node.depth));
    prefix.back() = prefix.size() >= 2 ? prefix[prefix.size() - 2] : std::string();
    prefix.back() += static_cast<char>(node.byte);
    const std::string& p = prefix.back();
    for (int32_t j = 0; j < static_cast<int32_t>(sorted.size()); ++j) {
      const std::string& b = vocab->bytes(sorted[static_cast<size_t>(j)]);
      const bool inside = j >= node.lo && j < node.hi;
      EXPECT_EQ(inside, b.compare(0, p.size(), p) == 0) << "node " << i << " token " << b;
      EXPECT_EQ(j >= node.lo && j < node.mid, b == p) << "node " << i << " token " << b;
    }
    EXPECT_GT(node.next, static_cast<int32_t>(i));
  }
}

TEST(TokenMasks, JsonOverAMadeUpVocabularyMatchTheByteMatcher) {
  auto g = compile_gbnf(kJsonGbnf);
  ASSERT_NE(g, nullptr);
  auto tg = TokenGrammar::compile(g, made_up_vocabulary());
  ASSERT_TRUE(tg.ok()) << tg.status().message();
  for (uint32_t seed = 1; seed <= 40; ++seed) walk_and_check(*tg, false, 80, seed, seed % 2 == 0);
}

TEST(TokenMasks, AmbiguousAndNestedGrammarsMatchTheByteMatcher) {
  // Rules ending inside tokens at several depths at once, an ambiguous split, and a root that can
  // end and go on.
  for (const char* gbnf : {
           R"(root ::= ("a" | "ab") ("b" | "bc")* "c"? )",
           R"(root ::= x+ ; x ::= "[" y "]" ; y ::= x* | "\"" [a-c]* "\"" )",
           R"(root ::= "{" inner "}" ; inner ::= ("1" | "12" | "2")* ("," inner)?)",
           R"(root ::= [0-9]+ ("e" [0-9]+)? | "true" | "tru" "e}" )",
       }) {
    std::string text = gbnf;
    std::replace(text.begin(), text.end(), ';', '\n');
    auto g = compile_gbnf(text);
    ASSERT_NE(g, nullptr) << gbnf;
    auto tg = TokenGrammar::compile(g, made_up_vocabulary());
    ASSERT_TRUE(tg.ok()) << tg.status().message();
    for (uint32_t seed = 1; seed <= 20; ++seed) walk_and_check(*tg, false, 30, seed, true);
  }
}

TEST(TokenMasks, RollbackRestoresTheMaskAndStopEnds) {
  auto g = compile_gbnf(R"(root ::= "{" [a-z]* "}")");
  ASSERT_NE(g, nullptr);
  auto vocab = made_up_vocabulary();
  auto tg = TokenGrammar::compile(g, vocab);
  ASSERT_TRUE(tg.ok());
  TokenMatcher m(*tg, false);
  std::vector<uint64_t> before(vocab->mask_words()), after(vocab->mask_words());
  ASSERT_TRUE(m.accept('{'));
  m.fill_mask(before);
  EXPECT_FALSE(m.accept('{'));  // refused, and nothing moved
  ASSERT_TRUE(m.accept('a'));
  ASSERT_TRUE(m.accept('b'));
  EXPECT_EQ(m.accepted(), 3u);
  m.rollback(2);
  m.fill_mask(after);
  EXPECT_EQ(before, after);
  const int32_t stop = vocab->stop_ids().at(0);
  EXPECT_FALSE(has(after, stop));
  EXPECT_FALSE(m.accept(stop));
  ASSERT_TRUE(m.accept('}'));
  EXPECT_TRUE(m.can_end());
  EXPECT_TRUE(m.finished());
  m.fill_mask(after);
  EXPECT_TRUE(has(after, stop));
  EXPECT_EQ(std::count_if(after.begin(), after.end(), [](uint64_t w) { return w != 0; }), 1);
  ASSERT_TRUE(m.accept(stop));
  // After the stop, only stop tokens (again and again, for a request that ignores EOS).
  m.fill_mask(after);
  EXPECT_TRUE(has(after, stop));
  EXPECT_EQ(std::count_if(after.begin(), after.end(), [](uint64_t w) { return w != 0; }), 1);
  EXPECT_FALSE(m.accept('a'));
  ASSERT_TRUE(m.accept(stop));
  m.rollback(2);  // both stops undone: '}' is the last token again
  EXPECT_FALSE(m.accept('a'));  // ('}' ended the match)
  m.rollback(1);
  EXPECT_TRUE(m.accept('a'));
  // A request's own stop tokens count too.
  const int32_t own = 'x';
  TokenMatcher with_own(*tg, false, std::span<const int32_t>(&own, 1));
  ASSERT_TRUE(with_own.accept('{'));
  with_own.fill_mask(after);
  EXPECT_TRUE(has(after, 'y'));
  EXPECT_FALSE(has(after, own));  // a stop, so not where the match cannot end, text or not
  EXPECT_FALSE(with_own.accept(own));
  ASSERT_TRUE(with_own.accept('}'));
  with_own.fill_mask(after);
  EXPECT_TRUE(has(after, own));
  EXPECT_TRUE(has(after, stop));
}

std::unique_ptr<Tokenizer> hf_tokenizer(const std::string& dir) {
  auto tok = load_hf_tokenizer(dir);
  EXPECT_TRUE(tok.ok()) << tok.status().message();
  return tok.ok() ? std::move(tok).value() : nullptr;
}

TEST(TokenMasks, JsonOverLlama3AndQwen3MatchTheByteMatcher) {
  PAGODA_TEST_FILE(llama3, "tokenizers/llama3/tokenizer.json");
  PAGODA_TEST_FILE(qwen3, "tokenizers/qwen3/tokenizer.json");
  auto g = compile_gbnf(kJsonGbnf);
  ASSERT_NE(g, nullptr);
  for (const std::string& file : {llama3, qwen3}) {
    auto tok = hf_tokenizer(file.substr(0, file.rfind('/')));
    ASSERT_NE(tok, nullptr);
    auto vocab = TokenVocabulary::of(*tok, tok->vocab_size());
    auto tg = TokenGrammar::compile(g, vocab);
    ASSERT_TRUE(tg.ok()) << tg.status().message();
    for (uint32_t seed = 1; seed <= 3; ++seed) walk_and_check(*tg, false, 25, seed, seed != 1);
  }
}

TEST(TokenMasks, Stories260KDropsTheFirstLeadingSpaceAsTheDetokenizerDoes) {
  PAGODA_TEST_FILE(path, "stories260K/stories260K.gguf");
  auto gguf = GgufFile::open(path);
  ASSERT_TRUE(gguf.ok()) << gguf.status().message();
  auto tok = load_gguf_tokenizer(**gguf);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  ASSERT_TRUE((*tok)->decode_strips_leading_space());
  auto vocab = TokenVocabulary::of(**tok, (*tok)->vocab_size());
  auto g = compile_gbnf(R"(root ::= "Once" (" upon" | " a" | " time" | [a-z ]+)* "." )");
  ASSERT_NE(g, nullptr);
  auto tg = TokenGrammar::compile(g, vocab);
  ASSERT_TRUE(tg.ok()) << tg.status().message();
  // "▁Once" is allowed first only because its space is dropped; after prompt text it is not.
  int32_t once = -1;
  for (int32_t id = 0; id < vocab->size(); ++id) {
    if (vocab->bytes(id) == " Once") once = id;
  }
  ASSERT_GE(once, 0);
  std::vector<uint64_t> mask(vocab->mask_words());
  TokenMatcher first(*tg, true), later(*tg, false);
  first.fill_mask(mask);
  EXPECT_TRUE(has(mask, once));
  later.fill_mask(mask);
  EXPECT_FALSE(has(mask, once));
  EXPECT_FALSE(later.accept(once));
  EXPECT_TRUE(first.accept(once));
  for (uint32_t seed = 1; seed <= 10; ++seed) {
    walk_and_check(*tg, true, 20, seed, seed % 2 == 0);
    walk_and_check(*tg, false, 20, seed, seed % 2 == 0);
  }
  auto json = compile_gbnf(kJsonGbnf);
  auto tj = TokenGrammar::compile(json, vocab);
  ASSERT_TRUE(tj.ok()) << tj.status().message();
  for (uint32_t seed = 1; seed <= 10; ++seed) walk_and_check(*tj, true, 40, seed, seed % 2 == 0);
}

}  // namespace
}  // namespace pagoda::structured
