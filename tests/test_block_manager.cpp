// The KV block manager: reference counting, all-or-nothing allocation, the
// prefix cache (hash chain, full blocks only, LRU eviction), and a randomized
// run checked against a shadow model after every operation.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <span>
#include <vector>

#include "kv/block_manager.h"
#include "util/error.h"

namespace tandem {
namespace {

constexpr int kBs = 4;

BlockManagerConfig config(int64_t n_blocks, bool caching = true, uint64_t salt = 0) {
  BlockManagerConfig c;
  c.n_blocks = n_blocks;
  c.block_size = kBs;
  c.enable_prefix_caching = caching;
  c.salt = salt;
  return c;
}

std::vector<int32_t> iota_tokens(int n, int32_t start) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), start);
  return t;
}

std::span<const int32_t> block_of(const std::vector<int32_t>& tokens, int i) {
  return std::span<const int32_t>(tokens).subspan(static_cast<size_t>(i * kBs), kBs);
}

// What a request does after computing its prompt: allocate blocks for every
// token not matched, then register each full block along the hash chain.
struct Request {
  std::vector<int32_t> blocks;
  std::vector<BlockHash> hashes;  // of the full blocks
  int64_t matched_tokens = 0;
};

Request run_prompt(BlockManager& bm, const std::vector<int32_t>& tokens) {
  Request r;
  const int64_t n = static_cast<int64_t>(tokens.size());
  BlockManager::PrefixMatch m = bm.acquire_prefix(tokens, n - 1);
  r.blocks = m.blocks;
  r.hashes = m.hashes;
  r.matched_tokens = m.n_tokens;
  const int64_t need = (n + kBs - 1) / kBs - static_cast<int64_t>(r.blocks.size());
  auto fresh = bm.allocate(need);
  EXPECT_TRUE(fresh.has_value());
  if (!fresh) return r;
  r.blocks.insert(r.blocks.end(), fresh->begin(), fresh->end());
  for (int i = static_cast<int>(r.hashes.size()); (i + 1) * kBs <= n; ++i) {
    const BlockHash parent = i == 0 ? kNoParentHash : r.hashes.back();
    r.hashes.push_back(bm.commit_full_block(r.blocks[i], parent, block_of(tokens, i)));
  }
  bm.check_invariants();
  return r;
}

void expect_counts(const BlockManager& bm, int64_t free, int64_t owned, int64_t cached) {
  const BlockManagerStats s = bm.stats();
  EXPECT_EQ(s.free, free);
  EXPECT_EQ(s.owned, owned);
  EXPECT_EQ(s.cached, cached);
  EXPECT_EQ(s.free + s.owned + s.cached, s.total);
  EXPECT_EQ(bm.n_available(), free + cached);
}

TEST(BlockManager, RejectsBadConfig) {
  BlockManagerConfig zero_size = config(4);
  zero_size.block_size = 0;
  EXPECT_THROW(BlockManager{zero_size}, Error);
  EXPECT_THROW(BlockManager{config(-1)}, Error);
  BlockManager empty(config(0));
  EXPECT_EQ(empty.n_total(), 0);
  EXPECT_FALSE(empty.allocate(1).has_value());
  EXPECT_TRUE(empty.allocate(0).has_value());
  empty.check_invariants();
}

TEST(BlockManager, AllocateReleaseAccounting) {
  BlockManager bm(config(8));
  EXPECT_EQ(bm.n_total(), 8);
  EXPECT_EQ(bm.block_size(), kBs);
  expect_counts(bm, 8, 0, 0);

  auto a = bm.allocate(3);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(*a, (std::vector<int32_t>{0, 1, 2}));
  for (int32_t b : *a) EXPECT_EQ(bm.refcount(b), 1);
  expect_counts(bm, 5, 3, 0);

  auto b = bm.allocate(5);
  ASSERT_TRUE(b.has_value());
  std::set<int32_t> all(a->begin(), a->end());
  all.insert(b->begin(), b->end());
  EXPECT_EQ(all.size(), 8u) << "a block was handed out twice";
  expect_counts(bm, 0, 8, 0);

  bm.release(*a);
  for (int32_t x : *a) EXPECT_EQ(bm.refcount(x), 0);
  expect_counts(bm, 3, 5, 0);
  bm.release(*b);
  expect_counts(bm, 8, 0, 0);
  bm.check_invariants();
}

