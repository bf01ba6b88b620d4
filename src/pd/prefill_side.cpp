#include "pd/prefill_side.h"

#include <algorithm>

#include "util/error.h"

namespace tandem::pd {

namespace {
// Addresses arriving this long after the KV was ready are "late" in the sense of
// field report 000 (60 s expiry vs 78 s arrival); counted for coverage.
constexpr TimeMs kLateAddressesMs = 60'000;
}  // namespace

PrefillSide::PrefillSide(NodeId id, Epoch epoch, int32_t capacity_blocks,
                         const ProtocolConfig& config)
    : TransferSide(id, epoch, Role::kPrefill, capacity_blocks, config) {}

void PrefillSide::handle(const Message& m, TimeMs now_ms, Outputs* out) {
  if (m.kind == MessageKind::kStartPrefill) return on_start(m, now_ms, out);
  PrefillTransfer* t = accept<PrefillTransfer>(
      transfers_, m, now_ms, out,
      [&](PrefillTransfer& x) { end_transfer(x, EndReason::kRouterAbort, now_ms, out); },
      [&](PrefillTransfer& x) {
        set_state(x, PrefillState::kEnded, now_ms);
        schedule_next(x);
      });
  if (t == nullptr) return;
  switch (m.kind) {
    case MessageKind::kRemoteBlocks:
      return on_remote_blocks(*t, m, now_ms, out);
    case MessageKind::kRelease:
      return on_release(*t, m, now_ms, out);
    default:
      return drop(DropReason::kUnexpected);
  }
}

void PrefillSide::on_start(const Message& m, TimeMs now_ms, Outputs* out) {
  send_ack(m, out);
  auto [it, inserted] = transfers_.try_emplace(m.transfer);
  PrefillTransfer& t = it->second;
  if (!inserted) {
    drop(t.state == PrefillState::kEnded ? DropReason::kEnded : DropReason::kDuplicate);
    return;
  }
  TANDEM_ASSERT(m.prompt_tokens >= 1, "a request has at least one prompt token");
  t.id = m.transfer;
  t.mode = m.mode;
  t.peer = m.peer;
  t.peer_epoch = m.peer_epoch;
  t.prompt_tokens = m.prompt_tokens;
  t.router = m.from;
  t.router_epoch = m.from_epoch;
  t.created_ms = now_ms;
  t.deadline_ms = now_ms + m.budget_ms;
  set_state(t, PrefillState::kPrefilling, now_ms);
  if (draining_) {
    t.computed = true;  // nothing to cancel: no compute was asked for
    end_transfer(t, EndReason::kDraining, now_ms, out);
    return;
  }
  std::vector<PeerDeath> deaths;
  bool peer_alive = leases_.expect(t.peer, t.peer_epoch, now_ms, &deaths);
  declare_deaths(deaths, now_ms, out);
  if (!peer_alive) {
    t.peer_dead = true;
    end_transfer(t, EndReason::kPeerDead, now_ms, out);
    return;
  }
  Effect compute;
  compute.kind = EffectKind::kComputePrefill;
  compute.transfer = t.id;
  compute.prompt_tokens = t.prompt_tokens;
  compute.n_blocks = transfer_blocks(t.prompt_tokens, config_);
  out->effects.push_back(std::move(compute));
  schedule_next(t);
}

void PrefillSide::on_prefill_computed(TransferId transfer, std::vector<BlockId> blocks,
                                      int32_t slot, TimeMs now_ms, Outputs* out) {
  auto it = transfers_.find(transfer);
  if (it == transfers_.end() || it->second.ending) {
    // The transfer ended while the engine computed: the blocks come straight back.
    free_blocks(transfer, std::move(blocks), slot, out);
    return finish(now_ms, out);
  }
  PrefillTransfer& t = it->second;
  TANDEM_ASSERT(!t.computed, "prefill reported twice");
  TANDEM_ASSERT(static_cast<int32_t>(blocks.size()) ==
                    transfer_blocks(t.prompt_tokens, config_),
                "prefill engine returned the wrong number of blocks");
  t.blocks = std::move(blocks);
  t.slot = slot;
  t.computed = true;
  t.computed_ms = now_ms;
  if (t.mode == TransferMode::kWrite) {
    if (t.addresses_known) {
      post_write(t, now_ms, out);
    } else {
      // The deferred write: it waits for the decode's addresses as long as the
      // request lives (no timer of its own, unless mutation 1 is on).
      ++stats_.deferred_writes;
      set_state(t, PrefillState::kAwaitingAddresses, now_ms);
      if (mutated(config_, Mutation::kFixedDeferExpiry))
        t.defer_expiry_ms = now_ms + config_.mutation_defer_expiry_ms;
    }
  } else {
    if (t.blocks.empty()) ++stats_.zero_block_transfers;
    expose_and_send(t, MessageKind::kKvAddresses, 0, t.blocks, now_ms, out);
    set_state(t, PrefillState::kExposed, now_ms);
  }
  schedule_next(t);
  finish(now_ms, out);
}

void PrefillSide::cancel(TransferId transfer, EndReason reason, TimeMs now_ms, Outputs* out) {
  auto it = transfers_.find(transfer);
  if (it != transfers_.end() && !it->second.ending) end_transfer(it->second, reason, now_ms, out);
  finish(now_ms, out);
}

void PrefillSide::on_prefill_failed(TransferId transfer, TimeMs now_ms, Outputs* out) {
  auto it = transfers_.find(transfer);
  if (it != transfers_.end() && !it->second.ending)
    end_transfer(it->second, EndReason::kPrefillFailed, now_ms, out);
  finish(now_ms, out);
}

void PrefillSide::on_remote_blocks(PrefillTransfer& t, const Message& m, TimeMs now_ms,
                                   Outputs* out) {
  if (t.mode != TransferMode::kWrite) return drop(DropReason::kUnexpected);
  send_ack(m, out);
  if (t.ending) return drop(DropReason::kEnded);
  if (t.addresses_known) return drop(DropReason::kDuplicate);
  // The decode names blocks for our moved range from first_block on: exactly
  // the blocks it lacks. Anything else cannot be written.
  int32_t n_moved = transfer_blocks(t.prompt_tokens, config_);
  if (m.first_block < 0 || m.first_block > n_moved ||
      static_cast<int64_t>(m.blocks.size()) != n_moved - m.first_block)
    return drop(DropReason::kInvalid);
  t.addresses_known = true;
  t.first_remote_block = m.first_block;
  t.remote_blocks = m.blocks;
  t.remote_slot = m.state_slot;
  if (!t.computed) {
    ++stats_.addresses_before_kv;
  } else {
    if (now_ms - t.computed_ms >= kLateAddressesMs) ++stats_.late_addresses_accepted;
    post_write(t, now_ms, out);
  }
}

void PrefillSide::post_write(PrefillTransfer& t, TimeMs now_ms, Outputs* out) {
  TANDEM_ASSERT(t.computed && t.addresses_known && !t.rma_in_flight);
  int32_t n_moved = static_cast<int32_t>(t.blocks.size());
  TANDEM_ASSERT(t.first_remote_block >= 0 && t.first_remote_block <= n_moved,
                "decode asked for blocks past the prompt");
  Effect write;
  write.kind = EffectKind::kPostWrite;
  write.transfer = t.id;
  write.peer = t.peer;
  write.peer_epoch = t.peer_epoch;
  write.local_blocks.assign(t.blocks.begin() + t.first_remote_block, t.blocks.end());
  write.remote_blocks = t.remote_blocks;
  TANDEM_ASSERT(write.local_blocks.size() == write.remote_blocks.size(),
                "decode's block list does not match the moved range");
  write.local_slot = t.slot;
  write.remote_slot = t.remote_slot;
  if (write.local_blocks.empty()) ++stats_.zero_block_transfers;
  out->effects.push_back(std::move(write));
  t.rma_in_flight = true;
  set_state(t, PrefillState::kWriting, now_ms);
}

void PrefillSide::on_write_done(TransferId transfer, RmaResult result, TimeMs now_ms,
                                Outputs* out) {
  auto it = transfers_.find(transfer);
  TANDEM_ASSERT(it != transfers_.end() && it->second.rma_in_flight,
                "write completion for no write in flight");
  PrefillTransfer& t = it->second;
  t.rma_in_flight = false;
  if (t.ending) {
    try_finish_end(t, now_ms, out);
  } else if (result == RmaResult::kOk) {
    // Our blocks are no longer needed; WriteDone also says we are done with the
    // decode's memory, so it doubles as our release.
    free_held(t, out);
    Message done = make(MessageKind::kWriteDone, t.peer, t.peer_epoch, t.id);
    t.outbox.put(std::move(done), now_ms, config_.retransmit_interval_ms, out);
    t.release_sent = true;
    set_state(t, PrefillState::kAwaitingWriteDoneAck, now_ms);
  } else if (result == RmaResult::kPostFailed &&
             mutated(config_, Mutation::kSilentWritePostFailure)) {
    // Mutation 5: give up without telling the decode or the router.
    free_held(t, out);
    t.ending = true;
    t.end_reason = EndReason::kWritePostFailed;
    t.release_sent = true;
    t.outbox.clear();
    t.ended_ms = now_ms;
    set_state(t, PrefillState::kEnded, now_ms);
  } else {
    end_transfer(t, result == RmaResult::kPostFailed ? EndReason::kWritePostFailed
                                                      : EndReason::kRmaFailed,
                 now_ms, out);
  }
  schedule_next(t);
  finish(now_ms, out);
}

void PrefillSide::on_release(PrefillTransfer& t, const Message& m, TimeMs now_ms, Outputs* out) {
  send_ack(m, out);
  if (t.peer_released) return drop(DropReason::kDuplicate);
  t.peer_released = true;
  if (t.ending) return try_finish_end(t, now_ms, out);
  bool read_complete = t.mode == TransferMode::kRead && t.state == PrefillState::kExposed &&
                       m.reason == EndReason::kCompleted;
  end_transfer(t, read_complete ? EndReason::kCompleted : EndReason::kPeerReleased, now_ms, out);
}

void PrefillSide::on_ack(TransferId transfer, MessageKind acked, TimeMs now_ms, Outputs* out) {
  auto it = transfers_.find(transfer);
  if (it == transfers_.end()) return;
  PrefillTransfer& t = it->second;
  if (acked == MessageKind::kWriteDone && t.state == PrefillState::kAwaitingWriteDoneAck) {
    t.peer_released = true;  // the decode took the KV; nothing of ours is exposed
    end_transfer(t, EndReason::kCompleted, now_ms, out);
  }
}

void PrefillSide::end_transfer(PrefillTransfer& t, EndReason reason, TimeMs now_ms,
                               Outputs* out) {
  if (t.ending) return;
  t.ending = true;
  t.end_reason = reason;
  ++stats_.ends[static_cast<int>(reason)];
  if (t.state == PrefillState::kPrefilling && !t.computed) {
    Effect cancel;
    cancel.kind = EffectKind::kCancel;
    cancel.transfer = t.id;
    out->effects.push_back(std::move(cancel));
  }
  // The prefill reports only its own failures (the decode reports the rest),
  // and nothing once the KV has left (WriteDone sent): the decode has it.
  if (reason != EndReason::kCompleted && reason != EndReason::kPeerReleased &&
      t.state != PrefillState::kAwaitingWriteDoneAck)
    report_outcome(t, now_ms, out);
  try_finish_end(t, now_ms, out);
}

void PrefillSide::try_finish_end(PrefillTransfer& t, TimeMs now_ms, Outputs* out) {
  if (t.state == PrefillState::kEnded) return;
  if (must_hold(t, now_ms, out)) {
    if (t.state != PrefillState::kDraining) {
      ++stats_.quarantines;
      set_state(t, PrefillState::kDraining, now_ms);
    }
    schedule_next(t);
    return;
  }
  // An unacknowledged WriteDone stays: it is the decode's release (it may be
  // quarantined waiting for it). In WRITE the decode exposed its blocks to
  // us; WriteDone, when sent, was our Release.
  release_held(t, MessageKind::kKvAddresses, t.mode == TransferMode::kWrite, now_ms, out);
  set_state(t, PrefillState::kEnded, now_ms);
  schedule_next(t);
}

TimeMs PrefillSide::side_timer(const PrefillTransfer& t) const {
  return t.ending ? kNever : std::min(t.deadline_ms, t.defer_expiry_ms);
}

void PrefillSide::service_side(PrefillTransfer& t, bool peer_silent, TimeMs now_ms, Outputs* out) {
  if (peer_silent && t.state == PrefillState::kDraining && !t.rma_in_flight) {
    // Waiting on a decode that answers nothing for max_retransmits: treat it
    // as dead (fenced before anything is freed).
    t.peer_dead = true;
    try_finish_end(t, now_ms, out);
  }
  if (t.state == PrefillState::kAwaitingAddresses && now_ms >= t.defer_expiry_ms)
    end_transfer(t, EndReason::kDeferExpired, now_ms, out);
}

}  // namespace tandem::pd
