#include "pd/router_core.h"

#include <algorithm>

#include "util/error.h"

namespace tandem::pd {

RouterCore::RouterCore(NodeId id, Epoch epoch, const ProtocolConfig& config)
    : NodeCore(id, epoch, Role::kRouter, 0, config),
      next_transfer_((static_cast<TransferId>(epoch) << kTransferEpochShift) + 1) {}

const RouterRequest* RouterCore::find(TransferId transfer) const {
  auto it = requests_.find(transfer);
  return it == requests_.end() ? nullptr : &it->second;
}

Outbox* RouterCore::outbox_of(TransferId transfer) {
  auto it = requests_.find(transfer);
  return it == requests_.end() ? nullptr : &it->second.outbox;
}

std::array<int64_t, kRouterStateCount> RouterCore::count_by_state() const {
  std::array<int64_t, kRouterStateCount> counts{};
  for (const auto& [id, r] : requests_) ++counts[static_cast<int>(r.state)];
  return counts;
}

int64_t RouterCore::reserved_blocks(NodeId node) const {
  auto it = reserved_.find(node);
  return it == reserved_.end() ? 0 : it->second;
}

TransferId RouterCore::submit(const RequestSpec& spec, TimeMs now_ms, Outputs* out) {
  TANDEM_ASSERT(spec.prompt_tokens >= 1 && spec.n_siblings >= 1 && spec.max_tokens >= 1);
  TransferId id = next_transfer_++;
  RouterRequest& r = requests_[id];
  r.id = id;
  r.spec = spec;
  r.arrived_ms = now_ms;
  r.deadline_ms = now_ms + config_.request_timeout_ms;
  if (static_cast<int32_t>(queue_.size()) >= config_.max_queued_requests) {
    end_request(r, RouterState::kFailed, EndReason::kOverloaded, now_ms, out);
  } else {
    queue_.push_back(id);
    dispatch(now_ms, out);
  }
  schedule_next(r);
  finish(now_ms, out);
  return id;
}

void RouterCore::cancel(TransferId transfer, TimeMs now_ms, Outputs* out) {
  auto it = requests_.find(transfer);
  if (it != requests_.end()) fail(it->second, EndReason::kClientAbort, 0, now_ms, out);
  finish(now_ms, out);
}

NodeId RouterCore::pick(Role role, int32_t blocks, bool* never_fits) const {
  NodeId best = 0;
  int64_t best_free = -1;
  bool any_could_fit = false, any_live = false;
  for (const auto& [node, peer] : leases_.peers()) {
    if (!peer.alive || !peer.heard || peer.role != role || peer.draining) continue;
    any_live = true;
    if (peer.capacity_blocks >= blocks) any_could_fit = true;
    // Blocks the instance still holds for ended transfers (quarantined) are
    // not covered by any reservation here, yet they are not free.
    int64_t free = peer.capacity_blocks - peer.quarantined_blocks - reserved_blocks(node);
    if (free >= blocks && free > best_free) {
      best = node;
      best_free = free;
    }
  }
  *never_fits = any_live && !any_could_fit;
  return best;
}

void RouterCore::dispatch(TimeMs now_ms, Outputs* out) {
  while (!queue_.empty()) {
    RouterRequest& r = requests_.at(queue_.front());
    if (r.state != RouterState::kQueued) {
      queue_.pop_front();
      continue;
    }
    int32_t p_blocks = std::max(1, moved_blocks(r.spec.prompt_tokens, config_.block_size_tokens));
    int32_t d_blocks = decode_blocks(r.spec.prompt_tokens, r.spec.n_siblings, r.spec.max_tokens,
                                     config_.block_size_tokens);
    bool p_never = false, d_never = false;
    NodeId prefill = pick(Role::kPrefill, p_blocks, &p_never);
    NodeId decode = pick(Role::kDecode, d_blocks, &d_never);
    if (p_never || d_never) {
      queue_.pop_front();
      end_request(r, RouterState::kFailed, EndReason::kCapacity, now_ms, out);
      continue;
    }
    if (prefill == 0 || decode == 0) return;  // head of line waits for credits
    queue_.pop_front();
    r.state = RouterState::kDispatched;
    r.prefill = prefill;
    r.prefill_epoch = leases_.peers().at(prefill).epoch;
    r.decode = decode;
    r.decode_epoch = leases_.peers().at(decode).epoch;
    r.prefill_credits = p_blocks;
    r.decode_credits = d_blocks;
    reserved_[prefill] += p_blocks;
    reserved_[decode] += d_blocks;
    TimeMs budget_ms = r.deadline_ms - now_ms;
    Message to_prefill = make(MessageKind::kStartPrefill, prefill, r.prefill_epoch, r.id);
    to_prefill.mode = r.spec.mode;
    to_prefill.peer = decode;
    to_prefill.peer_epoch = r.decode_epoch;
    to_prefill.prompt_tokens = r.spec.prompt_tokens;
    to_prefill.n_siblings = r.spec.n_siblings;
    to_prefill.max_tokens = r.spec.max_tokens;
    to_prefill.budget_ms = budget_ms;
    Message to_decode = to_prefill;
    to_decode.kind = MessageKind::kStartDecode;
    to_decode.to = decode;
    to_decode.to_epoch = r.decode_epoch;
    to_decode.peer = prefill;
    to_decode.peer_epoch = r.prefill_epoch;
    r.outbox.put(std::move(to_prefill), now_ms, config_.retransmit_interval_ms, out);
    r.outbox.put(std::move(to_decode), now_ms, config_.retransmit_interval_ms, out);
    schedule_next(r);
  }
}

void RouterCore::handle(const Message& m, TimeMs now_ms, Outputs* out) {
  if (m.kind != MessageKind::kOutcome) return drop(DropReason::kUnexpected);
  send_ack(m, out);  // the instance needs the ack whatever we make of it
  auto it = requests_.find(m.transfer);
  if (it == requests_.end()) return drop(DropReason::kUnknown);
  RouterRequest& r = it->second;
  bool from_prefill = m.from == r.prefill && m.from_epoch == r.prefill_epoch;
  bool from_decode = m.from == r.decode && m.from_epoch == r.decode_epoch;
  if (!from_prefill && !from_decode) return drop(DropReason::kWrongPeer);
  if (r.state != RouterState::kDispatched) return drop(DropReason::kEnded);
  // The prefill lost its lease on the decode: whether the decode lives is for
  // our own lease to judge (it may be decoding, with the KV, behind a partition).
  if (from_prefill && m.reason == EndReason::kPeerDead) return;
  if (m.reason == EndReason::kCompleted && from_decode) {
    complete(r, now_ms, out);
  } else {
    fail(r, m.reason, m.from, now_ms, out);
  }
}

void RouterCore::on_ack(TransferId, MessageKind, TimeMs, Outputs*) {}

void RouterCore::complete(RouterRequest& r, TimeMs now_ms, Outputs* out) {
  r.outbox.clear();
  end_request(r, RouterState::kCompleted, EndReason::kCompleted, now_ms, out);
}

void RouterCore::fail(RouterRequest& r, EndReason reason, NodeId reporter, TimeMs now_ms,
                      Outputs* out) {
  if (r.state == RouterState::kCompleted || r.state == RouterState::kFailed) return;
  bool dispatched = r.state == RouterState::kDispatched;
  r.outbox.drop_kind(MessageKind::kStartPrefill);
  r.outbox.drop_kind(MessageKind::kStartDecode);
  end_request(r, RouterState::kFailed, reason, now_ms, out);
  if (!dispatched) return;
  // Both instances must end the transfer; the one that reported already has.
  struct Side {
    NodeId node;
    Epoch epoch;
    NodeId peer;
    Epoch peer_epoch;
  };
  for (Side s : {Side{r.prefill, r.prefill_epoch, r.decode, r.decode_epoch},
                 Side{r.decode, r.decode_epoch, r.prefill, r.prefill_epoch}}) {
    if (s.node == reporter || leases_.is_superseded(s.node, s.epoch)) continue;
    Message abort = make(MessageKind::kAbort, s.node, s.epoch, r.id);
    abort.reason = reason;
    abort.peer = s.peer;  // an abort that overtakes the start still names the peer
    abort.peer_epoch = s.peer_epoch;
    r.outbox.put(std::move(abort), now_ms, config_.retransmit_interval_ms, out);
  }
  schedule_next(r);
}

void RouterCore::end_request(RouterRequest& r, RouterState state, EndReason reason,
                             TimeMs now_ms, Outputs* out) {
  TANDEM_ASSERT(r.state == RouterState::kQueued || r.state == RouterState::kDispatched,
                "a request ends once");
  if (r.state == RouterState::kDispatched) {
    reserved_[r.prefill] -= r.prefill_credits;
    reserved_[r.decode] -= r.decode_credits;
    TANDEM_ASSERT(reserved_[r.prefill] >= 0 && reserved_[r.decode] >= 0, "credits went negative");
  }
  r.state = state;
  r.reason = reason;
  r.ended_ms = now_ms;
  ++stats_.ends[static_cast<int>(reason)];
  out->request_ends.push_back({r.id, state, reason});
  dispatch(now_ms, out);  // freed credits may let the queue move
}

void RouterCore::schedule_next(RouterRequest& r) {
  TimeMs next = r.outbox.next_due_ms();
  if (r.state == RouterState::kQueued || r.state == RouterState::kDispatched) {
    next = std::min(next, r.deadline_ms);
  } else {
    if (r.outbox.empty()) next = std::min(next, r.ended_ms + config_.tombstone_ttl_ms);
  }
  schedule(r.id, next);
}

void RouterCore::service(TransferId transfer, TimeMs now_ms, Outputs* out) {
  auto it = requests_.find(transfer);
  if (it == requests_.end()) return;
  RouterRequest& r = it->second;
  bool live = r.state == RouterState::kQueued || r.state == RouterState::kDispatched;
  int exhausted = r.outbox.service(now_ms, config_.retransmit_interval_ms,
                                   config_.max_retransmits, out, &stats_.retransmits);
  stats_.retransmit_exhausted += exhausted;
  if (live && exhausted > 0) fail(r, EndReason::kRetransmitLimit, 0, now_ms, out);
  live = r.state == RouterState::kQueued || r.state == RouterState::kDispatched;
  if (live && now_ms >= r.deadline_ms) fail(r, EndReason::kDeadline, 0, now_ms, out);
  if (!live && r.outbox.empty() && now_ms >= r.ended_ms + config_.tombstone_ttl_ms) {
    requests_.erase(it);
    return;
  }
  schedule_next(r);
}

void RouterCore::on_peer_death(const PeerDeath& death, TimeMs now_ms, Outputs* out) {
  bool restarted = leases_.is_superseded(death.node, death.epoch);
  for (auto& [id, r] : requests_) {
    // A lease can expire on a live instance cut off for a while: our aborts
    // keep going to it, unless it restarted and forgot everything.
    if (restarted) r.outbox.drop_to(death.node, death.epoch);
    if (r.state != RouterState::kDispatched) continue;
    // Only the decode's death fails a request here: a dead prefill is the
    // decode's to notice (it fails the transfer if its KV had not arrived, and
    // goes on decoding if it had). Abort both sides: the "dead" one may only be
    // cut off, and must still hear it.
    if (r.decode == death.node && r.decode_epoch == death.epoch)
      fail(r, EndReason::kPeerDead, 0, now_ms, out);
  }
}

}  // namespace tandem::pd
