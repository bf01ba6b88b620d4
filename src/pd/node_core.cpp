#include "pd/node_core.h"

#include <algorithm>

#include "util/error.h"

namespace tandem::pd {

void Outbox::put(Message message, TimeMs now_ms, TimeMs interval_ms, Outputs* out) {
  std::erase_if(pending_, [&](const PendingSend& p) {
    return p.message.kind == message.kind && p.message.to == message.to;
  });
  out->messages.push_back(message);
  TimeMs first = std::max<TimeMs>(1, interval_ms / 16);
  pending_.push_back({std::move(message), now_ms + first, first, 1});
}

bool Outbox::ack(NodeId from, MessageKind kind) {
  auto it = std::find_if(pending_.begin(), pending_.end(), [&](const PendingSend& p) {
    return p.message.kind == kind && p.message.to == from;
  });
  if (it == pending_.end()) return false;
  pending_.erase(it);
  acked_kinds_ |= uint32_t{1} << static_cast<int>(kind);
  return true;
}

void Outbox::drop_to(NodeId node, Epoch epoch) {
  std::erase_if(pending_, [&](const PendingSend& p) {
    return p.message.to == node && p.message.to_epoch == epoch;
  });
}

void Outbox::drop_kind(MessageKind kind) {
  std::erase_if(pending_, [&](const PendingSend& p) { return p.message.kind == kind; });
}

bool Outbox::has(MessageKind kind) const {
  return std::any_of(pending_.begin(), pending_.end(),
                     [&](const PendingSend& p) { return p.message.kind == kind; });
}

int Outbox::service(TimeMs now_ms, TimeMs interval_ms, int32_t max_sends, Outputs* out,
                    int64_t* retransmits, NodeId node, bool* to_node_exhausted) {
  int exhausted = 0;
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->next_send_ms > now_ms) {
      ++it;
      continue;
    }
    if (it->sends >= max_sends) {
      ++exhausted;
      if (to_node_exhausted != nullptr && it->message.to == node) *to_node_exhausted = true;
      it = pending_.erase(it);
      continue;
    }
    out->messages.push_back(it->message);
    ++it->sends;
    ++*retransmits;
    it->backoff_ms = std::min(interval_ms, it->backoff_ms * 2);
    it->next_send_ms = now_ms + it->backoff_ms;
    ++it;
  }
  return exhausted;
}

TimeMs Outbox::next_due_ms() const {
  TimeMs next = kNever;
  for (const PendingSend& p : pending_) next = std::min(next, p.next_send_ms);
  return next;
}

NodeCore::NodeCore(NodeId id, Epoch epoch, Role role, int32_t capacity_blocks,
                   const ProtocolConfig& config)
    : id_(id), epoch_(epoch), role_(role), capacity_blocks_(capacity_blocks), config_(config),
      leases_(config.lease_ms) {
  TANDEM_ASSERT(config.tombstone_ttl_ms > config.lease_ms,
                "tombstones must outlive a lease so late messages get an answer");
  TANDEM_ASSERT(epoch > 0, "epoch 0 means 'any' in heartbeats");
}

void NodeCore::start(TimeMs now_ms, Outputs* out) {
  next_heartbeat_ms_ = now_ms;
  on_timer(now_ms, out);
}

Message NodeCore::make(MessageKind kind, NodeId to, Epoch to_epoch, TransferId transfer) const {
  Message m;
  m.kind = kind;
  m.from = id_;
  m.from_epoch = epoch_;
  m.to = to;
  m.to_epoch = to_epoch;
  m.transfer = transfer;
  return m;
}

void NodeCore::free_blocks(TransferId transfer, std::vector<BlockId> blocks, int32_t slot,
                           Outputs* out) {
  if (blocks.empty() && slot == kNoSlot) return;
  Effect free;
  free.kind = EffectKind::kFree;
  free.transfer = transfer;
  free.local_blocks = std::move(blocks);
  free.local_slot = slot;
  out->effects.push_back(std::move(free));
}

