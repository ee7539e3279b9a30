// pagoda: the one binary, with subcommands like vllm's: serve, generate, tokenize, bench. Errors are one line on stderr and a non-zero exit.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "apps/pagoda/commands.h"
#include "launch/engine_setup.h"

namespace pagoda::app {
namespace {

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

// vLLM's --help=VALUE: "listgroup" lists the option groups, a group name shows that group, "all"
// everything, anything else the options whose name contains it.
int print_help_section(CLI::App& cmd, const std::string& value) {
  std::vector<std::string> groups;
  for (const CLI::Option* o : cmd.get_options()) {
    if (!o->get_group().empty() && std::find(groups.begin(), groups.end(), o->get_group()) == groups.end()) {
      groups.push_back(o->get_group());
    }
  }
  if (value == "listgroup") {
    for (const std::string& g : groups) std::printf("%s\n", g.c_str());
    return 0;
  }
  if (value == "all") {
    std::printf("%s", cmd.help().c_str());
    return 0;
  }
  const bool is_group = std::find(groups.begin(), groups.end(), value) != groups.end();
  std::string lowered = value;
  for (char& c : lowered) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  int shown = 0;
  for (CLI::Option* o : cmd.get_options()) {
    if (o->get_group().empty()) continue;  // hidden
    const bool match = is_group ? o->get_group() == value : o->get_name().find(lowered) != std::string::npos;
    if (!match) {
      o->group("");  // hidden from this help
    } else {
      ++shown;
    }
  }
  if (shown == 0) {
    std::fprintf(stderr, "pagoda: error: --help=%s matches no option group or option name (groups: --help=listgroup)\n",
                 value.c_str());
    return 2;
  }
  std::printf("%s", cmd.help().c_str());
  return 0;
}

int main_impl(int argc, char** argv) {
  if (Status st = register_backends(); !st.ok()) return fail(st);

  CLI::App app{"Pagoda: an LLM inference and serving engine"};
  app.set_version_flag("--version", PAGODA_VERSION, "print the version and exit");
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "help for every subcommand");

  GenerateFlags gen;
  CLI::App* generate_cmd = app.add_subcommand(
      "generate",
      "generate text: one --prompt (only the text on stdout, a summary line on stderr), or an "
      "--input-file of JSONL requests (one JSON result per line)");
  add_model_flags(*generate_cmd, gen.model, true);
  add_engine_flags(*generate_cmd, gen.engine);
  generate_cmd->add_option("--prompt,-p", gen.prompt, "the prompt text (may be empty: BOS only)");
  generate_cmd->add_option("--input-file", gen.input_file,
                           "JSONL file, one request per line: {\"prompt\": ..., OpenAI sampling fields}");
  generate_cmd->add_option("--output-file", gen.output_file, "where --input-file results go (default: stdout)");
  generate_cmd->add_option("--max-tokens,-n", gen.max_tokens, "tokens to generate")->capture_default_str();
  generate_cmd->add_option("--temperature,-t", gen.temperature,
                           "0 = greedy (default: --generation-config's, else 1)");
  generate_cmd->add_option("--top-p", gen.top_p, "nucleus sampling mass in (0, 1] (default: --generation-config's, else 1)");
  generate_cmd->add_option("--top-k", gen.top_k, "keep the k most likely tokens (default: --generation-config's, else all)");
  generate_cmd->add_option("--min-p", gen.min_p, "drop tokens below min_p x the top probability (default: --generation-config's, else 0)");
  generate_cmd->add_option("--request-seed", gen.request_seed, "sampling seed of the prompt (default: from --seed)");
  generate_cmd->add_flag("--ignore-eos", gen.ignore_eos, "keep generating past end-of-sequence tokens");
  generate_cmd->add_flag("--no-add-special", gen.no_add_special, "do not add BOS/EOS to the prompt");
  generate_cmd->add_flag("--verbose,-v", gen.verbose, "log the KV cache size on stderr");
  generate_cmd->get_option("--prompt")->excludes("--input-file");

  ModelFlags tok_model;
  std::string tok_prompt;
  bool tok_no_special = false;
  CLI::App* tokenize_cmd = app.add_subcommand("tokenize", "print the token ids of a prompt as a JSON array");
  add_model_flags(*tokenize_cmd, tok_model, false);
  tokenize_cmd->add_option("--prompt,-p", tok_prompt, "the text to tokenize");
  tokenize_cmd->add_flag("--no-add-special", tok_no_special, "leave out BOS/EOS");

