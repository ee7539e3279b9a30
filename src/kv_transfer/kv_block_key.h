// KvBlockKey: the identity of one KV block's contents in the tiers beyond the KV cache (host
// memory, disk): a SHA-256 chain over the model's fingerprint, the request's cache salt and the
// token ids of every block up to and including this one. Unlike the prefix cache's 64-bit hashes
// (kv/kv_cache_manager.h), whose hits are made exact by comparing tokens and parent links, these
// keys are trusted as they are: two prefixes share a key only by a SHA-256 collision. Plain value.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>

#include "base/sha256.h"

namespace pagoda {

struct KvBlockKey {
  std::array<uint8_t, 32> bytes{};

  bool operator==(const KvBlockKey&) const = default;
  // 64 lowercase hex digits.
  std::string hex() const { return to_hex(bytes); }
};

}  // namespace pagoda

// For unordered containers: the key is a SHA-256, so its first 8 bytes are a good hash.
template <>
struct std::hash<pagoda::KvBlockKey> {
  size_t operator()(const pagoda::KvBlockKey& key) const noexcept {
    uint64_t h;
    std::memcpy(&h, key.bytes.data(), sizeof h);
    return static_cast<size_t>(h);
  }
};
