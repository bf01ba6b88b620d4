// What the prefill side and the decode side share about their table of
// transfers: lookup and inspection, state entries, the timer service
// (retransmits, the deadline, tombstone expiry), and a peer incarnation's
// death. Each side adds its messages and states, its own timers and what a
// silent peer means to it, through the hooks at the end.
#pragma once

#include <algorithm>
#include <array>
#include <map>

#include "pd/node_core.h"

namespace tandem::pd {

template <typename Transfer, typename State, size_t kStates>
class TransferSide : public NodeCore {
 public:
  using NodeCore::NodeCore;

  // Inspection (metrics, debug endpoint, simulator invariants).
  const Transfer* find(TransferId transfer) const { return find_transfer(transfers_, transfer); }
  const std::map<TransferId, Transfer>& transfers() const { return transfers_; }
  std::array<int64_t, kStates> count_by_state() const { return count_by_state_of<kStates>(transfers_); }
  std::array<StateAge, kStates> ages_by_state(TimeMs now_ms) const {
    return pd::ages_by_state<std::map<TransferId, Transfer>, kStates>(transfers_, now_ms);
  }
  int64_t blocks_held() const { return blocks_held_by(transfers_); }
  int64_t quarantined_blocks() const override { return blocks_quarantined_by(transfers_, capacity_blocks()); }
  int64_t slots_held() const { return slots_held_by(transfers_); }

 protected:
  Outbox* outbox_of(TransferId transfer) override {
    auto it = transfers_.find(transfer);
    return it == transfers_.end() ? nullptr : &it->second.outbox;
  }

  void set_state(Transfer& t, State state, TimeMs now_ms) {
    t.state = state;
    t.state_since_ms = now_ms;
    ++stats_.state_entries[static_cast<int>(state)];
  }

  void service(TransferId transfer, TimeMs now_ms, Outputs* out) override {
    auto it = transfers_.find(transfer);
    if (it == transfers_.end()) return;
    Transfer& t = it->second;
    const bool peer_silent = service_outbox(t, now_ms, out, [&](EndReason reason) { end_transfer(t, reason, now_ms, out); });
    service_side(t, peer_silent, now_ms, out);
    if (t.state == State::kEnded && t.outbox.empty() && now_ms >= t.ended_ms + config_.tombstone_ttl_ms) {
      ++stats_.tombstones_expired;
      transfers_.erase(it);
      return;
    }
    schedule_next(t);
  }

  void on_peer_death(const PeerDeath& death, TimeMs now_ms, Outputs* out) override {
    for (auto& [id, t] : transfers_) {
      if (t.peer != death.node || t.peer_epoch != death.epoch) continue;
      if (death.fenced) t.peer_fenced = true;
      // A lease can expire on a live peer cut off for a while: keep telling it
      // (it may still wait for us), unless it restarted and forgot everything.
      if (forgot_us(t)) t.outbox.drop_to(death.node, death.epoch);
      if (t.peer_dead) {
        // Already ending on its death; a completed fence may let it finish.
        if (t.ending) try_finish_end(t, now_ms, out);
        continue;
      }
      t.peer_dead = true;
      if (outlives_peer(t)) continue;
      if (!t.ending) {
        end_transfer(t, EndReason::kPeerDead, now_ms, out);
      } else {
        try_finish_end(t, now_ms, out);
      }
    }
  }

  // The transfer's next timer: its next retransmit, then its tombstone's
  // expiry once ended, or while live the side's own (side_timer).
  void schedule_next(Transfer& t) {
    TimeMs next = t.outbox.next_due_ms();
    if (t.state == State::kEnded) {
      // Forgotten at the TTL, but only once nothing is left to retransmit.
      if (t.outbox.empty()) next = std::min(next, t.ended_ms + config_.tombstone_ttl_ms);
    } else {
      next = std::min(next, side_timer(t));
    }
    schedule(t.id, next);
  }

  // The one release path: runs once per transfer.
  virtual void end_transfer(Transfer& t, EndReason reason, TimeMs now_ms, Outputs* out) = 0;
  // Frees and leaves a tombstone once no peer access and no RMA remain.
  virtual void try_finish_end(Transfer& t, TimeMs now_ms, Outputs* out) = 0;
  // After the retransmits: the side's own timers, and what a peer that
  // answered an ending transfer nothing for max_retransmits means to it.
  virtual void service_side(Transfer& t, bool peer_silent, TimeMs now_ms, Outputs* out) = 0;
  // When a live transfer next needs service besides its retransmits.
  virtual TimeMs side_timer(const Transfer& t) const = 0;
  // The transfer goes on when its peer dies (a decode that holds the KV).
  virtual bool outlives_peer(const Transfer&) const { return false; }

  std::map<TransferId, Transfer> transfers_;
};

}  // namespace tandem::pd
