// Block arithmetic shared by every place that must agree on how much KV a
// request can take: a single instance's admission, the decode's allocation in
// P/D, and the router's credits.
#pragma once

#include <cstdint>

namespace tandem {

inline int64_t blocks_for_tokens(int64_t tokens, int64_t block_size) {
  return (tokens + block_size - 1) / block_size;
}

// The most blocks a request with `n_sequences` sequences (best_of) can own at
// once. The prompt and the first sequence's output share blocks; every other
// sequence owns its output blocks plus its copy of the prompt's partly filled
// last block (copied on write when the sequences fork).
inline int64_t worst_case_request_blocks(int64_t prompt_tokens, int64_t n_sequences, int64_t max_tokens,
                                         int64_t block_size) {
  const int64_t copy = prompt_tokens % block_size != 0 ? 1 : 0;
  return blocks_for_tokens(prompt_tokens + max_tokens, block_size) +
         (n_sequences - 1) * (blocks_for_tokens(max_tokens, block_size) + copy);
}

}  // namespace tandem
