// `pagoda generate`: one prompt streamed to stdout, or a JSONL file of requests run as one batch.
//
// Both go through the server's request parser (server/openai_request.h): a --prompt is turned
// into the completions body its flags describe, and every line of an --input-file is a
// completions body. So the CLI and the server accept, default, validate and refuse requests by
// the same rules, and offline logprobs come out in the same OpenAI shape.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "apps/pagoda/commands.h"
#include "launch/engine_setup.h"
#include "launch/ranks.h"
#include "base/log.h"
#include "engine/llm.h"
#include "server/openai_request.h"
#include "server/openai_response.h"

namespace pagoda::app {

int fail(const Status& status) {
  std::fprintf(stderr, "pagoda: error: %s\n", status.message().c_str());
  return 1;
}

namespace {

using server::ApiError;
using server::ParsedRequest;

void write_out(const std::string& s) {
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fflush(stdout);
}

// Whether two descriptors write to the same file or pipe (`2>&1`).
bool same_file(int a, int b) {
  struct stat x{}, y{};
  return fstat(a, &x) == 0 && fstat(b, &y) == 0 && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

Result<ParsedRequest> parse(const std::string& body, const server::ModelContext& ctx,
                            server::IgnoredFieldNames& ignored, const std::string& where) {
  server::ApiResult<ParsedRequest> parsed = server::parse_completion_request(body, ctx);
  if (auto* e = std::get_if<ApiError>(&parsed)) return invalid_argument(where + e->message);
  for (const std::string& name : ignored.first_seen(std::get<ParsedRequest>(parsed).ignored_fields)) {
    log_line(LogLevel::kWarning, "generate", where + "ignoring the unknown request field '" + name + "'");
  }
  return std::get<ParsedRequest>(std::move(parsed));
}

// The completions body the --prompt flags describe. Sampling flags that were not given stay
// out, so --generation-config defaults apply to them as they do to a server request.
std::string prompt_body(const GenerateFlags& f) {
  nlohmann::json j = {{"prompt", f.prompt}, {"max_tokens", f.max_tokens}};
  if (f.no_add_special) j["add_special_tokens"] = false;
  if (f.temperature) j["temperature"] = *f.temperature;
  if (f.top_p) j["top_p"] = *f.top_p;
  if (f.top_k) j["top_k"] = *f.top_k;
  if (f.min_p) j["min_p"] = *f.min_p;
  if (f.request_seed) j["seed"] = *f.request_seed;
  if (f.ignore_eos) j["ignore_eos"] = true;
  return j.dump();
}

// One prompt, streamed as it is generated.
int generate_one(const GenerateFlags& f, EngineSetup& setup) {
  server::IgnoredFieldNames ignored;
  auto parsed = parse(prompt_body(f), model_context(f.model, setup, f.max_tokens), ignored, "--prompt: ");
  if (!parsed.ok()) return fail(parsed.status());
  const PreparedRequest& r = parsed->prompts.at(0);
  LLMEngine& core = *setup.engine;
  const auto start = std::chrono::steady_clock::now();
  Status st = core.add_request(1, r);
  if (!st.ok()) return fail(st);
  OutputChunk last;
  bool line_ended = true;  // the text written so far ends with a newline (or is empty)
  while (core.has_unfinished()) {
    for (OutputChunk& c : core.step()) {
      write_out(c.text);
      if (!c.text.empty()) line_ended = c.text.back() == '\n';
      if (c.finished()) last = std::move(c);
    }
  }
  // stdout holds the text alone (as the model wrote it); where the stats line below meets it, on
  // a terminal or in one file or pipe, that line starts a line of its own.
  if (!line_ended) {
    if (isatty(STDOUT_FILENO)) {
      write_out("\n");
    } else if (isatty(STDERR_FILENO) || same_file(STDOUT_FILENO, STDERR_FILENO)) {
      std::fputc('\n', stderr);
    }
  }
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double prefill = last.timings.first_token_s;
  const double decode = total - prefill;
  std::fprintf(stderr,
               "prompt tokens: %lld, generated tokens: %lld, prefill: %.1f tokens/s, decode: %.1f tokens/s\n",
               static_cast<long long>(last.prompt_tokens), static_cast<long long>(last.completion_tokens),
               prefill > 0 ? last.prompt_tokens / prefill : 0.0,
               decode > 0 && last.completion_tokens > 1 ? (last.completion_tokens - 1) / decode : 0.0);
  if (const SpecDecodeStats& spec = core.core().spec_stats(); f.verbose && spec.num_drafts > 0) {
    std::fprintf(stderr, "speculative decoding: %lld of %lld draft tokens accepted\n",
                 static_cast<long long>(spec.num_accepted_tokens), static_cast<long long>(spec.num_draft_tokens));
  }
  if (const std::optional<KvConnectorStats> kv = core.core().connector_stats(); f.verbose && kv) {
    std::fprintf(stderr, "KV offloading: %lld prompt tokens loaded (%lld from disk), %lld failed loads, %lld blocks saved\n",
                 static_cast<long long>(kv->hits), static_cast<long long>(kv->disk_hits),
                 static_cast<long long>(kv->failed_loads), static_cast<long long>(kv->moved.stored_blocks));
  }
  return 0;
}

// The engine's finished output of one sequence as the single chunk a ResponseBuilder takes.
OutputChunk as_chunk(const RequestOutput& r, const CompletionOutput& o) {
  OutputChunk c;
  c.index = o.index;
  c.text = o.text;
  c.token_ids = o.token_ids;
  c.logprobs = o.logprobs;
  c.prompt_logprobs = r.prompt_logprobs;
  c.finish_reason = o.finish_reason;
  c.stop_string = o.stop_string;
  c.stop_token = o.stop_token;
  c.prompt_tokens = r.prompt_tokens;
  c.completion_tokens = static_cast<int64_t>(o.token_ids.size());
  c.cached_tokens = r.cached_tokens;
  return c;
}

// One output line for one input line: the first choice's text, token_ids and finish_reason,
// usage, and, when asked, logprobs (OpenAI's completions shape) and prompt_logprobs (vLLM's);
// with several choices (n > 1, or a list of prompts) all of them under "outputs".
nlohmann::json output_line(const ParsedRequest& parsed, const RequestOutput* results, const Tokenizer& tok) {
  server::ResponseBuilder builder(parsed, tok, "cmpl-offline", 0);
  std::vector<const CompletionOutput*> outputs;
  for (size_t p = 0; p < parsed.prompts.size(); ++p) {
    for (const CompletionOutput& o : results[p].outputs) {
      builder.add(p, as_chunk(results[p], o));
      outputs.push_back(&o);
    }
  }
  const nlohmann::json body = nlohmann::json::parse(builder.body());
  const auto choice = [&](size_t k) {
    const nlohmann::json& c = body["choices"][k];
    nlohmann::json j = {{"index", k}, {"text", c["text"]}, {"token_ids", outputs[k]->token_ids},
                        {"finish_reason", c["finish_reason"]}};
    if (parsed.logprobs) j["logprobs"] = c["logprobs"];
    if (parsed.prompt_logprobs) j["prompt_logprobs"] = c["prompt_logprobs"];
    return j;
  };
  nlohmann::json line = choice(0);
  line.erase("index");
  if (outputs.size() > 1) {
    for (size_t k = 0; k < outputs.size(); ++k) line["outputs"].push_back(choice(k));
  }
  const nlohmann::json& usage = body["usage"];
  line["usage"] = {{"prompt_tokens", usage["prompt_tokens"]},
                   {"completion_tokens", usage["completion_tokens"]},
                   {"total_tokens", usage["total_tokens"]},
                   {"cached_tokens", usage["prompt_tokens_details"]["cached_tokens"]}};
  return line;
}

void progress_bar(size_t done, size_t total) {
  const int width = 30;
  const int filled = total ? static_cast<int>(width * done / total) : width;
  std::fprintf(stderr, "\r[%.*s%*s] %zu/%zu requests", filled, "==============================",
               width - filled, "", done, total);
  if (done == total) std::fputc('\n', stderr);
  std::fflush(stderr);
}

// A JSONL file of completions requests, one output line per input line, in input order.
int generate_file(const GenerateFlags& f, EngineSetup& setup) {
  std::ifstream in(f.input_file);
  if (!in) return fail(not_found(f.input_file + ": cannot open"));
  const server::ModelContext ctx = model_context(f.model, setup, f.max_tokens);
  server::IgnoredFieldNames ignored;
  std::vector<ParsedRequest> lines;
  std::vector<size_t> first_prompt;  // per line: its first request's index in the batch
  std::vector<GenerateRequest> requests;
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto parsed = parse(line, ctx, ignored, f.input_file + ":" + std::to_string(line_no) + ": ");
    if (!parsed.ok()) return fail(parsed.status());
    first_prompt.push_back(requests.size());
    for (const GenerateRequest& g : parsed->prompts) requests.push_back(g);
    lines.push_back(std::move(*parsed));
  }
  LLM llm(std::move(setup.engine));
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
  for (size_t i = 0; i < lines.size(); ++i) {
    const nlohmann::json out = output_line(lines[i], results->data() + first_prompt[i], *setup.tokenizer);
    std::string text = out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    if (file.is_open()) file << text; else write_out(text);
  }
  return 0;
}

}  // namespace

int run_generate(const GenerateFlags& f) {
  if (Status st = f.engine.check_one_replica("pagoda generate"); !st.ok()) return fail(st);
  auto group = RankGroup::start(f.model, f.engine);  // before any thread; declared before the engine
  if (!group.ok()) return fail(group.status());
  auto setup = make_engine(f.model, f.engine, {}, group->get());
  if (!setup.ok()) return fail(setup.status());
  if (f.verbose) {
    const EngineCore& core = setup->engine->core();
    std::fprintf(stderr, "%s\n%s\n", setup->kernels.c_str(), core.kv_cache_summary().c_str());
    if (const std::string spec = core.speculative_summary(); !spec.empty()) std::fprintf(stderr, "%s\n", spec.c_str());
    if (!core.connector_summary().empty()) std::fprintf(stderr, "%s\n", core.connector_summary().c_str());
  }
  return f.input_file.empty() ? generate_one(f, *setup) : generate_file(f, *setup);
}

}  // namespace pagoda::app
