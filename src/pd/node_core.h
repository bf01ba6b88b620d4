// What the prefill side, the decode side and the router share: identity and
// epoch, peer leases and heartbeats, reliable (retransmitted) sends, the timer
// queue, and the counters every core exposes.
#pragma once

#include <algorithm>
#include <array>
#include <deque>
#include <functional>
#include <map>
#include <queue>
#include <set>
#include <utility>
#include <vector>

#include "pd/message.h"
#include "pd/peer_leases.h"

namespace tandem::pd {

// One message awaiting its Ack. Resends back off: the first comes after
// interval/16, each next one after twice the last, up to the interval. A
// message that merely overtook its transfer's Start (dropped as unknown by a
// peer that has not seen the Start yet) is so resent within tens of
// milliseconds, while a dead or cut-off peer still costs one send per interval.
struct PendingSend {
  Message message;
  TimeMs next_send_ms = 0;
  TimeMs backoff_ms = 0;
  int32_t sends = 0;
};

// A transfer's unacknowledged messages (at most one per kind and receiver).
class Outbox {
 public:
  // Sends `message` now and keeps it for retransmission until acknowledged.
  void put(Message message, TimeMs now_ms, TimeMs interval_ms, Outputs* out);
  // Removes the pending `kind` to `from`; false if none was pending.
  bool ack(NodeId from, MessageKind kind);
  // Drops what is addressed to that incarnation of `node` (not to a newer one).
  void drop_to(NodeId node, Epoch epoch);
  void drop_kind(MessageKind kind);
  void clear() { pending_.clear(); }
  // Resends what is due. Returns the number of messages that reached
  // `max_sends` (they are dropped from the outbox); *to_node_exhausted tells
  // whether one of them was addressed to `node`.
  int service(TimeMs now_ms, TimeMs interval_ms, int32_t max_sends, Outputs* out,
              int64_t* retransmits, NodeId node = 0, bool* to_node_exhausted = nullptr);
  TimeMs next_due_ms() const;
  bool empty() const { return pending_.empty(); }
  bool has(MessageKind kind) const;
  // Whether a `kind` of this outbox was ever acknowledged (one that exhausted
  // its retransmits instead was never heard).
  bool was_acked(MessageKind kind) const { return (acked_kinds_ >> static_cast<int>(kind)) & 1u; }
  const std::vector<PendingSend>& pending() const { return pending_; }

