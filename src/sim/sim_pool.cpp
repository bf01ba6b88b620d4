#include "sim/sim_pool.h"

namespace tandem::sim {

SimPool::SimPool(int32_t n_blocks) : blocks_(static_cast<size_t>(n_blocks)) {
  free_.reserve(blocks_.size());
  for (int32_t b = n_blocks - 1; b >= 0; --b) free_.push_back(b);
}

std::optional<std::vector<BlockId>> SimPool::allocate(int32_t n, TransferId owner) {
  if (n > free_count()) return std::nullopt;
  std::vector<BlockId> out(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    out[i] = free_.back();
    free_.pop_back();
    blocks_[out[i]].owner = owner;
    blocks_[out[i]].tag = 0;
  }
  return out;
}

std::string SimPool::free(const std::vector<BlockId>& blocks, TransferId owner) {
  std::string problem;
  for (BlockId b : blocks) {
    if (!valid(b)) return "free of block " + std::to_string(b) + " outside the pool";
    Block& block = blocks_[b];
    if (block.owner == 0) {
      problem = "double free of block " + std::to_string(b) + " by " + pd::transfer_name(owner);
      continue;
    }
    if (block.owner != owner) {
      problem = pd::transfer_name(owner) + " freed block " + std::to_string(b) +
                " owned by " + pd::transfer_name(block.owner);
      continue;
    }
    if (block.exposed_transfer != 0)
      problem = "block " + std::to_string(b) + " of " + pd::transfer_name(owner) +
                " freed while still exposed to n" + std::to_string(block.exposed_peer);
    block.owner = 0;
    free_.push_back(b);
  }
  return problem;
}

void SimPool::expose(const std::vector<BlockId>& blocks, NodeId peer, TransferId transfer) {
  auto& list = exposed_[transfer];
  for (BlockId b : blocks) {
    blocks_[b].exposed_peer = peer;
    blocks_[b].exposed_transfer = transfer;
    list.push_back(b);
  }
}

void SimPool::revoke(TransferId transfer) {
  auto it = exposed_.find(transfer);
  if (it == exposed_.end()) return;
  for (BlockId b : it->second) {
    if (blocks_[b].exposed_transfer == transfer) {
      blocks_[b].exposed_transfer = 0;
      blocks_[b].exposed_peer = 0;
    }
  }
  exposed_.erase(it);
}

bool SimPool::owned_by(BlockId block, TransferId owner) const {
  return valid(block) && blocks_[block].owner == owner;
}

bool SimPool::exposed_to(BlockId block, NodeId peer, TransferId transfer) const {
  return valid(block) && blocks_[block].exposed_transfer == transfer &&
         blocks_[block].exposed_peer == peer;
}

int32_t SimPool::exposed_count() const {
  int32_t n = 0;
  for (const auto& [t, list] : exposed_) n += static_cast<int32_t>(list.size());
  return n;
}

}  // namespace tandem::sim