void NodeCore::free_held(TransferBase& t, Outputs* out) {
  free_blocks(t.id, std::move(t.blocks), t.slot, out);
  t.blocks.clear();
  t.slot = kNoSlot;
}

void NodeCore::end_exposure(TransferBase& t, Outputs* out) {
  if (!t.exposed) return;
  Effect end;
  end.kind = EffectKind::kEndExposure;
  end.transfer = t.id;
  end.peer = t.peer;
  end.peer_epoch = t.peer_epoch;
  out->effects.push_back(std::move(end));
  t.exposed = false;
}

void NodeCore::request_fence(NodeId node, Epoch epoch, Outputs* out) {
  if (!fences_pending_.insert({node, epoch}).second) return;
  ++stats_.fences_requested;
  Effect fence;
  fence.kind = EffectKind::kFencePeer;
  fence.peer = node;
  fence.peer_epoch = epoch;
  out->effects.push_back(std::move(fence));
  leases_.fence(node, epoch, &deferred_deaths_);
}

void NodeCore::on_peer_fenced(NodeId node, Epoch epoch, TimeMs now_ms, Outputs* out) {
  fences_pending_.erase({node, epoch});
  ++stats_.fences_completed;
  std::vector<PeerDeath> deaths;
  // Declared dead when the fence was asked for, or now (a fence the driver
  // did on its own).
  leases_.fence(node, epoch, &deaths);
  leases_.fence_completed(node, epoch);
  declare_deaths(deaths, now_ms, out);
  on_peer_death({node, epoch, true}, now_ms, out);
  finish(now_ms, out);
}

void NodeCore::expose_and_send(TransferBase& t, MessageKind kind, int32_t first_block,
                               std::vector<BlockId> blocks, TimeMs now_ms, Outputs* out) {
  Message addresses = make(kind, t.peer, t.peer_epoch, t.id);
  addresses.first_block = first_block;
  addresses.blocks = blocks;
  addresses.state_slot = t.slot;
  Effect expose;
  expose.kind = EffectKind::kExpose;
  expose.transfer = t.id;
  expose.peer = t.peer;
  expose.peer_epoch = t.peer_epoch;
  expose.local_blocks = std::move(blocks);
  expose.local_slot = t.slot;
  out->effects.push_back(std::move(expose));
  t.exposed = true;
  t.outbox.put(std::move(addresses), now_ms, config_.retransmit_interval_ms, out);
}

void NodeCore::send_ack(const Message& received, Outputs* out) const {
  Message ack = make(MessageKind::kAck, received.from, received.from_epoch, received.transfer);
  ack.acked = received.kind;
  out->messages.push_back(std::move(ack));
}

void NodeCore::answer_ended(TransferBase& t, const Message& message, TimeMs now_ms,
                            Outputs* out) {
  drop(DropReason::kEnded);
  bool data = message.kind == MessageKind::kRemoteBlocks || message.kind == MessageKind::kKvAddresses;
  if (!data) send_ack(message, out);
  // Our Release counts once it was heard, or while it is still being resent;
  // one that exhausted its retransmits (a link that lost everything but
  // heartbeats) is owed again, or the peer holds its memory for ever.
  const bool released = t.release_sent && (t.outbox.has(MessageKind::kRelease) || t.outbox.was_acked(MessageKind::kRelease));
  if (!released && !t.peer_released) {
    send_release(t, now_ms, out);
    schedule(t.id, t.outbox.next_due_ms());
  } else if (data) {
    Message release = make(MessageKind::kRelease, t.peer, t.peer_epoch, t.id);
    release.reason = t.end_reason;
    out->messages.push_back(std::move(release));
  }
}

EndReason NodeCore::released_reason(EndReason peer_reason) {
  switch (peer_reason) {
    case EndReason::kCompleted:
    case EndReason::kRouterAbort:
    case EndReason::kClientAbort:
    case EndReason::kPeerReleased:
      return EndReason::kPeerReleased;
    default:
      return peer_reason;
  }
}