  PerplexityFlags ppl;
  CLI::App* ppl_cmd = app.add_subcommand(
      "perplexity", "perplexity of the model on a text, and KL divergence from a saved base run, as llama-perplexity");
  add_model_flags(*ppl_cmd, ppl.model, true);
  ppl_cmd->add_option("--text-file,-f", ppl.text_file, "the text to score")->required();
  ppl_cmd->add_option("--ctx,-c", ppl.ctx, "tokens per chunk; each chunk's second half is scored")->capture_default_str();
  ppl_cmd->add_option("--chunks", ppl.chunks, "score at most this many chunks (0: every whole chunk)")->capture_default_str();
  ppl_cmd->add_option("--batch-size,-b", ppl.batch_size, "tokens per forward pass")->capture_default_str();
  ppl_cmd->add_option("--save-logits", ppl.save_logits,
                      "write the scored positions' log-probabilities here (the base run of --kl-base)");
  ppl_cmd->add_option("--kl-base", ppl.kl_base,
                      "compare with a --save-logits file: KL divergence, its 99th percentile, same top token");
  ppl_cmd->add_option("--kv-cache-dtype", ppl.kv_cache_dtype, "the KV cache's element type, as serve takes it")
      ->capture_default_str();
  ppl_cmd->add_option("--output-json", ppl.output_json, "also write the results as JSON here");

  QuantizeFlags quant;
  CLI::App* quant_cmd = app.add_subcommand(
      "quantize",
      "write a model's weights quantized: a GGUF file in a llama-quantize file type, as llama-quantize does, or a "
      "compressed-tensors W8A8 / W4A8 folder, as llm-compressor does");
  quant_cmd->add_option("input", quant.input, "the model to read: a GGUF file (float weights for w8a8 / w4a8) or a "
                                             "Hugging Face folder (w8a8 / w4a8)")->required();
  quant_cmd->add_option("output", quant.output, "the GGUF file, or for w8a8 / w4a8 the folder, to write")->required();
  quant_cmd->add_option("--type", quant.type,
                        "w8a8, w4a8 (compressed-tensors int-quantized folder); q8_0, q4_0, q4_1, q5_0, q5_1, q6_k, "
                        "q2_k, q3_k_m, q4_k_m, q5_k_m (llama-quantize's mixes, GGUF)")
      ->required();
  quant_cmd->add_option("--calibration-file", quant.calibration_file,
                        "JSONL texts ({\"text\": ...} or strings per line) the float model runs over: with --gptq, "
                        "for GPTQ's rounding of the weights (any type); without, w8a8 / w4a8 get a static "
                        "activation scale (input_scale) per projection");
  quant_cmd->add_flag("--gptq", quant.gptq,
                      "round the weights with GPTQ against the calibration texts' activations (needs "
                      "--calibration-file); w8a8 / w4a8 activations stay per token");
  quant_cmd->add_option("--act-order", quant.act_order,
                        "with --gptq: round the columns in the order of their inputs' energy, largest first (GPTQ's "
                        "act-order; each group or block kept whole, so the output needs no g_idx); false: in "
                        "stored order")
      ->capture_default_str();
  quant_cmd->add_option("--smooth-alpha", quant.smooth_alpha,
                        "w8a8 / w4a8 with --calibration-file: SmoothQuant's migration strength in [0, 1] (0.5 is "
                        "its usual value)");
  quant_cmd->add_option("--num-calibration-samples", quant.num_calibration_samples, "texts read from the file")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  quant_cmd->add_option("--max-seq-len", quant.max_seq_len, "tokens of each calibration text run")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  quant_cmd->add_option("--tokenizer", quant.tokenizer, "tokenizer of the calibration texts (default: the input's)");

  ServeFlags serve;
  CLI::App* serve_cmd = app.add_subcommand("serve", "serve the model over an OpenAI-compatible HTTP API, as vllm serve");
  serve.add_to(*serve_cmd);

  ProxyFlags proxy;
  CLI::App* proxy_cmd = app.add_subcommand(
      "proxy", "the OpenAI API in front of prefill and decode instances (disaggregated prefill, as vLLM's proxy)");
  proxy.add_to(*proxy_cmd);

  CLI::App* bench_cmd = app.add_subcommand("bench", "benchmarks, as vllm bench");
  bench_cmd->require_subcommand(1);
  BenchThroughputFlags thr;
  thr.model.byte_tokenizer_fallback = true;
  CLI::App* thr_cmd = bench_cmd->add_subcommand("throughput", "offline throughput on random prompts");
  add_model_flags(*thr_cmd, thr.model, true);
  add_engine_flags(*thr_cmd, thr.engine);
  thr_cmd->add_option("--input-len", thr.input_len, "prompt tokens per request")->capture_default_str();
  thr_cmd->add_option("--output-len", thr.output_len, "output tokens per request")->capture_default_str();
  thr_cmd->add_option("--num-prompts", thr.num_prompts, "requests")->capture_default_str();
  thr_cmd->add_option("--dataset-seed", thr.dataset_seed, "seed of the random prompts")->capture_default_str();
  thr_cmd->add_option("--dataset-name", thr.dataset_name,
                      "random (random token ids), or copy (a random passage of half --input-len, repeated to fill it: "
                      "an answer that copies its prompt, as in editing or summarising, continues it; for speculative "
                      "decoding)")
      ->check(CLI::IsMember({"random", "copy"}))
      ->capture_default_str();
  thr_cmd->add_option("--temperature", thr.temperature, "sampling temperature of every request (0 = greedy)")
      ->capture_default_str();
  thr_cmd->add_option("--dataset-path", thr.dataset_path,
                      "JSONL prompts, one {\"prompt\": ..., \"output_len\": ...} per line, instead of random ones");
  thr_cmd->add_option("--output-json", thr.output_json, "also write the results as JSON here");