TEST(BlockManager, AllocationIsAllOrNothing) {
  BlockManager bm(config(8));
  const auto tokens = iota_tokens(8, 100);
  Request r = run_prompt(bm, tokens);  // 2 blocks, both registered
  bm.release(r.blocks);
  auto held = bm.allocate(4);
  ASSERT_TRUE(held.has_value());
  expect_counts(bm, 2, 4, 2);

  // 4 available (2 free + 2 cached): asking for 5 must change nothing.
  EXPECT_FALSE(bm.allocate(5).has_value());
  expect_counts(bm, 2, 4, 2);
  EXPECT_EQ(bm.stats().evictions, 0);
  for (int32_t b : *held) EXPECT_EQ(bm.refcount(b), 1);
  bm.check_invariants();
  // The cached blocks were not evicted by the failed attempt.
  BlockManager::PrefixMatch m = bm.acquire_prefix(tokens, 8);
  EXPECT_EQ(m.blocks, r.blocks);
  bm.release(m.blocks);

  // Exactly the available count succeeds, evicting the cached blocks.
  auto rest = bm.allocate(4);
  ASSERT_TRUE(rest.has_value());
  expect_counts(bm, 0, 8, 0);
  EXPECT_EQ(bm.stats().evictions, 2);
  EXPECT_FALSE(bm.allocate(1).has_value());
  expect_counts(bm, 0, 8, 0);
  bm.check_invariants();
}

TEST(BlockManager, AddRefSharesBlocksBetweenSiblings) {
  BlockManager bm(config(4));
  const auto tokens = iota_tokens(8, 1);
  Request parent = run_prompt(bm, tokens);
  ASSERT_EQ(parent.blocks.size(), 2u);
  for (int32_t b : parent.blocks) bm.add_ref(b);  // a sibling forks off
  for (int32_t b : parent.blocks) EXPECT_EQ(bm.refcount(b), 2);
  expect_counts(bm, 2, 2, 0);

  bm.release(parent.blocks);  // the parent finishes, the sibling still holds them
  for (int32_t b : parent.blocks) EXPECT_EQ(bm.refcount(b), 1);
  expect_counts(bm, 2, 2, 0);

  bm.release(parent.blocks);  // the sibling finishes: registered blocks become cached
  for (int32_t b : parent.blocks) EXPECT_EQ(bm.refcount(b), 0);
  expect_counts(bm, 2, 0, 2);
  bm.check_invariants();
}

TEST(BlockManager, PrefixHitAfterRelease) {
  BlockManager bm(config(8));
  const auto prompt = iota_tokens(10, 7);  // 2 full blocks + 2 tokens

  Request first = run_prompt(bm, prompt);
  EXPECT_EQ(first.matched_tokens, 0);
  ASSERT_EQ(first.blocks.size(), 3u);
  ASSERT_EQ(first.hashes.size(), 2u);
  bm.release(first.blocks);
  expect_counts(bm, 6, 0, 2);  // the partial block is not registered

  BlockManager::PrefixMatch m = bm.acquire_prefix(prompt, 9);
  EXPECT_EQ(m.n_tokens, 8);
  EXPECT_EQ(m.blocks, (std::vector<int32_t>{first.blocks[0], first.blocks[1]}));
  EXPECT_EQ(m.hashes, first.hashes);
  for (int32_t b : m.blocks) EXPECT_EQ(bm.refcount(b), 1);
  expect_counts(bm, 6, 2, 0);

  // A concurrent request with the same prompt shares the owned blocks.
  BlockManager::PrefixMatch m2 = bm.acquire_prefix(prompt, 9);
  EXPECT_EQ(m2.blocks, m.blocks);
  for (int32_t b : m.blocks) EXPECT_EQ(bm.refcount(b), 2);
  expect_counts(bm, 6, 2, 0);
  bm.release(m.blocks);
  bm.release(m2.blocks);
  expect_counts(bm, 6, 0, 2);
  bm.check_invariants();
}

