// An EngineCore on the CPU backend for engine-level tests: the model and tokenizer as `pagoda`
// loads them from `flags`, on the kernel table `isa` (the best the CPU has, by default). Fails the
// calling test (and returns nullptr) when loading fails.
// Header-only: the tests that include it link pagoda_app.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "launch/model_loading.h"
#include "backend/cpu/cpu_backend.h"
#include "engine/llm_engine.h"

namespace pagoda::testing {

inline std::unique_ptr<LLMEngine> make_engine_core(const app::ModelFlags& flags, const EngineConfig& config,
                                                    const std::string& isa = "auto") {
  cpu::register_cpu_backend(cpu::CpuBackendOptions{.isa = isa});
  auto loaded = app::load_model_and_tokenizer(flags);
  EXPECT_TRUE(loaded.ok()) << loaded.status().message();
  if (!loaded.ok()) return nullptr;
  std::shared_ptr<const Tokenizer> tok(std::move(loaded->tokenizer));
  EngineConfig with_fingerprint = config;
  with_fingerprint.model_fingerprint = loaded->weights_fingerprint;
  auto core = LLMEngine::create(std::move(loaded->model), tok, with_fingerprint);
  EXPECT_TRUE(core.ok()) << core.status().message();
  return core.ok() ? std::move(*core) : nullptr;
}

// The same for the model file at `model_path`, loaded with pagoda's default flags.
inline std::unique_ptr<LLMEngine> make_engine_core(const std::string& model_path, const EngineConfig& config) {
  app::ModelFlags flags;
  flags.model = model_path;
  return make_engine_core(flags, config);
}

}  // namespace pagoda::testing
