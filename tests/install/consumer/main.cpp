// consumer MODEL N: greedy decoding of N tokens from BOS with an installed Pagoda, the ids printed
// on one line. Builds the engine as `pagoda generate` does, from the same flags structures.
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "launch/engine_setup.h"
#include "engine/llm.h"

int main(int argc, char** argv) {
  using namespace pagoda;
  if (argc != 3) {
    std::fprintf(stderr, "usage: consumer MODEL N\n");
    return 2;
  }
  if (Status st = app::register_backends(); !st.ok()) {
    std::fprintf(stderr, "consumer: %s\n", st.message().c_str());
    return 1;
  }
  app::ModelFlags model;
  model.model = argv[1];
  app::EngineFlags engine;
  engine.max_model_len = 512;
  Result<app::EngineSetup> setup = app::make_engine(model, engine);
  if (!setup.ok()) {
    std::fprintf(stderr, "consumer: %s\n", setup.status().message().c_str());
    return 1;
  }
  const std::optional<TokenId> bos = setup->tokenizer->bos_id();
  if (!bos) {
    std::fprintf(stderr, "consumer: the model has no BOS token\n");
    return 1;
  }
  LLM llm(std::move(setup->engine));
  GenerateRequest request;
  request.prompt_token_ids = {*bos};
  request.params.temperature = 0;
  request.params.max_tokens = std::atoi(argv[2]);
  Result<std::vector<RequestOutput>> out = llm.generate({request});
  if (!out.ok()) {
    std::fprintf(stderr, "consumer: %s\n", out.status().message().c_str());
    return 1;
  }
  for (TokenId id : (*out)[0].outputs[0].token_ids) std::printf("%d ", id);
  std::printf("\n");
  return 0;
}