// The KV behind every block is gone (a tensor-parallel worker was
// replaced): nothing cached matches again, the cached blocks are free, and
// what a live request owns stays its own until released.
TEST(BlockManager, ForgetCachedFreesEveryCachedBlockAndNothingMatchesAfter) {
  BlockManager bm(config(8));
  const auto prompt = iota_tokens(9, 10);
  const auto other = iota_tokens(5, 300);
  bm.release(run_prompt(bm, prompt).blocks);  // 2 full blocks cached, 1 freed
  Request live = run_prompt(bm, other);        // 1 full block registered, 2 owned
  expect_counts(bm, 4, 2, 2);
  bm.forget_cached();
  bm.check_invariants();
  expect_counts(bm, 6, 2, 0);
  EXPECT_EQ(bm.acquire_prefix(prompt, 8).n_tokens, 0);
  bm.release(live.blocks);
  expect_counts(bm, 7, 0, 1);  // the live request's full block is cached on release, as before
  bm.check_invariants();
}

TEST(BlockManager, OnlyFullBlocksMatch) {
  BlockManager bm(config(8));
  const auto prompt = iota_tokens(8, 50);
  bm.release(run_prompt(bm, prompt).blocks);  // registers 2 blocks

  const std::vector<int32_t> seven(prompt.begin(), prompt.begin() + 7);
  BlockManager::PrefixMatch m = bm.acquire_prefix(seven, 7);
  EXPECT_EQ(m.n_tokens, 4);
  EXPECT_EQ(m.blocks.size(), 1u);
  bm.release(m.blocks);

  const std::vector<int32_t> three(prompt.begin(), prompt.begin() + 3);
  m = bm.acquire_prefix(three, 3);
  EXPECT_EQ(m.n_tokens, 0);
  EXPECT_TRUE(m.blocks.empty());
  EXPECT_TRUE(m.hashes.empty());

  m = bm.acquire_prefix(prompt, 8);
  EXPECT_EQ(m.n_tokens, 8);
  bm.release(m.blocks);
  bm.check_invariants();
}

TEST(BlockManager, MaxTokensCapsTheMatch) {
  BlockManager bm(config(8));
  const auto prompt = iota_tokens(12, 3);
  bm.release(run_prompt(bm, prompt).blocks);
  // run_prompt matched nothing and registered all 3 full blocks.
  expect_counts(bm, 5, 0, 3);

  for (auto [max_tokens, want] : std::vector<std::pair<int64_t, int64_t>>{
           {11, 8}, {12, 12}, {100, 12}, {8, 8}, {7, 4}, {3, 0}, {0, 0}, {-5, 0}}) {
    BlockManager::PrefixMatch m = bm.acquire_prefix(prompt, max_tokens);
    EXPECT_EQ(m.n_tokens, want) << "max_tokens " << max_tokens;
    EXPECT_EQ(static_cast<int64_t>(m.blocks.size()) * kBs, m.n_tokens);
    EXPECT_EQ(m.hashes.size(), m.blocks.size());
    bm.release(m.blocks);
  }
  expect_counts(bm, 5, 0, 3);
  bm.check_invariants();
}

TEST(BlockManager, HashIsAChainOverParentSaltAndTokens) {
  BlockManager a(config(4, true, 1));
  BlockManager a2(config(4, true, 1));
  BlockManager b(config(4, true, 2));
  const auto t = iota_tokens(4, 10);
  const BlockHash h = a.hash_block(kNoParentHash, t);
  EXPECT_NE(h, kNoParentHash);
  EXPECT_EQ(a2.hash_block(kNoParentHash, t), h) << "the hash must be deterministic";
  EXPECT_NE(b.hash_block(kNoParentHash, t), h) << "salt must matter";
  EXPECT_NE(a.hash_block(h, t), h) << "parent must matter";
  std::vector<int32_t> swapped = t;
  std::swap(swapped[0], swapped[1]);
  EXPECT_NE(a.hash_block(kNoParentHash, swapped), h) << "token order must matter";
  std::vector<int32_t> bumped = t;
  ++bumped[3];
  EXPECT_NE(a.hash_block(kNoParentHash, bumped), h);

  // No collisions, and never 0, over many nearby inputs.
  std::set<BlockHash> seen;
  for (int32_t x = 0; x < 2000; ++x) {
    const std::vector<int32_t> tok{x, 0, 0, 0};
    for (BlockHash parent : {BlockHash{0}, BlockHash{1}, h}) {
      const BlockHash v = a.hash_block(parent, tok);
      EXPECT_NE(v, kNoParentHash);
      seen.insert(v);
    }
  }
  EXPECT_EQ(seen.size(), 6000u);
}

