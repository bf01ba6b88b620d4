#include "kv/block_manager.h"

#include <algorithm>
#include <limits>
#include <string>
#include <unordered_map>

#include "util/error.h"

namespace tandem {
namespace {

// The splitmix64 finalizer: a bijection with full avalanche, so every input
// bit flips about half of the output bits.
uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

constexpr int32_t kNone = -1;  // end of the LRU list

}  // namespace

struct BlockManager::Impl {
  BlockManagerConfig config;
  std::vector<int32_t> refcount;
  // The hash a block is registered under in the prefix cache; kNoParentHash
  // (0) when unregistered, which is why a real hash is never 0.
  std::vector<BlockHash> block_hash;
  std::unordered_map<BlockHash, int32_t> cache;  // hash -> registered block
  // Used as a stack: back() is handed out next, so a just-released block
  // (still warm in the CPU caches) is reused first.
  std::vector<int32_t> free_list;
  // Intrusive doubly-linked LRU over the cached blocks: lru_head is evicted
  // first, lru_tail is the most recently released. prev/next are meaningful
  // only for blocks in the list.
  std::vector<int32_t> lru_prev, lru_next;
  int32_t lru_head = kNone;
  int32_t lru_tail = kNone;
  int64_t n_cached = 0;
  int64_t n_owned = 0;
  int64_t prefix_queries_tokens = 0;
  int64_t prefix_hits_tokens = 0;
  int64_t evictions = 0;

  void check_block(int32_t b) const {
    TANDEM_ASSERT(b >= 0 && b < config.n_blocks,
                  "block " + std::to_string(b) + " out of range [0, " +
                      std::to_string(config.n_blocks) + ")");
  }

  void lru_push_back(int32_t b) {
    lru_prev[b] = lru_tail;
    lru_next[b] = kNone;
    if (lru_tail == kNone)
      lru_head = b;
    else
      lru_next[lru_tail] = b;
    lru_tail = b;
    ++n_cached;
  }

  void lru_remove(int32_t b) {
    const int32_t p = lru_prev[b], n = lru_next[b];
    if (p == kNone)
      lru_head = n;
    else
      lru_next[p] = n;
    if (n == kNone)
      lru_tail = p;
    else
      lru_prev[n] = p;
    lru_prev[b] = lru_next[b] = kNone;
    --n_cached;
  }

  void unregister(int32_t b) {
    cache.erase(block_hash[b]);
    block_hash[b] = kNoParentHash;
  }

  void checked() const {
#ifdef TANDEM_KV_CHECKS
    check_invariants();
#endif
  }

