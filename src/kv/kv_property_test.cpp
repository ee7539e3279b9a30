// Randomized model test of KvCacheManager + BlockPool: long seeded sequences of scheduler-like
// operations (admit with prefix hits, chunked prefill, decode with draft slots, finish, abort,
// preempt and re-admit, prefix-cache resets), checked after every step against a shadow model
// that records which tokens were written into every block and which exact salted prefix every
// cached block holds. Some runs make every block hash collide (a constant hasher), so that only
// the token compares, parent links and exact salts can keep the hits right.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "kv/kv_cache_manager.h"

namespace pagoda {
namespace {

using Tokens = std::vector<TokenId>;

constexpr TokenId kUnwritten = -1;
constexpr int64_t kMaxLen = 60;      // a request finishes once it has this many tokens
constexpr int64_t kMaxDrafts = 3;    // speculative slots allocated past the last real token
constexpr size_t kMaxLive = 12;

struct SimConfig {
  uint32_t seed;
  int32_t block_size;
  bool caching;
  int num_ops;
  bool collide = false;  // every block hash (and so every salt's chain root) collides
};

void PrintTo(const SimConfig& c, std::ostream* os) {
  *os << "{seed " << c.seed << ", block_size " << c.block_size << ", caching " << c.caching
      << ", " << c.num_ops << " ops" << (c.collide ? ", colliding hashes" : "") << "}";
}

std::string config_name(const testing::TestParamInfo<SimConfig>& info) {
  return "seed" + std::to_string(info.param.seed) + "_bs" + std::to_string(info.param.block_size) +
         (info.param.caching ? "_cache" : "_nocache") + (info.param.collide ? "_collide" : "");
}

struct SimRequest {
  Tokens tokens;
  int64_t num_computed = 0;
  std::string salt;
  bool running = false;
  int64_t admitted_at = 0;  // admission sequence number, for preempting the newest first
};

class KvSimulation {
 public:
  explicit KvSimulation(const SimConfig& c)
      : cfg_(c),
        rng_(c.seed),
        bs_(c.block_size),
        num_blocks_(static_cast<int32_t>(3 * ((kMaxLen + kMaxDrafts + bs_ - 1) / bs_))),
        m_(KvCacheConfig{num_blocks_, bs_, c.caching}),
        content_(static_cast<size_t>(num_blocks_), Tokens(static_cast<size_t>(bs_), kUnwritten)),
        cached_(static_cast<size_t>(num_blocks_), false),
        prefix_(static_cast<size_t>(num_blocks_)),
        prefix_salt_(static_cast<size_t>(num_blocks_)) {
    if (c.collide) m_.set_block_hasher_for_testing([](uint64_t, std::span<const TokenId>) {
      return uint64_t{7};
    });
    // Shared prompt prefixes; P3 extends P2 so prefixes nest.
    prefixes_.push_back({});
    prefixes_.push_back(random_tokens(10, 100, 200));
    prefixes_.push_back(random_tokens(16, 100, 200));
    prefixes_.push_back(prefixes_[2]);
    Tokens more = random_tokens(5, 100, 200);
    prefixes_[3].insert(prefixes_[3].end(), more.begin(), more.end());
    salts_ = {"", "", "", "tenant-a", "tenant-b", std::string("tenant-a\0", 9)};
  }