TEST(BlockManager, DifferentSaltMisses) {
  // The salt stands for the model: the same prompt under another salt gets a
  // different hash chain, so its blocks can never be matched across models.
  BlockManager a(config(4, true, 1));
  BlockManager b(config(4, true, 2));
  const auto prompt = iota_tokens(8, 0);
  Request ra = run_prompt(a, prompt);
  Request rb = run_prompt(b, prompt);
  ASSERT_EQ(ra.hashes.size(), 2u);
  ASSERT_EQ(rb.hashes.size(), 2u);
  EXPECT_NE(ra.hashes[0], rb.hashes[0]);
  EXPECT_NE(ra.hashes[1], rb.hashes[1]);
  a.release(ra.blocks);
  b.release(rb.blocks);
}

TEST(BlockManager, EarlierTokenChangesEveryLaterHash) {
  BlockManager bm(config(8));
  const auto prompt = iota_tokens(12, 200);
  bm.release(run_prompt(bm, prompt).blocks);

  // Differs only in block 0: blocks 1 and 2 have identical tokens, but their
  // parents differ, so nothing matches.
  auto early = prompt;
  early[1] = 9999;
  BlockManager::PrefixMatch m = bm.acquire_prefix(early, 12);
  EXPECT_EQ(m.n_tokens, 0);

  // Differs only in block 1: block 0 still matches.
  auto middle = prompt;
  middle[6] = 9999;
  m = bm.acquire_prefix(middle, 12);
  EXPECT_EQ(m.n_tokens, 4);
  bm.release(m.blocks);

  // Differs only in block 2: blocks 0 and 1 match.
  auto late = prompt;
  late[11] = 9999;
  m = bm.acquire_prefix(late, 12);
  EXPECT_EQ(m.n_tokens, 8);
  bm.release(m.blocks);
  bm.check_invariants();
}

TEST(BlockManager, EvictsLeastRecentlyReleasedFirst) {
  BlockManager bm(config(4));
  // Four single-block prompts, each registering one block.
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int32_t> block;
  for (int i = 0; i < 4; ++i) {
    prompts.push_back(iota_tokens(kBs, 1000 * (i + 1)));
    Request r = run_prompt(bm, prompts.back());
    ASSERT_EQ(r.blocks.size(), 1u);
    block.push_back(r.blocks[0]);
  }
  // Released in the order 2, 0, 3, 1: the LRU order.
  for (int i : {2, 0, 3, 1}) bm.release(std::vector<int32_t>{block[i]});
  expect_counts(bm, 0, 0, 4);

  auto e = bm.allocate(1);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ((*e)[0], block[2]);
  EXPECT_EQ(bm.stats().evictions, 1);
  // The evicted block's prefix is gone; the others still hit.
  EXPECT_EQ(bm.acquire_prefix(prompts[2], kBs).n_tokens, 0);

  // Touch 0 (acquire and release again): it becomes most recently used, so
  // 3 is now the oldest.
  BlockManager::PrefixMatch m = bm.acquire_prefix(prompts[0], kBs);
  ASSERT_EQ(m.blocks, std::vector<int32_t>{block[0]});
  bm.release(m.blocks);
  e = bm.allocate(1);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ((*e)[0], block[3]);
  e = bm.allocate(1);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ((*e)[0], block[1]);
  e = bm.allocate(1);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ((*e)[0], block[0]);
  EXPECT_EQ(bm.stats().evictions, 4);
  EXPECT_EQ(bm.acquire_prefix(prompts[0], kBs).n_tokens, 0);
  bm.check_invariants();
}

