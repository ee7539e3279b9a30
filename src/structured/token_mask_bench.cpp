// Token-mask micro-benchmark (docs/benchmarks.md): the cost of TokenMatcher::fill_mask per token of
// one sequence, on real 128k-152k vocabularies, replaying documents a model could have written
// (each encoded by the real tokenizer, so every token is one the mask allows), and the cost of
// compiling each grammar against the vocabulary.
//
//   token_mask_bench [tokenizers folder]   (default: ../shared/models/tokenizers, or
//                                           $PAGODA_TEST_DATA/tokenizers)
//
// Each document is replayed 7 times, each time by a new matcher (as a new request would); the
// figures are medians over the replays of each replay's median, 90th percentile and largest step.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "structured/json_schema.h"
#include "structured/token_grammar.h"
#include "tokenizer/tokenizer.h"

namespace pagoda::structured {
namespace {

using Clock = std::chrono::steady_clock;

double us_since(Clock::time_point t) { return std::chrono::duration<double, std::micro>(Clock::now() - t).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

// A function call's arguments and a record with nesting, as a model would write them, and schemas
// they satisfy.
constexpr const char* kCall =
    R"({"location": "San Francisco, CA", "unit": "celsius", "days": 5, "include_hourly": false})";
constexpr const char* kCallSchema = R"({"type": "object", "properties": {
    "location": {"type": "string", "description": "City and state"},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 16},
    "include_hourly": {"type": "boolean"}},
  "required": ["location", "unit", "days", "include_hourly"], "additionalProperties": false})";
constexpr const char* kRecord = R"({
  "name": "Ada Lovelace",
  "born": 1815,
  "fields": ["mathematics", "computing"],
  "notes": "Wrote the first algorithm intended for a machine: \"Note G\".",
  "address": {"city": "London", "postcode": "W1", "lat": 51.5072, "lon": -0.1276},
  "verified": true,
  "tags": [{"k": "era", "v": "Victorian"}, {"k": "lang", "v": "en"}]
})";
constexpr const char* kRecordSchema = R"({"type": "object", "properties": {
    "name": {"type": "string", "minLength": 1},
    "born": {"type": "integer"},
    "fields": {"type": "array", "items": {"type": "string"}},
    "notes": {"type": "string"},
    "address": {"type": "object", "properties": {"city": {"type": "string"}, "postcode": {"type": "string"},
                "lat": {"type": "number"}, "lon": {"type": "number"}}, "required": ["city", "lat", "lon"]},
    "verified": {"type": "boolean"},
    "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}, "maxItems": 10}},
  "required": ["name", "born", "fields", "notes", "address", "verified", "tags"],
  "$defs": {"tag": {"type": "object", "properties": {"k": {"type": "string"}, "v": {"type": "string"}},
                    "required": ["k", "v"]}}})";

struct Case {
  std::string name;
  Grammar grammar;
  std::vector<const char*> documents;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  out.push_back({"json_object", json_object_grammar(), {kCall, kRecord}});
  auto call = json_schema_grammar(nlohmann::ordered_json::parse(kCallSchema));
  auto record = json_schema_grammar(nlohmann::ordered_json::parse(kRecordSchema));
  if (!call.ok() || !record.ok()) {
    std::fprintf(stderr, "%s\n", (call.ok() ? record.status() : call.status()).message().c_str());
    std::exit(1);
  }
  out.push_back({"function-call schema", std::move(*call), {kCall}});
  out.push_back({"record schema", std::move(*record), {kRecord}});
  return out;
}

int run(const std::string& dir) {
  for (const char* name : {"llama3", "qwen3"}) {
    auto tok = load_hf_tokenizer(dir + "/" + name);
    if (!tok.ok()) {
      std::fprintf(stderr, "%s: %s\n", name, tok.status().message().c_str());
      return 1;
    }
    auto vocab = TokenVocabulary::of(**tok, (*tok)->vocab_size());
    for (Case& c : cases()) {
      auto compiled = std::make_shared<const CompiledGrammar>(std::move(c.grammar));
      std::vector<double> compile_ms;
      std::shared_ptr<const TokenGrammar> tg;
      for (int r = 0; r < 5; ++r) {
        const Clock::time_point t = Clock::now();
        auto result = TokenGrammar::compile(compiled, vocab);
        compile_ms.push_back(us_since(t) / 1000);
        if (!result.ok()) {
          std::fprintf(stderr, "%s\n", result.status().message().c_str());
          return 1;
        }
        tg = *result;
      }
      const TokenGrammar::Stats& st = tg->stats();
      std::printf("%s, vocabulary %d, grammar %s: compile %.1f ms (median of 5); %lld positions, %lld accepted ids "
                  "listed, %lld uncertain (%lld suffixes)\n",
                  name, vocab->size(), c.name.c_str(), median(compile_ms), static_cast<long long>(st.positions),
                  static_cast<long long>(st.accepted), static_cast<long long>(st.uncertain),
                  static_cast<long long>(st.suffixes));
      std::vector<uint64_t> mask(vocab->mask_words());
      for (const char* doc : c.documents) {
        const std::vector<TokenId> ids = (*tok)->encode(doc, false);
        std::vector<double> med, p90, worst;
        for (int r = 0; r < 7; ++r) {
          TokenMatcher m(tg, false);
          std::vector<double> steps;
          for (TokenId id : ids) {
            const Clock::time_point t = Clock::now();
            m.fill_mask(mask);
            steps.push_back(us_since(t));
            if (!((mask[static_cast<size_t>(id) / 64] >> (id % 64)) & 1) || !m.accept(id)) {
              std::fprintf(stderr, "token %d of the document is not allowed\n", id);
              return 1;
            }
          }
          med.push_back(median(steps));
          p90.push_back(percentile(steps, 0.9));
          worst.push_back(*std::max_element(steps.begin(), steps.end()));
        }
        std::printf("  %zu-token document: fill_mask median %.1f us, p90 %.1f us, max %.1f us\n", ids.size(),
                    median(med), median(p90), median(worst));
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace pagoda::structured

int main(int argc, char** argv) {
  std::string dir = "../shared/models/tokenizers";
  if (const char* env = std::getenv("PAGODA_TEST_DATA"); env && *env) dir = std::string(env) + "/tokenizers";
  if (argc > 1) dir = argv[1];
  return pagoda::structured::run(dir);
}