  void check_invariants() const;
};

void BlockManager::Impl::check_invariants() const {
  const int64_t total = config.n_blocks;
  TANDEM_ASSERT(static_cast<int64_t>(refcount.size()) == total);
  TANDEM_ASSERT(static_cast<int64_t>(block_hash.size()) == total);
  TANDEM_ASSERT(static_cast<int64_t>(lru_prev.size()) == total);
  TANDEM_ASSERT(static_cast<int64_t>(lru_next.size()) == total);

  std::vector<char> in_free(static_cast<size_t>(total), 0);
  for (int32_t b : free_list) {
    check_block(b);
    const std::string id = "block " + std::to_string(b);
    TANDEM_ASSERT(!in_free[b], id + " is in the free list twice");
    in_free[b] = 1;
    TANDEM_ASSERT(refcount[b] == 0, id + " is free with refcount " + std::to_string(refcount[b]));
    TANDEM_ASSERT(block_hash[b] == kNoParentHash, id + " is free but registered");
  }

  std::vector<char> in_lru(static_cast<size_t>(total), 0);
  int64_t lru_len = 0;
  int32_t prev = kNone;
  for (int32_t b = lru_head; b != kNone; b = lru_next[b]) {
    check_block(b);
    const std::string id = "block " + std::to_string(b);
    TANDEM_ASSERT(!in_lru[b], id + " is in the LRU twice (cycle)");
    in_lru[b] = 1;
    TANDEM_ASSERT(lru_prev[b] == prev, id + " has a broken LRU back link");
    TANDEM_ASSERT(!in_free[b], id + " is both free and cached");
    TANDEM_ASSERT(refcount[b] == 0, id + " is cached with refcount " + std::to_string(refcount[b]));
    TANDEM_ASSERT(block_hash[b] != kNoParentHash, id + " is cached but unregistered");
    prev = b;
    ++lru_len;
  }
  TANDEM_ASSERT(lru_tail == prev, "LRU tail does not end the list");
  TANDEM_ASSERT(lru_len == n_cached, "LRU holds " + std::to_string(lru_len) + " blocks, counted " +
                                         std::to_string(n_cached));

  int64_t owned = 0, registered = 0;
  for (int32_t b = 0; b < total; ++b) {
    const std::string id = "block " + std::to_string(b);
    TANDEM_ASSERT(refcount[b] >= 0, id + " has a negative refcount");
    if (refcount[b] > 0) {
      ++owned;
      TANDEM_ASSERT(!in_free[b] && !in_lru[b], id + " is owned but also free or cached");
    } else {
      TANDEM_ASSERT(in_free[b] + in_lru[b] == 1,
                    id + " has refcount 0 but is not in exactly one of free and cached");
    }
    if (block_hash[b] != kNoParentHash) {
      ++registered;
      const auto it = cache.find(block_hash[b]);
      TANDEM_ASSERT(it != cache.end() && it->second == b,
                    id + " has a hash that the prefix cache maps elsewhere");
    }
  }
  TANDEM_ASSERT(owned == n_owned, "owned blocks: counted " + std::to_string(n_owned) + ", found " +
                                      std::to_string(owned));
  TANDEM_ASSERT(static_cast<int64_t>(free_list.size()) + n_cached + n_owned == total,
                "free + cached + owned != total");
  // Every map entry points back at a block registered under that hash, and
  // there are no extra entries.
  TANDEM_ASSERT(static_cast<int64_t>(cache.size()) == registered,
                "prefix cache has " + std::to_string(cache.size()) + " entries for " +
                    std::to_string(registered) + " registered blocks");
  for (const auto& [h, b] : cache) {
    check_block(b);
    TANDEM_ASSERT(h != kNoParentHash && block_hash[b] == h,
                  "prefix cache entry for block " + std::to_string(b) + " is stale");
  }
  if (!config.enable_prefix_caching)
    TANDEM_ASSERT(cache.empty() && n_cached == 0, "prefix caching is off but blocks are cached");
}

BlockManager::BlockManager(const BlockManagerConfig& config) : impl_(std::make_shared<Impl>()) {
  if (config.n_blocks < 0 || config.n_blocks > std::numeric_limits<int32_t>::max())
    throw Error("KV block manager: n_blocks must be in [0, 2^31), got " +
                std::to_string(config.n_blocks));
  if (config.block_size <= 0)
    throw Error("KV block manager: block_size must be positive, got " +
                std::to_string(config.block_size));
  Impl& m = *impl_;
  m.config = config;
  const auto n = static_cast<size_t>(config.n_blocks);
  m.refcount.assign(n, 0);
  m.block_hash.assign(n, kNoParentHash);
  m.lru_prev.assign(n, kNone);
  m.lru_next.assign(n, kNone);
  // Reversed so that the lowest ids are handed out first: deterministic and
  // easy to read in logs and tests.
  m.free_list.reserve(n);
  for (int64_t b = config.n_blocks - 1; b >= 0; --b) m.free_list.push_back(static_cast<int32_t>(b));
  m.checked();
}

int BlockManager::block_size() const { return impl_->config.block_size; }
int64_t BlockManager::n_total() const { return impl_->config.n_blocks; }
int64_t BlockManager::n_available() const {
  return static_cast<int64_t>(impl_->free_list.size()) + impl_->n_cached;
}

BlockHash BlockManager::hash_block(BlockHash parent, std::span<const int32_t> tokens) const {
  const Impl& m = *impl_;
  TANDEM_ASSERT(static_cast<int64_t>(tokens.size()) == m.config.block_size,
                "hash_block takes a full block of " + std::to_string(m.config.block_size) +
                    " tokens, got " + std::to_string(tokens.size()));
  // Parent and salt go through different constants so that swapping them
  // changes the hash; each token word is avalanched before it is folded in,
  // and the rotate-multiply makes the fold order-sensitive.
  uint64_t h = mix64(parent ^ 0x9e3779b97f4a7c15ULL);
  h = mix64(h ^ rotl64(mix64(m.config.salt + 0xc2b2ae3d27d4eb4fULL), 17));
  for (size_t i = 0; i < tokens.size(); ++i) {
    const uint64_t word = static_cast<uint32_t>(tokens[i]) | (static_cast<uint64_t>(i) << 32);
    h = rotl64(h ^ mix64(word + 0x165667b19e3779f9ULL), 27) * 0x9fb21c651e98df25ULL;
  }
  h = mix64(h ^ tokens.size());
  // 0 marks "no parent" and "unregistered"; a real block must never hash to it.
  return h == kNoParentHash ? 1 : h;
}

BlockManager::PrefixMatch BlockManager::acquire_prefix(std::span<const int32_t> tokens,
                                                       int64_t max_tokens) {
  Impl& m = *impl_;
  PrefixMatch match;
  if (!m.config.enable_prefix_caching) return match;
  m.prefix_queries_tokens += static_cast<int64_t>(tokens.size());
  const int64_t limit = std::clamp<int64_t>(max_tokens, 0, static_cast<int64_t>(tokens.size()));
  const int64_t bs = m.config.block_size;
  BlockHash parent = kNoParentHash;
  for (int64_t i = 0; (i + 1) * bs <= limit; ++i) {
    const BlockHash h =
        hash_block(parent, tokens.subspan(static_cast<size_t>(i * bs), static_cast<size_t>(bs)));
    const auto it = m.cache.find(h);
    if (it == m.cache.end()) break;
    const int32_t b = it->second;
    if (m.refcount[b] == 0) {
      m.lru_remove(b);
      ++m.n_owned;
    }
    ++m.refcount[b];
    match.blocks.push_back(b);
    match.hashes.push_back(h);
    parent = h;
  }
  match.n_tokens = static_cast<int64_t>(match.blocks.size()) * bs;
  m.prefix_hits_tokens += match.n_tokens;
  m.checked();
  return match;
}

std::optional<std::vector<int32_t>> BlockManager::allocate(int64_t n) {
  Impl& m = *impl_;
  TANDEM_ASSERT(n >= 0, "allocate of " + std::to_string(n) + " blocks");
  if (n > n_available()) return std::nullopt;
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(n));
  while (static_cast<int64_t>(out.size()) < n) {
    int32_t b;
    if (!m.free_list.empty()) {
      b = m.free_list.back();
      m.free_list.pop_back();
    } else {
      // Checked above that enough blocks are free or cached.
      b = m.lru_head;
      TANDEM_ASSERT(b != kNone, "LRU empty while blocks were counted available");
      m.lru_remove(b);
      m.unregister(b);
      ++m.evictions;
    }
    m.refcount[b] = 1;
    ++m.n_owned;
    out.push_back(b);
  }
  m.checked();
  return out;
}

