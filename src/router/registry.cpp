#include "router/registry.h"

#include <map>

#include <algorithm>
#include <chrono>
#include <tuple>

#include "util/clock.h"
#include "util/error.h"

namespace tandem::router {

std::optional<std::string> Registry::add(InstanceInfo info, int64_t now_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  if (info.node <= 1) return "node id " + std::to_string(info.node) + " is reserved (0: none, 1: the router)";
  if (info.role != pd::Role::kPrefill && info.role != pd::Role::kDecode)
    return std::string("only prefill and decode instances register with a router");
  // The first instance sets the cluster's fingerprint; every later one must match.
  if (instances_.empty()) cluster_fingerprint_ = info.fingerprint;
  if (auto diff = transport::fingerprint_difference(*cluster_fingerprint_, info.fingerprint, "the cluster", "this instance"))
    return *diff;
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
    // A new incarnation knows nothing of the old one's requests; their
    // reservations are released as they end (done() finds the node).
    info.in_flight = old.in_flight;
    info.reserved_blocks = old.reserved_blocks;
    info.requests = old.requests;
    info.registration = old.registration;
  } else {
    info.registration = next_registration_++;
  }
  info.last_heard_ms = now_ms;
  info.registered_ms = now_ms;
  info.free_blocks = info.capacity_blocks;
  instances_[info.node] = std::move(info);
  ++version_;
  credits_changed();
  return std::nullopt;
}

bool Registry::heartbeat(pd::NodeId node, pd::Epoch epoch, const InstanceLoad& load, int64_t now_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = instances_.find(node);
  if (it == instances_.end() || it->second.epoch != epoch) return false;
  InstanceInfo& i = it->second;
  const bool freed = load.quarantined_blocks && *load.quarantined_blocks < i.quarantined_blocks;
  i.free_blocks = load.free_blocks;
  if (load.quarantined_blocks) i.quarantined_blocks = std::clamp<int64_t>(*load.quarantined_blocks, 0, i.capacity_blocks);
  i.waiting = load.waiting;
  i.draining = load.draining;
  i.ready = load.ready;
  i.dp_group_failures = load.dp_group_failures;
  if (load.fencing) i.fencing = *load.fencing;
  if (load.drops) i.drops = *load.drops;
  if (load.transfers_by_state) i.transfers_by_state = *load.transfers_by_state;
  i.last_heard_ms = now_ms;
  if (freed) credits_changed();
  return true;
}

bool Registry::contains(pd::NodeId node) const {
  std::lock_guard<std::mutex> lock(mu_);
  return instances_.count(node) != 0;
}

std::vector<pd::NodeId> Registry::evict_silent(int64_t now_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<pd::NodeId> evicted;
  for (auto it = instances_.begin(); it != instances_.end();) {
    if (now_ms - it->second.last_heard_ms > eviction_ms_) {
      evicted.push_back(it->first);
      it = instances_.erase(it);
    } else {
      ++it;
    }
  }
  evictions_ += static_cast<int64_t>(evicted.size());
  if (!evicted.empty()) {
    ++version_;
    credits_changed();  // a waiter may now find that nothing left can hold its request
  }
  if (instances_.empty()) cluster_fingerprint_.reset();
  return evicted;
}

InstanceInfo* Registry::choose_locked(pd::Role role, int64_t blocks, const std::vector<pd::NodeId>& avoid,
                                      bool* must_wait) {
  InstanceInfo* best = nullptr;      // among those with the credits free now
  InstanceInfo* fallback = nullptr;  // among all: when none could ever hold it
  bool could_fit = false;
  auto load = [](const InstanceInfo& i) { return std::make_tuple(i.in_flight, i.waiting, -i.free_credits(), i.node); };
  for (auto& [node, info] : instances_) {
    if (info.role != role || info.draining || !info.ready || std::find(avoid.begin(), avoid.end(), node) != avoid.end())
      continue;
    if (fallback == nullptr || load(info) < load(*fallback)) fallback = &info;
    if (info.capacity_blocks >= blocks) could_fit = true;
    if (info.free_credits() >= blocks && (best == nullptr || load(info) < load(*best))) best = &info;
  }
  *must_wait = best == nullptr && could_fit;
  return best != nullptr ? best : (*must_wait ? nullptr : fallback);
}

void Registry::reserve_locked(InstanceInfo& i, int64_t blocks) {
  ++i.in_flight;
  ++i.requests;
  i.reserved_blocks += blocks;
}

Pick Registry::pick(pd::Role role, int64_t blocks, const std::vector<pd::NodeId>& avoid) {
  std::lock_guard<std::mutex> lock(mu_);
  Pick p;
  p.credits_version = credits_version_;
  InstanceInfo* best = choose_locked(role, blocks, avoid, &p.must_wait);
  if (best == nullptr) return p;
  reserve_locked(*best, blocks);
  p.instance = *best;
  return p;
}

