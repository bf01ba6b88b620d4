// The protocol tests' cast: router node 1, prefill node 2, decode node 3, all
// in epoch 1, and the router's Start of a transfer for one side of the pair.
#pragma once

#include "pd/message.h"

namespace tandem::testing {

constexpr pd::NodeId kRouterNode = 1, kPrefillNode = 2, kDecodeNode = 3;

inline pd::Message start_message(pd::MessageKind kind, pd::TransferId transfer, pd::TransferMode mode,
                                 int32_t prompt_tokens, int32_t n_siblings, pd::TimeMs budget_ms) {
  const bool prefill = kind == pd::MessageKind::kStartPrefill;
  pd::Message m;
  m.kind = kind;
  m.from = kRouterNode;
  m.from_epoch = 1;
  m.to = prefill ? kPrefillNode : kDecodeNode;
  m.to_epoch = 1;
  m.transfer = transfer;
  m.mode = mode;
  m.peer = prefill ? kDecodeNode : kPrefillNode;
  m.peer_epoch = 1;
  m.prompt_tokens = prompt_tokens;
  m.n_siblings = n_siblings;
  m.max_tokens = 16;
  m.budget_ms = budget_ms;
  return m;
}

}  // namespace tandem::testing
