// Liveness of peers from per-instance heartbeats: one lease per node, not per request.
#pragma once

#include <map>
#include <vector>

#include "pd/types.h"

namespace tandem::pd {

struct PeerDeath {
  NodeId node = 0;
  Epoch epoch = 0;
  // The driver fenced it: none of its RMA can reach our memory any more.
  bool fenced = false;
};

class PeerLeases {
 public:
  struct Peer {
    Epoch epoch = 0;
    TimeMs last_heard_ms = 0;
    bool alive = true;
    bool heard = false;  // a heartbeat arrived (not just named by a Start)
    // A fence of this incarnation is under way: it stays dead (its heartbeats
    // are stale) until the fence completes, so no new transfer exposes memory
    // to it over the connection being cut.
    bool fencing = false;
    Role role = Role::kRouter;
    int32_t capacity_blocks = 0;
    int32_t quarantined_blocks = 0;  // from its last heartbeat
    bool draining = false;           // likewise: it refuses new transfers
  };

  explicit PeerLeases(TimeMs lease_ms) : lease_ms_(lease_ms) {}

  // A heartbeat from `node` in `epoch`. A newer epoch than known declares the
  // older one dead at once (appended to `deaths`). An older one is ignored and
  // reported as stale (returns false).
  bool heard(NodeId node, Epoch epoch, Role role, int32_t capacity_blocks, TimeMs now_ms,
             std::vector<PeerDeath>* deaths, int32_t quarantined_blocks = 0, bool draining = false);
  // A transfer names `node` in `epoch` as its peer: starts its lease if the node
  // was unknown, and retires an older known epoch. Returns false when the named
  // epoch is already dead or superseded (the transfer must fail at once).
  bool expect(NodeId node, Epoch epoch, TimeMs now_ms, std::vector<PeerDeath>* deaths);
  // True when `epoch` of `node` is declared dead or superseded.
  bool is_dead(NodeId node, Epoch epoch) const;
  // True when `epoch` is older than the newest known epoch of `node`.
  bool is_superseded(NodeId node, Epoch epoch) const;
  // A fence of `epoch` of `node` starts: declared dead now if it was alive
  // (appended to `deaths`), and not resurrected by its heartbeats until
  // fence_completed(). After that it may come back on a new connection.
  void fence(NodeId node, Epoch epoch, std::vector<PeerDeath>* deaths);
  void fence_completed(NodeId node, Epoch epoch);
  // Declares dead every live peer silent for lease_ms.
  void expire(TimeMs now_ms, std::vector<PeerDeath>* deaths);
  TimeMs next_expiry_ms() const;
  const std::map<NodeId, Peer>& peers() const { return peers_; }
  int64_t resurrections() const { return resurrections_; }

 private:
  TimeMs lease_ms_;
  std::map<NodeId, Peer> peers_;
  int64_t resurrections_ = 0;
};

}  // namespace tandem::pd