 private:
  std::vector<PendingSend> pending_;
  uint32_t acked_kinds_ = 0;  // bit per MessageKind
};

// Fields every transfer record has, on either side.
struct TransferBase {
  TransferId id = 0;
  TransferMode mode = TransferMode::kWrite;
  NodeId peer = 0;
  Epoch peer_epoch = 0;
  int32_t prompt_tokens = 0;
  NodeId router = 0;  // where Outcome goes
  Epoch router_epoch = 0;
  TimeMs created_ms = 0;
  TimeMs state_since_ms = 0;
  TimeMs deadline_ms = kNever;
  TimeMs ended_ms = kNever;
  bool ending = false;          // end_transfer() ran
  EndReason end_reason = EndReason::kCompleted;
  bool peer_dead = false;       // the peer's epoch was declared dead
  bool peer_released = false;   // the peer holds no access to our memory any more
  bool release_sent = false;
  bool addresses_known = false; // the remote side's block addresses arrived
  bool exposed = false;         // our blocks are registered for the peer's RMA
  bool peer_fenced = false;     // the peer incarnation was fenced while this transfer lived
  bool rma_in_flight = false;   // our RMA on the peer's memory is posted
  std::vector<BlockId> blocks;  // blocks this side holds for the transfer
  int32_t slot = kNoSlot;       // recurrent-state slot this side holds
  Outbox outbox;
};

// Transfers in one state: how many, and how long the oldest has been in it
// (the watchdog and the debug endpoint read this).
struct StateAge {
  int64_t count = 0;
  TimeMs oldest_ms = 0;
};

template <typename Transfers, size_t N>
std::array<StateAge, N> ages_by_state(const Transfers& transfers, TimeMs now_ms) {
  std::array<StateAge, N> ages{};
  for (const auto& [id, t] : transfers) {
    StateAge& a = ages[static_cast<size_t>(t.state)];
    ++a.count;
    a.oldest_ms = std::max(a.oldest_ms, now_ms - t.state_since_ms);
  }
  return ages;
}

// Read-only views over a side's transfer map (shared by both instance sides).
template <typename Map>
const typename Map::mapped_type* find_transfer(const Map& transfers, TransferId id) {
  auto it = transfers.find(id);
  return it == transfers.end() ? nullptr : &it->second;
}
template <typename Map>
int64_t blocks_held_by(const Map& transfers) {
  int64_t n = 0;
  for (const auto& [id, t] : transfers) n += static_cast<int64_t>(t.blocks.size());
  return n;
}
template <typename Map>
int64_t slots_held_by(const Map& transfers) {
  int64_t n = 0;
  for (const auto& [id, t] : transfers) n += t.slot != kNoSlot ? 1 : 0;
  return n;
}
// KV blocks that ended transfers still hold (waiting for the peer's Release,
// an RMA in flight, or a fence): no request owns them, yet they are not free.
// Ids from `n_kv_blocks` on are a hybrid model's state slot, not KV capacity.
template <typename Map>
int64_t blocks_quarantined_by(const Map& transfers, int32_t n_kv_blocks) {
  int64_t n = 0;
  for (const auto& [id, t] : transfers)
    if (t.ending)
      for (BlockId b : t.blocks) n += b < n_kv_blocks ? 1 : 0;
  return n;
}
template <size_t N, typename Map>
std::array<int64_t, N> count_by_state_of(const Map& transfers) {
  std::array<int64_t, N> counts{};
  for (const auto& [id, t] : transfers) ++counts[static_cast<size_t>(t.state)];
  return counts;
}

struct NodeStats {
  std::array<int64_t, kDropReasonCount> drops{};
  std::array<int64_t, kEndReasonCount> ends{};
  std::array<int64_t, kMessageKindCount> received{};
  std::array<int64_t, 8> state_entries{};  // by PrefillState / DecodeState value
  int64_t retransmits = 0;
  int64_t retransmit_exhausted = 0;
  int64_t peer_deaths = 0;
  int64_t tombstones_expired = 0;
  // Protocol paths taken (the simulator's coverage reads these).
  int64_t deferred_writes = 0;          // KV ready before the decode's addresses
  int64_t late_addresses_accepted = 0;  // addresses arrived >= 60 s after the KV was ready
  int64_t addresses_before_kv = 0;      // addresses arrived before the KV was ready
  int64_t zero_block_transfers = 0;
  int64_t sibling_fanouts = 0;          // n > 1 transfers forked on the decode
  int64_t quarantines = 0;              // end waited for a peer or an RMA
  int64_t early_end_tombstones = 0;     // an Abort or Release came before the Start
  int64_t fences_requested = 0;         // a dead or silent peer had our memory exposed
  int64_t fences_completed = 0;
  int64_t early_messages_replayed = 0;  // a peer's message came before its Start, and was kept
  int64_t silent_peers = 0;             // an ending transfer's peer answered nothing for max_retransmits
};

class NodeCore {
 public:
  NodeCore(NodeId id, Epoch epoch, Role role, int32_t capacity_blocks,
           const ProtocolConfig& config);
  virtual ~NodeCore() = default;

  NodeId id() const { return id_; }
  Epoch epoch() const { return epoch_; }
  Role role() const { return role_; }
  const ProtocolConfig& config() const { return config_; }
  const NodeStats& stats() const { return stats_; }
  const PeerLeases& leases() const { return leases_; }

  // The nodes this one heartbeats (the router and the instances of the other role).
  void set_heartbeat_targets(std::vector<NodeId> nodes) { heartbeat_targets_ = std::move(nodes); }

  void start(TimeMs now_ms, Outputs* out);
  // The instance is going away: every Start from now on is refused (the
  // router hears kDraining, the peer a Release); live transfers go on.
  void begin_drain() { draining_ = true; }
  bool draining() const { return draining_; }
  void on_message(const Message& message, TimeMs now_ms, Outputs* out);
  void on_timer(TimeMs now_ms, Outputs* out);
  // The driver completed a kFencePeer: no RMA of that incarnation reaches our
  // memory any more. Its transfers end, and what they exposed is freed.
  void on_peer_fenced(NodeId node, Epoch epoch, TimeMs now_ms, Outputs* out);
  // Incarnations whose fence was asked for and has not completed (blocks
  // exposed to them stay quarantined until it does).
  const std::set<std::pair<NodeId, Epoch>>& fences_pending() const { return fences_pending_; }
  // Blocks held by transfers that have ended (sent in heartbeats: the router
  // counts them against this instance until they are freed).
  virtual int64_t quarantined_blocks() const { return 0; }
  // The KV blocks of this instance's pool (block ids beyond are state slots).
  int32_t capacity_blocks() const { return capacity_blocks_; }