  BenchLatencyFlags lat;
  lat.model.byte_tokenizer_fallback = true;
  CLI::App* lat_cmd = bench_cmd->add_subcommand("latency", "end-to-end latency of one batch, prefill and decode apart");
  add_model_flags(*lat_cmd, lat.model, true);
  add_engine_flags(*lat_cmd, lat.engine);
  lat_cmd->add_option("--batch-size", lat.batch_size, "requests in the batch")->capture_default_str();
  lat_cmd->add_option("--input-len", lat.input_len, "prompt tokens per request")->capture_default_str();
  lat_cmd->add_option("--output-len", lat.output_len, "output tokens per request")->capture_default_str();
  lat_cmd->add_option("--num-iters-warmup", lat.num_iters_warmup, "untimed iterations first")->capture_default_str();
  lat_cmd->add_option("--num-iters", lat.num_iters, "timed iterations")->capture_default_str();
  lat_cmd->add_option("--dataset-seed", lat.dataset_seed, "seed of the random prompts")->capture_default_str();
  lat_cmd->add_option("--dataset-name", lat.dataset_name,
                      "random (random token ids), or copy (a random passage of half --input-len, repeated to fill it: "
                      "an answer that copies its prompt, as in editing or summarising, continues it; for speculative "
                      "decoding)")
      ->check(CLI::IsMember({"random", "copy"}))
      ->capture_default_str();
  lat_cmd->add_option("--temperature", lat.temperature, "sampling temperature of every request (0 = greedy)")
      ->capture_default_str();
  lat_cmd->add_option("--output-json", lat.output_json, "also write the results as JSON here");

  BenchServeFlags bserve;
  CLI::App* bserve_cmd = bench_cmd->add_subcommand(
      "serve", "load an OpenAI-compatible server (this one or any other) and report latency and throughput");
  bserve.add_to(*bserve_cmd);

  BenchRooflineFlags roof;
  CLI::App* roof_cmd = bench_cmd->add_subcommand(
      "roofline", "measure memory bandwidth and peak FLOP/s here, and the decode/prefill ceilings they imply");
  roof_cmd->add_option("--threads", roof.threads, "threads (0 = one per hardware thread)")->capture_default_str();
  roof_cmd->add_option("--buffer", roof.buffer, "size of the bandwidth test's buffer")->capture_default_str();
  roof_cmd->add_option("--seconds", roof.seconds, "seconds per arithmetic test")->capture_default_str();
  roof_cmd->add_option("--output-json", roof.output_json, "also write the results as JSON here");

  BenchSweepFlags sweep;
  CLI::App* sweep_cmd = bench_cmd->add_subcommand(
      "sweep", "run bench throughput or bench serve over a grid of settings; CSV, SVG chart, best setting");
  sweep.add_to(*sweep_cmd);

  // vLLM's --help=GROUP / --help=listgroup / --help=KEYWORD, on the subcommand named before it.
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--help=", 0) != 0) continue;
    CLI::App* sub = &app;
    for (int k = 1; k < i; ++k) {
      for (CLI::App* s : sub->get_subcommands({})) {
        if (s->get_name() == argv[k]) sub = s;
      }
    }
    return print_help_section(*sub, arg.substr(7));
  }

  std::vector<std::string> args = rewrite_vllm_short_options(argc, argv);
  std::vector<char*> arg_ptrs;
  for (std::string& a : args) arg_ptrs.push_back(a.data());
  try {
    app.parse(static_cast<int>(arg_ptrs.size()), arg_ptrs.data());
  } catch (const CLI::Success& e) {  // --help, --help-all, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "pagoda: error: %s (see --help)\n", e.what());
    return 2;
  }
  if (generate_cmd->parsed()) return run_generate(gen);
  if (tokenize_cmd->parsed()) return run_tokenize(tok_model, tok_prompt, tok_no_special);
  if (ppl_cmd->parsed()) return run_perplexity(ppl);
  if (quant_cmd->parsed()) return run_quantize(quant);
  if (thr_cmd->parsed()) return run_bench_throughput(thr);
  if (bserve_cmd->parsed()) return run_bench_serve(bserve);
  if (lat_cmd->parsed()) return run_bench_latency(lat);
  if (roof_cmd->parsed()) return run_bench_roofline(roof);
  if (sweep_cmd->parsed()) return run_bench_sweep(sweep);
  if (serve_cmd->parsed()) return run_serve(std::move(serve));
  if (proxy_cmd->parsed()) return run_proxy(proxy);
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
