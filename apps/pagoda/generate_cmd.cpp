// `pagoda generate`: one prompt streamed to stdout, or a JSONL file of requests run as one batch.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "apps/pagoda/commands.h"
#include "apps/pagoda/engine_setup.h"
#include "engine/llm.h"

namespace pagoda::app {

int fail(const Status& status) {
  std::fprintf(stderr, "pagoda: error: %s\n", status.message().c_str());
  return 1;
}

namespace {

void write_out(const std::string& s) {
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fflush(stdout);
}

// One prompt, streamed as it is generated.
int generate_one(const GenerateFlags& f, EngineSetup& setup) {
  GenerateRequest r;
  r.prompt = f.prompt;
  r.add_special_tokens = !f.no_add_special;
  r.params.max_tokens = f.max_tokens;
  r.params.temperature = f.temperature;
  r.params.top_p = f.top_p;
  r.params.top_k = f.top_k;
  r.params.min_p = f.min_p;
  r.params.seed = f.request_seed;
  r.params.ignore_eos = f.ignore_eos;
  EngineCore& core = *setup.core;
  Status st = core.prepare(r);
  if (!st.ok()) return fail(st);
  const auto start = std::chrono::steady_clock::now();
  st = core.add_request(1, r);
  if (!st.ok()) return fail(st);
  OutputChunk last;
  while (core.has_unfinished()) {
    for (OutputChunk& c : core.step()) {
      write_out(c.text);
      if (c.finished()) last = std::move(c);
    }
  }
  if (isatty(STDOUT_FILENO)) write_out("\n");
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double prefill = last.timings.first_token_s;
  const double decode = total - prefill;
  std::fprintf(stderr,
               "prompt tokens: %lld, generated tokens: %lld, prefill: %.1f tokens/s, decode: %.1f tokens/s\n",
               static_cast<long long>(last.prompt_tokens), static_cast<long long>(last.completion_tokens),
               prefill > 0 ? last.prompt_tokens / prefill : 0.0,
               decode > 0 && last.completion_tokens > 1 ? (last.completion_tokens - 1) / decode : 0.0);
  return 0;
}

nlohmann::json output_json(const RequestOutput& r) {
  nlohmann::json j;
  auto one = [](const CompletionOutput& o) {
    return nlohmann::json{{"index", o.index},
                          {"text", o.text},
                          {"token_ids", o.token_ids},
                          {"finish_reason", finish_reason_name(o.finish_reason)}};
  };
  const CompletionOutput& first = r.outputs.at(0);
  j["text"] = first.text;
  j["token_ids"] = first.token_ids;
  j["finish_reason"] = finish_reason_name(first.finish_reason);
  if (r.outputs.size() > 1) {
    for (const auto& o : r.outputs) j["outputs"].push_back(one(o));
  }
  j["usage"] = {{"prompt_tokens", r.prompt_tokens},
                {"completion_tokens", r.completion_tokens},
                {"total_tokens", r.prompt_tokens + r.completion_tokens},
                {"cached_tokens", r.cached_tokens}};
  return j;
}

void progress_bar(size_t done, size_t total) {
  const int width = 30;
  const int filled = total ? static_cast<int>(width * done / total) : width;
  std::fprintf(stderr, "\r[%.*s%*s] %zu/%zu requests", filled, "==============================",
               width - filled, "", done, total);
  if (done == total) std::fputc('\n', stderr);
  std::fflush(stderr);
}

// A JSONL file of requests, one output line per input line, in input order.
int generate_file(const GenerateFlags& f, EngineSetup& setup) {
  std::ifstream in(f.input_file);
  if (!in) return fail(not_found(f.input_file + ": cannot open"));
  std::vector<GenerateRequest> requests;
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return fail(invalid_argument(f.input_file + ":" + std::to_string(line_no) + ": not valid JSON"));
    auto r = request_from_json(j);
    if (!r.ok()) return fail(r.status().with_context(f.input_file + ":" + std::to_string(line_no)));
    if (!j.contains("max_tokens")) r->params.max_tokens = f.max_tokens;
    requests.push_back(std::move(*r));
  }
  LLM llm(std::move(setup.core));
  const bool show_progress = isatty(STDERR_FILENO);
  auto results = llm.generate(std::move(requests), [&](size_t done, size_t total) {
    if (show_progress || done == total) progress_bar(done, total);
  });
  if (!results.ok()) return fail(results.status().with_context(f.input_file));
  std::ofstream file;
  if (!f.output_file.empty()) {
    file.open(f.output_file);
    if (!file) return fail(io_error(f.output_file + ": cannot write"));
  }
  for (const RequestOutput& r : *results) {
    std::string text = output_json(r).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    if (file.is_open()) file << text; else write_out(text);
  }
  return 0;
}

}  // namespace

int run_generate(const GenerateFlags& f) {
  auto setup = make_engine(f.model, f.engine);
  if (!setup.ok()) return fail(setup.status());
  if (f.verbose) std::fprintf(stderr, "%s\n", setup->core->kv_cache_summary().c_str());
  return f.input_file.empty() ? generate_one(f, *setup) : generate_file(f, *setup);
}

}  // namespace pagoda::app
