// `pagoda bench serve`: vLLM's `vllm bench serve` against any OpenAI-compatible server: build a
// dataset, send it at a request rate (Poisson, or gamma with --burstiness) under an optional
// concurrency cap, streaming, and report throughput and TTFT / TPOT / ITL / E2E latency.
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>

#include "apps/pagoda/bench/load_client.h"
#include "apps/pagoda/bench/prompt_file.h"
#include "apps/pagoda/commands.h"

namespace pagoda::app {

void BenchServeFlags::add_to(CLI::App& cmd) {
  cmd.add_option("--base-url", base_url, "the server, http://HOST:PORT")->capture_default_str();
  cmd.add_option("--endpoint", endpoint, "/v1/completions or /v1/chat/completions")->capture_default_str();
  cmd.add_option("--model", model, "the model name to send (default: the server's first)");
  cmd.add_option("--api-key", api_key, "sent as 'Authorization: Bearer KEY' (default: $OPENAI_API_KEY)");
  cmd.add_option("--dataset-name", dataset_name, "random, or jsonl (with --dataset-path)")->capture_default_str();
  cmd.add_option("--dataset-path", dataset_path, "jsonl: one {\"prompt\": ...} per line (optional \"output_len\")");
  cmd.add_option("--random-input-len", random_input_len, "prompt tokens per request")->capture_default_str();
  cmd.add_option("--random-output-len", random_output_len, "output tokens per request")->capture_default_str();
  cmd.add_option("--random-range-ratio", random_range_ratio,
                 "lengths drawn uniformly from [len * (1 - r), len * (1 + r)]")
      ->capture_default_str();
  cmd.add_option("--random-prefix-len", random_prefix_len, "tokens of a prefix every prompt shares")
      ->capture_default_str();
  cmd.add_option("--num-prompts", num_prompts, "requests to send")->capture_default_str();
  cmd.add_option("--request-rate", request_rate, "requests per second, or inf (all at once)")->capture_default_str();
  cmd.add_option("--burstiness", burstiness, "gamma shape of the arrival gaps (1 = Poisson)")->capture_default_str();
  cmd.add_option("--max-concurrency", max_concurrency, "most requests in flight (0 = no cap)")->capture_default_str();
  cmd.add_flag("--ignore-eos", ignore_eos, "ask the server to ignore EOS (exact output lengths)");
  cmd.add_option("--seed", seed, "seed of the dataset and the arrivals")->capture_default_str();
  cmd.add_option("--goodput", goodput, "goals as KEY:MS (ttft, tpot, e2el), e.g. ttft:500 tpot:50");
  cmd.add_option("--percentile-metrics", percentile_metrics, "metrics to report: ttft,tpot,itl,e2el")
      ->capture_default_str();
  cmd.add_option("--metric-percentiles", metric_percentiles, "percentiles to report, e.g. 50,90,99")
      ->capture_default_str();
  cmd.add_option("--save-result", save_result, "write the summary and every request's timings here (JSON)");
  cmd.add_flag("--disable-progress", disable_progress, "no progress bar");
}

namespace {

using nlohmann::json;

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, sep)) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

struct Prompt {
  json prompt;             // text, or token ids
  int64_t output_len = 0;
};

// Token ids that exist in the server's vocabulary: the tokenization of a stretch of ordinary
// text, from the server's own /tokenize (so any OpenAI-compatible server with that route works).
Result<std::vector<int64_t>> vocabulary_sample(const bench::Target& t, const std::string& model) {
  static const char* kText =
      "The quick brown fox jumps over the lazy dog. Once upon a time, in a small village by the sea, "
      "there lived an old fisherman and his three daughters. Every morning they walked to the harbour, "
      "mended their nets, and told each other stories about distant lands, strange animals, and ships "
      "that sailed beyond the edge of the world. Numbers like 42, 1999 and 3.14159 appeared in them too.";
  json req = {{"prompt", kText}, {"add_special_tokens", false}};
  if (!model.empty()) req["model"] = model;
  PAGODA_ASSIGN_OR_RETURN(bench::SimpleResponse r, bench::simple_request(t, "POST", "/tokenize", req.dump()));
  const json j = json::parse(r.body, nullptr, false);
  if (r.status != 200 || j.is_discarded() || !j.contains("tokens") || !j["tokens"].is_array()) {
    return unavailable("the random dataset needs the server's /tokenize route; it answered HTTP " +
                       std::to_string(r.status));
  }
  std::set<int64_t> ids;
  for (const json& id : j["tokens"]) {
    if (id.is_number_integer()) ids.insert(id.get<int64_t>());
  }
  if (ids.empty()) return unavailable("/tokenize returned no tokens");
  return std::vector<int64_t>(ids.begin(), ids.end());
}

