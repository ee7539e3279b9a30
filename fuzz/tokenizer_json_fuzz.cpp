// tokenizer.json: load_hf_tokenizer on any bytes (written to a scratch folder, as a Hugging Face
// directory holds it). A file is either rejected with a message, or the tokenizer keeps the
// invariants of tokenizer_checks.h on a sample text and on arbitrary ids.
#include <string>

#include "fuzz_support.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer_checks.h"

using namespace pagoda;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  fuzz::write_scratch_file("tokenizer.json", bytes);
  auto tok = load_hf_tokenizer(fuzz::scratch_dir());
  if (!tok.ok()) {
    FUZZ_CHECK(!tok.status().message().empty());
    return 0;
  }
  const Tokenizer& t = *tok.value();
  (void)fuzz::check_encode(t, fuzz::kSampleText, /*real_vocab=*/false);
  fuzz::check_decode(t, fuzz::ids_from_bytes(bytes.substr(0, 256), t.vocab_size()));
  return 0;
}
