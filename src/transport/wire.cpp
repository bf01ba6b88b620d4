#include "transport/wire.h"

#include <algorithm>

#include "transport/bytes.h"

namespace tandem::transport {

std::string_view name(WireError error) {
  switch (error) {
    case WireError::kNone: return "none";
    case WireError::kTruncated: return "truncated";
    case WireError::kBadMagic: return "bad_magic";
    case WireError::kBadVersion: return "bad_version";
    case WireError::kBadEnum: return "bad_enum";
    case WireError::kBadCount: return "bad_count";
    case WireError::kTooManyBlocks: return "too_many_blocks";
    case WireError::kBlockOutOfRange: return "block_out_of_range";
    case WireError::kDuplicateBlock: return "duplicate_block";
    case WireError::kBadSlot: return "bad_slot";
    case WireError::kTrailingBytes: return "trailing_bytes";
  }
  return "?";
}

std::vector<uint8_t> encode_message(const pd::Message& m) {
  ByteWriter w;
  w.put(kMessageMagic);
  w.put(kWireVersion);
  w.put(m.kind);
  w.put(m.from);
  w.put(m.from_epoch);
  w.put(m.to);
  w.put(m.to_epoch);
  w.put(m.transfer);
  w.put(m.role);
  w.put(m.capacity_blocks);
  w.put(m.quarantined_blocks);
  w.put(static_cast<uint8_t>(m.draining ? 1 : 0));
  w.put(m.mode);
  w.put(m.peer);
  w.put(m.peer_epoch);
  w.put(m.prompt_tokens);
  w.put(m.n_siblings);
  w.put(m.max_tokens);
  w.put(m.budget_ms);
  w.put(m.first_block);
  w.put(m.state_slot);
  w.put(m.reason);
  w.put(m.acked);
  w.put(static_cast<uint32_t>(m.blocks.size()));
  for (pd::BlockId b : m.blocks) w.put(b);
  return std::move(w.bytes());
}

namespace {

template <typename E>
bool get_enum(ByteReader& r, int count, E* out) {
  uint8_t v = r.get<uint8_t>();
  *out = static_cast<E>(v);
  return v < count;
}

}  // namespace

WireError decode_message(std::span<const uint8_t> frame, const WireLimits& limits, pd::Message* out) {
  ByteReader r(frame);
  if (r.get<uint32_t>() != kMessageMagic) return r.ok() ? WireError::kBadMagic : WireError::kTruncated;
  if (r.get<uint16_t>() != kWireVersion) return r.ok() ? WireError::kBadVersion : WireError::kTruncated;
  pd::Message m;
  bool enums_ok = get_enum(r, pd::kMessageKindCount, &m.kind);
  m.from = r.get<uint32_t>();
  m.from_epoch = r.get<uint32_t>();
  m.to = r.get<uint32_t>();
  m.to_epoch = r.get<uint32_t>();
  m.transfer = r.get<uint64_t>();
  enums_ok &= get_enum(r, 3, &m.role);
  m.capacity_blocks = r.get<int32_t>();
  m.quarantined_blocks = r.get<int32_t>();
  const uint8_t draining = r.get<uint8_t>();
  enums_ok &= draining <= 1;
  m.draining = draining == 1;
  enums_ok &= get_enum(r, 2, &m.mode);
  m.peer = r.get<uint32_t>();
  m.peer_epoch = r.get<uint32_t>();
  m.prompt_tokens = r.get<int32_t>();
  m.n_siblings = r.get<int32_t>();
  m.max_tokens = r.get<int32_t>();
  m.budget_ms = r.get<int64_t>();
  m.first_block = r.get<int32_t>();
  m.state_slot = r.get<int32_t>();
  enums_ok &= get_enum(r, pd::kEndReasonCount, &m.reason);
  enums_ok &= get_enum(r, pd::kMessageKindCount, &m.acked);
  uint32_t n_blocks = r.get<uint32_t>();
  if (!r.ok()) return WireError::kTruncated;
  if (!enums_ok) return WireError::kBadEnum;
  if (m.capacity_blocks < 0 || m.quarantined_blocks < 0 || m.quarantined_blocks > m.capacity_blocks ||
      m.prompt_tokens < 0 || m.prompt_tokens > limits.max_prompt_tokens ||
      m.n_siblings < 1 || m.n_siblings > limits.max_siblings || m.max_tokens < 0 ||
      m.max_tokens > limits.max_tokens || m.budget_ms < 0 || m.first_block < 0)
    return WireError::kBadCount;
  // Each id takes 4 bytes: a count the frame cannot hold is a truncation, checked
  // before anything is allocated for it.
  if (n_blocks > r.remaining() / 4) return WireError::kTruncated;
  if (n_blocks > static_cast<uint32_t>(std::max(limits.peer_n_blocks, 0)) ||
      int64_t{m.first_block} + n_blocks > limits.max_prompt_tokens)
    return WireError::kTooManyBlocks;
  m.blocks.resize(n_blocks);
  for (pd::BlockId& b : m.blocks) {
    b = r.get<int32_t>();
    if (b < 0 || b >= limits.peer_n_blocks) return WireError::kBlockOutOfRange;
  }
  if (!r.at_end()) return WireError::kTrailingBytes;
  std::vector<pd::BlockId> sorted = m.blocks;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) return WireError::kDuplicateBlock;
  if (m.state_slot != pd::kNoSlot && (m.state_slot < 0 || m.state_slot >= limits.peer_n_slots))
    return WireError::kBadSlot;
  *out = std::move(m);
  return WireError::kNone;
}

}  // namespace tandem::transport
