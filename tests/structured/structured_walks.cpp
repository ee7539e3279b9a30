// The structured-output property test, first half: random JSON schemas, and random walks through
// their token masks. validate.mjs (the second half) checks every walk that ended with a stop token
// against its schema with ajv, a validator written apart from ours; this program checks that the
// masks never lead to a dead end (an allowed token after which nothing is allowed and the text
// cannot end) and that every token a mask allows is accepted.
//
// The walks: a "dummy model" that picks at random among the allowed tokens, over the real Llama 3
// and Qwen3 vocabularies (128k and 152k ids; the Qwen3 model's logits are longer than its
// tokenizer, as Qwen's are) and stories260K's (SentencePiece, with the leading-space rule); and
// stories260K itself through the engine (LLM::generate, temperature 1, seeded: the model's own
// choices among the allowed tokens, which no bias helps to finish).
//
//   structured_walks --out walks.jsonl [--seed 1] [--schemas 40] [--engine-every 1]
//
// (ctest runs seed 1 with 120 schemas: tests/structured/CMakeLists.txt.)
//
// One JSON line per walk: {"schema", "output", "stopped", "vocabulary", ...}. Exits 77 (ctest's
// skip) when the test data is missing, 1 instead where CI or PAGODA_REQUIRE_TEST_DATA says it must
// be there (tests/support/test_data.h), and 1 on a dead end or a refused allowed token.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "engine/llm.h"
#include "launch/model_loading.h"
#include "structured/json_schema.h"
#include "structured/token_grammar.h"
#include "support/test_data.h"
#include "tokenizer/tokenizer.h"

namespace pagoda {
namespace {

using json = nlohmann::ordered_json;

// --- Random schemas. ---
//
// Only what json_schema.h supports, and only where it says our reading and JSON Schema's agree:
// oneOf is compiled as anyOf, so its branches here have different types and cannot both match;
// patterns keep to the syntax regex_grammar.h says it shares with ECMAScript (ajv compiles them
// with the "u" flag). Sizes stay small so that most walks can close every bracket in time.
class SchemaMaker {
 public:
  explicit SchemaMaker(uint64_t seed) : rng_(seed) {}

  json make() {
    defs_ = json::object();
    nodes_ = 0;
    json root;
    const int r = pick(10);
    if (r < 7) {
      root = object(0, true);
    } else if (r == 7) {
      root = array(0);
    } else if (r == 8) {
      root = chance(0.5) ? any_of(0) : one_of(0);
    } else {
      root = any(0);
    }
    if (!defs_.empty()) {
      if (!root.is_object()) root = json{{"anyOf", json::array({root})}};
      root["$defs"] = defs_;
    }
    return root;
  }