Result<std::string> detokenize(const bench::Target& t, const json& ids) {
  PAGODA_ASSIGN_OR_RETURN(bench::SimpleResponse r, bench::simple_request(t, "POST", "/detokenize", json{{"tokens", ids}}.dump()));
  const json j = json::parse(r.body, nullptr, false);
  if (r.status != 200 || j.is_discarded() || !j.contains("prompt")) {
    return unavailable("/detokenize answered HTTP " + std::to_string(r.status));
  }
  return j["prompt"].get<std::string>();
}

// vLLM's random dataset: lengths around the targets, token ids drawn from the vocabulary, an
// optional shared prefix. Completions get the ids themselves (exact prompt lengths); chat gets
// their text.
Result<std::vector<Prompt>> random_dataset(const BenchServeFlags& f, const bench::Target& t, bool chat) {
  PAGODA_ASSIGN_OR_RETURN(std::vector<int64_t> vocab, vocabulary_sample(t, f.model));
  std::mt19937_64 rng(f.seed);
  std::uniform_int_distribution<size_t> pick(0, vocab.size() - 1);
  auto length = [&](int64_t len) {
    const auto lo = static_cast<int64_t>(std::floor(static_cast<double>(len) * (1 - f.random_range_ratio)));
    const auto hi = static_cast<int64_t>(std::ceil(static_cast<double>(len) * (1 + f.random_range_ratio)));
    return std::uniform_int_distribution<int64_t>(std::max<int64_t>(lo, 1), std::max<int64_t>(hi, 1))(rng);
  };
  json prefix = json::array();
  for (int64_t i = 0; i < f.random_prefix_len; ++i) prefix.push_back(vocab[pick(rng)]);
  std::vector<Prompt> out;
  for (int64_t n = 0; n < f.num_prompts; ++n) {
    Prompt p;
    json ids = prefix;
    const int64_t in = length(f.random_input_len);
    for (int64_t i = 0; i < in; ++i) ids.push_back(vocab[pick(rng)]);
    p.output_len = length(f.random_output_len);
    if (chat) {
      PAGODA_ASSIGN_OR_RETURN(std::string text, detokenize(t, ids));
      p.prompt = text;
    } else {
      p.prompt = std::move(ids);
    }
    out.push_back(std::move(p));
  }
  return out;
}

Result<std::vector<Prompt>> jsonl_dataset(const BenchServeFlags& f) {
  PAGODA_ASSIGN_OR_RETURN(auto prompts, bench::read_prompt_file(f.dataset_path, f.num_prompts, f.random_output_len));
  std::vector<Prompt> out;
  for (bench::FilePrompt& p : prompts) out.push_back(Prompt{std::move(p.prompt), p.output_len});
  return out;
}

void progress(size_t done, size_t total) {
  const int width = 40;
  const int filled = static_cast<int>(static_cast<double>(done) / static_cast<double>(total) * width);
  std::fprintf(stderr, "\r[%.*s%*s] %zu/%zu requests", filled, "========================================",
               width - filled, "", done, total);
  if (done == total) std::fprintf(stderr, "\n");
}

}  // namespace