void BlockManager::forget_cached() {
  Impl& m = *impl_;
  while (m.lru_head != kNone) {
    const int32_t b = m.lru_head;
    m.lru_remove(b);
    m.unregister(b);
    m.free_list.push_back(b);
  }
  m.checked();
}

void BlockManager::add_ref(int32_t block) {
  Impl& m = *impl_;
  m.check_block(block);
  // A sibling shares a block its parent holds; a cached block is re-acquired
  // through acquire_prefix, which also takes it out of the LRU.
  TANDEM_ASSERT(m.refcount[block] > 0,
                "add_ref on block " + std::to_string(block) + " which is not owned");
  ++m.refcount[block];
  m.checked();
}

void BlockManager::release(std::span<const int32_t> blocks) {
  Impl& m = *impl_;
  // Last to first: for a sequence's block table this puts the chain's tail
  // nearer the LRU end than its head, so eviction takes the deepest blocks
  // first (a block whose parent was evicted can never be matched again).
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
    const int32_t b = *it;
    m.check_block(b);
    TANDEM_ASSERT(m.refcount[b] > 0,
                  "release of block " + std::to_string(b) + " with refcount 0 (double release)");
    if (--m.refcount[b] > 0) continue;
    --m.n_owned;
    if (m.block_hash[b] != kNoParentHash)
      m.lru_push_back(b);
    else
      m.free_list.push_back(b);
  }
  m.checked();
}

BlockHash BlockManager::commit_full_block(int32_t block, BlockHash parent,
                                          std::span<const int32_t> tokens) {
  Impl& m = *impl_;
  m.check_block(block);
  TANDEM_ASSERT(m.refcount[block] > 0,
                "commit of block " + std::to_string(block) + " which is not owned");
  const BlockHash h = hash_block(parent, tokens);
  if (!m.config.enable_prefix_caching) return h;
  if (m.block_hash[block] != kNoParentHash) {
    // A block's contents never change once full, so it can only be
    // re-committed under the same hash.
    TANDEM_ASSERT(m.block_hash[block] == h,
                  "block " + std::to_string(block) + " re-committed under a different hash");
    return h;
  }
  // If another block already holds this prefix, keep it: it may be shared or
  // cached already, and this block is freed normally on release.
  if (m.cache.emplace(h, block).second) m.block_hash[block] = h;
  m.checked();
  return h;
}

int32_t BlockManager::refcount(int32_t block) const {
  impl_->check_block(block);
  return impl_->refcount[block];
}

BlockManagerStats BlockManager::stats() const {
  const Impl& m = *impl_;
  BlockManagerStats s;
  s.total = m.config.n_blocks;
  s.free = static_cast<int64_t>(m.free_list.size());
  s.owned = m.n_owned;
  s.cached = m.n_cached;
  s.prefix_queries_tokens = m.prefix_queries_tokens;
  s.prefix_hits_tokens = m.prefix_hits_tokens;
  s.evictions = m.evictions;
  return s;
}

void BlockManager::check_invariants() const { impl_->check_invariants(); }

}  // namespace tandem
