// Building an EngineCore from the command line's model and engine flags.
#pragma once

#include <memory>

#include "apps/pagoda/engine_flags.h"
#include "apps/pagoda/model_loading.h"
#include "engine/engine_core.h"

namespace pagoda::app {

struct EngineSetup {
  std::unique_ptr<EngineCore> core;
  std::shared_ptr<const Tokenizer> tokenizer;
};

// Loads the model and tokenizer and sizes the engine.
Result<EngineSetup> make_engine(const ModelFlags& model, const EngineFlags& engine);

}  // namespace pagoda::app