TEST(BlockManager, OneReleaseEvictsTheChainTailFirst) {
  BlockManager bm(config(3));
  const auto prompt = iota_tokens(12, 0);
  Request r = run_prompt(bm, prompt);
  bm.release(r.blocks);
  expect_counts(bm, 0, 0, 3);
  // Evicting the deepest block first keeps the shorter prefix usable.
  auto e = bm.allocate(1);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ((*e)[0], r.blocks[2]);
  BlockManager::PrefixMatch m = bm.acquire_prefix(prompt, 12);
  EXPECT_EQ(m.n_tokens, 8);
  bm.release(m.blocks);
  bm.check_invariants();
}

TEST(BlockManager, ReacquiredCachedBlockLeavesTheLru) {
  BlockManager bm(config(4));
  const auto prompt = iota_tokens(8, 5);
  Request r = run_prompt(bm, prompt);
  bm.release(r.blocks);
  expect_counts(bm, 2, 0, 2);

  BlockManager::PrefixMatch m = bm.acquire_prefix(prompt, 8);
  ASSERT_EQ(m.blocks, r.blocks);
  expect_counts(bm, 2, 2, 0);
  // Owned again, so no allocation may take them.
  EXPECT_FALSE(bm.allocate(3).has_value());
  auto rest = bm.allocate(2);
  ASSERT_TRUE(rest.has_value());
  for (int32_t b : *rest) EXPECT_EQ(std::count(r.blocks.begin(), r.blocks.end(), b), 0);
  EXPECT_EQ(bm.stats().evictions, 0);
  bm.release(*rest);
  bm.release(m.blocks);
  expect_counts(bm, 2, 0, 2);
  bm.check_invariants();
}

TEST(BlockManager, CommitOfAnAlreadyCachedHashKeepsTheFirstBlock) {
  BlockManager bm(config(4));
  const auto tokens = iota_tokens(kBs, 77);
  // Two requests computed the same block concurrently (neither could hit).
  auto a = bm.allocate(1);
  auto b = bm.allocate(1);
  ASSERT_TRUE(a && b);
  const BlockHash ha = bm.commit_full_block((*a)[0], kNoParentHash, tokens);
  const BlockHash hb = bm.commit_full_block((*b)[0], kNoParentHash, tokens);
  EXPECT_EQ(ha, hb);
  EXPECT_EQ(ha, bm.hash_block(kNoParentHash, tokens));
  // Committing the same block twice is harmless.
  EXPECT_EQ(bm.commit_full_block((*a)[0], kNoParentHash, tokens), ha);
  bm.check_invariants();

  bm.release(*b);  // unregistered: straight to free
  expect_counts(bm, 3, 1, 0);
  bm.release(*a);  // registered: cached
  expect_counts(bm, 3, 0, 1);
  BlockManager::PrefixMatch m = bm.acquire_prefix(tokens, kBs);
  EXPECT_EQ(m.blocks, *a);
  bm.release(m.blocks);

  // The same hash registered to a cached block: still the cached one wins.
  auto c = bm.allocate(1);
  ASSERT_TRUE(c.has_value());
  EXPECT_NE((*c)[0], (*a)[0]) << "a free block must be used before evicting";
  EXPECT_EQ(bm.commit_full_block((*c)[0], kNoParentHash, tokens), ha);
  bm.release(*c);
  expect_counts(bm, 3, 0, 1);
  m = bm.acquire_prefix(tokens, kBs);
  EXPECT_EQ(m.blocks, *a);
  bm.release(m.blocks);
  bm.check_invariants();
}

TEST(BlockManager, StatsCountQueriedAndHitTokens) {
  BlockManager bm(config(8));
  const auto prompt = iota_tokens(10, 1);
  bm.release(run_prompt(bm, prompt).blocks);  // 10 queried, 0 hit
  BlockManagerStats s = bm.stats();
  EXPECT_EQ(s.prefix_queries_tokens, 10);
  EXPECT_EQ(s.prefix_hits_tokens, 0);

  bm.release(run_prompt(bm, prompt).blocks);  // 10 queried, 8 hit
  const std::vector<int32_t> other = iota_tokens(6, 500);
  bm.release(run_prompt(bm, other).blocks);  // 6 queried, 0 hit
  s = bm.stats();
  EXPECT_EQ(s.prefix_queries_tokens, 26);
  EXPECT_EQ(s.prefix_hits_tokens, 8);
  EXPECT_EQ(s.evictions, 0);
  expect_counts(bm, 5, 0, 3);

  auto all = bm.allocate(8);
  ASSERT_TRUE(all.has_value());
  EXPECT_EQ(bm.stats().evictions, 3);
  bm.release(*all);
  expect_counts(bm, 8, 0, 0);
}

