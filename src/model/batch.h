// The flat batch one forward call consumes: token rows from many sequences,
// prefill chunks and single decode tokens mixed.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace tandem {

// One sequence's slice of the batch: rows [first_row, first_row + n_tokens),
// at consecutive positions, with the block table that maps its positions
// 0..last to KV pool blocks (position p lives in block_table[p / block_size],
// slot p % block_size).
// A hybrid model's sequence also names its recurrent-state slot in the pool
// (KvPool::state_slot): a chunk starting at position 0 begins from a zero
// state, any other continues the slot's state (its last position's).
struct BatchSequence {
  int32_t first_row = 0;
  int32_t n_tokens = 0;
  std::vector<int32_t> block_table;
  int32_t state_slot = -1;  // -1: none (models without recurrent layers)
};

struct Batch {
  std::vector<int32_t> tokens;
  std::vector<int32_t> positions;
  std::vector<BatchSequence> sequences;
  // Rows whose logits the forward returns, in this order.
  std::vector<int32_t> logit_rows;
  // KV the engine copied in its pool before this step, as (from, to) pairs
  // flattened: whole blocks (copy on write) and recurrent-state slots (a
  // forked sibling's). The forward ignores them; a tensor-parallel worker
  // on another host, which keeps its own share of the pool, repeats them.
  std::vector<int32_t> block_copies;
  std::vector<int32_t> state_copies;

  // Appends `tokens` of one sequence at positions first_position, ...; asks
  // for the logits of its last row when want_logits. Returns that row.
  int32_t add_sequence(std::span<const int32_t> seq_tokens, int32_t first_position, std::vector<int32_t> block_table,
                       bool want_logits, int32_t state_slot = -1);
  int32_t n_rows() const { return static_cast<int32_t>(tokens.size()); }
};

inline int32_t Batch::add_sequence(std::span<const int32_t> seq_tokens, int32_t first_position,
                                   std::vector<int32_t> block_table, bool want_logits, int32_t state_slot) {
  BatchSequence s;
  s.state_slot = state_slot;
  s.first_row = n_rows();
  s.n_tokens = static_cast<int32_t>(seq_tokens.size());
  s.block_table = std::move(block_table);
  for (size_t i = 0; i < seq_tokens.size(); ++i) {
    tokens.push_back(seq_tokens[i]);
    positions.push_back(first_position + static_cast<int32_t>(i));
  }
  sequences.push_back(std::move(s));
  const int32_t last = n_rows() - 1;
  if (want_logits) logit_rows.push_back(last);
  return last;
}

}  // namespace tandem
