// Ids, states, reasons and timing of the P/D transfer protocol (docs/PD_PROTOCOL.md).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "util/block_budget.h"

namespace tandem::pd {

// Minted by the router, one per client request; the only id that crosses instances.
using TransferId = uint64_t;
// A node is the router or one instance; its epoch grows with every restart.
using NodeId = uint32_t;
using Epoch = uint32_t;
// Decode-local ids of parallel-sampling siblings; never sent to another node.
using SiblingId = uint64_t;
using BlockId = int32_t;
using TimeMs = int64_t;

constexpr TimeMs kNever = INT64_MAX;
constexpr int32_t kNoSlot = -1;

enum class TransferMode : uint8_t { kWrite, kRead };
enum class Role : uint8_t { kRouter, kPrefill, kDecode };

enum class PrefillState : uint8_t {
  kPrefilling,            // computing the prompt's KV (addresses may already be known)
  kAwaitingAddresses,     // WRITE: KV ready, the deferred write waits for the decode's blocks
  kWriting,               // WRITE: RMA write posted
  kAwaitingWriteDoneAck,  // WRITE: written, own blocks freed, WriteDone sent
  kExposed,               // READ: blocks exposed to the decode, waiting for its Release
  kDraining,              // ended, but a write is in flight or blocks are exposed to a live decode
  kEnded,                 // tombstone
};
constexpr int kPrefillStateCount = 7;

enum class DecodeState : uint8_t {
  kAdmitting,          // allocating blocks (may take long)
  kAwaitingWrite,      // WRITE: blocks exposed, RemoteBlocks sent, waiting for WriteDone
  kAwaitingAddresses,  // READ: blocks allocated, waiting for KvAddresses
  kReading,            // READ: RMA read posted
  kDecoding,           // KV complete, siblings running
  kQuarantined,        // ended, but blocks are exposed to a live prefill or a read is in flight
  kEnded,              // tombstone
};
constexpr int kDecodeStateCount = 7;

enum class RouterState : uint8_t { kQueued, kDispatched, kCompleted, kFailed };
constexpr int kRouterStateCount = 4;

// Why a transfer or request ended. kCompleted is the only success.
enum class EndReason : uint8_t {
  kCompleted,
  kClientAbort,
  kRouterAbort,       // the router told this instance to stop (the cause is known there)
  kPeerReleased,      // the peer ended its side first
  kPeerDead,          // lease expired, or the peer restarted in a newer epoch
  kDeadline,          // the request's deadline passed
  kPrefillFailed,     // the prefill engine could not compute the prompt
  kAllocationFailed,  // the decode engine could not allocate the request's blocks
  kWritePostFailed,   // the RMA write could not be posted
  kRmaFailed,         // an RMA write or read completed with an error
  kRetransmitLimit,   // a message was never acknowledged by a live peer
  kCapacity,          // the request can never fit the instances' pools
  kOverloaded,        // the router's queue is full
  kEngineFailed,      // the engine failed the request after it started (decode: mid-decode)
  kDraining,          // the instance is draining: it takes no new transfer
  kDeferExpired,      // mutation 1 only: the fixed deferred-write expiry
};
constexpr int kEndReasonCount = 16;

// Messages dropped without effect, by reason.
// kUnexpected: a kind (or a kind for the other transfer mode) this side never receives,
// or one that cannot come in the transfer's state (WriteDone before our addresses).
// kInvalid: well-formed on the wire but inconsistent with the transfer (an
// address list that does not cover the moved range). A peer's message never
// reaches an assert: what the protocol cannot use is dropped and counted.
enum class DropReason : uint8_t { kUnknown, kEnded, kDuplicate, kStaleEpoch, kWrongPeer, kUnexpected, kInvalid };
constexpr int kDropReasonCount = 7;

// "t<router epoch>.<n>": transfer ids carry the minting router's epoch.
std::string transfer_name(TransferId id);
constexpr int kTransferEpochShift = 40;

std::string_view name(TransferMode mode);
std::string_view name(Role role);
std::string_view name(PrefillState state);
std::string_view name(DecodeState state);
std::string_view name(RouterState state);
std::string_view name(EndReason reason);
std::string_view name(DropReason reason);

// Test-only switches that reintroduce the bug families of the field reports, so
// the simulator and the tests can show that their checks catch each one.
enum class Mutation : uint8_t {
  kNone,
  kFixedDeferExpiry,       // (1) the deferred write expires after 60 s and drops late addresses
  kOneToOneSiblingMap,     // (2) transfer -> sibling map is one-to-one under n > 1
  kReleaseWithLocalId,     // (3) the decode's Release carries its local sibling id
  kFreeQuarantineOnTimeout,// (4) quarantined blocks freed after a timeout while the peer lives
  kSilentWritePostFailure, // (5) a write that cannot be posted ends without any message
  kEndKeepsSiblings,       // (6) an ended transfer's siblings are not stopped (they decode on)
  kFreeWithoutFence,       // (7) a dead peer's exposed blocks are freed at once, unfenced
                           //     (revoking access assumed instant, as before fencing existed)
};
constexpr int kMutationCount = 8;
std::string_view name(Mutation mutation);
// Accepts the names printed by name(); returns false for an unknown name.
bool parse_mutation(std::string_view text, Mutation* out);

struct ProtocolConfig {
  int32_t block_size_tokens = 16;
  // Blocks a request's recurrent state adds to what moves (a hybrid model's
  // state slot, KvPool::state_slot_blocks; 0 for attention-only models).
  int32_t state_blocks = 0;
  TimeMs heartbeat_interval_ms = 500;
  TimeMs lease_ms = 3000;               // a peer silent this long is declared dead
  TimeMs retransmit_interval_ms = 1000;
  int32_t max_early_messages = 256;  // peers' messages kept until their Start comes (each for one interval)
  int32_t max_retransmits = 900;        // per message; then the transfer fails
  TimeMs tombstone_ttl_ms = 60'000;     // must exceed lease_ms
  TimeMs request_timeout_ms = 900'000;  // the router's per-request deadline
  int32_t max_queued_requests = 4096;   // router queue bound
  Mutation mutation = Mutation::kNone;
  TimeMs mutation_defer_expiry_ms = 60'000;        // mutation 1
  TimeMs mutation_quarantine_timeout_ms = 2'000;   // mutation 4
};

// Mutations are known bugs the simulator's and the protocol tests' mutation
// checks switch on. They are built only into test builds (Debug,
// RelWithDebInfo, sanitizers: TANDEM_PD_MUTATIONS); in a Release build every
// check below is the constant false, so no test switch sits in a hot decision.
#ifdef TANDEM_PD_MUTATIONS
constexpr bool kMutationsBuilt = true;
#else
constexpr bool kMutationsBuilt = false;
#endif
inline bool mutated(const ProtocolConfig& config, Mutation mutation) {
  return kMutationsBuilt && config.mutation == mutation;
}

// Block arithmetic shared by the router's credits and the instances' allocations.
inline int32_t blocks_for_tokens(int64_t tokens, int32_t block_size) {
  return static_cast<int32_t>(tandem::blocks_for_tokens(tokens, block_size));
}
// The prefill moves the KV of the first N-1 prompt tokens.
inline int32_t moved_blocks(int32_t prompt_tokens, int32_t block_size) {
  return blocks_for_tokens(prompt_tokens - 1, block_size);
}
// What a transfer moves: those KV blocks and, when there are any, the
// recurrent state after them (state_blocks more, appended to the block list).
inline int32_t transfer_blocks(int32_t prompt_tokens, const ProtocolConfig& config) {
  const int32_t kv = moved_blocks(prompt_tokens, config.block_size_tokens);
  return kv > 0 ? kv + config.state_blocks : 0;
}
// The decode holds the whole prompt plus every sibling's outputs, each
// sibling after the first with its copy of the prompt's last block.
inline int32_t decode_blocks(int32_t prompt_tokens, int32_t n_siblings, int32_t max_tokens,
                             int32_t block_size) {
  return static_cast<int32_t>(worst_case_request_blocks(prompt_tokens, n_siblings, max_tokens, block_size));
}

}  // namespace tandem::pd
