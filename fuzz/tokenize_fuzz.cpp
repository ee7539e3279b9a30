// Tokenize / detokenize on the real vocabularies of ../shared/models: the first input byte picks
// the tokenizer, the rest is the text (and, read 4 bytes at a time, a list of ids to decode).
// Checks the invariants of tokenizer_checks.h, and for the byte-level BPE vocabularies (GPT-2,
// Llama 3), which map every byte string to tokens and back unchanged, that decode(encode(text))
// is the text itself whenever the text is valid UTF-8.
#include <memory>
#include <string>
#include <vector>

#include "fuzz_support.h"
#include "loader/gguf_file.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer_checks.h"

using namespace pagoda;

namespace {

struct Vocab {
  std::string name;
  std::unique_ptr<GgufFile> gguf;  // kept open while its tokenizer lives
  std::unique_ptr<Tokenizer> tok;
  bool byte_level_round_trip = false;
};

std::vector<Vocab>& vocabs() {
  static std::vector<Vocab> v;
  return v;
}

void add_gguf(const std::string& relative, bool round_trip) {
  const std::string path = fuzz::find_model_file(relative);
  if (path.empty()) return;
  auto gguf = GgufFile::open(path);
  FUZZ_CHECK(gguf.ok());
  auto tok = load_gguf_tokenizer(*gguf.value());
  FUZZ_CHECK(tok.ok());
  vocabs().push_back({relative, std::move(gguf).value(), std::move(tok).value(), round_trip});
}

void add_hf(const std::string& relative_dir, bool round_trip) {
  const std::string json = fuzz::find_model_file(relative_dir + "/tokenizer.json");
  if (json.empty()) return;
  auto tok = load_hf_tokenizer(json.substr(0, json.rfind('/')));
  FUZZ_CHECK(tok.ok());
  vocabs().push_back({relative_dir, nullptr, std::move(tok).value(), round_trip});
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  add_gguf("stories260K/stories260K.gguf", false);
  add_gguf("vocab/ggml-vocab-llama-spm.gguf", false);
  add_gguf("vocab/ggml-vocab-gpt-2.gguf", true);
  add_hf("tokenizers/llama3", true);
  add_hf("tokenizers/qwen3", false);  // NFC-normalizes, so only NFC text would round-trip
  add_hf("tokenizers/mistral-7b-v0.1", false);
  fuzz::require_test_data("tokenize_fuzz", vocabs().size() == 6);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (vocabs().empty() || size == 0) return 0;
  fuzz::Input in(data, size);
  const Vocab& v = vocabs()[in.take_byte() % vocabs().size()];
  const std::string_view text = in.rest();
  const std::vector<TokenId> ids = fuzz::check_encode(*v.tok, text, /*real_vocab=*/true);
  if (v.byte_level_round_trip && fuzz::is_valid_utf8(text)) {
    FUZZ_CHECK(v.tok->decode(ids, /*skip_special=*/false) == text);
  }
  fuzz::check_decode(*v.tok, fuzz::ids_from_bytes(text, v.tok->vocab_size()));
  return 0;
}
