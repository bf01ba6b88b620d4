// Printable names of the protocol's enums (traces, metrics, the debug endpoint).
#include <array>
#include <string>

#include "pd/message.h"

namespace tandem::pd {

namespace {
template <typename E, size_t N>
std::string_view lookup(const std::array<std::string_view, N>& names, E value) {
  size_t i = static_cast<size_t>(value);
  return i < N ? names[i] : std::string_view{"?"};
}
}  // namespace

std::string_view name(TransferMode v) { return lookup(std::array<std::string_view, 2>{"write", "read"}, v); }
std::string_view name(Role v) {
  return lookup(std::array<std::string_view, 3>{"router", "prefill", "decode"}, v);
}
std::string_view name(PrefillState v) {
  return lookup(std::array<std::string_view, kPrefillStateCount>{
                    "Prefilling", "AwaitingAddresses", "Writing", "AwaitingWriteDoneAck",
                    "Exposed", "Draining", "Ended"},
                v);
}
std::string_view name(DecodeState v) {
  return lookup(std::array<std::string_view, kDecodeStateCount>{
                    "Admitting", "AwaitingWrite", "AwaitingAddresses", "Reading", "Decoding",
                    "Quarantined", "Ended"},
                v);
}
std::string_view name(RouterState v) {
  return lookup(
      std::array<std::string_view, kRouterStateCount>{"Queued", "Dispatched", "Completed", "Failed"},
      v);
}
std::string_view name(EndReason v) {
  return lookup(std::array<std::string_view, kEndReasonCount>{
                    "completed", "client_abort", "router_abort", "peer_released", "peer_dead",
                    "deadline", "prefill_failed", "allocation_failed", "write_post_failed",
                    "rma_failed", "retransmit_limit", "capacity", "overloaded", "engine_failed",
                    "draining", "defer_expired"},
                v);
}
std::string_view name(DropReason v) {
  return lookup(std::array<std::string_view, kDropReasonCount>{"unknown", "ended", "duplicate",
                                                               "stale_epoch", "wrong_peer",
                                                               "unexpected", "invalid"},
                v);
}
std::string_view name(Mutation v) {
  return lookup(std::array<std::string_view, kMutationCount>{
                    "none", "fixed-defer-expiry", "one-to-one-sibling-map",
                    "release-with-local-id", "free-quarantine-on-timeout",
                    "silent-write-post-failure", "end-keeps-siblings",
                    "free-without-fence"},
                v);
}
bool parse_mutation(std::string_view text, Mutation* out) {
  for (int i = 0; i < kMutationCount; ++i) {
    if (name(static_cast<Mutation>(i)) == text) {
      *out = static_cast<Mutation>(i);
      return true;
    }
  }
  return false;
}
std::string_view name(MessageKind v) {
  return lookup(std::array<std::string_view, kMessageKindCount>{
                    "Heartbeat", "StartPrefill", "StartDecode", "Abort", "Outcome",
                    "RemoteBlocks", "KvAddresses", "WriteDone", "Release", "Ack"},
                v);
}
std::string_view name(EffectKind v) {
  return lookup(std::array<std::string_view, kEffectKindCount>{
                    "ComputePrefill", "Allocate", "Cancel", "Expose", "EndExposure", "FencePeer",
                    "PostWrite", "PostRead", "Free", "StartSiblings", "StopSiblings"},
                v);
}

namespace {
std::string join(const std::vector<BlockId>& blocks) {
  std::string s = "[";
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (i > 0) s += ',';
    if (i == 8) {
      s += "..+" + std::to_string(blocks.size() - 8);
      break;
    }
    s += std::to_string(blocks[i]);
  }
  return s + "]";
}
}  // namespace

std::string transfer_name(TransferId id) {
  return "t" + std::to_string(id >> kTransferEpochShift) + "." +
         std::to_string(id & ((TransferId{1} << kTransferEpochShift) - 1));
}

std::string describe(const Message& m) {
  std::string s = std::string(name(m.kind)) + " n" + std::to_string(m.from) + "e" +
                  std::to_string(m.from_epoch) + "->n" + std::to_string(m.to) + "e" +
                  std::to_string(m.to_epoch);
  if (m.kind != MessageKind::kHeartbeat) s += " " + transfer_name(m.transfer);
  switch (m.kind) {
    case MessageKind::kStartPrefill:
    case MessageKind::kStartDecode:
      s += " " + std::string(name(m.mode)) + " peer=n" + std::to_string(m.peer) + "e" +
           std::to_string(m.peer_epoch) + " prompt=" + std::to_string(m.prompt_tokens) +
           " n=" + std::to_string(m.n_siblings);
      break;
    case MessageKind::kRemoteBlocks:
    case MessageKind::kKvAddresses:
      s += " first=" + std::to_string(m.first_block) + " blocks=" + join(m.blocks) +
           " slot=" + std::to_string(m.state_slot);
      break;
    case MessageKind::kAbort:
    case MessageKind::kOutcome:
    case MessageKind::kRelease:
      s += " reason=" + std::string(name(m.reason));
      break;
    case MessageKind::kAck:
      s += " of=" + std::string(name(m.acked));
      break;
    default:
      break;
  }
  return s;
}

std::string describe(const Effect& e) {
  std::string s = std::string(name(e.kind)) + " " + transfer_name(e.transfer);
  if (!e.local_blocks.empty()) s += " local=" + join(e.local_blocks);
  if (!e.remote_blocks.empty()) s += " remote=" + join(e.remote_blocks);
  if (e.local_slot != kNoSlot) s += " slot=" + std::to_string(e.local_slot);
  if (e.kind == EffectKind::kAllocate || e.kind == EffectKind::kComputePrefill)
    s += " blocks=" + std::to_string(e.n_blocks);
  if (!e.siblings.empty()) s += " siblings=" + std::to_string(e.siblings.size());
  return s;
}

}  // namespace tandem::pd
