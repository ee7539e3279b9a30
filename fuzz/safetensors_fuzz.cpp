// .safetensors files: SafetensorsFile::open on any bytes. A file is either rejected with a
// message naming it, or every tensor's bytes lie inside the mapping (or its own copy).
#include <string>

#include "fuzz_support.h"
#include "loader/safetensors_file.h"

using namespace pagoda;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::MemFile file(data, size);
  auto opened = SafetensorsFile::open(file.path());
  if (!opened.ok()) {
    FUZZ_CHECK(opened.status().message().find(file.path()) != std::string::npos);
    return 0;
  }
  const SafetensorsFile& st = *opened.value();
  uint8_t sink = 0;
  for (const SafetensorsTensor& t : st.tensors()) {
    FUZZ_CHECK(t.begin <= t.end);
    FUZZ_CHECK(st.find(t.name) == &t);
    const int64_t n = t.tensor.nbytes();
    FUZZ_CHECK(n >= 0 && static_cast<uint64_t>(n) == t.end - t.begin);
    if (n > 0) {
      const auto* bytes = static_cast<const uint8_t*>(t.tensor.data);
      sink ^= bytes[0] ^ bytes[n - 1];  // ASan reports a read outside the mapping
    }
  }
  fuzz::keep(sink);
  return 0;
}