void NodeCore::start_tombstone(TransferBase& t, TransferId id, NodeId peer, Epoch peer_epoch,
                               EndReason reason, TimeMs now_ms, Outputs* out) {
  t.id = id;
  t.peer = peer;
  t.peer_epoch = peer_epoch;
  t.ending = true;
  t.end_reason = reason;
  t.ended_ms = now_ms;
  ++stats_.early_end_tombstones;
  if (forgot_us(t)) {
    t.peer_dead = true;
    return;
  }
  send_release(t, now_ms, out);
}

void NodeCore::send_release(TransferBase& t, TimeMs now_ms, Outputs* out) {
  Message release = make(MessageKind::kRelease, t.peer, t.peer_epoch, t.id);
  release.reason = t.end_reason;
  t.outbox.put(std::move(release), now_ms, config_.retransmit_interval_ms, out);
  t.release_sent = true;
}

bool NodeCore::must_hold(TransferBase& t, TimeMs now_ms, Outputs* out) {
  bool reachable = peer_can_reach(t) && !(t.peer_dead && mutated(config_, Mutation::kFreeWithoutFence));
  if (!t.rma_in_flight && !reachable) return false;
  // A dead peer never answers: only fencing it makes the memory private again.
  if (reachable && t.peer_dead) request_fence(t.peer, t.peer_epoch, out);
  // Tell the peer we ended (it may never have heard of the transfer); it
  // answers with its own Release once no RMA of its own is in flight.
  if (!t.release_sent && !forgot_us(t) && !t.rma_in_flight) send_release(t, now_ms, out);
  return true;
}

void NodeCore::release_held(TransferBase& t, MessageKind own_addresses, bool peer_exposed_to_us,
                            TimeMs now_ms, Outputs* out) {
  end_exposure(t, out);
  free_held(t, out);
  t.outbox.drop_kind(own_addresses);
  if (!t.release_sent && !forgot_us(t) && (!t.peer_released || peer_exposed_to_us))
    send_final_release(t, now_ms, out);
  if (forgot_us(t)) t.outbox.drop_to(t.peer, t.peer_epoch);
  t.ended_ms = now_ms;
}

void NodeCore::report_outcome(TransferBase& t, TimeMs now_ms, Outputs* out) {
  switch (t.end_reason) {
    case EndReason::kRouterAbort:
    case EndReason::kClientAbort:
      return;
    default:
      break;
  }
  if (t.router == 0) return;
  Message outcome = make(MessageKind::kOutcome, t.router, t.router_epoch, t.id);
  outcome.reason = t.end_reason;
  t.outbox.put(std::move(outcome), now_ms, config_.retransmit_interval_ms, out);
}

void NodeCore::schedule(TransferId transfer, TimeMs at_ms) {
  if (at_ms != kNever) timers_.push({at_ms, transfer});
}

void NodeCore::declare_deaths(std::vector<PeerDeath>& deaths, TimeMs now_ms, Outputs* out) {
  for (const PeerDeath& death : deaths) {
    ++stats_.peer_deaths;
    on_peer_death(death, now_ms, out);
  }
  deaths.clear();
}

void NodeCore::on_message(const Message& message, TimeMs now_ms, Outputs* out) {
  TANDEM_ASSERT(message.to == id_, "message delivered to the wrong node");
  ++stats_.received[static_cast<int>(message.kind)];
  std::vector<PeerDeath> deaths;
  if (message.kind == MessageKind::kHeartbeat) {
    if (!leases_.heard(message.from, message.from_epoch, message.role, message.capacity_blocks,
                       now_ms, &deaths, message.quarantined_blocks, message.draining))
      drop(DropReason::kStaleEpoch);
    declare_deaths(deaths, now_ms, out);
    on_heartbeat(now_ms, out);
  } else if (message.to_epoch != epoch_ || leases_.is_superseded(message.from, message.from_epoch)) {
    drop(DropReason::kStaleEpoch);
  } else if (message.kind == MessageKind::kAck) {
    Outbox* outbox = outbox_of(message.transfer);
    if (outbox == nullptr) {
      drop(DropReason::kUnknown);
    } else if (!outbox->ack(message.from, message.acked)) {
      drop(DropReason::kDuplicate);
    } else {
      on_ack(message.transfer, message.acked, now_ms, out);
      schedule(message.transfer, now_ms + 1);
    }
  } else {
    handle(message, now_ms, out);
    replay_early(message.transfer, now_ms, out);
  }
  finish(now_ms, out);
}

