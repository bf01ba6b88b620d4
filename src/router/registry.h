// The router's registry of instances: who they are (role, node, epoch,
// addresses, model), whether they are alive (heartbeats; eviction on
// silence), and how loaded (free KV blocks, queue depth, requests in flight).
// Thread-safe: HTTP handler threads register, heartbeat and pick.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "pd/types.h"

namespace tandem::router {

struct InstanceInfo {
  pd::NodeId node = 0;
  pd::Epoch epoch = 0;
  pd::Role role = pd::Role::kDecode;
  pd::TransferMode mode = pd::TransferMode::kWrite;
  std::string api_host;
  uint16_t api_port = 0;
  std::string transfer_host;
  uint16_t transfer_port = 0;
  uint64_t model_hash = 0;
  std::string model_name;
  int64_t capacity_blocks = 0;
  // From heartbeats.
  int64_t free_blocks = 0;
  int64_t waiting = 0;
  bool draining = false;  // shutting down: not picked for new requests
  int64_t last_heard_ms = 0;
  int64_t registered_ms = 0;
  // Router side.
  int64_t in_flight = 0;
  int64_t requests = 0;
};

class Registry {
 public:
  explicit Registry(int64_t eviction_ms) : eviction_ms_(eviction_ms) {}

  // Registers (or re-registers in a newer epoch) an instance. Returns an error
  // message when it cannot join: another model than the cluster's, another
  // transfer mode, a node id taken by another address, an older epoch.
  std::optional<std::string> add(InstanceInfo info, int64_t now_ms);
  // False when the node is unknown or the epoch is not the registered one
  // (the instance must register again).
  bool heartbeat(pd::NodeId node, pd::Epoch epoch, int64_t free_blocks, int64_t waiting, bool draining,
                 int64_t now_ms);
  // Drops instances silent for eviction_ms; returns how many.
  int evict_silent(int64_t now_ms);
  // The live instance of `role` with the fewest requests in flight here (then
  // the shortest queue, then the most free blocks), excluding `avoid`. Counts
  // the pick as in flight until done(node).
  std::optional<InstanceInfo> pick(pd::Role role, const std::vector<pd::NodeId>& avoid = {});
  void done(pd::NodeId node);
  std::vector<InstanceInfo> list() const;
  int count(pd::Role role) const;
  int64_t evictions() const;
  // Grows whenever the set of instances or their addresses changes (not on
  // load updates): a heartbeat answer carries the list only when it moved.
  uint64_t version() const;

 private:
  int64_t eviction_ms_;
  mutable std::mutex mu_;
  std::map<pd::NodeId, InstanceInfo> instances_;
  uint64_t cluster_model_hash_ = 0;
  std::optional<pd::TransferMode> cluster_mode_;
  int64_t evictions_ = 0;
  uint64_t version_ = 1;
};

}  // namespace tandem::router
