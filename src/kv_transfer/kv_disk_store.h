// KvDiskStore: a directory of KV-cache block files, the persistent tier of the KV cache that
// survives restarts. One file per (key, shard): `<key hex>.<shard_tag>.kvb`, holding a header
// (magic "PGKVBLK1", u32 format version 1, u32 reserved 0, the 32-byte fingerprint of the model
// and KV layout, the 32-byte key, u64 payload size, the 32-byte SHA-256 of the payload; all
// little-endian) and then exactly block_bytes of payload. The store only moves bytes: which
// blocks to keep (capacity, LRU order) is its caller's business.
//
// Several stores may share one directory: tensor-parallel ranks keep apart by shard_tag, and
// servers of other models by fingerprint (their files are never used, and scan leaves them).
// Writes are atomic (a temporary `<key hex>.<shard_tag>.<pid>-<n>.tmp` renamed over the final
// name); open() deletes this shard's leftover temporary files.
//
// Thread safety: write, read and remove on *different* keys may run concurrently from several
// threads; each call uses its own file descriptors, and the only shared mutable state is an
// atomic counter for temporary names. Calls on the same key must be serialized by the caller.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/sha256.h"
#include "base/status.h"
#include "kv_transfer/kv_block_key.h"

namespace pagoda {

class KvDiskStore {
 public:
  // Opens (creating it and its parents when missing) the store in `dir` for the files of
  // `shard_tag` (letters, digits, '_' and '-', e.g. "r0of2") whose header carries `fingerprint`
  // and whose payload is exactly `block_bytes` (> 0). Deletes this shard's leftover temporary
  // files. Fails with invalid_argument for a bad shard_tag or block_bytes, and io_error naming
  // the directory when it cannot be created, is not a directory, or is not readable and writable.
  static Result<std::unique_ptr<KvDiskStore>> open(const std::string& dir, const Sha256Digest& fingerprint,
                                                   const std::string& shard_tag, int64_t block_bytes);

  // Stores `payload` (exactly block_bytes) as the block `key`, atomically replacing any earlier
  // file. invalid_argument for a wrong size; io_error naming the path when the OS refuses (then
  // no temporary file is left behind).
  Status write(const KvBlockKey& key, std::span<const uint8_t> payload);

  // Reads block `key` into `out` (exactly block_bytes). not_found when there is no file;
  // data_loss naming the file and the problem when it is short, long, of another format, model
  // or KV layout, key or payload size, or its content hash does not match; the bad file is then
  // deleted. io_error when the OS refuses. On any error `out` holds unspecified bytes.
  Status read(const KvBlockKey& key, std::span<uint8_t> out);

  // The keys of this shard's files whose header matches (fingerprint, key from the file name,
  // payload size) and whose length is file_bytes(), oldest modification time first. Reads only
  // headers. Skips and leaves every other file; an unreadable directory yields what was found.
  std::vector<KvBlockKey> scan() const;

  // Deletes block `key`'s file if present; errors are ignored.
  void remove(const KvBlockKey& key);

  // The size of one block file, header and payload (for capacity accounting).
  int64_t file_bytes() const;

  const std::string& dir() const { return dir_; }
  int64_t block_bytes() const { return block_bytes_; }

 private:
  KvDiskStore(std::string dir, const Sha256Digest& fingerprint, std::string shard_tag, int64_t block_bytes)
      : dir_(std::move(dir)), fingerprint_(fingerprint), shard_tag_(std::move(shard_tag)), block_bytes_(block_bytes) {}

  std::string path_of(const KvBlockKey& key) const;
  // Checks the header bytes of `path` against `key` and this store; data_loss naming the problem.
  Status check_header(std::span<const uint8_t> header, const KvBlockKey& key, const std::string& path) const;

  const std::string dir_;
  const Sha256Digest fingerprint_;
  const std::string shard_tag_;
  const int64_t block_bytes_;
};

}  // namespace pagoda