void NodeCore::expire_early(TimeMs now_ms) {
  // Older than one retransmit interval: the sender has resent it by now.
  while (!early_.empty() && early_.front().first + config_.retransmit_interval_ms <= now_ms) {
    early_.pop_front();
    drop(DropReason::kUnknown);  // its Start never came in time
  }
}

bool NodeCore::park_early(const Message& m, TimeMs now_ms) {
  expire_early(now_ms);
  if (static_cast<int32_t>(early_.size()) >= config_.max_early_messages) return false;
  early_.emplace_back(now_ms, m);
  return true;
}

void NodeCore::replay_early(TransferId transfer, TimeMs now_ms, Outputs* out) {
  if (early_.empty() || outbox_of(transfer) == nullptr) return;
  expire_early(now_ms);
  std::vector<Message> kept;
  for (auto it = early_.begin(); it != early_.end();) {
    if (it->second.transfer == transfer) {
      kept.push_back(std::move(it->second));
      it = early_.erase(it);
    } else {
      ++it;
    }
  }
  for (const Message& m : kept) {
    ++stats_.early_messages_replayed;
    handle(m, now_ms, out);
  }
}

void NodeCore::on_timer(TimeMs now_ms, Outputs* out) {
  if (now_ms >= next_heartbeat_ms_) {
    for (NodeId node : heartbeat_targets_) {
      Message hb = make(MessageKind::kHeartbeat, node, 0, 0);
      hb.role = role_;
      hb.capacity_blocks = capacity_blocks_;
      hb.quarantined_blocks = static_cast<int32_t>(std::min<int64_t>(quarantined_blocks(), capacity_blocks_));
      hb.draining = draining_;
      out->messages.push_back(std::move(hb));
    }
    next_heartbeat_ms_ = now_ms + config_.heartbeat_interval_ms;
  }
  std::vector<PeerDeath> deaths;
  leases_.expire(now_ms, &deaths);
  declare_deaths(deaths, now_ms, out);
  std::vector<TransferId> due;
  while (!timers_.empty() && timers_.top().first <= now_ms) {
    due.push_back(timers_.top().second);
    timers_.pop();
  }
  std::sort(due.begin(), due.end());
  due.erase(std::unique(due.begin(), due.end()), due.end());
  for (TransferId transfer : due) service(transfer, now_ms, out);
  finish(now_ms, out);
}

bool NodeCore::service_outbox(TransferBase& t, TimeMs now_ms, Outputs* out,
                              const std::function<void(EndReason)>& end) {
  bool peer_silent = false;
  int exhausted = t.outbox.service(now_ms, config_.retransmit_interval_ms, config_.max_retransmits,
                                   out, &stats_.retransmits, t.peer, &peer_silent);
  stats_.retransmit_exhausted += exhausted;
  bool was_ending = t.ending;
  if (exhausted > 0 && !t.ending) end(EndReason::kRetransmitLimit);
  if (!t.ending && now_ms >= t.deadline_ms) end(EndReason::kDeadline);
  if (peer_silent && was_ending) ++stats_.silent_peers;
  return peer_silent && was_ending;
}

void NodeCore::finish(TimeMs now_ms, Outputs* out) {
  while (!deferred_deaths_.empty()) {
    std::vector<PeerDeath> deaths = std::move(deferred_deaths_);
    deferred_deaths_.clear();
    declare_deaths(deaths, now_ms, out);
  }
  TimeMs wake = std::min(next_heartbeat_ms_, leases_.next_expiry_ms());
  if (!timers_.empty()) wake = std::min(wake, timers_.top().first);
  // Everything due now was serviced; never ask to be woken in the past.
  wake = std::max(wake, now_ms + 1);
  out->wake_at_ms = std::min(out->wake_at_ms, wake);
}

}  // namespace tandem::pd