 private:
  int pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }
  int between(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  bool chance(double p) { return std::bernoulli_distribution(p)(rng_); }
  template <typename T>
  T one(const std::vector<T>& v) {
    return v[static_cast<size_t>(pick(static_cast<int>(v.size())))];
  }

  // Any schema; deep or after many nodes, a scalar one.
  json any(int depth) {
    ++nodes_;
    if (depth >= 3 || nodes_ > 24) return scalar();
    switch (pick(16)) {
      case 0:
      case 1: return object(depth, false);
      case 2:
      case 3: return array(depth);
      case 4: return any_of(depth);
      case 5: return one_of(depth);
      case 6: return type_list();
      case 7:
      case 8: return ref(depth);
      case 9: return chance(0.5) ? json(true) : json::object();  // any value
      default: return scalar();
    }
  }

  json scalar() {
    switch (pick(9)) {
      case 0:
      case 1: return string();
      case 2: return integer();
      case 3: return number();
      case 4: return json{{"type", "boolean"}};
      case 5: return json{{"type", "null"}};
      case 6: return enumeration();
      case 7: return json{{"const", literal()}};
      default: return string();
    }
  }

  // A schema of the one JSON type `type`, saying so (oneOf's branches).
  json typed(const std::string& type, int depth) {
    if (type == "object") return object(depth, false);
    if (type == "array") return array(depth);
    if (type == "string") return string();
    if (type == "integer") return integer();
    return json{{"type", type}};
  }

  json string() {
    json s{{"type", "string"}};
    switch (pick(6)) {
      case 0: break;
      case 1:
      case 2: {
        const int min = pick(4);
        if (chance(0.8)) s["minLength"] = min;
        if (chance(0.8)) s["maxLength"] = min + pick(8);
        break;
      }
      case 3:
      case 4: s["pattern"] = pattern(); break;
      default:
        s["format"] = one<std::string>({"date", "time", "date-time", "email", "uuid", "ipv4", "hostname", "uri"});
    }
    return s;
  }

  // A regular expression of that shared syntax: literals, classes (negated and non-ASCII ones
  // too), the class escapes, '.', groups with alternation, every quantifier, anchors or none.
  std::string pattern() {
    int groups = 0;  // (named groups take fresh names: ECMAScript refuses a name twice)
    auto piece = [&]() {
      static const std::vector<std::string> kAtoms = {
          "a",      "xy",     "_-",      "0",     "[a-z]",   "[A-Z0-9]", "[0-9a-f]", "[^a-z]", "[α-ω]",
          "[aeiou_]", "[^\"\\\\]", "\\d",   "\\w",   "\\s",     "\\D",      "\\W",      "\\S",    ".",
          "\\.",    "\\u00e9", "\\x41",   "é",     "(ab|cd)", "(?:x|yz|\\d{2})", "(?<n>q|rs)", "[-+]"};
      static const std::vector<std::string> kQuantifiers = {"",   "",      "",      "?",     "*",  "+",
                                                            "{2}", "{1,3}", "{0,2}", "{2,}", "+?", "{1,2}?"};
      std::string atom = one(kAtoms);
      if (atom.rfind("(?<n>", 0) == 0) atom.insert(4, std::to_string(++groups));
      return atom + one(kQuantifiers);
    };
    auto sequence = [&]() {
      std::string s;
      for (int i = between(1, 3); i > 0; --i) s += piece();
      return s;
    };
    std::string p = sequence();
    if (chance(0.15)) p += "|" + sequence();  // ('^' then anchors the first branch only, '$' the last)
    if (chance(0.5)) p = "^" + p;
    if (chance(0.5)) p += "$";
    return p;
  }

  // Bounds on integers, fractional ones included (they round inward).
  json integer() {
    json s{{"type", "integer"}};
    bounds(s, true);
    return s;
  }

  // Bounds on numbers: whole numbers only (json_schema.h), sometimes written as 5.0.
  json number() {
    json s{{"type", "number"}};
    bounds(s, false);
    return s;
  }

  void bounds(json& s, bool integer) {
    const int64_t unit = chance(0.2) ? 10000000 : 1;  // (large bounds too, within doubles' exact integers)
    const int64_t lo = between(-100, 100) * unit;
    const int64_t hi = lo + between(2, 150) * unit;
    auto value = [&](int64_t v) {
      if (integer && chance(0.2)) return json(static_cast<double>(v) + 0.5);
      if (!integer && chance(0.2)) return json(static_cast<double>(v));
      return json(v);
    };
    const int shape = pick(5);
    if (shape == 0) return;
    if (shape != 2) s[chance(0.3) ? "exclusiveMinimum" : "minimum"] = value(lo);
    if (shape != 1) s[chance(0.3) ? "exclusiveMaximum" : "maximum"] = value(hi);
  }

  // A JSON value for enum and const: strings that need escaping, numbers, and small containers.
  json literal() {
    switch (pick(8)) {
      case 0: return one<std::string>({"red", "a b", "", "é", "quo\"te", "back\\slash", "tab\there", "日本", "😀"});
      case 1: return between(-20, 1000);
      case 2: return one<double>({1.5, -0.25, 3.125, 1e-3});
      case 3: return chance(0.5);
      case 4: return nullptr;
      case 5: return json::array({between(0, 9), "x"});
      case 6: return json{{"k", between(0, 9)}, {"flag", chance(0.5)}};
      default: return one<std::string>({"alpha", "beta", "gamma"});
    }
  }

  json enumeration() {
    json values = json::array();
    for (int i = between(1, 5); i > 0; --i) values.push_back(literal());
    json s{{"enum", values}};
    // With a type beside it, only the values of that type match (ours drops the others).
    if (chance(0.3)) {
      values.push_back("typed");
      s = json{{"type", "string"}, {"enum", values}};
    }
    return s;
  }

  json any_of(int depth) {
    json branches = json::array();
    for (int i = between(2, 3); i > 0; --i) branches.push_back(any(depth + 1));
    return json{{"anyOf", branches}};
  }

  // Branches of different types, so that no value matches two (see the class comment).
  json one_of(int depth) {
    std::vector<std::string> types = {"string", "integer", "boolean", "null", "object", "array"};
    std::shuffle(types.begin(), types.end(), rng_);
    json branches = json::array();
    for (int i = between(2, 3); i > 0; --i) branches.push_back(typed(types[static_cast<size_t>(i)], depth + 1));
    return json{{"oneOf", branches}};
  }

  // A list of types, with keywords for some of them.
  json type_list() {
    switch (pick(5)) {
      case 0: return json{{"type", {"string", "null"}}, {"maxLength", between(0, 6)}};
      case 1: return json{{"type", {"integer", "string"}}, {"minimum", between(-5, 5)}, {"maxLength", 4}};
      case 2: return json{{"type", {"array", "null"}}, {"items", {{"type", "boolean"}}}, {"maxItems", 3}};
      case 3: return json{{"type", {"integer", "number"}}, {"maximum", 10}};
      default: return json{{"type", {"boolean", "null", "number"}}};
    }
  }

  json object(int depth, bool root) {
    static const std::vector<std::string> kNames = {"id",   "name", "value", "tags", "a b", "ключ", "q\"t",
                                                    "x-1",  "😀",   "",      "n/m",  "tab\t", "é", "count"};
    json s{{"type", "object"}};
    const int n = root ? between(1, 5) : pick(4);
    if (n == 0 && chance(0.5)) {
      // No properties: any members (of any value, or of one schema).
      if (chance(0.5)) s["additionalProperties"] = scalar();
      return s;
    }
    std::vector<std::string> names = kNames;
    std::shuffle(names.begin(), names.end(), rng_);
    json properties = json::object();
    json required = json::array();
    for (int i = 0; i < n; ++i) {
      const std::string& name = names[static_cast<size_t>(i)];
      properties[name] = any(depth + 1);
      if (chance(0.6)) required.push_back(name);
    }
    // The whole schema again, optionally: recursion through "#" (its base case: leave it out).
    if (root && chance(0.2)) properties["child"] = json{{"$ref", "#"}};
    s["properties"] = properties;
    if (!required.empty()) s["required"] = required;
    const int extra = pick(20);
    if (extra < 11) {
      s["additionalProperties"] = false;
    } else if (extra < 15) {
      // (absent beside properties: false, in json_schema.h's reading; JSON Schema allows more)
    } else if (extra < 19) {
      s["additionalProperties"] = scalar();
    } else {
      s["additionalProperties"] = true;
    }
    return s;
  }

  json array(int depth) {
    json s{{"type", "array"}};
    int held = -1;  // how many items the array can hold at most, -1 any number
    if (chance(0.3)) {
      json prefix = json::array();
      const int k = between(1, 3);
      for (int i = 0; i < k; ++i) prefix.push_back(any(depth + 1));
      s["prefixItems"] = prefix;
      const int rest = pick(3);
      if (rest == 0) {
        s["items"] = false;
        held = k;
      } else if (rest == 1) {
        s["items"] = any(depth + 1);
      } else {
        held = k;  // (items absent: ours writes the prefix only)
      }
    } else {
      s["items"] = any(depth + 1);
    }
    const int min = pick(3);
    if (chance(0.5)) s["minItems"] = held < 0 ? min : std::min(min, held);
    if (chance(0.6)) s["maxItems"] = (s.contains("minItems") ? s["minItems"].get<int>() : 0) + pick(4);
    return s;
  }

  // A reference into $defs, making the definition on first use: plain ones and recursive ones,
  // each with a base case the walk reaches by choice (null, an empty or absent list, a number).
  json ref(int depth) {
    static const std::vector<std::string> kDefs = {"leaf", "list", "tree", "expr"};
    const std::string name = one(kDefs);
    if (!defs_.contains(name)) {
      defs_[name] = json::object();  // (taken, so that the definition's own references stop here)
      if (name == "leaf") {
        defs_[name] = depth < 2 ? object(2, false) : scalar();
      } else if (name == "list") {
        defs_[name] = json{{"type", "object"},
                           {"properties",
                            {{"head", scalar()},
                             {"tail", {{"anyOf", {{{"$ref", "#/$defs/list"}}, {{"type", "null"}}}}}}}},
                           {"required", {"head", "tail"}},
                           {"additionalProperties", false}};
      } else if (name == "tree") {
        defs_[name] = json{{"type", "object"},
                           {"properties",
                            {{"label", {{"type", "string"}, {"maxLength", 4}}},
                             {"kids", {{"type", "array"}, {"items", {{"$ref", "#/$defs/tree"}}}, {"maxItems", 2}}}}},
                           {"required", {"label"}}};
      } else {
        // One recursive operand, so that the expected size stays finite.
        defs_[name] = json{
            {"anyOf",
             {{{"type", "integer"}, {"minimum", 0}, {"maximum", 9}},
              {{"type", "array"},
               {"prefixItems", {{{"enum", {"+", "-", "*"}}}, {{"$ref", "#/$defs/expr"}}, {{"type", "integer"}}}},
               {"items", false},
               {"minItems", 3}}}}};
      }
    }
    return json{{"$ref", "#/$defs/" + name}};
  }

  std::mt19937_64 rng_;
  json defs_;
  int nodes_ = 0;
};

// --- Walks. ---

struct Walk {
  std::string text;
  bool stopped = false;
  int steps = 0;
};

// A dummy model: each step fills the mask and picks an allowed token at random, biased so that
// walks finish: a stop token where one is allowed (mostly), else often a token that closes
// something ('"', ']' or '}' first), more often as the walk grows, else mostly a short one. And
// sometimes an escape ('\' first), which a uniform pick among 100k tokens would hardly ever make:
// the control characters and quotes that patterns and key names must treat as JSON spells them.
// Sets `problem` where the mask allows nothing, disagrees with can_end() about stopping, allows a
// token without bytes that is no stop token, or refuses a token it allowed.
Walk dummy_walk(const std::shared_ptr<const structured::TokenGrammar>& tg, uint64_t seed, int max_steps,
                std::string& problem) {
  const structured::TokenVocabulary& vocab = tg->vocabulary();
  structured::TokenMatcher matcher(tg, /*starts_text=*/true);
  std::vector<uint64_t> mask(vocab.mask_words());
  std::mt19937_64 rng(seed);
  std::vector<int32_t> stop_ids = vocab.stop_ids();
  std::sort(stop_ids.begin(), stop_ids.end());
  std::vector<int32_t> stops, closers, escapes, short_ones, all;
  Walk w;
  for (; w.steps < max_steps; ++w.steps) {
    matcher.fill_mask(mask);
    stops.clear(), closers.clear(), escapes.clear(), short_ones.clear(), all.clear();
    for (size_t word = 0; word < mask.size(); ++word) {
      for (uint64_t bits = mask[word]; bits != 0; bits &= bits - 1) {
        const int32_t id = static_cast<int32_t>(word * 64 + static_cast<size_t>(__builtin_ctzll(bits)));
        const std::string& bytes = vocab.bytes(id);
        if (std::binary_search(stop_ids.begin(), stop_ids.end(), id)) {
          stops.push_back(id);
          continue;
        }
        if (bytes.empty()) {
          problem = "the mask allows token " + std::to_string(id) + ", which has no bytes and is no stop token";
          return w;
        }
        all.push_back(id);
        if (bytes[0] == '"' || bytes[0] == ']' || bytes[0] == '}') closers.push_back(id);
        if (bytes[0] == '\\') escapes.push_back(id);
        if (bytes.size() <= 2) short_ones.push_back(id);
      }
    }
    if (stops.empty() && all.empty()) {
      problem = "dead end: the mask allows nothing after the text";
      return w;
    }
    if (!stops.empty() != matcher.can_end()) {
      problem = "the mask " + std::string(stops.empty() ? "refuses" : "allows") + " a stop token where can_end() is " +
                (matcher.can_end() ? "true" : "false");
      return w;
    }
    const double close = 0.2 + 0.6 * w.steps / max_steps;
    std::uniform_real_distribution<double> u(0, 1);
    const std::vector<int32_t>* from = &all;
    if (!stops.empty() && (all.empty() || u(rng) < 0.85)) {
      from = &stops;
    } else if (!closers.empty() && u(rng) < close) {
      from = &closers;
    } else if (!escapes.empty() && u(rng) < 0.1) {
      from = &escapes;
    } else if (!short_ones.empty() && u(rng) < 0.7) {
      from = &short_ones;
    }
    const int32_t token = (*from)[std::uniform_int_distribution<size_t>(0, from->size() - 1)(rng)];
    if (!matcher.accept(token)) {
      problem = "token " + std::to_string(token) + " was allowed but accept() refused it";
      return w;
    }
    if (from == &stops) {
      w.stopped = true;
      ++w.steps;
      return w;
    }
    std::string_view bytes = vocab.bytes(token);
    if (w.text.empty() && w.steps == 0 && vocab.strips_leading_space() && bytes[0] == ' ') bytes.remove_prefix(1);
    w.text += bytes;
  }
  return w;
}

// The line for one walk; false when a stopped output is not UTF-8 (itself a failure).
bool write_line(std::ofstream& out, const json& schema, size_t index, const std::string& vocabulary, bool any_ws,
                uint64_t seed, const std::string& text, bool stopped, int steps) {
  json line{{"schema", schema}, {"index", index}, {"vocabulary", vocabulary}, {"any_whitespace", any_ws},
            {"seed", seed},     {"stopped", stopped}, {"steps", steps}};
  line["output"] = text;
  std::string dumped;
  try {
    dumped = line.dump(-1, ' ', false, json::error_handler_t::strict);
  } catch (const json::exception&) {
    // An unfinished walk may end inside a character; a stopped one may not.
    dumped = line.dump(-1, ' ', false, json::error_handler_t::replace);
    if (stopped) {
      out << dumped << "\n";
      return false;
    }
  }
  out << dumped << "\n";
  return true;
}

struct Vocabulary {
  std::string name;
  std::shared_ptr<const structured::TokenVocabulary> vocab;
};

std::unique_ptr<Tokenizer> hf_tokenizer(const std::string& file) {
  auto tok = load_hf_tokenizer(file.substr(0, file.rfind('/')));
  if (!tok.ok()) {
    std::cerr << "loading " << file << ": " << tok.status().message() << "\n";
    return nullptr;
  }
  return std::move(tok).value();
}

int usage() {
  std::cerr << "usage: structured_walks --out FILE [--seed N] [--schemas N] [--engine-every K]\n";
  return 2;
}

int run(int argc, char** argv) {
  uint64_t seed = 1;
  int schemas = 40;
  int engine_every = 1;  // stories260K through the engine for every K-th schema (0: none)
  const int walks_per_grammar = 2, max_steps = 256, engine_max_tokens = 512;
  std::string out_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return usage();
    const std::string v = argv[++i];
    try {
      if (a == "--seed") {
        seed = std::stoull(v);
      } else if (a == "--schemas") {
        schemas = std::stoi(v);
      } else if (a == "--engine-every") {
        engine_every = std::stoi(v);
      } else if (a == "--out") {
        out_path = v;
      } else {
        return usage();
      }
    } catch (const std::exception&) {  // (not a number)
      return usage();
    }
  }
  if (out_path.empty()) return usage();

