#include "model/model.h"

#include "model/arch/llama.h"

namespace pagoda {

Result<std::unique_ptr<Model>> create_model(ModelSource source, const Backend& backend) {
  const std::string& arch = source.config.architecture;
  if (arch == "llama" || arch == "qwen2" || arch == "qwen3") {
    return create_llama_model(std::move(source), backend);
  }
  return unimplemented(source.path + ": unsupported architecture '" + arch +
                       "' (supported: llama, mistral, qwen2, qwen3)");
}

}  // namespace pagoda