  void run() {
    for (int op = 0; op < cfg_.num_ops; ++op) {
      const int dice = uniform(0, 99);
      if (dice < 22) {
        op_new_request();
      } else if (dice < 35) {
        op_admit_waiting();
      } else if (dice < 80) {
        op_grow();
      } else if (dice < 90) {
        op_finish();
      } else if (dice < 97) {
        op_preempt();
      } else {
        op_reset();
      }
      check_all();
      if (testing::Test::HasFatalFailure() || testing::Test::HasNonfatalFailure()) {
        ADD_FAILURE() << "first failure after operation " << op;
        return;
      }
    }
    testing::Test::RecordProperty("hit_tokens", std::to_string(num_hit_tokens_));
    testing::Test::RecordProperty("failed_allocations", std::to_string(num_failed_allocs_));
    testing::Test::RecordProperty("successful_resets", std::to_string(num_resets_));
    for (auto& [id, r] : reqs_) m_.free(id);
    reqs_.clear();
    check_all();
    EXPECT_EQ(m_.num_free_blocks(), num_blocks_);
    EXPECT_EQ(m_.usage(), 0.0);
    if (cfg_.caching) {
      EXPECT_GT(num_hit_tokens_, 0) << "the workload never exercised a prefix hit";
      EXPECT_GT(num_failed_allocs_, 0) << "the workload never ran out of blocks";
      EXPECT_GT(num_resets_, 0) << "the workload never reset the prefix cache";
      EXPECT_EQ(m_.stats().hits, num_hit_tokens_);
    } else {
      EXPECT_EQ(m_.stats().queries, 0);
    }
  }

 private:
  int uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

  Tokens random_tokens(int n, TokenId lo, TokenId hi) {
    Tokens t(static_cast<size_t>(n));
    for (TokenId& x : t) x = uniform(lo, hi);
    return t;
  }

  template <typename Pred>
  RequestId pick(Pred pred) {
    std::vector<RequestId> ids;
    for (const auto& [id, r] : reqs_) {
      if (pred(r)) ids.push_back(id);
    }
    if (ids.empty()) return 0;
    return ids[static_cast<size_t>(uniform(0, static_cast<int>(ids.size()) - 1))];
  }

  // What the pool looks like from outside, to prove a refused allocation changed nothing.
  struct Snapshot {
    std::vector<BlockId> free_queue;
    std::vector<int32_t> refs;
    std::vector<std::optional<uint64_t>> hashes;
    std::vector<uint64_t> generations;
    std::vector<BlockId> table;
    PrefixCacheStats stats;
    bool operator==(const Snapshot& o) const {
      return free_queue == o.free_queue && refs == o.refs && hashes == o.hashes &&
             generations == o.generations && table == o.table &&
             stats.queries == o.stats.queries && stats.hits == o.stats.hits;
    }
  };
  Snapshot snapshot(RequestId id) const {
    Snapshot s;
    s.refs.reserve(static_cast<size_t>(num_blocks_));
    s.hashes.reserve(static_cast<size_t>(num_blocks_));
    s.free_queue = m_.pool().free_queue();
    for (BlockId b = 0; b < num_blocks_; ++b) {
      s.refs.push_back(m_.pool().ref_count(b));
      s.hashes.push_back(m_.pool().block_hash(b));
      s.generations.push_back(m_.pool().generation(b));
    }
    std::span<const BlockId> t = m_.block_table(id);
    s.table.assign(t.begin(), t.end());
    s.stats = m_.stats();
    return s;
  }

  Tokens prefix_of(const Tokens& t, int64_t n) const {
    return Tokens(t.begin(), t.begin() + static_cast<ptrdiff_t>(n));
  }

  // Whether `stored` is exactly the first n tokens of t.
  static bool is_prefix(const Tokens& stored, const Tokens& t, int64_t n) {
    return static_cast<int64_t>(stored.size()) == n && static_cast<int64_t>(t.size()) >= n &&
           std::equal(stored.begin(), stored.end(), t.begin());
  }

  // Whether the shadow model holds a cached block for exactly this salted prefix.
  bool shadow_has(const std::string& salt, const Tokens& tokens, int64_t num_tokens) const {
    for (BlockId b = 0; b < num_blocks_; ++b) {
      if (!cached_[b] || prefix_salt_[b] != salt) continue;
      if (static_cast<int64_t>(prefix_[b].size()) != num_tokens) continue;
      if (std::equal(prefix_[b].begin(), prefix_[b].end(), tokens.begin())) return true;
    }
    return false;
  }