  const std::vector<std::string> files = {"tokenizers/llama3/tokenizer.json", "tokenizers/qwen3/tokenizer.json",
                                          "stories260K/stories260K.gguf"};
  std::vector<std::string> paths;
  for (const std::string& f : files) {
    paths.push_back(testing::find_test_file(f));
    if (paths.back().empty()) {
      std::cout << "test data missing: " << testing::test_data_dir() << "/" << f
                << " (set PAGODA_TEST_DATA to the shared/models folder)\n";
      return testing::test_data_required() ? 1 : 77;
    }
  }
  const auto start = std::chrono::steady_clock::now();
  auto llama3 = hf_tokenizer(paths[0]);
  auto qwen3 = hf_tokenizer(paths[1]);
  if (!llama3 || !qwen3) return 1;
  app::ModelFlags flags;
  flags.model = paths[2];
  cpu::register_cpu_backend();
  auto loaded = app::load_model_and_tokenizer(flags);
  if (!loaded.ok()) {
    std::cerr << "loading stories260K: " << loaded.status().message() << "\n";
    return 1;
  }
  std::shared_ptr<const Tokenizer> stories_tok(std::move(loaded->tokenizer));
  auto core = LLMEngine::create(std::move(loaded->model), stories_tok, EngineConfig{});
  if (!core.ok()) {
    std::cerr << "starting the engine: " << core.status().message() << "\n";
    return 1;
  }
  LLM llm(std::move(*core));
  const std::vector<Vocabulary> vocabularies = {
      {"llama3", structured::TokenVocabulary::of(*llama3, llama3->vocab_size())},
      {"qwen3", structured::TokenVocabulary::of(*qwen3, 151936)},  // Qwen3's lm_head rows
      {"stories260K", structured::TokenVocabulary::of(*stories_tok, llm.core().model_config().vocab_size)},
  };
  for (const Vocabulary& v : vocabularies) {
    if (v.vocab->stop_ids().empty()) {
      std::cerr << v.name << ": the vocabulary has no stop token\n";
      return 1;
    }
  }

