#include "kv_transfer/kv_disk_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string_view>
#include <system_error>
#include <tuple>
#include <utility>

namespace pagoda {

namespace {

constexpr char kMagic[8] = {'P', 'G', 'K', 'V', 'B', 'L', 'K', '1'};
constexpr uint32_t kFormatVersion = 1;
// magic, version, reserved, fingerprint, key, payload size, payload SHA-256.
constexpr size_t kOffVersion = 8, kOffReserved = 12, kOffFingerprint = 16, kOffKey = 48, kOffPayloadSize = 80,
                 kOffPayloadHash = 88, kHeaderBytes = 120;
constexpr std::string_view kFileSuffix = ".kvb", kTempSuffix = ".tmp";

// Unique temporary names across every store of the process (two stores may share a directory).
std::atomic<uint64_t> g_temp_counter{0};

std::string errno_text() { return std::error_code(errno, std::generic_category()).message(); }

// Owns a file descriptor; closing for reading needs no check (nothing to lose).
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

int open_retrying(const std::string& path, int flags, mode_t mode = 0) {
  int fd;
  do fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  while (fd < 0 && errno == EINTR);
  return fd;
}

// Reads up to `size` bytes at `offset`, fewer only at end of file; -1 on error (errno set).
ssize_t pread_full(int fd, uint8_t* out, size_t size, off_t offset) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, out + done, size - done, offset + static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -1;
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  return static_cast<ssize_t>(done);
}

bool write_full(int fd, const uint8_t* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;  // write() returns 0 only for a zero size
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

template <class T>
void put_le(uint8_t* at, T value) {
  std::memcpy(at, &value, sizeof value);  // the host is little-endian (base/wire.h asserts it)
}
template <class T>
T get_le(const uint8_t* at) {
  T value;
  std::memcpy(&value, at, sizeof value);
  return value;
}

// Parses 64 lowercase hex characters (the only spelling hex() writes).
bool parse_key(std::string_view hex, KvBlockKey* key) {
  if (hex.size() != 64) return false;
  auto nibble = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; };
  for (size_t i = 0; i < 32; ++i) {
    const int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    key->bytes[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return true;
}

// Calls fn(name) for each entry of `dir`; stops quietly when the directory cannot be read.
template <class Fn>
void for_each_name(const std::string& dir, Fn fn) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return;
  while (const dirent* e = ::readdir(d)) fn(std::string_view(e->d_name));
  ::closedir(d);
}

}  // namespace

Result<std::unique_ptr<KvDiskStore>> KvDiskStore::open(const std::string& dir, const Sha256Digest& fingerprint,
                                                       const std::string& shard_tag, int64_t block_bytes) {
  if (dir.empty()) return invalid_argument("KV disk store: empty directory name");
  if (block_bytes <= 0) {
    return invalid_argument("KV disk store: block size " + std::to_string(block_bytes) + " is not positive");
  }
  // The tag is part of file names, and has no '.', so that names parse back unambiguously.
  auto tag_char = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; };
  if (shard_tag.empty() || shard_tag.size() > 64 || !std::all_of(shard_tag.begin(), shard_tag.end(), tag_char)) {
    return invalid_argument("KV disk store: shard tag '" + shard_tag + "' is not 1-64 letters, digits, '_' or '-'");
  }
  std::error_code ec, stat_ec;
  std::filesystem::create_directories(dir, ec);
  if (const auto st = std::filesystem::status(dir, stat_ec); exists(st) && !is_directory(st)) {
    return io_error("KV disk store directory " + dir + ": exists and is not a directory");
  }
  if (ec) return io_error("KV disk store directory " + dir + ": cannot create it: " + ec.message());
  if (::access(dir.c_str(), R_OK | W_OK | X_OK) != 0) {
    return io_error("KV disk store directory " + dir + ": not readable and writable: " + errno_text());
  }
  auto store = std::unique_ptr<KvDiskStore>(new KvDiskStore(dir, fingerprint, shard_tag, block_bytes));
  // A crash mid-write leaves `<key hex>.<shard_tag>.<pid>-<n>.tmp`; only this shard's are ours.
  const std::string infix = "." + shard_tag + ".";
  for_each_name(dir, [&](std::string_view name) {
    KvBlockKey unused;
    if (name.size() > 64 + infix.size() + kTempSuffix.size() && name.ends_with(kTempSuffix) &&
        name.substr(64, infix.size()) == infix && parse_key(name.substr(0, 64), &unused)) {
      ::unlink((dir + "/" + std::string(name)).c_str());
    }
  });
  return store;
}