  // A hit is right (every block holds this request's salted prefix) and maximal.
  void check_hit(const SimRequest& r, const ComputedBlocks& hit) {
    const int64_t n = static_cast<int64_t>(hit.blocks.size());
    ASSERT_EQ(hit.num_tokens, n * bs_);
    if (!cfg_.caching) {
      ASSERT_EQ(n, 0);
      return;
    }
    const int64_t max_blocks = (static_cast<int64_t>(r.tokens.size()) - 1) / bs_;
    ASSERT_LE(n, max_blocks);
    for (int64_t i = 0; i < n; ++i) {
      const BlockId b = hit.blocks[static_cast<size_t>(i)];
      ASSERT_TRUE(cached_[b]) << "hit on block " << b << " which the shadow says is not cached";
      ASSERT_EQ(prefix_salt_[b], r.salt);
      ASSERT_TRUE(is_prefix(prefix_[b], r.tokens, (i + 1) * bs_)) << "hit block " << b;
      for (int64_t j = 0; j < bs_; ++j) {
        ASSERT_EQ(content_[b][j], r.tokens[static_cast<size_t>(i * bs_ + j)]);
      }
    }
    if (n < max_blocks) {
      ASSERT_FALSE(shadow_has(r.salt, r.tokens, (n + 1) * bs_))
          << "a cached block for the next prefix block was missed";
    }
    num_hit_tokens_ += hit.num_tokens;
  }

  // Applies a successful allocate_slots to the shadow: new blocks are fresh (evicted), the new
  // tokens are written, full blocks are committed.
  void apply_alloc(RequestId id, SimRequest& r, size_t old_size, const ComputedBlocks& hit,
                   int64_t num_new_real, int64_t total) {
    std::span<const BlockId> table = m_.block_table(id);
    ASSERT_GE(table.size(), old_size + hit.blocks.size());
    ASSERT_EQ(static_cast<int64_t>(table.size()),
              std::max<int64_t>(static_cast<int64_t>(old_size), m_.blocks_for(total)));
    for (size_t i = 0; i < hit.blocks.size(); ++i) ASSERT_EQ(table[old_size + i], hit.blocks[i]);
    for (size_t i = old_size + hit.blocks.size(); i < table.size(); ++i) {
      const BlockId b = table[i];
      ASSERT_EQ(m_.pool().ref_count(b), 1) << "a newly allocated block must be exclusive";
      cached_[b] = false;
      prefix_[b].clear();
      std::fill(content_[b].begin(), content_[b].end(), kUnwritten);
    }
    for (int64_t p = r.num_computed; p < r.num_computed + num_new_real; ++p) {
      content_[table[static_cast<size_t>(p / bs_)]][static_cast<size_t>(p % bs_)] =
          r.tokens[static_cast<size_t>(p)];
    }
    r.num_computed += num_new_real;
    if (!cfg_.caching) return;
    const int64_t num_full = std::min<int64_t>(total, static_cast<int64_t>(r.tokens.size())) / bs_;
    for (int64_t i = 0; i < num_full; ++i) {
      const BlockId b = table[static_cast<size_t>(i)];
      Tokens expect = prefix_of(r.tokens, (i + 1) * bs_);
      if (cached_[b]) {
        ASSERT_EQ(prefix_[b], expect);
        ASSERT_EQ(prefix_salt_[b], r.salt);
      } else {
        cached_[b] = true;
        prefix_[b] = std::move(expect);
        prefix_salt_[b] = r.salt;
      }
    }
  }

  bool try_admit(RequestId id) {
    SimRequest& r = reqs_.at(id);
    ComputedBlocks hit = m_.get_computed_blocks(id, r.tokens, r.salt);
    check_hit(r, hit);
    if (testing::Test::HasFatalFailure()) return false;
    const int64_t remaining = static_cast<int64_t>(r.tokens.size()) - hit.num_tokens;
    // Half the admissions prefill in chunks.
    const int64_t n = uniform(0, 1) ? remaining : uniform(1, static_cast<int>(remaining));
    const Snapshot before = snapshot(id);
    r.num_computed = hit.num_tokens;
    if (!m_.allocate_slots(id, r.tokens, hit.num_tokens, n, hit, r.salt)) {
      ++num_failed_allocs_;
      r.num_computed = 0;
      EXPECT_TRUE(snapshot(id) == before) << "refused admission changed state";
      return false;
    }
    r.running = true;
    r.admitted_at = ++admissions_;
    apply_alloc(id, r, 0, hit, n, hit.num_tokens + n);
    return true;
  }