 protected:
  // A message that passed the epoch checks (heartbeats and acks are handled here).
  virtual void handle(const Message& message, TimeMs now_ms, Outputs* out) = 0;
  virtual void on_ack(TransferId transfer, MessageKind acked, TimeMs now_ms, Outputs* out) = 0;
  virtual Outbox* outbox_of(TransferId transfer) = 0;
  // Retransmits, deadlines, tombstone expiry for one transfer.
  virtual void service(TransferId transfer, TimeMs now_ms, Outputs* out) = 0;
  virtual void on_peer_death(const PeerDeath& death, TimeMs now_ms, Outputs* out) = 0;
  // After a heartbeat (the router dispatches queued work to newly heard instances).
  virtual void on_heartbeat(TimeMs, Outputs*) {}

  Message make(MessageKind kind, NodeId to, Epoch to_epoch, TransferId transfer) const;
  // Returns the blocks and slot a transfer holds to the pool (moves them out of t).
  static void free_held(TransferBase& t, Outputs* out);
  static void free_blocks(TransferId transfer, std::vector<BlockId> blocks, int32_t slot, Outputs* out);
  // Records that the transfer's memory is private again: the peer released it
  // or was fenced (there is no per-transfer revoke; see kFencePeer).
  static void end_exposure(TransferBase& t, Outputs* out);
  // No RMA of the transfer's peer can reach our memory: it was fenced, or it
  // restarted (a newer epoch of the same node: the old process is gone).
  bool peer_fenced(const TransferBase& t) const {
    return t.peer_fenced || leases_.is_superseded(t.peer, t.peer_epoch);
  }
  // The peer can still reach memory the transfer exposed to it.
  bool peer_can_reach(const TransferBase& t) const {
    return t.exposed && !t.peer_released && !peer_fenced(t);
  }
  // Asks the driver to fence the peer incarnation (once), and treats it as
  // dead from now on: every transfer with it ends, none starts, until the
  // fence completes. Memory it can reach stays quarantined until then.
  void request_fence(NodeId node, Epoch epoch, Outputs* out);
  // Exposes `blocks` (the moved blocks from `first_block` on) and t.slot to the
  // peer's RMA, then sends their addresses (`kind`: RemoteBlocks or KvAddresses).
  void expose_and_send(TransferBase& t, MessageKind kind, int32_t first_block,
                       std::vector<BlockId> blocks, TimeMs now_ms, Outputs* out);
  // The checks every message about a transfer goes through on an instance.
  // Returns the live transfer the message is for, or null when it was fully
  // handled here: unknown (dropped; an Abort or Release leaves a tombstone),
  // an Abort (ends the transfer through `end_on_abort`), from the wrong peer
  // or epoch (dropped), or for a tombstone (answered).
  template <typename Transfer>
  Transfer* accept(std::map<TransferId, Transfer>& transfers, const Message& m, TimeMs now_ms,
                   Outputs* out, const std::function<void(Transfer&)>& end_on_abort,
                   const std::function<void(Transfer&)>& became_tombstone);
  void send_ack(const Message& received, Outputs* out) const;
  void schedule(TransferId transfer, TimeMs at_ms);
  void drop(DropReason reason) { ++stats_.drops[static_cast<int>(reason)]; }
  // Answers the peer's message about a transfer this side has ended. A peer we
  // never released (we thought it dead, or never knew the transfer) is owed a
  // reliable Release; otherwise a data message gets a one-shot Release (its
  // sender retransmits until it hears one) and anything else an Ack.
  void answer_ended(TransferBase& t, const Message& message, TimeMs now_ms, Outputs* out);
  // A transfer this side never started ends before it began (an Abort or a
  // peer's Release overtook the Start): the tombstone refuses a later Start,
  // and the peer hears that we hold nothing of it.
  void start_tombstone(TransferBase& t, TransferId id, NodeId peer, Epoch peer_epoch,
                       EndReason reason, TimeMs now_ms, Outputs* out);
  // Why a transfer ends when the peer's Release ends it: the peer's failure
  // reason if it failed (its own report may be lost with it), else kPeerReleased.
  static EndReason released_reason(EndReason peer_reason);
  // The peer restarted (a newer epoch is known) or was never named: nothing we
  // send can reach the incarnation that knew the transfer. A peer whose lease
  // merely expired may be alive behind a partition, so it still gets our Release.
  bool forgot_us(const TransferBase& t) const {
    return t.peer == 0 || leases_.is_superseded(t.peer, t.peer_epoch);
  }
  // The Release a side sends when it ends: reliable, carrying the shared id.
  void send_release(TransferBase& t, TimeMs now_ms, Outputs* out);
  // The one release path of an ending transfer, shared by both sides (their
  // try_finish_end adds only the state names):
  //  - must_hold(): true while our own RMA is in flight or the peer can still
  //    reach memory we exposed. Then the peer hears our Release (once no RMA
  //    of ours is in flight), and a peer known dead is fenced; the blocks stay.
  //  - release_held(): nothing can reach the memory any more: end the
  //    exposure, free, drop our address message (`own_addresses`), and send
  //    the Release the peer still waits for. `peer_exposed_to_us`: in this
  //    mode the peer exposes memory to us before it tells us where (we may
  //    never have heard), so it waits for our Release even if it released first.
  bool must_hold(TransferBase& t, TimeMs now_ms, Outputs* out);
  void release_held(TransferBase& t, MessageKind own_addresses, bool peer_exposed_to_us, TimeMs now_ms,
                    Outputs* out);
  // The Release of release_held() (mutation 3 replaces it on the decode).
  virtual void send_final_release(TransferBase& t, TimeMs now_ms, Outputs* out) { send_release(t, now_ms, out); }
  // The end of a transfer is reported to the router, except the router's own
  // aborts. The decode reports every end (the router decides a request's fate
  // on its word, even when the prefill that failed first has crashed since).
  void report_outcome(TransferBase& t, TimeMs now_ms, Outputs* out);
  void declare_deaths(std::vector<PeerDeath>& deaths, TimeMs now_ms, Outputs* out);
  // Keeps a message for a transfer not started here yet (bounded in count and
  // age: config.max_early_messages, retransmit_interval_ms); false when full.
  bool park_early(const Message& m, TimeMs now_ms);
  // Handles what was kept for `transfer` once it exists.
  void replay_early(TransferId transfer, TimeMs now_ms, Outputs* out);
  void expire_early(TimeMs now_ms);
  // Deaths found where a synchronous on_peer_death would re-enter the caller
  // (a fence asked for from inside a transfer's end); declared by finish().
  std::vector<PeerDeath> deferred_deaths_;
  std::set<std::pair<NodeId, Epoch>> fences_pending_;
  // Common services of a transfer record: retransmit, and end at the deadline
  // or when a message exhausted its retransmits. Returns true when the
  // transfer was already ending (waiting on its peer) and a message to the
  // peer went unanswered for max_retransmits.
  bool service_outbox(TransferBase& t, TimeMs now_ms, Outputs* out,
                      const std::function<void(EndReason)>& end);

