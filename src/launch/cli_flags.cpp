#include "launch/cli_flags.h"

#include <CLI/CLI.hpp>

namespace pagoda::app {

void add_model_flags(CLI::App& app, ModelFlags& f, bool weights) {
  app.add_option("--model,-m", f.model,
                 "a GGUF file, a Hugging Face directory, or a built-in config name "
                 "(demo-random, llama-110m, tinyllama-1.1b, qwen2.5-0.5b, ...)")
      ->capture_default_str()
      ->group(kModelConfig);
  app.add_option("--tokenizer", f.tokenizer, "tokenizer to use instead of the model's own (GGUF or HF directory)")
      ->group(kModelConfig);
  app.add_option("--tokenizer-mode", f.tokenizer_mode,
                 "auto, slow or hf (all the same here: Pagoda's tokenizers reproduce the reference ones "
                 "exactly); mistral and custom not yet")
      ->capture_default_str()
      ->group(kModelConfig);
  app.add_flag("--trust-remote-code", f.trust_remote_code,
               "accepted, no effect: Pagoda never runs code from a model folder")
      ->group(kModelConfig);
  app.add_option("--revision", f.revision, "accepted, no effect: nothing is downloaded; the model is read as given")
      ->group(kModelConfig);
  app.add_option("--code-revision", f.code_revision, "accepted, no effect: no code is ever fetched or run")
      ->group(kModelConfig);
  app.add_option("--tokenizer-revision", f.tokenizer_revision,
                 "accepted, no effect: nothing is downloaded; the tokenizer is read as given")
      ->group(kModelConfig);
  if (!weights) return;
  app.add_option("--load-format", f.load_format, "auto, gguf, safetensors, or dummy (random weights)")
      ->capture_default_str()
      ->group(kLoadConfig);
  app.add_option("--download-dir", f.download_dir, "accepted, no effect: nothing is downloaded")->group(kLoadConfig);
  app.add_option("--dtype", f.dtype,
                 "matmul weight type: auto, float32 (float, f32), float16 (half, f16), bfloat16 (bf16), "
                 "or a GGUF block type: q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k. Files: float "
                 "weights converted at load, auto keeps them as stored; "
                 "dummy weights: generated in it, auto = bf16 above 200M parameters, else f32")
      ->capture_default_str()
      ->group(kModelConfig);
  app.add_option("--quantization,-q", f.quantization,
                 "none; gguf for a GGUF file; a checkpoint's method (detected from config.json without the "
                 "flag): awq (AutoAWQ GEMM), gptq (4/8-bit, act-order), compressed-tensors (int8 W8A8, "
                 "pack-quantized W4A16/W8A16); applied to float weights at load: w8a8 (int8 per channel, int8 "
                 "activations per token), w4a8 (int4 in groups of 128, int8 activations), or a llama-quantize "
                 "file type with its mix of tensor types: q8_0, q4_0, q4_1, q5_0, q5_1, q6_k, q2_k, q3_k_m, "
                 "q4_k_m, q5_k_m; fp8 is not a CPU type")
      ->group(kModelConfig);
  app.add_option("--hf-overrides", f.hf_overrides,
                 "JSON object of config.json fields that replace the model's (GGUF files too): rope_scaling, "
                 "rope_theta, max_position_embeddings")
      ->group(kModelConfig);
  app.add_option("--rope-scaling", f.rope_scaling,
                 "JSON rope_scaling as config.json has it, e.g. '{\"rope_type\":\"yarn\",\"factor\":4,"
                 "\"original_max_position_embeddings\":32768}' (types linear, dynamic, yarn, llama3)")
      ->group(kModelConfig);
  app.add_option("--rope-theta", f.rope_theta, "RoPE base frequency, replacing the model's")->group(kModelConfig);
  app.add_option("--weights-seed", f.weights_seed, "seed of dummy weights")->capture_default_str()->group(kLoadConfig);
  app.add_option("--backend", f.backend, "compute backend")->capture_default_str()->group(kPagodaGroup);
  app.add_option("--threads", f.threads, "CPU backend threads (default: one per physical core)")
      ->check(CLI::Range(1, 4096))
      ->group(kPagodaGroup);
}

void add_engine_flags(CLI::App& app, EngineFlags& f) {
  app.add_option("--block-size", f.block_size, "tokens per KV cache block (1..256)")
      ->capture_default_str()
      ->group(kCacheConfig);
  app.add_option("--kv-cache-memory-bytes,--kv-cache-memory", f.kv_cache_memory,
                 "KV cache size in bytes, e.g. 4GiB or 4294967296; overrides --gpu-memory-utilization "
                 "(default: a quarter of the available memory, capped at what --max-num-seqs full-length "
                 "sequences need)")
      ->group(kCacheConfig);
  app.add_option("--gpu-memory-utilization", f.gpu_memory_utilization,
                 "fraction (0, 1] of the machine's memory the engine may use for weights + activations + KV "
                 "cache; the KV cache gets what is left (the CPU's memory stands in for the GPU's)")
      ->group(kCacheConfig);
  app.add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", f.enable_prefix_caching,
               "automatic prefix caching (on by default; --no-enable-prefix-caching turns it off)")
      ->group(kCacheConfig);
  app.add_option("--swap-space", f.swap_space,
                 "accepted, no effect: there is no GPU memory to swap out of; preempted requests recompute")
      ->capture_default_str()
      ->group(kCacheConfig);
  app.add_option("--kv-cache-dtype", f.kv_cache_dtype,
                 "KV cache element type: auto (float32, the model's compute type), float32, bfloat16, float16, "
                 "fp8 (= fp8_e4m3), fp8_e4m3, fp8_e5m2, int8 (a scale per token and head); 2-4x the tokens in "
                 "the same memory")
      ->capture_default_str()
      ->group(kCacheConfig);

