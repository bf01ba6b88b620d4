#include "pd/peer_leases.h"

#include <algorithm>

namespace tandem::pd {

bool PeerLeases::heard(NodeId node, Epoch epoch, Role role, int32_t capacity_blocks,
                       TimeMs now_ms, std::vector<PeerDeath>* deaths, int32_t quarantined_blocks,
                       bool draining) {
  auto [it, inserted] = peers_.try_emplace(node);
  Peer& peer = it->second;
  if (!inserted && epoch < peer.epoch) return false;
  if (!inserted && epoch == peer.epoch && peer.fencing) return false;
  // A newer epoch retires the old one, even one already declared dead by its
  // lease: the retirement lets holders forget what they owed it.
  if (!inserted && epoch > peer.epoch) deaths->push_back({node, peer.epoch});
  if (!inserted && epoch == peer.epoch && !peer.alive) ++resurrections_;
  peer.epoch = epoch;
  peer.last_heard_ms = now_ms;
  peer.alive = true;
  peer.fencing = false;
  peer.heard = true;
  peer.role = role;
  peer.capacity_blocks = capacity_blocks;
  peer.quarantined_blocks = quarantined_blocks;
  peer.draining = draining;
  return true;
}

bool PeerLeases::expect(NodeId node, Epoch epoch, TimeMs now_ms, std::vector<PeerDeath>* deaths) {
  auto [it, inserted] = peers_.try_emplace(node);
  Peer& peer = it->second;
  if (inserted) {
    peer.epoch = epoch;
    peer.last_heard_ms = now_ms;  // the lease starts now: unheard for lease_ms = dead
    return true;
  }
  if (epoch < peer.epoch) return false;
  if (epoch > peer.epoch) {
    deaths->push_back({node, peer.epoch});
    peer.epoch = epoch;
    peer.last_heard_ms = now_ms;
    peer.alive = true;
    peer.fencing = false;
    peer.heard = false;
    return true;
  }
  return peer.alive;
}

void PeerLeases::fence(NodeId node, Epoch epoch, std::vector<PeerDeath>* deaths) {
  auto it = peers_.find(node);
  if (it == peers_.end() || it->second.epoch != epoch) return;  // unknown or superseded
  Peer& peer = it->second;
  peer.fencing = true;
  if (peer.alive) {
    peer.alive = false;
    deaths->push_back({node, epoch});
  }
}

void PeerLeases::fence_completed(NodeId node, Epoch epoch) {
  auto it = peers_.find(node);
  if (it != peers_.end() && it->second.epoch == epoch) it->second.fencing = false;
}

bool PeerLeases::is_dead(NodeId node, Epoch epoch) const {
  auto it = peers_.find(node);
  if (it == peers_.end()) return false;
  return epoch < it->second.epoch || !it->second.alive;
}

bool PeerLeases::is_superseded(NodeId node, Epoch epoch) const {
  auto it = peers_.find(node);
  return it != peers_.end() && epoch < it->second.epoch;
}

void PeerLeases::expire(TimeMs now_ms, std::vector<PeerDeath>* deaths) {
  for (auto& [node, peer] : peers_) {
    if (peer.alive && now_ms - peer.last_heard_ms >= lease_ms_) {
      peer.alive = false;
      deaths->push_back({node, peer.epoch});
    }
  }
}

TimeMs PeerLeases::next_expiry_ms() const {
  TimeMs next = kNever;
  for (const auto& [node, peer] : peers_)
    if (peer.alive) next = std::min(next, peer.last_heard_ms + lease_ms_);
  return next;
}

}  // namespace tandem::pd
