// The router's registry of instances: who they are (role, node, epoch,
// addresses, model and KV layout), whether they are alive (heartbeats;
// eviction on silence), how loaded (free KV blocks, queue depth, requests in
// flight), and the block credits the router has reserved on each.
//
// Credits: a picked request reserves its worst case (util/block_budget.h) on
// the instance until released. An instance's free credits are its capacity,
// less those reservations, less the blocks it reports quarantined (held by
// transfers that ended; no reservation covers them any more). Thread-safe:
// HTTP handler threads register, heartbeat, pick and wait for credits.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "pd/types.h"
#include "transport/handshake.h"

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
  // Model identity, KV dtype and layout, block size, protocol version: what
  // the transfer hand-shake checks too, checked here at registration.
  transport::Fingerprint fingerprint;
  std::string model_name;
  int64_t max_model_len = 0;
  int64_t capacity_blocks = 0;
  // From heartbeats.
  int64_t free_blocks = 0;
  int64_t quarantined_blocks = 0;
  int64_t waiting = 0;
  bool draining = false;  // shutting down: not picked for new requests
  bool ready = true;      // false: its data-parallel group is re-forming (not picked meanwhile)
  // A data-parallel rank: its group (one instance of `dp_size` ranks, each
  // registered on its own: they have their own KV pools and transfer
  // listeners) and its rank. Empty group: not data-parallel.
  std::string dp_group;
  int dp_rank = 0;
  int dp_size = 1;
  int64_t dp_group_failures = 0;  // times this rank's group failed and re-formed (heartbeat)
  // Peer incarnations this instance is fencing (it holds them dead until the
  // fence completes, which on shared memory it may never): the router does
  // not pair it with them.
  std::vector<std::pair<pd::NodeId, pd::Epoch>> fencing;
  // The protocol's health, from heartbeats: message drops by reason (totals
  // since the instance started), and transfers by state: {count, oldest_ms}.
  std::map<std::string, int64_t> drops;
  std::map<std::string, std::pair<int64_t, int64_t>> transfers_by_state;
  int64_t last_heard_ms = 0;
  int64_t registered_ms = 0;
  // Router side.
  int64_t in_flight = 0;
  int64_t requests = 0;
  int64_t reserved_blocks = 0;
  // Which entry of this node the router's reservations were made on: an
  // evicted node that registers again starts a new one, and what the old
  // entry's requests return on ending does not touch it.
  uint64_t registration = 0;
  int64_t free_credits() const { return capacity_blocks - quarantined_blocks - reserved_blocks; }
};

// What an instance's heartbeat says of its load.
struct InstanceLoad {
  int64_t free_blocks = 0;
  int64_t waiting = 0;
  bool draining = false;
  bool ready = true;
  int64_t dp_group_failures = 0;
  // From the instance's transfer agent; absent (it did not answer in time):
  // keep the last.
  std::optional<int64_t> quarantined_blocks;
  std::optional<std::vector<std::pair<pd::NodeId, pd::Epoch>>> fencing;
  std::optional<std::map<std::string, int64_t>> drops;
  std::optional<std::map<std::string, std::pair<int64_t, int64_t>>> transfers_by_state;
};

struct Pick {
  std::optional<InstanceInfo> instance;  // picked, with `blocks` reserved on it
  // Nothing picked: an instance could hold the request, but none has the
  // credits free now (wait_for_credits from credits_version, then pick again).
  bool must_wait = false;
  uint64_t credits_version = 0;  // what the pick saw
};

// A prefill and a decode picked together (both reserved, or neither).
struct PairPick {
  std::optional<InstanceInfo> prefill, decode;
  pd::Role missing = pd::Role::kRouter;  // the role that had no instance (when nothing was picked)
  bool must_wait = false;                // ... but has one that could hold the request later
  bool skipped_cut = false;              // prefills were passed over: every decode is cut off from them
  uint64_t credits_version = 0;
  bool ok() const { return prefill.has_value() && decode.has_value(); }
};

class Registry {
 public:
  explicit Registry(int64_t eviction_ms) : eviction_ms_(eviction_ms) {}