  app.add_option("--max-num-seqs", f.max_num_seqs, "most sequences in one step")
      ->capture_default_str()
      ->group(kSchedulerConfig);
  app.add_option("--max-num-batched-tokens", f.max_num_batched_tokens, "token budget of one step")
      ->capture_default_str()
      ->group(kSchedulerConfig);
  app.add_option("--long-prefill-token-threshold", f.long_prefill_token_threshold,
                 "most tokens one request may take in a step (0 = no cap)")
      ->capture_default_str()
      ->group(kSchedulerConfig);
  app.add_flag("--enable-chunked-prefill,!--no-enable-chunked-prefill", f.enable_chunked_prefill,
               "split long prompts across steps (on by default; off: a prompt runs whole in one step, which "
               "needs --max-num-batched-tokens >= --max-model-len)")
      ->group(kSchedulerConfig);
  app.add_option("--scheduling-policy", f.scheduling_policy, "fcfs or priority (lower first)")
      ->capture_default_str()
      ->group(kSchedulerConfig);

  app.add_option("--speculative-config", f.speculative_config,
                 "speculative decoding, vLLM's JSON object: {\"method\": \"ngram\", \"num_speculative_tokens\": k, "
                 "\"prompt_lookup_max\": n, \"prompt_lookup_min\": m, \"disable_by_batch_size\": b}, or with a draft "
                 "model of the same vocabulary {\"model\": PATH, \"num_speculative_tokens\": k}")
      ->group(kSpeculativeConfig);

  app.add_option("--kv-transfer-config", f.kv_transfer_config,
                 "a KV connector, vLLM's JSON object: {\"kv_connector\": \"OffloadingConnector\", \"kv_role\": "
                 "\"kv_both\", \"kv_connector_extra_config\": {\"cpu_bytes_to_use\": BYTES, \"disk_path\": DIR, "
                 "\"disk_bytes_to_use\": BYTES}}: evicted prefix blocks kept in host memory, and on disk across "
                 "restarts")
      ->group(kKvTransferConfig);
  app.add_option("--kv-offloading-size", f.kv_offloading_size,
                 "GiB of host memory for KV blocks evicted from the cache (the OffloadingConnector's host tier)")
      ->group(kKvTransferConfig);
  app.add_option("--kv-offloading-backend", f.kv_offloading_backend,
                 "native (the only one): the tier --kv-offloading-size sizes")
      ->capture_default_str()
      ->group(kKvTransferConfig);

