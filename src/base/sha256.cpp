#include "base/sha256.h"

#include <openssl/evp.h>

#include <utility>

#include "base/check.h"

namespace pagoda {

namespace {

// EVP calls fail only on allocation failure or a broken context; neither is caused by input.
void init_sha256(EVP_MD_CTX* ctx) { PAGODA_CHECK(EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr) == 1); }

}  // namespace

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  PAGODA_CHECK(ctx_ != nullptr);
  init_sha256(ctx_);
}

Sha256::~Sha256() { EVP_MD_CTX_free(ctx_); }  // accepts null

Sha256::Sha256(Sha256&& other) noexcept : ctx_(std::exchange(other.ctx_, nullptr)) {}

Sha256& Sha256::operator=(Sha256&& other) noexcept {
  if (this != &other) {
    EVP_MD_CTX_free(ctx_);
    ctx_ = std::exchange(other.ctx_, nullptr);
  }
  return *this;
}

void Sha256::update(std::span<const uint8_t> data) {
  PAGODA_CHECK(ctx_ != nullptr);
  if (data.empty()) return;  // data() may be null
  PAGODA_CHECK(EVP_DigestUpdate(ctx_, data.data(), data.size()) == 1);
}

void Sha256::update(std::string_view data) {
  update(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(data.data()), data.size()));
}

Sha256Digest Sha256::finish() {
  PAGODA_CHECK(ctx_ != nullptr);
  Sha256Digest digest{};
  unsigned int size = 0;
  PAGODA_CHECK(EVP_DigestFinal_ex(ctx_, digest.data(), &size) == 1 && size == digest.size());
  init_sha256(ctx_);
  return digest;
}

Sha256Digest sha256(std::span<const uint8_t> data) {
  Sha256 h;
  h.update(data);
  return h.finish();
}

std::string to_hex(const Sha256Digest& digest) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * digest.size());
  for (uint8_t b : digest) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 15]);
  }
  return out;
}

}  // namespace pagoda
