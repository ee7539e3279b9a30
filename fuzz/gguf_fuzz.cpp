// GGUF files: GgufFile::open on any bytes, then what the loader reads from an opened file (every
// typed getter on every key, the model config, the tokenizer, the first row of each tensor
// decoded by its type's row and chunk decoders). A file is either rejected with a message naming
// it, or every tensor's bytes lie inside the mapping.
#include <string>
#include <vector>

#include "fuzz_support.h"
#include "loader/config_parsers.h"
#include "loader/gguf_file.h"
#include "tensor/convert.h"
#include "tensor/quant_blocks.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer_checks.h"

using namespace pagoda;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::MemFile file(data, size);
  auto opened = GgufFile::open(file.path());
  if (!opened.ok()) {
    FUZZ_CHECK(opened.status().message().find(file.path()) != std::string::npos);
    return 0;
  }
  const GgufFile& gguf = *opened.value();
  uint8_t sink = 0;
  for (const GgufTensorInfo& t : gguf.tensors()) {
    const int64_t n = t.tensor.nbytes();
    FUZZ_CHECK(n >= 0);
    if (n > 0) {
      const auto* bytes = static_cast<const uint8_t*>(t.tensor.data);
      sink ^= bytes[0] ^ bytes[n - 1];  // ASan reports a read outside the mapping
    }
    // Any bytes are a valid block (NaN scales included): decoding reads exactly one row.
    const Tensor& w = t.tensor;
    if (w.num_rows() > 0 && w.row_len() <= 4096) {
      std::vector<float> row(static_cast<size_t>(w.row_len()));
      dequantize_row(w.dtype, w.row(0), row.data(), w.row_len());
      const DTypeTraits& traits = dtype_traits(w.dtype);
      if (traits.decode_chunks != nullptr) {
        std::vector<QuantChunk> chunks(static_cast<size_t>(traits.block_elems / kQuantBlock));
        traits.decode_chunks(w.row(0), chunks.data());
        sink ^= static_cast<uint8_t>(chunks[0].q[0]);
      }
      sink ^= static_cast<uint8_t>(row[0] > 0);
    }
  }
  for (const auto& [key, value] : gguf.metadata()) {
    (void)gguf.get_string(key);
    (void)gguf.get_int(key);
    (void)gguf.get_float(key);
    (void)gguf.get_bool(key);
    (void)gguf.get_string_array(key);
    (void)gguf.get_float_array(key);
    (void)gguf.get_int_array(key);
  }
  auto config = config_from_gguf(gguf);
  if (!config.ok()) FUZZ_CHECK(!config.status().message().empty());
  auto tok = load_gguf_tokenizer(gguf);
  if (!tok.ok()) {
    FUZZ_CHECK(tok.status().message().find(file.path()) != std::string::npos);
  } else {
    const Tokenizer& t = *tok.value();
    (void)fuzz::check_encode(t, fuzz::kSampleText, /*real_vocab=*/false);
    const std::string_view head(reinterpret_cast<const char*>(data), size < 256 ? size : 256);
    fuzz::check_decode(t, fuzz::ids_from_bytes(head, t.vocab_size()));
  }
  fuzz::keep(sink);
  return 0;
}
