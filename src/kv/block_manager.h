// Ownership of the KV pool's blocks: reference counts, a free list, and a
// prefix cache of full blocks.
//
// Every block is in exactly one state:
//   free     - refcount 0, not in the prefix cache;
//   owned    - refcount > 0 (held by one or more sequences);
//   cached   - refcount 0 but registered in the prefix cache: reusable by a
//              request with the same prefix until evicted (LRU) to serve an
//              allocation.
// free + owned + cached == total, asserted by check_invariants() (called after
// every mutation in debug and test builds).
//
// Prefix caching identifies a full block by a hash chain: hash(parent block's
// hash, the block's token ids, salt), the salt standing for the model (and
// adapter). A new request reuses the longest run of cached full blocks that
// matches its prompt from the start.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

namespace tandem {

using BlockHash = uint64_t;
constexpr BlockHash kNoParentHash = 0;

struct BlockManagerConfig {
  int64_t n_blocks = 0;
  int block_size = 16;
  bool enable_prefix_caching = true;
  uint64_t salt = 0;  // distinguishes models/adapters sharing nothing
};

struct BlockManagerStats {
  int64_t total = 0;
  int64_t free = 0;
  int64_t owned = 0;
  int64_t cached = 0;
  int64_t prefix_queries_tokens = 0;  // prompt tokens looked up
  int64_t prefix_hits_tokens = 0;     // of which found in the cache
  int64_t evictions = 0;
};

class BlockManager {
 public:
  explicit BlockManager(const BlockManagerConfig& config);

  int block_size() const;
  int64_t n_total() const;
  // Blocks an allocation can obtain now: free + cached (evictable).
  int64_t n_available() const;

  // The hash of a full block following `parent` (kNoParentHash for the first).
  BlockHash hash_block(BlockHash parent, std::span<const int32_t> tokens) const;

  struct PrefixMatch {
    std::vector<int32_t> blocks;  // each now referenced once more by the caller
    std::vector<BlockHash> hashes;
    int64_t n_tokens = 0;  // blocks.size() * block_size
  };
  // Takes references on the longest cached run of full blocks matching
  // `tokens` from the start. At most `max_tokens` tokens are matched (callers
  // pass prompt length - 1 so that at least one token is computed). Counts
  // the lookup in the stats (all of `tokens` as queried). Empty, and not
  // counted, when prefix caching is off.
  PrefixMatch acquire_prefix(std::span<const int32_t> tokens, int64_t max_tokens);

  // Takes n blocks (refcount 1 each), evicting cached blocks LRU-first when
  // the free list runs out. All or nothing: nullopt when fewer than n are
  // available.
  std::optional<std::vector<int32_t>> allocate(int64_t n);

  // One more reference (a sibling sharing the block).
  void add_ref(int32_t block);
  // Drops one reference from each block. A block reaching refcount 0 becomes
  // cached if it is registered in the prefix cache, else free. Blocks are
  // released last to first, so for a sequence's block table the chain's tail
  // is evicted before its head. Releasing a block with refcount 0 aborts.
  void release(std::span<const int32_t> blocks);

  // Registers a block that now holds block_size tokens under its hash chain
  // (no-op when prefix caching is off or the hash is already cached by another
  // block). Returns the block's hash.
  BlockHash commit_full_block(int32_t block, BlockHash parent, std::span<const int32_t> tokens);

  // The KV in every block is gone (a tensor-parallel worker holding part of
  // it was replaced): every cached block is unregistered and freed, so no
  // later prefix can match it. Owned blocks are the caller's to release.
  void forget_cached();

  int32_t refcount(int32_t block) const;
  BlockManagerStats stats() const;
  // Aborts with a message if the accounting is inconsistent.
  void check_invariants() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace tandem