  std::ofstream out(out_path);
  if (!out) {
    std::cerr << "cannot write " << out_path << "\n";
    return 1;
  }
  SchemaMaker maker(seed);
  int failures = 0, walks = 0, stopped = 0;
  std::vector<GenerateRequest> requests;
  std::vector<std::pair<json, size_t>> request_schemas;
  double compile_seconds = 0;
  for (int i = 0; i < schemas; ++i) {
    const json schema = maker.make();
    const bool any_ws = i % 2 == 0;
    auto fail = [&](const std::string& what, const std::string& text) {
      ++failures;
      std::cerr << "FAIL schema " << i << " (any_whitespace " << any_ws << "): " << what << "\n  schema: "
                << schema.dump() << "\n  text so far: "
                << json(text).dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
    };
    auto grammar = structured::json_schema_grammar(schema, {.any_whitespace = any_ws});
    if (!grammar.ok()) {
      // The maker keeps to what json_schema.h supports, so a refusal is a bug on one side.
      fail("refused: " + grammar.status().message(), "");
      continue;
    }
    auto compiled = std::make_shared<const structured::CompiledGrammar>(std::move(*grammar));
    // One of the large vocabularies (their masks take longest to compile: more schemas in the
    // time, alternating them) and stories260K's; every combination of vocabulary and whitespace.
    for (size_t v : {static_cast<size_t>((i / 2) % 2), size_t{2}}) {
      const Vocabulary& vocab = vocabularies[v];
      const auto t0 = std::chrono::steady_clock::now();
      auto tg = structured::TokenGrammar::compile(compiled, vocab.vocab);
      compile_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!tg.ok()) {
        fail(vocab.name + ": token masks refused: " + tg.status().message(), "");
        continue;
      }
      for (int k = 0; k < walks_per_grammar; ++k) {
        const uint64_t walk_seed = seed * 1000003 + static_cast<uint64_t>(i) * 16 + v * 4 + static_cast<uint64_t>(k);
        std::string problem;
        const Walk w = dummy_walk(*tg, walk_seed, max_steps, problem);
        ++walks;
        stopped += w.stopped;
        if (!problem.empty()) fail(vocab.name + " walk (seed " + std::to_string(walk_seed) + "): " + problem, w.text);
        if (!write_line(out, schema, static_cast<size_t>(i), vocab.name, any_ws, walk_seed, w.text, w.stopped,
                        w.steps)) {
          fail(vocab.name + ": the stopped output is not UTF-8", w.text);
        }
      }
      if (v == 2 && engine_every > 0 && i % engine_every == 0) {
        GenerateRequest r;
        r.prompt = "";  // (BOS only: the output starts the text, so its first space is dropped)
        r.params.temperature = 1.0;
        r.params.max_tokens = engine_max_tokens;
        r.params.seed = seed * 1000003 + static_cast<uint64_t>(i) * 16 + 15;
        r.constraint = GrammarConstraint{*tg, std::nullopt};
        requests.push_back(std::move(r));
        request_schemas.emplace_back(schema, static_cast<size_t>(i));
      }
    }
  }
  const auto walked = std::chrono::steady_clock::now();
  int engine_stopped = 0;
  if (!requests.empty()) {
    auto results = llm.generate(requests);
    if (!results.ok()) {
      std::cerr << "FAIL stories260K through the engine: " << results.status().message() << "\n";
      return 1;
    }
    for (size_t k = 0; k < results->size(); ++k) {
      const CompletionOutput& o = (*results)[k].outputs[0];
      const bool stop = o.finish_reason == FinishReason::kStop;
      ++walks;
      stopped += stop;
      engine_stopped += stop;
      const auto& [schema, index] = request_schemas[k];
      if (!write_line(out, schema, index, "stories260K-engine", index % 2 == 0, *requests[k].params.seed, o.text, stop,
                      static_cast<int>(o.token_ids.size()))) {
        ++failures;
        std::cerr << "FAIL schema " << index << ": the engine's stopped output is not UTF-8\n";
      }
    }
  }
  out.close();
  const auto end = std::chrono::steady_clock::now();
  std::printf(
      "schemas %d, walks %d, stopped %d (stories260K through the engine: %zu walks, %d stopped), failures %d\n"
      "time %.1f s (token masks compiled in %.1f s, engine %.1f s); walks written to %s\n",
      schemas, walks, stopped, requests.size(), engine_stopped, failures,
      std::chrono::duration<double>(end - start).count(), compile_seconds,
      std::chrono::duration<double>(end - walked).count(), out_path.c_str());
  return failures > 0 ? 1 : 0;
}

}  // namespace
}  // namespace pagoda

int main(int argc, char** argv) { return pagoda::run(argc, argv); }
