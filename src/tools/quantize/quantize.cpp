#include "tools/quantize/quantize.h"

#include "model/quant/quant_mix.h"

namespace pagoda {

Status quantize(const QuantizeOptions& options, const QuantizeLog& log) {
  if (options.gptq && options.calibration_file.empty()) {
    return invalid_argument("--gptq needs --calibration-file (the texts whose activations it rounds against)");
  }
  if (int_codes_mix(options.type)) return quantize_compressed(options, log);
  return quantize_gguf(options, log);
}

}  // namespace pagoda
