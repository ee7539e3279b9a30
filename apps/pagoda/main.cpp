// pagoda: the one binary, with subcommands like vllm's (generate, tokenize; serve and bench
// arrive with their issues). Errors are one line on stderr and a non-zero exit.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <string>

#include "apps/pagoda/generate.h"
#include "apps/pagoda/model_loading.h"
#include "backends/cpu/cpu_backend.h"

namespace pagoda::app {
namespace {

int fail(const Status& status) {
  std::fprintf(stderr, "pagoda: error: %s\n", status.message().c_str());
  return 1;
}

struct GenerateFlags {
  ModelFlags model;
  std::string prompt;
  int64_t max_tokens = 16;
  double temperature = 1.0;
  double top_p = 1.0;
  int64_t top_k = 0;
  double min_p = 0.0;
  std::optional<uint64_t> seed;
  bool ignore_eos = false;
  bool no_add_special = false;
};

int run_generate(const GenerateFlags& f) {
  auto loaded = load_model_and_tokenizer(f.model);
  if (!loaded.ok()) return fail(loaded.status());
  Tokenizer& tok = *loaded->tokenizer;
  std::vector<TokenId> prompt = tok.encode(f.prompt, !f.no_add_special);

  GenerateOptions options;
  options.max_tokens = f.max_tokens;
  options.sampling = {f.temperature, f.top_p, f.top_k, f.min_p};
  options.seed = f.seed;
  options.ignore_eos = f.ignore_eos;
  IncrementalDetokenizer detok(tok, /*skip_special=*/true);
  auto stats = generate(*loaded, prompt, options, [&](TokenId id) {
    std::string text = detok.push(id);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  });
  std::string rest = detok.flush();
  std::fwrite(rest.data(), 1, rest.size(), stdout);
  if (isatty(STDOUT_FILENO)) std::fputc('\n', stdout);
  std::fflush(stdout);
  if (!stats.ok()) return fail(stats.status());
  double decode_rate = stats->decode_seconds > 0 && stats->generated_tokens > 1
                           ? (stats->generated_tokens - 1) / stats->decode_seconds
                           : 0.0;
  double prefill_rate = stats->prefill_seconds > 0 ? stats->prompt_tokens / stats->prefill_seconds : 0.0;
  std::fprintf(stderr,
               "prompt tokens: %lld, generated tokens: %lld, prefill: %.1f tokens/s, decode: %.1f tokens/s\n",
               static_cast<long long>(stats->prompt_tokens),
               static_cast<long long>(stats->generated_tokens), prefill_rate, decode_rate);
  return 0;
}

int run_tokenize(const ModelFlags& model, const std::string& prompt, bool no_add_special) {
  auto tok = load_tokenizer(model);
  if (!tok.ok()) return fail(tok.status());
  std::vector<TokenId> ids = (*tok)->encode(prompt, !no_add_special);
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(ids[i]);
  }
  std::printf("%s]\n", out.c_str());
  return 0;
}

int main_impl(int argc, char** argv) {
  cpu::register_cpu_backend();

  CLI::App app{"Pagoda: an LLM inference and serving engine"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "help for every subcommand");

  GenerateFlags gen;
  CLI::App* generate_cmd = app.add_subcommand(
      "generate", "generate text from a prompt; prints only the text on stdout, a summary on stderr");
  gen.model.add_to(*generate_cmd, /*weights=*/true);
  generate_cmd->add_option("--prompt,-p", gen.prompt, "the prompt text (may be empty: BOS only)");
  generate_cmd->add_option("--max-tokens,-n", gen.max_tokens, "tokens to generate")->capture_default_str();
  generate_cmd->add_option("--temperature,-t", gen.temperature, "0 = greedy")->capture_default_str();
  generate_cmd->add_option("--top-p", gen.top_p, "nucleus sampling mass in (0, 1]")->capture_default_str();
  generate_cmd->add_option("--top-k", gen.top_k, "keep the k most likely tokens (0 = all)")->capture_default_str();
  generate_cmd->add_option("--min-p", gen.min_p, "drop tokens below min_p x the top probability")->capture_default_str();
  generate_cmd->add_option("--seed", gen.seed, "sampling seed (default: random)");
  generate_cmd->add_flag("--ignore-eos", gen.ignore_eos, "keep generating past end-of-sequence tokens");
  generate_cmd->add_flag("--no-add-special", gen.no_add_special, "do not add BOS/EOS to the prompt");

  ModelFlags tok_model;
  std::string tok_prompt;
  bool tok_no_special = false;
  CLI::App* tokenize_cmd = app.add_subcommand("tokenize", "print the token ids of a prompt as a JSON array");
  tok_model.add_to(*tokenize_cmd, /*weights=*/false);
  tokenize_cmd->add_option("--prompt,-p", tok_prompt, "the text to tokenize");
  tokenize_cmd->add_flag("--no-add-special", tok_no_special, "leave out BOS/EOS");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "pagoda: error: %s (see --help)\n", e.what());
    return 2;
  }
  if (generate_cmd->parsed()) return run_generate(gen);
  if (tokenize_cmd->parsed()) return run_tokenize(tok_model, tok_prompt, tok_no_special);
  return 2;
}

}  // namespace
}  // namespace pagoda::app

int main(int argc, char** argv) {
  try {
    return pagoda::app::main_impl(argc, argv);
  } catch (const std::exception& e) {  // a bug or out of memory: still one clear line
    std::fprintf(stderr, "pagoda: error: %s\n", e.what());
    return 1;
  }
}