  void op_new_request() {
    if (reqs_.size() >= kMaxLive) return;
    SimRequest r;
    r.tokens = prefixes_[static_cast<size_t>(uniform(0, static_cast<int>(prefixes_.size()) - 1))];
    // A tiny vocabulary makes identical blocks in different chains common.
    Tokens suffix = random_tokens(uniform(1, 14), 0, 3);
    r.tokens.insert(r.tokens.end(), suffix.begin(), suffix.end());
    r.salt = salts_[static_cast<size_t>(uniform(0, static_cast<int>(salts_.size()) - 1))];
    const RequestId id = next_id_++;
    reqs_.emplace(id, std::move(r));
    try_admit(id);
  }

  void op_admit_waiting() {
    const RequestId id = pick([](const SimRequest& r) { return !r.running; });
    if (id != 0) try_admit(id);
  }

  void preempt(RequestId id) {
    SimRequest& r = reqs_.at(id);
    m_.free(id);
    r.running = false;
    r.num_computed = 0;
  }

  void op_grow() {
    const RequestId id = pick([](const SimRequest& r) { return r.running; });
    if (id == 0) return;
    SimRequest& r = reqs_.at(id);
    if (r.num_computed == static_cast<int64_t>(r.tokens.size())) {
      if (static_cast<int64_t>(r.tokens.size()) >= kMaxLen) {
        m_.free(id);
        reqs_.erase(id);
        return;
      }
      // Sampled (or accepted speculative) tokens, from the tiny vocabulary.
      const int num_sampled = uniform(1, 3);
      for (int i = 0; i < num_sampled; ++i) r.tokens.push_back(uniform(0, 3));
    }
    const int64_t remaining = static_cast<int64_t>(r.tokens.size()) - r.num_computed;
    const int64_t n = uniform(1, static_cast<int>(std::min<int64_t>(remaining, 8)));
    // Draft slots only once caught up, as a speculative step would have.
    const int64_t drafts = (n == remaining && uniform(0, 2) == 0) ? uniform(1, kMaxDrafts) : 0;
    const size_t old_size = m_.block_table(id).size();
    const Snapshot before = snapshot(id);
    if (!m_.allocate_slots(id, r.tokens, r.num_computed, n + drafts, {}, r.salt)) {
      ++num_failed_allocs_;
      EXPECT_TRUE(snapshot(id) == before) << "refused growth changed state";
      // Out of blocks: preempt the newest running request (possibly this one).
      RequestId newest = 0;
      int64_t newest_at = -1;
      for (const auto& [rid, rr] : reqs_) {
        if (rr.running && rr.admitted_at > newest_at) newest = rid, newest_at = rr.admitted_at;
      }
      preempt(newest);
      return;
    }
    apply_alloc(id, r, old_size, ComputedBlocks{}, n, r.num_computed + n + drafts);
  }

  void op_finish() {
    const RequestId id = pick([](const SimRequest&) { return true; });
    if (id == 0) return;
    m_.free(id);
    reqs_.erase(id);
  }

  void op_preempt() {
    const RequestId id = pick([](const SimRequest& r) { return r.running; });
    if (id != 0) preempt(id);
  }

  void op_reset() {
    // Some attempts first preempt everything (as an engine draining for a weight update).
    if (uniform(0, 3) == 0) {
      for (auto& [id, r] : reqs_) {
        if (r.running) preempt(id);
      }
    }
    bool idle = true;
    for (const auto& [id, r] : reqs_) idle = idle && !r.running;
    EXPECT_EQ(m_.reset_prefix_cache(), idle);
    if (idle) {
      ++num_resets_;
      std::fill(cached_.begin(), cached_.end(), false);
      for (Tokens& p : prefix_) p.clear();
    }
  }