  // Registers (or re-registers in a newer epoch) an instance. Returns an error
  // message when it cannot join: a fingerprint that differs from the
  // cluster's (model, KV dtype, block size, layout, shape, protocol version,
  // transfer mode: the message names the field), a node id taken by another
  // address, an older epoch.
  std::optional<std::string> add(InstanceInfo info, int64_t now_ms);
  // False when the node is unknown or the epoch is not the registered one
  // (the instance must register again).
  bool heartbeat(pd::NodeId node, pd::Epoch epoch, const InstanceLoad& load, int64_t now_ms);
  // Whether `node` is registered (not evicted).
  bool contains(pd::NodeId node) const;
  // Drops instances silent for eviction_ms; returns their nodes.
  std::vector<pd::NodeId> evict_silent(int64_t now_ms);
  // Among the live instances of `role` not in `avoid` whose free credits hold
  // `blocks`: the one with the fewest requests in flight here (then the
  // shortest queue, then the most free credits). Reserves `blocks` on it and
  // counts the request in flight until done(). When no instance could ever
  // hold `blocks`, the least loaded is picked all the same: the instance
  // refuses the request with its own reason, which the client gets.
  Pick pick(pd::Role role, int64_t blocks, const std::vector<pd::NodeId>& avoid = {});
  // The same for a request's two legs at once, under one lock (nothing is
  // reserved for a moment and given back): the prefill first, then a decode
  // not cut off from it (cut_from), trying other prefills while every decode
  // is cut off from the one picked.
  PairPick pick_pair(int64_t prefill_blocks, int64_t decode_blocks, const std::vector<pd::NodeId>& avoid_prefill,
                     const std::vector<pd::NodeId>& avoid_decode);
  // The instances `picked` must not be paired with: those it is fencing, and
  // those fencing it, in their current incarnations.
  std::vector<pd::NodeId> cut_from(const InstanceInfo& picked) const;
  // Changes the reservation on `node` by `delta_blocks` (negative: returned;
  // a reservation corrected to the request's exact size, or the prefill's
  // returned once its KV has moved).
  void adjust(const InstanceInfo& picked, int64_t delta_blocks);
  // The request is over on the picked instance: no longer in flight, `blocks` released.
  void done(const InstanceInfo& picked, int64_t blocks);
  // Waits until credits may have been freed since a pick saw `seen` (a
  // release, a heartbeat, a new instance; at once if that happened already)
  // or deadline_ms passes; false at the deadline.
  bool wait_for_credits(uint64_t seen, int64_t deadline_ms);
  int64_t waiting_for_credits() const;
  // The cluster's block size and the longest context of its instances
  // (nullopt while none is registered).
  struct Limits {
    int64_t block_size = 16;
    int64_t max_model_len = 0;
  };
  std::optional<Limits> limits() const;
  std::vector<InstanceInfo> list() const;
  int count(pd::Role role) const;
  // Registered ranks of that role (an instance without data parallelism is one).
  int count_ranks(pd::Role role) const;
  int64_t evictions() const;
  int64_t eviction_ms() const { return eviction_ms_; }
  // Grows whenever the set of instances or their addresses changes (not on
  // load updates): a heartbeat answer carries the list only when it moved.
  uint64_t version() const;

 private:
  int64_t eviction_ms_;
  mutable std::mutex mu_;
  std::map<pd::NodeId, InstanceInfo> instances_;
  std::condition_variable credits_cv_;
  uint64_t credits_version_ = 0;  // grows whenever credits may have been freed
  int64_t waiting_for_credits_ = 0;
  std::optional<transport::Fingerprint> cluster_fingerprint_;
  int64_t evictions_ = 0;
  void credits_changed();  // under mu_
  uint64_t version_ = 1;
  uint64_t next_registration_ = 1;
  // Under mu_:
  InstanceInfo* entry_of(const InstanceInfo& picked);  // null when gone
  InstanceInfo* choose_locked(pd::Role role, int64_t blocks, const std::vector<pd::NodeId>& avoid, bool* must_wait);
  void reserve_locked(InstanceInfo& i, int64_t blocks);
  std::vector<pd::NodeId> cut_from_locked(const InstanceInfo& picked) const;
};

}  // namespace tandem::router
