// The messages of the P/D transfer protocol and the outputs a core hands its driver.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pd/types.h"

namespace tandem::pd {

enum class MessageKind : uint8_t {
  kHeartbeat,
  kStartPrefill,
  kStartDecode,
  kAbort,
  kOutcome,
  kRemoteBlocks,
  kKvAddresses,
  kWriteDone,
  kRelease,
  kAck,
};
constexpr int kMessageKindCount = 10;
static_assert(kMessageKindCount <= 32, "Outbox keeps a bit per message kind");
std::string_view name(MessageKind kind);

// One flat struct for every kind: the fields a kind does not use stay at their
// defaults. Plain data, so a simulator can copy, delay and duplicate it freely.
struct Message {
  MessageKind kind = MessageKind::kHeartbeat;
  NodeId from = 0;
  Epoch from_epoch = 0;
  NodeId to = 0;
  Epoch to_epoch = 0;  // the receiver's epoch the sender addresses; 0 = any (heartbeats)
  TransferId transfer = 0;

  // Heartbeat: what the sender is, how many blocks its pool has, and how many
  // of them ended transfers still hold (quarantined: the router's credits
  // count them as taken until they are freed).
  Role role = Role::kRouter;
  int32_t capacity_blocks = 0;
  int32_t quarantined_blocks = 0;
  bool draining = false;  // the sender refuses new transfers (it is shutting down)

  // StartPrefill / StartDecode.
  TransferMode mode = TransferMode::kWrite;
  NodeId peer = 0;
  Epoch peer_epoch = 0;
  int32_t prompt_tokens = 0;
  int32_t n_siblings = 1;
  int32_t max_tokens = 0;
  TimeMs budget_ms = 0;  // time left until the request's deadline when sent

  // RemoteBlocks / KvAddresses: block addresses for moved blocks first_block.. and
  // the recurrent-state slot (kNoSlot when the model has none).
  int32_t first_block = 0;
  std::vector<BlockId> blocks;
  int32_t state_slot = kNoSlot;

  // Outcome / Release / Abort.
  EndReason reason = EndReason::kCompleted;

  // Ack: which kind is acknowledged.
  MessageKind acked = MessageKind::kHeartbeat;
};

// A one-line rendering for traces.
std::string describe(const Message& message);

enum class EffectKind : uint8_t {
  kComputePrefill,  // prefill engine: allocate and compute prompt_tokens-1 tokens' KV (+ state)
  kAllocate,        // decode engine: admit and allocate n_blocks (+ a state slot)
  kCancel,          // engine: drop a pending compute/allocation; nothing will be reported
  kExpose,          // these blocks/slot may now be reached by the peer's RMA (for this transfer)
  kEndExposure,     // the peer can no longer reach them: it released them, or it is fenced.
                    // Bookkeeping only: no per-transfer revoke exists (the pool is
                    // registered once); access ends per peer, by kFencePeer
  kFencePeer,       // cut off the peer incarnation (peer, peer_epoch) so that none of
                    // its RMA reaches our memory any more; report on_peer_fenced() once so
  kPostWrite,       // RMA write local blocks -> peer's blocks (prefill, WRITE)
  kPostRead,        // RMA read peer's blocks -> local blocks (decode, READ)
  kFree,            // return blocks/slot to the pool
  kStartSiblings,   // decode engine: compute token N, sample, decode each sibling
  kStopSiblings,    // decode engine: stop these siblings; no more reports for them
};
constexpr int kEffectKindCount = 11;
std::string_view name(EffectKind kind);

struct Effect {
  EffectKind kind = EffectKind::kFree;
  TransferId transfer = 0;
  NodeId peer = 0;
  Epoch peer_epoch = 0;
  int32_t prompt_tokens = 0;
  int32_t n_blocks = 0;
  std::vector<BlockId> local_blocks;
  std::vector<BlockId> remote_blocks;
  int32_t local_slot = kNoSlot;
  int32_t remote_slot = kNoSlot;
  std::vector<SiblingId> siblings;
};

std::string describe(const Effect& effect);

// A request reached its terminal state at the router (reported once per request).
struct RequestEnd {
  TransferId transfer = 0;
  RouterState state = RouterState::kFailed;
  EndReason reason = EndReason::kCompleted;
};

// What one call into a core produced. The driver sends the messages, performs
// the effects in order, and calls on_timer() at wake_at_ms.
struct Outputs {
  std::vector<Message> messages;
  std::vector<Effect> effects;
  std::vector<RequestEnd> request_ends;  // router only
  TimeMs wake_at_ms = kNever;
  void clear() {
    messages.clear();
    effects.clear();
    request_ends.clear();
    wake_at_ms = kNever;
  }
};

// The result of an RMA operation or engine request, reported back to a core.
enum class RmaResult : uint8_t { kOk, kPostFailed, kFailed };

}  // namespace tandem::pd
