#include "kv_transfer/kv_disk_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>
#include <unordered_set>

namespace pagoda {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kBlockBytes = 256;
constexpr int64_t kHeaderBytes = 120;

KvBlockKey key_of(int i) { return KvBlockKey{sha256(std::span<const uint8_t>(reinterpret_cast<uint8_t*>(&i), sizeof i))}; }

Sha256Digest fingerprint_of(std::string_view model) {
  Sha256 h;
  h.update(model);
  return h.finish();
}

std::vector<uint8_t> payload_of(int seed, int64_t size = kBlockBytes) {
  std::vector<uint8_t> p(static_cast<size_t>(size));
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<uint8_t>(seed * 131 + i * 7 + (i >> 3));
  return p;
}

std::vector<uint8_t> slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void spit(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

bool contains(const Status& s, std::string_view text) { return s.message().find(text) != std::string::npos; }

class KvDiskStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/pagoda_kv_disk_store_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(dir_, ec);
  }

  std::unique_ptr<KvDiskStore> open_store(std::string_view model = "model-a", const std::string& tag = "r0of1",
                                          const std::string& sub = "") {
    auto r = KvDiskStore::open(dir_ + sub, fingerprint_of(model), tag, kBlockBytes);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? std::move(r).value() : nullptr;
  }
  std::string file_of(const KvBlockKey& key, const std::string& tag = "r0of1") const {
    return dir_ + "/" + key.hex() + "." + tag + ".kvb";
  }

  std::string dir_;
};

TEST_F(KvDiskStoreTest, RoundTrip) {
  auto store = open_store();
  EXPECT_EQ(store->file_bytes(), kHeaderBytes + kBlockBytes);
  ASSERT_TRUE(store->write(key_of(1), payload_of(1)).ok());
  std::vector<uint8_t> out(kBlockBytes);
  ASSERT_TRUE(store->read(key_of(1), out).ok());
  EXPECT_EQ(out, payload_of(1));
  EXPECT_EQ(fs::file_size(file_of(key_of(1))), static_cast<uintmax_t>(store->file_bytes()));
  // A rewrite replaces the block.
  ASSERT_TRUE(store->write(key_of(1), payload_of(2)).ok());
  ASSERT_TRUE(store->read(key_of(1), out).ok());
  EXPECT_EQ(out, payload_of(2));
  EXPECT_EQ(store->read(key_of(9), out).code(), StatusCode::kNotFound);
  store->remove(key_of(1));
  store->remove(key_of(1));  // absent: ignored
  EXPECT_EQ(store->read(key_of(1), out).code(), StatusCode::kNotFound);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 0);  // no temp files left
}

TEST_F(KvDiskStoreTest, RestartScansOldestFirstAndReadsBack) {
  {
    auto store = open_store("model-a", "r0of1", "/a/b");  // creates parents
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(store->write(key_of(i), payload_of(i)).ok());
  }
  // Modification times: key 2 oldest, then 0, then 1.
  const int64_t ages[3] = {200, 100, 300};
  for (int i = 0; i < 3; ++i) {
    const timespec times[2] = {{1700000000 - ages[i], 0}, {1700000000 - ages[i], 0}};
    ASSERT_EQ(::utimensat(AT_FDCWD, (dir_ + "/a/b/" + key_of(i).hex() + ".r0of1.kvb").c_str(), times, 0), 0);
  }
  auto store = open_store("model-a", "r0of1", "/a/b");
  EXPECT_EQ(store->scan(), (std::vector<KvBlockKey>{key_of(2), key_of(0), key_of(1)}));
  std::vector<uint8_t> out(kBlockBytes);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(store->read(key_of(i), out).ok());
    EXPECT_EQ(out, payload_of(i));
  }
}

TEST_F(KvDiskStoreTest, CorruptedFilesAreDataLossAndDeleted) {
  auto store = open_store();
  const struct {
    int64_t offset;
    const char* message;
  } cases[] = {
      {0, "wrong magic"},
      {8, "format version"},
      {12, "format version"},
      {16, "another model or KV layout"},
      {48, "another block's key"},
      {80, "payload size"},
      {88, "content hash mismatch"},
      {kHeaderBytes, "content hash mismatch"},
      {kHeaderBytes + kBlockBytes - 1, "content hash mismatch"},
  };
  std::vector<uint8_t> out(kBlockBytes);
  for (const auto& c : cases) {
    ASSERT_TRUE(store->write(key_of(1), payload_of(1)).ok());
    std::vector<uint8_t> bytes = slurp(file_of(key_of(1)));
    bytes[static_cast<size_t>(c.offset)] ^= 0x10;
    spit(file_of(key_of(1)), bytes);
    if (c.offset < 88) {  // the header check catches it
      EXPECT_TRUE(store->scan().empty()) << c.offset;
    }
    const Status s = store->read(key_of(1), out);
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << c.offset;
    EXPECT_TRUE(contains(s, c.message)) << s.message();
    EXPECT_TRUE(contains(s, file_of(key_of(1)))) << s.message();
    EXPECT_FALSE(fs::exists(file_of(key_of(1)))) << c.offset;
  }
}

