// The decode instance's side of the transfer protocol (sans-IO).
//
// It admits a request (allocating blocks, which may take long), receives the
// KV of the first N-1 prompt tokens (written by the prefill, or read from it),
// and forks the request's siblings, which all share the one transfer id.
#pragma once

#include <array>
#include <map>

#include "pd/transfer_side.h"

namespace tandem::pd {

struct DecodeTransfer : TransferBase {
  DecodeState state = DecodeState::kAdmitting;
  int32_t n_siblings = 1;
  int32_t max_tokens = 0;
  bool allocated = false;
  int32_t cached_blocks = 0;  // leading moved blocks already in this instance's prefix cache
  // The prefill's blocks and slot (READ).
  std::vector<BlockId> remote_blocks;
  int32_t remote_slot = kNoSlot;
  bool siblings_started = false;
  TimeMs quarantined_ms = kNever;  // mutation 4 only
};

class DecodeSide : public TransferSide<DecodeTransfer, DecodeState, kDecodeStateCount> {
 public:
  DecodeSide(NodeId id, Epoch epoch, int32_t capacity_blocks, const ProtocolConfig& config);

  // Engine reports. `blocks` are the request's blocks (prompt, then outputs);
  // the first `cached_blocks` of them already hold the prompt's KV (prefix cache).
  void on_blocks_allocated(TransferId transfer, std::vector<BlockId> blocks, int32_t slot,
                           int32_t cached_blocks, TimeMs now_ms, Outputs* out);
  void on_allocation_failed(TransferId transfer, TimeMs now_ms, Outputs* out);
  void on_read_done(TransferId transfer, RmaResult result, TimeMs now_ms, Outputs* out);
  void on_sibling_finished(SiblingId sibling, TimeMs now_ms, Outputs* out);
  // The engine failed the request after its siblings started (a forward
  // error, an out-of-memory): the transfer ends with kEngineFailed.
  void on_engine_failed(TransferId transfer, TimeMs now_ms, Outputs* out);
  // A local end (the client went away, shutdown): the one release path.
  void cancel(TransferId transfer, EndReason reason, TimeMs now_ms, Outputs* out);

  // Siblings are children of their transfer: transfer -> {siblings} and
  // sibling -> transfer must describe the same relation. Returns "" when they
  // do, else what is wrong.
  std::string check_sibling_maps() const;
  const std::map<TransferId, std::vector<SiblingId>>& siblings_by_transfer() const {
    return siblings_by_transfer_;
  }

 protected:
  void handle(const Message& message, TimeMs now_ms, Outputs* out) override;
  void on_ack(TransferId transfer, MessageKind acked, TimeMs now_ms, Outputs* out) override;
  void send_final_release(TransferBase& t, TimeMs now_ms, Outputs* out) override;
  void end_transfer(DecodeTransfer& t, EndReason reason, TimeMs now_ms, Outputs* out) override;
  void try_finish_end(DecodeTransfer& t, TimeMs now_ms, Outputs* out) override;
  void service_side(DecodeTransfer& t, bool peer_silent, TimeMs now_ms, Outputs* out) override;
  TimeMs side_timer(const DecodeTransfer& t) const override;
  // The KV is here: the prefill is no longer needed, the request goes on.
  bool outlives_peer(const DecodeTransfer& t) const override { return t.state == DecodeState::kDecoding; }

 private:
  void on_start(const Message& message, TimeMs now_ms, Outputs* out);
  void on_write_done(DecodeTransfer& t, const Message& message, TimeMs now_ms, Outputs* out);
  void on_kv_addresses(DecodeTransfer& t, const Message& message, TimeMs now_ms, Outputs* out);
  void on_release(DecodeTransfer& t, const Message& message, TimeMs now_ms, Outputs* out);
  void add_sibling(TransferId transfer, SiblingId sibling);
  void post_read(DecodeTransfer& t, TimeMs now_ms, Outputs* out);
  void kv_ready(DecodeTransfer& t, TimeMs now_ms, Outputs* out);
  void release_to_prefill(DecodeTransfer& t, TimeMs now_ms, Outputs* out);

  std::map<TransferId, std::vector<SiblingId>> siblings_by_transfer_;
  std::map<SiblingId, TransferId> transfer_by_sibling_;
  // Local ids live in their own range (transfer ids stay below 2^62) so that
  // one can never pass for a transfer id.
  SiblingId next_sibling_ = SiblingId{1} << 63;
};

}  // namespace tandem::pd