std::string KvDiskStore::path_of(const KvBlockKey& key) const {
  return dir_ + "/" + key.hex() + "." + shard_tag_ + std::string(kFileSuffix);
}

int64_t KvDiskStore::file_bytes() const { return static_cast<int64_t>(kHeaderBytes) + block_bytes_; }

Status KvDiskStore::write(const KvBlockKey& key, std::span<const uint8_t> payload) {
  if (payload.size() != static_cast<uint64_t>(block_bytes_)) {
    return invalid_argument("KV disk store: payload of " + std::to_string(payload.size()) + " bytes, blocks are " +
                            std::to_string(block_bytes_));
  }
  uint8_t header[kHeaderBytes] = {};
  std::memcpy(header, kMagic, sizeof kMagic);
  put_le<uint32_t>(header + kOffVersion, kFormatVersion);
  put_le<uint32_t>(header + kOffReserved, 0);
  std::memcpy(header + kOffFingerprint, fingerprint_.data(), 32);
  std::memcpy(header + kOffKey, key.bytes.data(), 32);
  put_le<uint64_t>(header + kOffPayloadSize, payload.size());
  const Sha256Digest hash = sha256(payload);
  std::memcpy(header + kOffPayloadHash, hash.data(), 32);

  const std::string path = path_of(key);
  const std::string temp = dir_ + "/" + key.hex() + "." + shard_tag_ + "." + std::to_string(::getpid()) + "-" +
                           std::to_string(g_temp_counter.fetch_add(1, std::memory_order_relaxed)) +
                           std::string(kTempSuffix);
  const int fd = open_retrying(temp, O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (fd < 0) return io_error("KV disk store: cannot create " + temp + ": " + errno_text());
  bool ok = write_full(fd, header, kHeaderBytes) && write_full(fd, payload.data(), payload.size());
  std::string what = ok ? "" : "cannot write " + temp + ": " + errno_text();
  // close() can report a delayed write error (NFS, a full disk); it closes the fd either way.
  if (::close(fd) != 0 && ok) {
    ok = false;
    what = "cannot close " + temp + ": " + errno_text();
  }
  if (ok && ::rename(temp.c_str(), path.c_str()) != 0) {
    ok = false;
    what = "cannot rename " + temp + " to " + path + ": " + errno_text();
  }
  if (!ok) {
    ::unlink(temp.c_str());
    return io_error("KV disk store: " + what);
  }
  return Status::ok_status();
}

Status KvDiskStore::check_header(std::span<const uint8_t> h, const KvBlockKey& key, const std::string& path) const {
  auto bad = [&](const std::string& problem) { return data_loss("KV block file " + path + ": " + problem); };
  if (h.size() < kHeaderBytes) return bad("short file: " + std::to_string(h.size()) + " bytes, less than a header");
  if (std::memcmp(h.data(), kMagic, sizeof kMagic) != 0) return bad("not a KV block file (wrong magic)");
  const uint32_t version = get_le<uint32_t>(&h[kOffVersion]);
  if (version != kFormatVersion || get_le<uint32_t>(&h[kOffReserved]) != 0) {
    return bad("format version " + std::to_string(version) + " (reserved " +
               std::to_string(get_le<uint32_t>(&h[kOffReserved])) + "), expected 1 (0)");
  }
  if (std::memcmp(&h[kOffFingerprint], fingerprint_.data(), 32) != 0) {
    return bad("written for another model or KV layout (fingerprint mismatch)");
  }
  if (std::memcmp(&h[kOffKey], key.bytes.data(), 32) != 0) return bad("holds another block's key");
  const uint64_t size = get_le<uint64_t>(&h[kOffPayloadSize]);
  if (size != static_cast<uint64_t>(block_bytes_)) {
    return bad("payload size " + std::to_string(size) + ", expected " + std::to_string(block_bytes_));
  }
  return Status::ok_status();
}

Status KvDiskStore::read(const KvBlockKey& key, std::span<uint8_t> out) {
  if (out.size() != static_cast<uint64_t>(block_bytes_)) {
    return invalid_argument("KV disk store: read into " + std::to_string(out.size()) + " bytes, blocks are " +
                            std::to_string(block_bytes_));
  }
  const std::string path = path_of(key);
  Status status = [&]() -> Status {
    Fd fd{open_retrying(path, O_RDONLY | O_NONBLOCK)};  // a FIFO must not block us
    if (fd.fd < 0 && errno == ENOENT) return not_found("KV block file " + path + " does not exist");
    if (fd.fd < 0) return io_error("KV disk store: cannot open " + path + ": " + errno_text());
    auto io_failed = [&] { return io_error("KV disk store: cannot read " + path + ": " + errno_text()); };
    // Exactly the expected sizes are read, whatever the header claims; the length is checked by
    // reading one byte past the end.
    uint8_t header[kHeaderBytes];
    const ssize_t n = pread_full(fd.fd, header, kHeaderBytes, 0);
    if (n < 0) return io_failed();
    PAGODA_RETURN_IF_ERROR(check_header({header, static_cast<size_t>(n)}, key, path));
    const ssize_t m = pread_full(fd.fd, out.data(), out.size(), kHeaderBytes);
    if (m < 0) return io_failed();
    if (static_cast<size_t>(m) != out.size()) {
      return data_loss("KV block file " + path + ": short file: payload of " + std::to_string(m) + " bytes, expected " +
                       std::to_string(out.size()));
    }
    uint8_t extra;
    const ssize_t e = pread_full(fd.fd, &extra, 1, static_cast<off_t>(file_bytes()));
    if (e < 0) return io_failed();
    if (e > 0) return data_loss("KV block file " + path + ": trailing bytes after the payload");
    if (std::memcmp(sha256(out).data(), header + kOffPayloadHash, 32) != 0) {
      return data_loss("KV block file " + path + ": content hash mismatch");
    }
    return Status::ok_status();
  }();
  if (status.code() == StatusCode::kDataLoss) ::unlink(path.c_str());  // so it is not tried again
  return status;
}

std::vector<KvBlockKey> KvDiskStore::scan() const {
  const std::string suffix = "." + shard_tag_ + std::string(kFileSuffix);
  // (mtime s, mtime ns, key): ties (coarse timestamps) broken by key, so the order is deterministic.
  std::vector<std::tuple<int64_t, int64_t, std::array<uint8_t, 32>>> found;
  for_each_name(dir_, [&](std::string_view name) {
    KvBlockKey key;
    if (name.size() != 64 + suffix.size() || name.substr(64) != suffix || !parse_key(name.substr(0, 64), &key)) return;
    const std::string path = dir_ + "/" + std::string(name);
    Fd fd{open_retrying(path, O_RDONLY | O_NONBLOCK)};  // a FIFO must not block us
    struct stat st;
    if (fd.fd < 0 || ::fstat(fd.fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size != file_bytes()) return;
    uint8_t header[kHeaderBytes];
    const ssize_t n = pread_full(fd.fd, header, kHeaderBytes, 0);
    if (n != static_cast<ssize_t>(kHeaderBytes) || !check_header(header, key, path).ok()) return;
    found.emplace_back(st.st_mtim.tv_sec, st.st_mtim.tv_nsec, key.bytes);
  });
  std::sort(found.begin(), found.end());
  std::vector<KvBlockKey> keys;
  keys.reserve(found.size());
  for (const auto& f : found) keys.push_back(KvBlockKey{std::get<2>(f)});
  return keys;
}

void KvDiskStore::remove(const KvBlockKey& key) { ::unlink(path_of(key).c_str()); }

}  // namespace pagoda