TEST_F(KvDiskStoreTest, TruncatedAndOverlongFilesAreDataLoss) {
  auto store = open_store();
  ASSERT_TRUE(store->write(key_of(1), payload_of(1)).ok());
  const std::vector<uint8_t> good = slurp(file_of(key_of(1)));
  std::vector<uint8_t> out(kBlockBytes);
  for (size_t len = 0; len < good.size(); ++len) {
    spit(file_of(key_of(1)), std::vector<uint8_t>(good.begin(), good.begin() + static_cast<ptrdiff_t>(len)));
    EXPECT_TRUE(store->scan().empty()) << len;
    const Status s = store->read(key_of(1), out);
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << len;
    EXPECT_TRUE(contains(s, "short file")) << s.message();
    EXPECT_FALSE(fs::exists(file_of(key_of(1)))) << len;
  }
  std::vector<uint8_t> longer = good;
  longer.push_back(0);
  spit(file_of(key_of(1)), longer);
  EXPECT_TRUE(store->scan().empty());
  const Status s = store->read(key_of(1), out);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_TRUE(contains(s, "trailing bytes")) << s.message();
}

TEST_F(KvDiskStoreTest, ForeignFingerprintIsSkippedByScanAndRefusedByRead) {
  auto a = open_store("model-a");
  ASSERT_TRUE(a->write(key_of(1), payload_of(1)).ok());
  auto b = open_store("model-b");
  EXPECT_TRUE(b->scan().empty());
  EXPECT_TRUE(fs::exists(file_of(key_of(1))));  // left for the other model's server
  EXPECT_EQ(a->scan(), std::vector<KvBlockKey>{key_of(1)});
  std::vector<uint8_t> out(kBlockBytes);
  const Status s = b->read(key_of(1), out);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_TRUE(contains(s, "written for another model or KV layout")) << s.message();
}

TEST_F(KvDiskStoreTest, FileUnderAnotherKeysNameIsRejected) {
  auto store = open_store();
  ASSERT_TRUE(store->write(key_of(1), payload_of(1)).ok());
  fs::rename(file_of(key_of(1)), file_of(key_of(2)));
  EXPECT_TRUE(store->scan().empty());
  std::vector<uint8_t> out(kBlockBytes);
  EXPECT_EQ(store->read(key_of(2), out).code(), StatusCode::kDataLoss);
}

TEST_F(KvDiskStoreTest, OtherShardsAndOtherFilesAreIgnored) {
  auto r0 = open_store("model-a", "r0of2");
  auto r1 = open_store("model-a", "r1of2");
  ASSERT_TRUE(r0->write(key_of(1), payload_of(1)).ok());
  ASSERT_TRUE(r1->write(key_of(2), payload_of(2)).ok());
  EXPECT_EQ(r0->scan(), std::vector<KvBlockKey>{key_of(1)});
  EXPECT_EQ(r1->scan(), std::vector<KvBlockKey>{key_of(2)});
  std::vector<uint8_t> out(kBlockBytes);
  EXPECT_EQ(r1->read(key_of(1), out).code(), StatusCode::kNotFound);
  // Malformed names, an upper-case spelling, a directory with a block file's name.
  std::string upper = key_of(3).hex();
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  spit(dir_ + "/" + upper + ".r0of2.kvb", slurp(file_of(key_of(1), "r0of2")));
  spit(dir_ + "/notes.txt", {1, 2, 3});
  spit(dir_ + "/" + key_of(4).hex().substr(1) + ".r0of2.kvb", {});
  fs::create_directory(file_of(key_of(5), "r0of2"));
  EXPECT_EQ(r0->scan(), std::vector<KvBlockKey>{key_of(1)});
  EXPECT_NE(r0->read(key_of(5), out).code(), StatusCode::kOk);
}