int run_bench_serve(const BenchServeFlags& f) {
  if (f.num_prompts < 1) return fail(invalid_argument("--num-prompts must be at least 1"));
  if (f.random_input_len < 1 || f.random_output_len < 1 || f.random_prefix_len < 0) {
    return fail(invalid_argument("--random-input-len and --random-output-len must be >= 1, --random-prefix-len >= 0"));
  }
  if (f.random_range_ratio < 0 || f.random_range_ratio >= 1) return fail(invalid_argument("--random-range-ratio must be in [0, 1)"));
  if (!(f.burstiness > 0)) return fail(invalid_argument("--burstiness must be > 0"));
  const bool chat = f.endpoint == "/v1/chat/completions";
  if (!chat && f.endpoint != "/v1/completions") {
    return fail(invalid_argument("--endpoint must be /v1/completions or /v1/chat/completions"));
  }
  double rate = std::numeric_limits<double>::infinity();
  if (f.request_rate != "inf") {
    char* end = nullptr;
    rate = std::strtod(f.request_rate.c_str(), &end);
    if (*end != '\0' || !(rate > 0)) return fail(invalid_argument("--request-rate must be > 0 or inf"));
  }
  bench::Goals goals;
  for (const std::string& g : f.goodput) {
    const size_t colon = g.find(':');
    const std::string key = g.substr(0, colon);
    char* end = nullptr;
    const double ms = colon == std::string::npos ? -1 : std::strtod(g.c_str() + colon + 1, &end);
    if ((key != "ttft" && key != "tpot" && key != "e2el") || !(ms > 0) || (end && *end != '\0')) {
      return fail(invalid_argument("--goodput takes KEY:MS with KEY ttft, tpot or e2el, got '" + g + "'"));
    }
    goals[key] = ms;
  }
  std::vector<double> percentiles;
  for (const std::string& p : split(f.metric_percentiles, ',')) {
    char* end = nullptr;
    const double v = std::strtod(p.c_str(), &end);
    if (*end != '\0' || v < 0 || v > 100) return fail(invalid_argument("--metric-percentiles: '" + p + "' is not in [0, 100]"));
    percentiles.push_back(v);
  }
  const std::vector<std::string> shown = split(f.percentile_metrics, ',');
  for (const std::string& m : shown) {
    if (m != "ttft" && m != "tpot" && m != "itl" && m != "e2el") {
      return fail(invalid_argument("--percentile-metrics: unknown metric '" + m + "'"));
    }
  }

  auto target = bench::parse_base_url(f.base_url);
  if (!target.ok()) return fail(target.status());
  target->path = f.endpoint;
  std::string key = f.api_key;
  if (key.empty()) {
    if (const char* env = std::getenv("OPENAI_API_KEY")) key = env;
  }
  if (!key.empty()) target->headers.emplace_back("Authorization", "Bearer " + key);

  std::string model = f.model;
  if (model.empty()) {
    auto models = bench::simple_request(*target, "GET", "/v1/models", "");
    if (!models.ok()) return fail(models.status());
    const json j = json::parse(models->body, nullptr, false);
    if (models->status != 200 || j.is_discarded() || !j.contains("data") || j["data"].empty()) {
      return fail(unavailable("GET /v1/models answered HTTP " + std::to_string(models->status) + "; pass --model"));
    }
    model = j["data"][0].value("id", std::string());
  }

  Result<std::vector<Prompt>> prompts = f.dataset_name == "random" ? random_dataset(f, *target, chat)
                                        : f.dataset_name == "jsonl"
                                            ? jsonl_dataset(f)
                                            : Result<std::vector<Prompt>>(invalid_argument("--dataset-name must be random or jsonl"));
  if (!prompts.ok()) return fail(prompts.status());

  std::vector<std::string> bodies;
  for (const Prompt& p : *prompts) {
    json body = {{"model", model}, {"max_tokens", p.output_len}, {"temperature", 0}, {"stream", true},
                 {"stream_options", {{"include_usage", true}}}};
    if (f.ignore_eos) body["ignore_eos"] = true;
    if (chat) {
      body["messages"] = json::array({{{"role", "user"}, {"content", p.prompt}}});
    } else {
      body["prompt"] = p.prompt;
    }
    bodies.push_back(body.dump());
  }
  const std::vector<double> arrivals =
      bench::arrival_times(static_cast<int64_t>(bodies.size()), rate, f.burstiness, f.seed);

  std::fprintf(stderr, "Traffic: %zu requests to %s%s, request rate %s, burstiness %g, max concurrency %s\n",
               bodies.size(), f.base_url.c_str(), f.endpoint.c_str(), f.request_rate.c_str(), f.burstiness,
               f.max_concurrency > 0 ? std::to_string(f.max_concurrency).c_str() : "none");
  bench::LoadOptions lo;
  lo.max_concurrency = f.max_concurrency;
  if (!f.disable_progress) lo.on_done = [total = bodies.size()](size_t done) { progress(done, total); };
  // The server's speculative-decoding counters around the run (vLLM's names; none from a server
  // without them).
  const auto spec_counters = [&] {
    auto m = bench::simple_request(*target, "GET", "/metrics", "");
    return m.ok() && m->status == 200 ? bench::parse_spec_decode_counters(m->body) : bench::SpecDecodeCounters{};
  };
  const bench::SpecDecodeCounters spec_before = spec_counters();
  double duration = 0;
  const std::vector<bench::RequestRecord> records = bench::run_load(*target, bodies, arrivals, lo, &duration);
  const bench::ServeSummary s = bench::summarize(records, duration, percentiles, goals);
  json spec_json = json::object();
  const std::string spec_report = bench::format_spec_decode(spec_before, spec_counters(), &spec_json);
  std::printf("%s%s", bench::format_summary(s, shown).c_str(), spec_report.c_str());
  for (const auto& r : records) {
    if (!r.success) {
      std::fprintf(stderr, "first failure: %s\n", r.error.c_str());
      break;
    }
  }
  if (!f.save_result.empty()) {
    json j = bench::summary_json(s, records);
    j["model_id"] = model;
    j["endpoint"] = f.endpoint;
    j["request_rate"] = f.request_rate;
    j["burstiness"] = f.burstiness;
    j["max_concurrency"] = f.max_concurrency;
    j["num_prompts"] = bodies.size();
    j.update(spec_json);
    std::ofstream out(f.save_result);
    out << j.dump(2) << "\n";
    if (!out) return fail(Status(StatusCode::kIoError, f.save_result + ": cannot write"));
  }
  return s.failed == 0 ? 0 : 1;
}

}  // namespace pagoda::app