TEST(BlockManager, PrefixCachingDisabled) {
  BlockManager bm(config(4, false));
  const auto prompt = iota_tokens(8, 1);
  auto blocks = bm.allocate(2);
  ASSERT_TRUE(blocks.has_value());
  const BlockHash h0 = bm.commit_full_block((*blocks)[0], kNoParentHash, block_of(prompt, 0));
  EXPECT_EQ(h0, bm.hash_block(kNoParentHash, block_of(prompt, 0)));
  const BlockHash h1 = bm.commit_full_block((*blocks)[1], h0, block_of(prompt, 1));
  EXPECT_EQ(h1, bm.hash_block(h0, block_of(prompt, 1)));
  bm.release(*blocks);
  expect_counts(bm, 4, 0, 0);

  BlockManager::PrefixMatch m = bm.acquire_prefix(prompt, 8);
  EXPECT_TRUE(m.blocks.empty());
  EXPECT_EQ(m.n_tokens, 0);
  EXPECT_EQ(bm.stats().prefix_queries_tokens, 0);
  EXPECT_EQ(bm.stats().prefix_hits_tokens, 0);
  auto all = bm.allocate(4);
  ASSERT_TRUE(all.has_value());
  EXPECT_EQ(bm.stats().evictions, 0);
  bm.release(*all);
  bm.check_invariants();
}

TEST(BlockManagerDeathTest, DoubleReleaseAborts) {
  BlockManager bm(config(4));
  auto a = bm.allocate(2);
  ASSERT_TRUE(a.has_value());
  const int32_t b = (*a)[1];
  bm.release(*a);
  EXPECT_DEATH(bm.release(std::vector<int32_t>{b}),
               "block " + std::to_string(b) + " with refcount 0");
  // A block never allocated, and one still in the same release list twice.
  EXPECT_DEATH(bm.release(std::vector<int32_t>{3}), "block 3 with refcount 0");
  auto c = bm.allocate(1);
  ASSERT_TRUE(c.has_value());
  const int32_t x = (*c)[0];
  EXPECT_DEATH(bm.release(std::vector<int32_t>{x, x}), "block " + std::to_string(x));
  EXPECT_DEATH(bm.release(std::vector<int32_t>{4}), "out of range");
  EXPECT_DEATH(bm.add_ref(3), "add_ref on block 3");
}

// A randomized workload over a small pool, checked against a shadow model
// after every step: each block's refcount (from the live sequences), which
// blocks are registered (from the commits and the evictions allocate
// reveals), and the tokens each block holds, so a match must return blocks
// whose contents equal the prompt.
class Stress {
 public:
  Stress() : bm_(config(kBlocks)), rng_(12345) {
    for (auto& doc : docs_) {
      doc.resize(40);
      // A small vocabulary so different documents share blocks now and then.
      for (auto& t : doc) t = static_cast<int32_t>(rng_() % 3);
    }
    docs_[1] = docs_[0];
    docs_[1][20] = 7;  // shares 5 blocks with doc 0
  }

  void run(int steps) {
    for (int i = 0; i < steps; ++i) {
      const uint32_t op = rng_() % 100;
      if (op < 35)
        start();
      else if (op < 60)
        append();
      else if (op < 70)
        fork();
      else
        finish();
      verify();
      if (::testing::Test::HasFatalFailure() || ::testing::Test::HasNonfatalFailure()) return;
    }
  }

  void drain() {
    while (!seqs_.empty()) finish_at(0);
    verify();
    const BlockManagerStats s = bm_.stats();
    EXPECT_EQ(s.owned, 0);
    EXPECT_EQ(s.free + s.cached, kBlocks);
    const int64_t evictions = s.evictions;
    auto all = bm_.allocate(kBlocks);
    ASSERT_TRUE(all.has_value());
    EXPECT_EQ(bm_.stats().evictions, evictions + s.cached);
    bm_.release(*all);
    bm_.check_invariants();
    EXPECT_EQ(bm_.stats().free, kBlocks);
  }

