// The wire format of the P/D protocol's messages (pd::Message) between
// instances and the router, and its validation at the boundary.
//
// Anything a peer sends is untrusted: decode_message() checks every field
// (enum ranges, counts, block ids against the sender's registered pool) and
// returns a reason for what it refuses; nothing here asserts on peer input.
// The caller counts the refusal (WireError) and drops the frame.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "pd/message.h"

namespace tandem::transport {

constexpr uint32_t kMessageMagic = 0x4d504454;  // "TDPM"
constexpr uint16_t kWireVersion = 2;

enum class WireError : uint8_t {
  kNone,
  kTruncated,         // shorter than its fields say
  kBadMagic,
  kBadVersion,
  kBadEnum,           // kind, role, mode, reason or acked out of range
  kBadCount,          // a negative or over-limit count, token number or budget
  kTooManyBlocks,     // more block ids than the sender's pool holds, or than the limit
  kBlockOutOfRange,   // a block id outside the sender's pool
  kDuplicateBlock,    // one block id twice in one address list
  kBadSlot,           // a state slot outside the sender's slot pool
  kTrailingBytes,
};
constexpr int kWireErrorCount = 11;
std::string_view name(WireError error);

// What a frame from one peer may contain. Set from that peer's hand-shake.
struct WireLimits {
  int32_t peer_n_blocks = 0;      // block ids in addresses lie in [0, peer_n_blocks)
  int32_t peer_n_slots = 0;       // state slots lie in [0, peer_n_slots) or are kNoSlot
  int32_t max_prompt_tokens = 1 << 24;
  int32_t max_siblings = 1024;
  int32_t max_tokens = 1 << 24;
};

std::vector<uint8_t> encode_message(const pd::Message& message);
WireError decode_message(std::span<const uint8_t> frame, const WireLimits& limits, pd::Message* out);

}  // namespace tandem::transport
