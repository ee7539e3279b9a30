#include "model/model.h"

#include "model/arch/decoder.h"
#include "model/arch/registry.h"

namespace pagoda {

Result<std::unique_ptr<Model>> create_model(ModelSource source, const Backend& backend, const TensorParallel& tp,
                                            const PipelineParallel& pp, std::optional<QuantMix> mix) {
  const std::string& arch = source.config.architecture;
  if (const ArchitectureSpec* spec = find_architecture(arch)) {
    return create_decoder_model(std::move(source), backend, *spec, tp, pp, std::move(mix));
  }
  std::string names;
  for (const ArchitectureSpec& a : architectures()) names += (names.empty() ? "" : ", ") + std::string(a.name);
  return unimplemented(source.path + ": unsupported architecture '" + arch + "' (supported: " + names + ")");
}

}  // namespace pagoda
