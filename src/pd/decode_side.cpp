#include "pd/decode_side.h"

#include <algorithm>

#include "util/error.h"

namespace tandem::pd {

DecodeSide::DecodeSide(NodeId id, Epoch epoch, int32_t capacity_blocks,
                       const ProtocolConfig& config)
    : TransferSide(id, epoch, Role::kDecode, capacity_blocks, config) {}

std::string DecodeSide::check_sibling_maps() const {
  size_t forward = 0;
  for (const auto& [transfer, siblings] : siblings_by_transfer_) {
    forward += siblings.size();
    for (SiblingId s : siblings) {
      auto it = transfer_by_sibling_.find(s);
      if (it == transfer_by_sibling_.end() || it->second != transfer)
        return "sibling " + std::to_string(s) + " listed under " + transfer_name(transfer) +
               " but mapped elsewhere";
    }
  }
  for (const auto& [sibling, transfer] : transfer_by_sibling_) {
    auto it = siblings_by_transfer_.find(transfer);
    if (it == siblings_by_transfer_.end() ||
        std::count(it->second.begin(), it->second.end(), sibling) != 1)
      return "sibling " + std::to_string(sibling) + " maps to " + transfer_name(transfer) +
             ", which does not list it exactly once";
  }
  if (forward != transfer_by_sibling_.size()) return "sibling maps differ in size";
  return "";
}

void DecodeSide::add_sibling(TransferId transfer, SiblingId sibling) {
  transfer_by_sibling_[sibling] = transfer;
  if (mutated(config_, Mutation::kOneToOneSiblingMap)) {
    siblings_by_transfer_[transfer] = {sibling};  // mutation 2: the last sibling wins
  } else {
    siblings_by_transfer_[transfer].push_back(sibling);
  }
}

void DecodeSide::handle(const Message& m, TimeMs now_ms, Outputs* out) {
  if (m.kind == MessageKind::kStartDecode) return on_start(m, now_ms, out);
  DecodeTransfer* t = accept<DecodeTransfer>(
      transfers_, m, now_ms, out,
      [&](DecodeTransfer& x) { end_transfer(x, EndReason::kRouterAbort, now_ms, out); },
      [&](DecodeTransfer& x) {
        set_state(x, DecodeState::kEnded, now_ms);
        schedule_next(x);
      });
  if (t == nullptr) return;
  switch (m.kind) {
    case MessageKind::kWriteDone:
      return on_write_done(*t, m, now_ms, out);
    case MessageKind::kKvAddresses:
      return on_kv_addresses(*t, m, now_ms, out);
    case MessageKind::kRelease:
      return on_release(*t, m, now_ms, out);
    default:
      return drop(DropReason::kUnexpected);
  }
}

void DecodeSide::on_start(const Message& m, TimeMs now_ms, Outputs* out) {
  send_ack(m, out);
  auto [it, inserted] = transfers_.try_emplace(m.transfer);
  DecodeTransfer& t = it->second;
  if (!inserted) {
    drop(t.state == DecodeState::kEnded ? DropReason::kEnded : DropReason::kDuplicate);
    if (t.router == 0) {
      // The transfer ended before its Start (the prefill's Release came
      // first): the router hears why from us, as for any other end.
      t.router = m.from;
      t.router_epoch = m.from_epoch;
      report_outcome(t, now_ms, out);
      schedule_next(t);
    }
    return;
  }
  TANDEM_ASSERT(m.prompt_tokens >= 1 && m.n_siblings >= 1);
  t.id = m.transfer;
  t.mode = m.mode;
  t.peer = m.peer;
  t.peer_epoch = m.peer_epoch;
  t.prompt_tokens = m.prompt_tokens;
  t.n_siblings = m.n_siblings;
  t.max_tokens = m.max_tokens;
  t.router = m.from;
  t.router_epoch = m.from_epoch;
  t.created_ms = now_ms;
  t.deadline_ms = now_ms + m.budget_ms;
  set_state(t, DecodeState::kAdmitting, now_ms);
  for (int32_t i = 0; i < m.n_siblings; ++i) add_sibling(t.id, next_sibling_++);
  if (draining_) {
    t.allocated = true;  // nothing to cancel: no allocation was asked for
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
  Effect allocate;
  allocate.kind = EffectKind::kAllocate;
  allocate.transfer = t.id;
  allocate.prompt_tokens = t.prompt_tokens;
  allocate.n_blocks =
      decode_blocks(t.prompt_tokens, t.n_siblings, t.max_tokens, config_.block_size_tokens);
  out->effects.push_back(std::move(allocate));
  schedule_next(t);
}

void DecodeSide::on_blocks_allocated(TransferId transfer, std::vector<BlockId> blocks,
                                     int32_t slot, int32_t cached_blocks, TimeMs now_ms,
                                     Outputs* out) {
  auto it = transfers_.find(transfer);
  if (it == transfers_.end() || it->second.ending) {
    free_blocks(transfer, std::move(blocks), slot, out);
    return finish(now_ms, out);
  }
  DecodeTransfer& t = it->second;
  int32_t n_moved = transfer_blocks(t.prompt_tokens, config_);
  TANDEM_ASSERT(!t.allocated, "allocation reported twice");
  TANDEM_ASSERT(static_cast<int32_t>(blocks.size()) >= n_moved && cached_blocks >= 0 &&
                    cached_blocks <= n_moved,
                "decode engine returned a bad allocation");
  t.blocks = std::move(blocks);
  t.slot = slot;
  t.cached_blocks = cached_blocks;
  t.allocated = true;
  if (t.mode == TransferMode::kWrite) {
    // Expose only what must move: blocks cached_blocks..n_moved and the slot.
    expose_and_send(t, MessageKind::kRemoteBlocks, cached_blocks,
                    {t.blocks.begin() + cached_blocks, t.blocks.begin() + n_moved}, now_ms, out);
    set_state(t, DecodeState::kAwaitingWrite, now_ms);
  } else if (t.addresses_known) {
    post_read(t, now_ms, out);
  } else {
    set_state(t, DecodeState::kAwaitingAddresses, now_ms);
  }
  schedule_next(t);
  finish(now_ms, out);
}

void DecodeSide::on_engine_failed(TransferId transfer, TimeMs now_ms, Outputs* out) {
  cancel(transfer, EndReason::kEngineFailed, now_ms, out);
}

void DecodeSide::cancel(TransferId transfer, EndReason reason, TimeMs now_ms, Outputs* out) {
  auto it = transfers_.find(transfer);
  if (it != transfers_.end() && !it->second.ending) end_transfer(it->second, reason, now_ms, out);
  finish(now_ms, out);
}

void DecodeSide::on_allocation_failed(TransferId transfer, TimeMs now_ms, Outputs* out) {
  auto it = transfers_.find(transfer);
  if (it != transfers_.end() && !it->second.ending)
    end_transfer(it->second, EndReason::kAllocationFailed, now_ms, out);
  finish(now_ms, out);
}

void DecodeSide::on_write_done(DecodeTransfer& t, const Message& m, TimeMs now_ms, Outputs* out) {
  send_ack(m, out);
  if (t.mode != TransferMode::kWrite) return drop(DropReason::kUnexpected);
  if (t.peer_released) return drop(DropReason::kDuplicate);
  // Our addresses went out only once allocated; a WriteDone before that is not
  // about our memory (a confused or hostile peer).
  if (!t.exposed && !t.ending) return drop(DropReason::kUnexpected);
  t.peer_released = true;
  t.outbox.drop_kind(MessageKind::kRemoteBlocks);
  if (t.ending) return try_finish_end(t, now_ms, out);
  end_exposure(t, out);
  kv_ready(t, now_ms, out);
}

void DecodeSide::on_kv_addresses(DecodeTransfer& t, const Message& m, TimeMs now_ms,
                                 Outputs* out) {
  if (t.mode != TransferMode::kRead) return drop(DropReason::kUnexpected);
  int32_t n_moved = transfer_blocks(t.prompt_tokens, config_);
  if (static_cast<int32_t>(m.blocks.size()) != n_moved || m.first_block != 0) return drop(DropReason::kInvalid);
  send_ack(m, out);
  if (t.addresses_known) return drop(DropReason::kDuplicate);
  // A READ decode is ending-but-not-ended only while its read is in flight,
  // and then it already has the addresses.
  TANDEM_ASSERT(!t.ending, "addresses for an ending transfer that never had them");
  t.addresses_known = true;
  t.remote_blocks = m.blocks;
  t.remote_slot = m.state_slot;
  if (t.allocated) {
    post_read(t, now_ms, out);
  } else {
    ++stats_.addresses_before_kv;
  }
}

void DecodeSide::post_read(DecodeTransfer& t, TimeMs now_ms, Outputs* out) {
  TANDEM_ASSERT(t.allocated && t.addresses_known && !t.rma_in_flight);
  int32_t n_moved = transfer_blocks(t.prompt_tokens, config_);
  Effect read;
  read.kind = EffectKind::kPostRead;
  read.transfer = t.id;
  read.peer = t.peer;
  read.peer_epoch = t.peer_epoch;
  read.local_blocks.assign(t.blocks.begin() + t.cached_blocks, t.blocks.begin() + n_moved);
  read.remote_blocks.assign(t.remote_blocks.begin() + t.cached_blocks, t.remote_blocks.end());
  read.local_slot = t.slot;
  read.remote_slot = t.remote_slot;
  if (read.local_blocks.empty()) ++stats_.zero_block_transfers;
  out->effects.push_back(std::move(read));
  t.rma_in_flight = true;
  set_state(t, DecodeState::kReading, now_ms);
}

void DecodeSide::on_read_done(TransferId transfer, RmaResult result, TimeMs now_ms,
                              Outputs* out) {
  auto it = transfers_.find(transfer);
  TANDEM_ASSERT(it != transfers_.end() && it->second.rma_in_flight,
                "read completion for no read in flight");
  DecodeTransfer& t = it->second;
  t.rma_in_flight = false;
  if (t.ending) {
    try_finish_end(t, now_ms, out);
  } else if (result == RmaResult::kOk) {
    release_to_prefill(t, now_ms, out);
    kv_ready(t, now_ms, out);
  } else {
    end_transfer(t, EndReason::kRmaFailed, now_ms, out);
  }
  schedule_next(t);
  finish(now_ms, out);
}

void DecodeSide::release_to_prefill(DecodeTransfer& t, TimeMs now_ms, Outputs* out) {
  if (mutated(config_, Mutation::kReleaseWithLocalId)) {
    // Mutation 3: the release names our local id, which the prefill never saw.
    Message release = make(MessageKind::kRelease, t.peer, t.peer_epoch, t.id);
    release.reason = t.ending ? t.end_reason : EndReason::kCompleted;
    auto sib = siblings_by_transfer_.find(t.id);
    if (sib != siblings_by_transfer_.end() && !sib->second.empty())
      release.transfer = sib->second.front();
    out->messages.push_back(std::move(release));
    t.release_sent = true;
    return;
  }
  EndReason saved = t.end_reason;
  if (!t.ending) t.end_reason = EndReason::kCompleted;
  send_release(t, now_ms, out);
  t.end_reason = saved;
}

void DecodeSide::kv_ready(DecodeTransfer& t, TimeMs now_ms, Outputs* out) {
  const std::vector<SiblingId>& siblings = siblings_by_transfer_[t.id];
  if (siblings.size() > 1) ++stats_.sibling_fanouts;
  Effect start;
  start.kind = EffectKind::kStartSiblings;
  start.transfer = t.id;
  start.prompt_tokens = t.prompt_tokens;
  start.local_blocks = t.blocks;
  start.local_slot = t.slot;
  start.siblings = siblings;
  out->effects.push_back(std::move(start));
  t.siblings_started = true;
  set_state(t, DecodeState::kDecoding, now_ms);
}

void DecodeSide::on_sibling_finished(SiblingId sibling, TimeMs now_ms, Outputs* out) {
  auto it = transfer_by_sibling_.find(sibling);
  if (it == transfer_by_sibling_.end()) return finish(now_ms, out);  // stopped already
  TransferId transfer = it->second;
  transfer_by_sibling_.erase(it);
  auto list = siblings_by_transfer_.find(transfer);
  if (list != siblings_by_transfer_.end()) {
    std::erase(list->second, sibling);
    if (list->second.empty()) {
      siblings_by_transfer_.erase(list);
      auto t = transfers_.find(transfer);
      TANDEM_ASSERT(t != transfers_.end(), "sibling of an unknown transfer");
      end_transfer(t->second, EndReason::kCompleted, now_ms, out);
    }
  }
  finish(now_ms, out);
}

void DecodeSide::on_release(DecodeTransfer& t, const Message& m, TimeMs now_ms, Outputs* out) {
  send_ack(m, out);
  if (t.peer_released) return drop(DropReason::kDuplicate);
  t.peer_released = true;
  t.outbox.drop_kind(MessageKind::kRemoteBlocks);
  if (t.ending) return try_finish_end(t, now_ms, out);
  if (t.state == DecodeState::kDecoding) {
    // The prefill is done with us (READ: after our read); nothing to end.
    return;
  }
  end_transfer(t, released_reason(m.reason), now_ms, out);
}

void DecodeSide::on_ack(TransferId, MessageKind, TimeMs, Outputs*) {}

void DecodeSide::end_transfer(DecodeTransfer& t, EndReason reason, TimeMs now_ms, Outputs* out) {
  if (t.ending) return;
  t.ending = true;
  t.end_reason = reason;
  ++stats_.ends[static_cast<int>(reason)];
  if (t.state == DecodeState::kAdmitting && !t.allocated) {
    Effect cancel;
    cancel.kind = EffectKind::kCancel;
    cancel.transfer = t.id;
    out->effects.push_back(std::move(cancel));
  }
  auto list = siblings_by_transfer_.find(t.id);
  if (list != siblings_by_transfer_.end()) {
    if (t.siblings_started && !mutated(config_, Mutation::kEndKeepsSiblings)) {
      Effect stop;
      stop.kind = EffectKind::kStopSiblings;
      stop.transfer = t.id;
      stop.siblings = list->second;
      out->effects.push_back(std::move(stop));
    }
    for (SiblingId s : list->second) transfer_by_sibling_.erase(s);
    siblings_by_transfer_.erase(list);
  }
  report_outcome(t, now_ms, out);
  try_finish_end(t, now_ms, out);
}

void DecodeSide::try_finish_end(DecodeTransfer& t, TimeMs now_ms, Outputs* out) {
  if (t.state == DecodeState::kEnded) return;
  if (must_hold(t, now_ms, out)) {
    if (t.state != DecodeState::kQuarantined) {
      ++stats_.quarantines;
      set_state(t, DecodeState::kQuarantined, now_ms);
      t.quarantined_ms = now_ms;
    }
    bool mutation_timeout = mutated(config_, Mutation::kFreeQuarantineOnTimeout) &&
                            !t.rma_in_flight &&
                            now_ms >= t.quarantined_ms + config_.mutation_quarantine_timeout_ms;
    if (!mutation_timeout) {
      schedule_next(t);
      return;
    }
    // Mutation 4: give the blocks back while the live prefill can still write them.
    t.exposed = false;
  }
  // In READ the prefill exposed its blocks to us.
  release_held(t, MessageKind::kRemoteBlocks, t.mode == TransferMode::kRead, now_ms, out);
  set_state(t, DecodeState::kEnded, now_ms);
  schedule_next(t);
}

void DecodeSide::send_final_release(TransferBase& base, TimeMs now_ms, Outputs* out) {
  auto& t = static_cast<DecodeTransfer&>(base);
  if (t.mode == TransferMode::kRead && mutated(config_, Mutation::kReleaseWithLocalId))
    return release_to_prefill(t, now_ms, out);
  send_release(t, now_ms, out);
}

TimeMs DecodeSide::side_timer(const DecodeTransfer& t) const {
  if (t.state == DecodeState::kQuarantined)
    return mutated(config_, Mutation::kFreeQuarantineOnTimeout) ? t.quarantined_ms + config_.mutation_quarantine_timeout_ms
                                                                : kNever;
  return t.ending ? kNever : t.deadline_ms;
}

void DecodeSide::service_side(DecodeTransfer& t, bool peer_silent, TimeMs now_ms, Outputs* out) {
  // Waiting on a peer that answers nothing for max_retransmits: treat it as
  // dead (fenced before anything is freed).
  if (peer_silent && t.state == DecodeState::kQuarantined) t.peer_dead = true;
  if (t.state == DecodeState::kQuarantined) try_finish_end(t, now_ms, out);
}

}  // namespace tandem::pd