  app.add_option("--max-model-len", f.max_model_len,
                 "longest prompt + output in tokens (default: the model's context length)")
      ->group(kModelConfig);
  app.add_option("--seed", f.seed, "seed for requests that bring none of their own")
      ->capture_default_str()
      ->group(kModelConfig);
  app.add_option("--max-logprobs", f.max_logprobs, "most logprobs / top_logprobs / prompt_logprobs a request may ask for")
      ->capture_default_str()
      ->group(kModelConfig);
  app.add_option("--generation-config", f.generation_config,
                 "request defaults: auto (the model folder's generation_config.json), vllm (the engine's own), "
                 "or a folder holding a generation_config.json")
      ->capture_default_str()
      ->group(kModelConfig);
  app.add_flag("--enforce-eager", f.enforce_eager, "accepted, no effect: the CPU backend captures no graphs")
      ->group(kModelConfig);
  app.add_option("--max-seq-len-to-capture", f.max_seq_len_to_capture,
                 "accepted, no effect: the CPU backend captures no graphs")
      ->group(kModelConfig);

  app.add_option("--tensor-parallel-size", f.tensor_parallel_size,
                 "tensor-parallel ranks (-tp): the model's heads, MLP and vocabulary split across processes")
      ->capture_default_str()
      ->group(kParallelConfig);
  app.add_option("--distributed-executor-backend", f.distributed_executor_backend,
                 "how the ranks start: mp (forked on this host, shared memory) or mpi (the ranks of mpirun); "
                 "default: mpi under mpirun, else mp")
      ->group(kParallelConfig);
  app.add_option("--cpu-affinity", f.cpu_affinity,
                 "the ranks' CPUs, one list per rank: 0-3|4-7, or one list for one process (default: "
                 "VLLM_CPU_OMP_THREADS_BIND, else the allowed cores split evenly between ranks)")
      ->group(kParallelConfig);
  app.add_option("--pipeline-parallel-size", f.pipeline_parallel_size,
                 "pipeline stages (-pp): the layers split across processes, several steps in flight; "
                 "tensor x pipeline ranks in all")
      ->capture_default_str()
      ->group(kParallelConfig);
  app.add_option("--data-parallel-size", f.data_parallel_size,
                 "data-parallel replicas (-dp) behind the one API server, each of tensor x pipeline ranks; "
                 "requests go to the least loaded (pagoda serve)")
      ->capture_default_str()
      ->group(kParallelConfig);
  app.add_option("--distributed-timeout-seconds", f.distributed_timeout_seconds,
                 "seconds a rank may leave the others waiting during a step before the engine fails (a hung rank)")
      ->capture_default_str()
      ->group(kParallelConfig);

  app.add_option("--log-level", f.log_level, "debug, info, warning, error or critical")
      ->capture_default_str()
      ->group(kPagodaGroup);
}

std::vector<std::string> rewrite_vllm_short_options(int argc, char** argv) {
  static const std::pair<const char*, const char*> kLong[] = {
      {"-tp", "--tensor-parallel-size"}, {"-pp", "--pipeline-parallel-size"}, {"-dp", "--data-parallel-size"},
      {"-sc", "--speculative-config"}};
  std::vector<std::string> out;
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    for (const auto& [short_name, long_name] : kLong) {
      const std::string s = short_name;
      if (arg == s) {
        arg = long_name;
      } else if (arg.rfind(s + "=", 0) == 0) {
        arg = std::string(long_name) + arg.substr(s.size());
      }
    }
    out.push_back(std::move(arg));
  }
  return out;
}

}  // namespace pagoda::app
