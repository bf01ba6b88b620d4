#include "router/registry.h"

#include <algorithm>
#include <tuple>

namespace tandem::router {

std::optional<std::string> Registry::add(InstanceInfo info, int64_t now_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  if (info.node <= 1) return "node id " + std::to_string(info.node) + " is reserved (0: none, 1: the router)";
  if (info.role != pd::Role::kPrefill && info.role != pd::Role::kDecode)
    return std::string("only prefill and decode instances register with a router");
  // The first instance sets the cluster's model and mode; every later one must match.
  if (instances_.empty()) {
    cluster_model_hash_ = info.model_hash;
    cluster_mode_ = info.mode;
  } else {
    if (info.model_hash != cluster_model_hash_)
      return "model differs: this cluster serves the model with hash " + std::to_string(cluster_model_hash_) +
             ", the instance has " + std::to_string(info.model_hash);
    if (cluster_mode_ && info.mode != *cluster_mode_)
      return "transfer mode differs: the cluster uses " + std::string(pd::name(*cluster_mode_)) +
             ", the instance " + std::string(pd::name(info.mode));
  }
  auto it = instances_.find(info.node);
  if (it != instances_.end()) {
    const InstanceInfo& old = it->second;
    // A restart comes back in a newer epoch, possibly on other ports: it
    // replaces the old incarnation. The same epoch elsewhere is a clash.
    if (info.epoch < old.epoch)
      return "epoch " + std::to_string(info.epoch) + " is older than the registered " + std::to_string(old.epoch);
    if (info.role != old.role)
      return "node id " + std::to_string(info.node) + " is registered as a " + std::string(pd::name(old.role));
    if (info.epoch == old.epoch &&
        (old.transfer_host != info.transfer_host || old.transfer_port != info.transfer_port))
      return "node id " + std::to_string(info.node) + " is already registered by another instance (" +
             old.transfer_host + ":" + std::to_string(old.transfer_port) + ")";
    info.in_flight = info.epoch == old.epoch ? old.in_flight : 0;
    info.requests = old.requests;
  }
  info.last_heard_ms = now_ms;
  info.registered_ms = now_ms;
  info.free_blocks = info.capacity_blocks;
  instances_[info.node] = std::move(info);
  ++version_;
  return std::nullopt;
}

bool Registry::heartbeat(pd::NodeId node, pd::Epoch epoch, int64_t free_blocks, int64_t waiting, bool draining,
                         int64_t now_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = instances_.find(node);
  if (it == instances_.end() || it->second.epoch != epoch) return false;
  it->second.free_blocks = free_blocks;
  it->second.waiting = waiting;
  it->second.draining = draining;
  it->second.last_heard_ms = now_ms;
  return true;
}

int Registry::evict_silent(int64_t now_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  int n = 0;
  for (auto it = instances_.begin(); it != instances_.end();) {
    if (now_ms - it->second.last_heard_ms > eviction_ms_) {
      it = instances_.erase(it);
      ++n;
    } else {
      ++it;
    }
  }
  evictions_ += n;
  if (n > 0) ++version_;
  if (instances_.empty()) cluster_mode_.reset();
  return n;
}

std::optional<InstanceInfo> Registry::pick(pd::Role role, const std::vector<pd::NodeId>& avoid) {
  std::lock_guard<std::mutex> lock(mu_);
  InstanceInfo* best = nullptr;
  auto load = [](const InstanceInfo& i) { return std::make_tuple(i.in_flight, i.waiting, -i.free_blocks, i.node); };
  for (auto& [node, info] : instances_) {
    if (info.role != role || info.draining || std::find(avoid.begin(), avoid.end(), node) != avoid.end()) continue;
    if (best == nullptr || load(info) < load(*best)) best = &info;
  }
  if (best == nullptr) return std::nullopt;
  ++best->in_flight;
  ++best->requests;
  return *best;
}

void Registry::done(pd::NodeId node) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = instances_.find(node);
  if (it != instances_.end() && it->second.in_flight > 0) --it->second.in_flight;
}

std::vector<InstanceInfo> Registry::list() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<InstanceInfo> v;
  for (const auto& [node, info] : instances_) v.push_back(info);
  return v;
}

int Registry::count(pd::Role role) const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(std::count_if(instances_.begin(), instances_.end(),
                                        [&](const auto& kv) { return kv.second.role == role; }));
}

uint64_t Registry::version() const {
  std::lock_guard<std::mutex> lock(mu_);
  return version_;
}

int64_t Registry::evictions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return evictions_;
}

}  // namespace tandem::router
