// The prefill instance's side of the transfer protocol (sans-IO).
//
// It computes a prompt's KV (through its engine, as an effect), then either
// writes it into the decode's blocks once their addresses arrive (WRITE), or
// exposes its own blocks for the decode to read and holds them until the
// decode's Release (READ). See docs/PD_PROTOCOL.md.
#pragma once

#include <array>
#include <map>

#include "pd/transfer_side.h"

namespace tandem::pd {

struct PrefillTransfer : TransferBase {
  PrefillState state = PrefillState::kPrefilling;
  bool computed = false;
  TimeMs computed_ms = kNever;
  // The decode's blocks for our moved blocks first_remote_block.. (WRITE).
  int32_t first_remote_block = 0;
  std::vector<BlockId> remote_blocks;
  int32_t remote_slot = kNoSlot;
  TimeMs defer_expiry_ms = kNever;  // mutation 1 only
};

class PrefillSide : public TransferSide<PrefillTransfer, PrefillState, kPrefillStateCount> {
 public:
  PrefillSide(NodeId id, Epoch epoch, int32_t capacity_blocks, const ProtocolConfig& config);

  // Engine reports. `blocks` hold the KV of prompt_tokens-1 tokens; `slot` the
  // recurrent state after them (kNoSlot without recurrent layers).
  void on_prefill_computed(TransferId transfer, std::vector<BlockId> blocks, int32_t slot,
                           TimeMs now_ms, Outputs* out);
  void on_prefill_failed(TransferId transfer, TimeMs now_ms, Outputs* out);
  void on_write_done(TransferId transfer, RmaResult result, TimeMs now_ms, Outputs* out);
  // A local end (the instance gives up on the transfer: shutdown, a local
  // error): the one release path with `reason`. Unknown or ending: no-op.
  void cancel(TransferId transfer, EndReason reason, TimeMs now_ms, Outputs* out);

 protected:
  void handle(const Message& message, TimeMs now_ms, Outputs* out) override;
  void on_ack(TransferId transfer, MessageKind acked, TimeMs now_ms, Outputs* out) override;
  void end_transfer(PrefillTransfer& t, EndReason reason, TimeMs now_ms, Outputs* out) override;
  void try_finish_end(PrefillTransfer& t, TimeMs now_ms, Outputs* out) override;
  void service_side(PrefillTransfer& t, bool peer_silent, TimeMs now_ms, Outputs* out) override;
  TimeMs side_timer(const PrefillTransfer& t) const override;

 private:
  void on_start(const Message& message, TimeMs now_ms, Outputs* out);
  void on_remote_blocks(PrefillTransfer& t, const Message& message, TimeMs now_ms, Outputs* out);
  void on_release(PrefillTransfer& t, const Message& message, TimeMs now_ms, Outputs* out);
  void post_write(PrefillTransfer& t, TimeMs now_ms, Outputs* out);
};

}  // namespace tandem::pd