PairPick Registry::pick_pair(int64_t prefill_blocks, int64_t decode_blocks, const std::vector<pd::NodeId>& avoid_prefill,
                             const std::vector<pd::NodeId>& avoid_decode) {
  std::lock_guard<std::mutex> lock(mu_);
  PairPick r;
  r.credits_version = credits_version_;
  std::vector<pd::NodeId> skip = avoid_prefill;
  for (;;) {
    bool prefill_waits = false, decode_waits = false;
    InstanceInfo* p = choose_locked(pd::Role::kPrefill, prefill_blocks, skip, &prefill_waits);
    if (p == nullptr) {
      r.missing = pd::Role::kPrefill;
      r.must_wait = prefill_waits;
      return r;
    }
    std::vector<pd::NodeId> avoid = avoid_decode;
    const std::vector<pd::NodeId> cut = cut_from_locked(*p);
    avoid.insert(avoid.end(), cut.begin(), cut.end());
    InstanceInfo* d = choose_locked(pd::Role::kDecode, decode_blocks, avoid, &decode_waits);
    if (d != nullptr) {
      reserve_locked(*p, prefill_blocks);
      reserve_locked(*d, decode_blocks);
      r.prefill = *p;
      r.decode = *d;
      return r;
    }
    if (!decode_waits && !cut.empty()) {
      // Every decode is cut off from this prefill: try another.
      skip.push_back(p->node);
      r.skipped_cut = true;
      continue;
    }
    r.missing = pd::Role::kDecode;
    r.must_wait = decode_waits;
    return r;
  }
}

std::vector<pd::NodeId> Registry::cut_from(const InstanceInfo& picked) const {
  std::lock_guard<std::mutex> lock(mu_);
  return cut_from_locked(picked);
}

std::vector<pd::NodeId> Registry::cut_from_locked(const InstanceInfo& picked) const {
  auto fences = [](const InstanceInfo& a, const InstanceInfo& b) {
    return std::find(a.fencing.begin(), a.fencing.end(), std::pair{b.node, b.epoch}) != a.fencing.end();
  };
  std::vector<pd::NodeId> cut;
  auto self = instances_.find(picked.node);
  if (self == instances_.end()) return cut;
  for (const auto& [node, info] : instances_)
    if (node != picked.node && (fences(self->second, info) || fences(info, self->second))) cut.push_back(node);
  return cut;
}

InstanceInfo* Registry::entry_of(const InstanceInfo& picked) {
  auto it = instances_.find(picked.node);
  // Evicted (its credits went with it), or evicted and registered anew.
  if (it == instances_.end() || it->second.registration != picked.registration) return nullptr;
  return &it->second;
}

void Registry::adjust(const InstanceInfo& picked, int64_t delta_blocks) {
  std::lock_guard<std::mutex> lock(mu_);
  InstanceInfo* i = entry_of(picked);
  if (i == nullptr) return;
  i->reserved_blocks += delta_blocks;
  TANDEM_ASSERT(i->reserved_blocks >= 0, "router credits went negative");
  if (delta_blocks < 0) credits_changed();
}

void Registry::done(const InstanceInfo& picked, int64_t blocks) {
  std::lock_guard<std::mutex> lock(mu_);
  InstanceInfo* i = entry_of(picked);
  if (i == nullptr) return;
  TANDEM_ASSERT(i->in_flight > 0, "a request ended twice");
  --i->in_flight;
  i->reserved_blocks -= blocks;
  TANDEM_ASSERT(i->reserved_blocks >= 0, "router credits went negative");
  credits_changed();
}

void Registry::credits_changed() {
  ++credits_version_;
  credits_cv_.notify_all();
}

bool Registry::wait_for_credits(uint64_t seen, int64_t deadline_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  ++waiting_for_credits_;
  const int64_t left_ms = std::max<int64_t>(0, deadline_ms - monotonic_ms());
  bool changed = credits_cv_.wait_for(lock, std::chrono::milliseconds(left_ms), [&] { return credits_version_ != seen; });
  --waiting_for_credits_;
  return changed;
}

int64_t Registry::waiting_for_credits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waiting_for_credits_;
}

std::optional<Registry::Limits> Registry::limits() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (instances_.empty() || !cluster_fingerprint_) return std::nullopt;
  Limits l;
  l.block_size = cluster_fingerprint_->block_size;
  for (const auto& [node, info] : instances_) l.max_model_len = std::max(l.max_model_len, info.max_model_len);
  return l;
}

std::vector<InstanceInfo> Registry::list() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<InstanceInfo> v;
  for (const auto& [node, info] : instances_) v.push_back(info);
  return v;
}

int Registry::count(pd::Role role) const {
  // A data-parallel group is one instance, counted once all its ranks are
  // here and ready (its group formed).
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, int> ranks_of_group;
  int n = 0;
  for (const auto& [node, i] : instances_) {
    if (i.role != role) continue;
    if (i.dp_group.empty()) ++n;
    else if (i.ready && ++ranks_of_group[i.dp_group] == i.dp_size) ++n;
  }
  return n;
}

int Registry::count_ranks(pd::Role role) const {
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
