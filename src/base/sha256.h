// Sha256: SHA-256 digests over OpenSSL's libcrypto (the EVP interface), for content hashes and
// cache keys (the KV disk tier names and checks its block files with them).
//
// Sha256 hashes incrementally: update() any number of times, then finish(). It owns an
// EVP_MD_CTX, so it is move-only; one object is thread-compatible (use it from one thread at a
// time), and separate objects are independent. sha256() and to_hex() are pure functions.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

// Forward-declared so that only sha256.cpp includes OpenSSL's headers.
struct evp_md_ctx_st;

namespace pagoda {

using Sha256Digest = std::array<uint8_t, 32>;

class Sha256 {
 public:
  // Starts an empty message. Aborts (PAGODA_CHECK) only when OpenSSL cannot allocate a context.
  Sha256();
  ~Sha256();
  Sha256(Sha256&& other) noexcept;
  Sha256& operator=(Sha256&& other) noexcept;
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  // Appends bytes to the message. Calling it on a moved-from object is a bug.
  void update(std::span<const uint8_t> data);
  void update(std::string_view data);
  // Returns the digest of everything appended since construction or the last finish(), and
  // starts a new, empty message.
  Sha256Digest finish();

 private:
  evp_md_ctx_st* ctx_;  // owned; null once moved from
};

// The digest of `data` in one call.
Sha256Digest sha256(std::span<const uint8_t> data);

// The digest as 64 lowercase hex characters.
std::string to_hex(const Sha256Digest& digest);

}  // namespace pagoda