  int64_t hits = 0, alloc_failures = 0, commits = 0, cows = 0;
  const BlockManager& bm() const { return bm_; }

 private:
  static constexpr int64_t kBlocks = 24;

  struct Seq {
    std::vector<int32_t> tokens;
    std::vector<int32_t> blocks;
    std::vector<BlockHash> hashes;  // one per full block, committed
  };

  void take(const std::vector<int32_t>& blocks) {
    for (int32_t b : blocks) {
      if (ref_[b] == 0 && reg_[b] != kNoParentHash) {
        EXPECT_EQ(shadow_cache_.at(reg_[b]), b);
      }
      ++ref_[b];
    }
  }

  // allocate(), recording which registered blocks it evicted.
  std::optional<std::vector<int32_t>> allocate(int64_t n) {
    int64_t free_before = 0;
    for (int b = 0; b < kBlocks; ++b) free_before += ref_[b] == 0 && reg_[b] == kNoParentHash;
    auto got = bm_.allocate(n);
    if (!got) {
      ++alloc_failures;
      return got;
    }
    int64_t evicted = 0;
    for (int32_t b : *got) {
      EXPECT_EQ(ref_[b], 0) << "allocate handed out an owned block " << b;
      if (reg_[b] != kNoParentHash) {
        shadow_cache_.erase(reg_[b]);
        reg_[b] = kNoParentHash;
        ++evicted;
      }
      content_[b].clear();
    }
    EXPECT_EQ(evicted, std::max<int64_t>(0, n - free_before))
        << "evicted while free blocks remained";
    take(*got);
    return got;
  }

  void commit(Seq& s, int i) {
    const BlockHash parent = i == 0 ? kNoParentHash : s.hashes[i - 1];
    const int32_t b = s.blocks[i];
    const BlockHash h = bm_.commit_full_block(b, parent, block_of(s.tokens, i));
    EXPECT_EQ(h, bm_.hash_block(parent, block_of(s.tokens, i)));
    if (reg_[b] == kNoParentHash && !shadow_cache_.count(h)) {
      shadow_cache_[h] = b;
      reg_[b] = h;
    }
    s.hashes.push_back(h);
    ++commits;
  }

  void start() {
    Seq s;
    const auto& doc = docs_[rng_() % docs_.size()];
    s.tokens.assign(doc.begin(), doc.begin() + 1 + rng_() % 24);
    if (rng_() % 3 == 0)
      for (uint32_t k = rng_() % 9; k > 0; --k)
        s.tokens.push_back(static_cast<int32_t>(rng_() % 50));
    const int64_t n = static_cast<int64_t>(s.tokens.size());

    BlockManager::PrefixMatch m = bm_.acquire_prefix(s.tokens, n - 1);
    EXPECT_EQ(m.n_tokens, static_cast<int64_t>(m.blocks.size()) * kBs);
    EXPECT_LE(m.n_tokens, n - 1);
    EXPECT_EQ(m.hashes.size(), m.blocks.size());
    BlockHash parent = kNoParentHash;
    for (size_t i = 0; i < m.blocks.size(); ++i) {
      const auto want = block_of(s.tokens, static_cast<int>(i));
      EXPECT_TRUE(std::equal(want.begin(), want.end(), content_[m.blocks[i]].begin(),
                             content_[m.blocks[i]].end()))
          << "matched block " << m.blocks[i] << " holds other tokens";
      parent = bm_.hash_block(parent, want);
      EXPECT_EQ(m.hashes[i], parent);
      EXPECT_EQ(reg_[m.blocks[i]], parent);
    }
    // Maximal: the next full block within the limit is not registered.
    const int next = static_cast<int>(m.blocks.size());
    if ((next + 1) * kBs <= n - 1) {
      EXPECT_EQ(shadow_cache_.count(bm_.hash_block(parent, block_of(s.tokens, next))), 0u);
    }
    take(m.blocks);
    hits += m.n_tokens;
    s.blocks = m.blocks;
    s.hashes = m.hashes;

    const int64_t need = (n + kBs - 1) / kBs - static_cast<int64_t>(s.blocks.size());
    auto fresh = allocate(need);
    if (!fresh) {
      release(s.blocks);  // not admitted: give back what the match took
      return;
    }
    for (int32_t b : *fresh) s.blocks.push_back(b);
    for (size_t i = m.blocks.size(); i < s.blocks.size(); ++i) {
      const auto first = s.tokens.begin() + static_cast<int64_t>(i) * kBs;
      content_[s.blocks[i]].assign(first, std::min(first + kBs, s.tokens.end()));
    }
    for (int i = static_cast<int>(s.hashes.size()); (i + 1) * kBs <= n; ++i) commit(s, i);
    seqs_.push_back(std::move(s));
  }