  void check_all() {
    Status s = m_.check_invariants();
    ASSERT_TRUE(s.ok()) << s.message();
    // holders[b]: (request, index in its block table) for every live reference.
    // (A member, cleared, so the inner vectors keep their capacity between calls.)
    auto& holders = holders_;
    holders.resize(static_cast<size_t>(num_blocks_));
    for (auto& h : holders) h.clear();
    for (const auto& [id, r] : reqs_) {
      std::span<const BlockId> table = m_.block_table(id);
      if (!r.running) {
        ASSERT_TRUE(table.empty()) << "waiting request " << id << " holds blocks";
        continue;
      }
      ASSERT_GE(static_cast<int64_t>(table.size()), m_.blocks_for(r.num_computed));
      // The KV this request will attend to is still what it wrote (or what its hit held).
      // (Plain ifs in the hot loops: gtest assertions dominate the run time in Debug.)
      for (int64_t p = 0; p < r.num_computed; ++p) {
        const BlockId b = table[static_cast<size_t>(p / bs_)];
        if (content_[b][static_cast<size_t>(p % bs_)] != r.tokens[static_cast<size_t>(p)]) {
          FAIL() << "request " << id << " position " << p << " block " << b
                 << " holds another token";
        }
      }
      for (size_t i = 0; i < table.size(); ++i) {
        holders[static_cast<size_t>(table[i])].push_back({&r, static_cast<int64_t>(i)});
      }
    }
    int32_t in_use = 0;
    for (BlockId b = 0; b < num_blocks_; ++b) {
      const auto& h = holders[static_cast<size_t>(b)];
      if (m_.pool().ref_count(b) != static_cast<int32_t>(h.size())) {
        FAIL() << "block " << b << " ref_count " << m_.pool().ref_count(b) << " but "
               << h.size() << " holders";
      }
      if (m_.pool().is_cached(b) != static_cast<bool>(cached_[b])) {
        FAIL() << "block " << b << " is_cached disagrees with the shadow";
      }
      in_use += !h.empty();
      if (h.size() < 2) continue;
      // Shared only as a cached full block holding the same salted prefix for every holder.
      ASSERT_TRUE(cached_[b]) << "block " << b << " shared but not cached";
      for (const auto& [r, index] : h) {
        if (prefix_salt_[b] != r->salt || !is_prefix(prefix_[b], r->tokens, (index + 1) * bs_)) {
          FAIL() << "block " << b << " shared by requests with different salted prefixes";
        }
      }
    }
    ASSERT_EQ(m_.num_free_blocks(), num_blocks_ - in_use);
  }

  SimConfig cfg_;
  std::mt19937 rng_;
  int32_t bs_;
  int32_t num_blocks_;
  KvCacheManager m_;
  // Shadow of every block: the token written at each slot, and for cached blocks the full
  // salted prefix (tokens [0, (i + 1) * block_size) of the request that committed it).
  std::vector<Tokens> content_;
  std::vector<bool> cached_;
  std::vector<std::vector<std::pair<const SimRequest*, int64_t>>> holders_;
  std::vector<Tokens> prefix_;
  std::vector<std::string> prefix_salt_;

  std::vector<Tokens> prefixes_;
  std::vector<std::string> salts_;
  std::map<RequestId, SimRequest> reqs_;
  RequestId next_id_ = 1;  // 0 means "none" in pick()
  int64_t admissions_ = 0;
  int64_t num_hit_tokens_ = 0;
  int64_t num_failed_allocs_ = 0;
  int64_t num_resets_ = 0;
};

class KvPropertyTest : public testing::TestWithParam<SimConfig> {};

TEST_P(KvPropertyTest, RandomOperationsKeepEveryInvariant) {
  KvSimulation sim(GetParam());
  sim.run();
}

INSTANTIATE_TEST_SUITE_P(Seeds, KvPropertyTest,
                         testing::Values(SimConfig{1, 4, true, 20000}, SimConfig{2, 4, true, 20000},
                                         SimConfig{3, 1, true, 8000}, SimConfig{4, 3, true, 20000},
                                         SimConfig{5, 4, false, 10000},
                                         SimConfig{6, 4, true, 20000, true},
                                         SimConfig{7, 1, true, 8000, true},
                                         SimConfig{8, 3, true, 20000, true}),
                         config_name);

}  // namespace
}  // namespace pagoda
