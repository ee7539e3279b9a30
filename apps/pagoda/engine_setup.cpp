#include "apps/pagoda/engine_setup.h"

namespace pagoda::app {

Result<EngineSetup> make_engine(const ModelFlags& model, const EngineFlags& engine) {
  PAGODA_ASSIGN_OR_RETURN(EngineConfig config, engine.to_config());
  PAGODA_ASSIGN_OR_RETURN(LoadedModel loaded, load_model_and_tokenizer(model));
  EngineSetup setup;
  setup.tokenizer = std::shared_ptr<const Tokenizer>(std::move(loaded.tokenizer));
  PAGODA_ASSIGN_OR_RETURN(setup.core, EngineCore::create(std::move(loaded.model), setup.tokenizer, config));
  return setup;
}

}  // namespace pagoda::app