  void append() {
    if (seqs_.empty()) return;
    Seq& s = seqs_[rng_() % seqs_.size()];
    for (uint32_t k = 1 + rng_() % 6; k > 0; --k) {
      const int32_t tok = static_cast<int32_t>(rng_() % 3);
      const int64_t n = static_cast<int64_t>(s.tokens.size());
      if (n % kBs == 0) {
        auto b = allocate(1);
        if (!b) return;
        s.blocks.push_back((*b)[0]);
      } else if (ref_[s.blocks.back()] > 1) {
        // The partial last block is shared with a sibling: copy on write.
        auto b = allocate(1);
        if (!b) return;
        content_[(*b)[0]] = content_[s.blocks.back()];
        release({s.blocks.back()});
        s.blocks.back() = (*b)[0];
        ++cows;
      }
      EXPECT_EQ(ref_[s.blocks.back()], 1);
      EXPECT_EQ(reg_[s.blocks.back()], kNoParentHash) << "writing into a registered block";
      s.tokens.push_back(tok);
      content_[s.blocks.back()].push_back(tok);
      if ((n + 1) % kBs == 0) commit(s, static_cast<int>(n / kBs));
    }
  }

  void fork() {
    if (seqs_.empty()) return;
    Seq copy = seqs_[rng_() % seqs_.size()];
    for (int32_t b : copy.blocks) bm_.add_ref(b);
    take(copy.blocks);
    seqs_.push_back(std::move(copy));
  }

  void finish() {
    if (!seqs_.empty()) finish_at(rng_() % seqs_.size());
  }

  void finish_at(size_t i) {
    release(seqs_[i].blocks);
    seqs_.erase(seqs_.begin() + static_cast<int64_t>(i));
  }

  void release(const std::vector<int32_t>& blocks) {
    bm_.release(blocks);
    for (int32_t b : blocks) --ref_[b];
  }

  void verify() {
    bm_.check_invariants();
    int64_t owned = 0, cached = 0, free = 0;
    for (int32_t b = 0; b < kBlocks; ++b) {
      ASSERT_EQ(bm_.refcount(b), ref_[b]) << "block " << b;
      if (ref_[b] > 0)
        ++owned;
      else if (reg_[b] != kNoParentHash)
        ++cached;
      else
        ++free;
    }
    const BlockManagerStats s = bm_.stats();
    ASSERT_EQ(s.owned, owned);
    ASSERT_EQ(s.cached, cached);
    ASSERT_EQ(s.free, free);
  }

  BlockManager bm_;
  std::mt19937 rng_;
  std::array<std::vector<int32_t>, 4> docs_;
  std::vector<Seq> seqs_;
  std::vector<int32_t> ref_ = std::vector<int32_t>(kBlocks, 0);
  std::vector<BlockHash> reg_ = std::vector<BlockHash>(kBlocks, kNoParentHash);
  std::vector<std::vector<int32_t>> content_ = std::vector<std::vector<int32_t>>(kBlocks);
  std::map<BlockHash, int32_t> shadow_cache_;
};

TEST(BlockManager, RandomizedStressMatchesShadowModel) {
  Stress st;
  st.run(20000);
  ASSERT_FALSE(HasFailure());
  // The workload must actually exercise hits, evictions, failures and CoW.
  EXPECT_GT(st.hits, 1000);
  EXPECT_GT(st.bm().stats().evictions, 100);
  EXPECT_GT(st.alloc_failures, 10);
  EXPECT_GT(st.commits, 1000);
  EXPECT_GT(st.cows, 10);
  st.drain();
}

}  // namespace
}  // namespace tandem