  // Sets out->wake_at_ms; every public entry point ends with it.
  void finish(TimeMs now_ms, Outputs* out);
  const NodeId id_;
  const Epoch epoch_;
  const Role role_;
  const int32_t capacity_blocks_;
  const ProtocolConfig config_;
  PeerLeases leases_;
  NodeStats stats_;
  std::vector<NodeId> heartbeat_targets_;
  bool draining_ = false;

 private:
  std::deque<std::pair<TimeMs, Message>> early_;  // oldest first
  TimeMs next_heartbeat_ms_ = 0;
  using Timer = std::pair<TimeMs, TransferId>;
  std::priority_queue<Timer, std::vector<Timer>, std::greater<Timer>> timers_;
};

template <typename Transfer>
Transfer* NodeCore::accept(std::map<TransferId, Transfer>& transfers, const Message& m,
                           TimeMs now_ms, Outputs* out,
                           const std::function<void(Transfer&)>& end_on_abort,
                           const std::function<void(Transfer&)>& became_tombstone) {
  auto it = transfers.find(m.transfer);
  if (it == transfers.end()) {
    if (m.kind == MessageKind::kAbort || m.kind == MessageKind::kRelease) {
      bool abort = m.kind == MessageKind::kAbort;
      Transfer& t = transfers[m.transfer];
      start_tombstone(t, m.transfer, abort ? m.peer : m.from, abort ? m.peer_epoch : m.from_epoch,
                      abort ? EndReason::kRouterAbort : released_reason(m.reason), now_ms, out);
      t.peer_released = !abort;
      became_tombstone(t);
      send_ack(m, out);
      return nullptr;
    }
    // Never seen: no answer, the sender retransmits if it must. A peer's
    // message that overtook the router's Start (both legs are sent at once)
    // is kept a while and replayed when the Start comes, so the transfer does
    // not wait for the resend.
    if (!park_early(m, now_ms)) drop(DropReason::kUnknown);
    return nullptr;
  }
  Transfer& t = it->second;
  if (m.kind == MessageKind::kAbort) {
    if (!t.ending) {
      end_on_abort(t);
    } else {
      drop(DropReason::kEnded);
    }
    send_ack(m, out);
    return nullptr;
  }
  if (m.from != t.peer) {
    drop(DropReason::kWrongPeer);
    return nullptr;
  }
  if (m.from_epoch != t.peer_epoch) {
    drop(DropReason::kStaleEpoch);
    return nullptr;
  }
  if (t.ended_ms != kNever) {
    answer_ended(t, m, now_ms, out);
    return nullptr;
  }
  return &t;
}

}  // namespace tandem::pd
