// The router's side of the transfer protocol (sans-IO): mints transfer ids,
// keeps the registry of instances (from their heartbeats), admits requests by
// the instances' block credits, picks a prefill and a decode instance, and
// turns every request into exactly one terminal state.
#pragma once

#include <array>
#include <deque>
#include <map>

#include "pd/node_core.h"

namespace tandem::pd {

struct RequestSpec {
  int32_t prompt_tokens = 1;
  int32_t n_siblings = 1;
  int32_t max_tokens = 16;
  TransferMode mode = TransferMode::kWrite;
};

struct RouterRequest {
  TransferId id = 0;
  RequestSpec spec;
  RouterState state = RouterState::kQueued;
  NodeId prefill = 0;
  Epoch prefill_epoch = 0;
  NodeId decode = 0;
  Epoch decode_epoch = 0;
  int32_t prefill_credits = 0;  // blocks reserved on each instance while dispatched
  int32_t decode_credits = 0;
  TimeMs arrived_ms = 0;
  TimeMs deadline_ms = kNever;
  TimeMs ended_ms = kNever;
  EndReason reason = EndReason::kCompleted;
  Outbox outbox;
};

class RouterCore : public NodeCore {
 public:
  RouterCore(NodeId id, Epoch epoch, const ProtocolConfig& config);

  // A client request arrives; returns its transfer id.
  TransferId submit(const RequestSpec& spec, TimeMs now_ms, Outputs* out);
  // The client went away.
  void cancel(TransferId transfer, TimeMs now_ms, Outputs* out);

  const RouterRequest* find(TransferId transfer) const;
  const std::map<TransferId, RouterRequest>& requests() const { return requests_; }
  std::array<int64_t, kRouterStateCount> count_by_state() const;
  int64_t reserved_blocks(NodeId node) const;

 protected:
  void handle(const Message& message, TimeMs now_ms, Outputs* out) override;
  void on_ack(TransferId transfer, MessageKind acked, TimeMs now_ms, Outputs* out) override;
  Outbox* outbox_of(TransferId transfer) override;
  void service(TransferId transfer, TimeMs now_ms, Outputs* out) override;
  void on_peer_death(const PeerDeath& death, TimeMs now_ms, Outputs* out) override;
  void on_heartbeat(TimeMs now_ms, Outputs* out) override { dispatch(now_ms, out); }

 private:
  // Dispatches queued requests in arrival order while credits allow.
  void dispatch(TimeMs now_ms, Outputs* out);
  // Picks the live instance of `role` with the most free credits (capacity,
  // less this router's reservations and the blocks the instance reported
  // quarantined) that fits `blocks`; 0 when none fits now. Sets *never_fits when no live instance of
  // that role could ever hold it.
  NodeId pick(Role role, int32_t blocks, bool* never_fits) const;
  void complete(RouterRequest& r, TimeMs now_ms, Outputs* out);
  void fail(RouterRequest& r, EndReason reason, NodeId reporter, TimeMs now_ms, Outputs* out);
  void end_request(RouterRequest& r, RouterState state, EndReason reason, TimeMs now_ms,
                   Outputs* out);
  void schedule_next(RouterRequest& r);

  TransferId next_transfer_;  // carries the router's epoch: ids never repeat across restarts
  std::map<TransferId, RouterRequest> requests_;
  std::deque<TransferId> queue_;
  std::map<NodeId, int64_t> reserved_;
};

}  // namespace tandem::pd
