// A simulated block (or state-slot) pool of one instance: who owns each block,
// which peer may reach it by RMA for which transfer, and a content tag that
// stands for the KV it holds. It reports protocol violations instead of asserting.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "pd/types.h"

namespace tandem::sim {

using pd::BlockId;
using pd::NodeId;
using pd::TransferId;

class SimPool {
 public:
  explicit SimPool(int32_t n_blocks);

  int32_t total() const { return static_cast<int32_t>(blocks_.size()); }
  int32_t free_count() const { return static_cast<int32_t>(free_.size()); }
  int32_t allocated_count() const { return total() - free_count(); }

  std::optional<std::vector<BlockId>> allocate(int32_t n, TransferId owner);
  // Returns "" or a description of the violation (double free, foreign block,
  // freed while still exposed to a peer).
  std::string free(const std::vector<BlockId>& blocks, TransferId owner);
  void expose(const std::vector<BlockId>& blocks, NodeId peer, TransferId transfer);
  void revoke(TransferId transfer);
  bool owned_by(BlockId block, TransferId owner) const;
  bool exposed_to(BlockId block, NodeId peer, TransferId transfer) const;
  bool valid(BlockId block) const { return block >= 0 && block < total(); }
  TransferId owner(BlockId block) const { return blocks_[block].owner; }
  uint64_t tag(BlockId block) const { return blocks_[block].tag; }
  void set_tag(BlockId block, uint64_t tag) { blocks_[block].tag = tag; }
  int32_t exposed_count() const;

 private:
  struct Block {
    TransferId owner = 0;  // 0 = free
    NodeId exposed_peer = 0;
    TransferId exposed_transfer = 0;  // 0 = not exposed
    uint64_t tag = 0;
  };
  std::vector<Block> blocks_;
  std::vector<BlockId> free_;  // LIFO, deterministic
  std::map<TransferId, std::vector<BlockId>> exposed_;
};

}  // namespace tandem::sim