TEST_F(KvDiskStoreTest, OpenDeletesOnlyThisShardsTemporaryFiles) {
  const std::string mine = dir_ + "/" + key_of(1).hex() + ".r0of1.4242-7.tmp";
  const std::string theirs = dir_ + "/" + key_of(1).hex() + ".r1of2.4242-7.tmp";
  spit(mine, {1, 2, 3});
  spit(theirs, {1, 2, 3});
  spit(dir_ + "/notes.tmp", {1});
  auto store = open_store("model-a", "r0of1");
  EXPECT_FALSE(fs::exists(mine));
  EXPECT_TRUE(fs::exists(theirs));
  EXPECT_TRUE(fs::exists(dir_ + "/notes.tmp"));
  EXPECT_TRUE(store->scan().empty());
}

TEST_F(KvDiskStoreTest, WrongSizesAndArgumentsAreRefused) {
  auto store = open_store();
  EXPECT_EQ(store->write(key_of(1), payload_of(1, kBlockBytes - 1)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store->write(key_of(1), payload_of(1, kBlockBytes + 1)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store->write(key_of(1), {}).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(store->write(key_of(1), payload_of(1)).ok());
  std::vector<uint8_t> small(kBlockBytes - 1);
  EXPECT_EQ(store->read(key_of(1), small).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(fs::exists(file_of(key_of(1))));
  // A store of another block size refuses (and drops) the file.
  auto other = KvDiskStore::open(dir_, fingerprint_of("model-a"), "r0of1", kBlockBytes * 2);
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE((*other)->scan().empty());
  std::vector<uint8_t> big(kBlockBytes * 2);
  EXPECT_EQ((*other)->read(key_of(1), big).code(), StatusCode::kDataLoss);

  const Sha256Digest fp = fingerprint_of("model-a");
  EXPECT_EQ(KvDiskStore::open(dir_, fp, "r0of1", 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(KvDiskStore::open(dir_, fp, "", kBlockBytes).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(KvDiskStore::open(dir_, fp, "r0.1", kBlockBytes).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(KvDiskStore::open(dir_, fp, "../x", kBlockBytes).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(KvDiskStoreTest, UnusableDirectoryNamesIt) {
  const Sha256Digest fp = fingerprint_of("model-a");
  spit(dir_ + "/file", {1});
  for (const std::string& bad : {dir_ + "/file", dir_ + "/file/sub"}) {
    auto r = KvDiskStore::open(bad, fp, "r0of1", kBlockBytes);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kIoError);
    EXPECT_TRUE(contains(r.status(), bad)) << r.status().message();
  }
  // A directory without write permission: root ignores permissions, so only other users can
  // check it (the cases above hold for everyone).
  if (::geteuid() == 0) return;
  fs::create_directory(dir_ + "/locked");
  fs::permissions(dir_ + "/locked", fs::perms::owner_read | fs::perms::owner_exec);
  auto r = KvDiskStore::open(dir_ + "/locked", fp, "r0of1", kBlockBytes);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(contains(r.status(), dir_ + "/locked")) << r.status().message();
  auto nested = KvDiskStore::open(dir_ + "/locked/sub", fp, "r0of1", kBlockBytes);
  ASSERT_FALSE(nested.ok());
  EXPECT_TRUE(contains(nested.status(), dir_ + "/locked/sub")) << nested.status().message();
  fs::permissions(dir_ + "/locked", fs::perms::owner_all);
}

TEST_F(KvDiskStoreTest, ConcurrentWritesAndReadsOfDifferentKeys) {
  auto store = open_store();
  constexpr int kThreads = 4, kKeysPerThread = 50;
  std::vector<std::thread> threads;
  std::vector<int> failures(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<uint8_t> out(kBlockBytes);
      for (int round = 0; round < 3; ++round) {
        for (int i = 0; i < kKeysPerThread; ++i) {
          const int k = t * kKeysPerThread + i;
          if (!store->write(key_of(k), payload_of(k + round)).ok()) ++failures[t];
          if (!store->read(key_of(k), out).ok() || out != payload_of(k + round)) ++failures[t];
          if (i % 5 == 0) store->remove(key_of(k));
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures, std::vector<int>(kThreads, 0));
  const std::vector<KvBlockKey> keys = store->scan();
  EXPECT_EQ(keys.size(), static_cast<size_t>(kThreads * kKeysPerThread * 4 / 5));
  std::unordered_set<KvBlockKey> unique(keys.begin(), keys.end());
  EXPECT_EQ(unique.size(), keys.size());
}

}  // namespace
}  // namespace pagoda
