// Causal attention of query rows over a paged KV cache.
//
// Each (token, head) pair is computed on its own, reading keys and values of
// positions 0..position in order through the sequence's block table, so the
// result depends only on the query and the cached K/V, never on which other
// tokens share the batch or how the prompt was chunked.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/dtype.h"

namespace tandem {
class ThreadPool;
}

namespace tandem::kernels {

// Where one layer's K and V rows live in a block-major pool: block b starts at
// base + b * block_bytes; its K row for slot s at + k_offset + s * row_bytes.
struct PagedKvLayer {
  const uint8_t* base = nullptr;
  size_t block_bytes = 0;
  size_t k_offset = 0;
  size_t v_offset = 0;
  size_t row_bytes = 0;  // one token's K (or V) for all KV heads
  int block_size = 0;
  DType dtype = DType::kF16;
};

// A query row: its position and its sequence's block table (covering 0..position).
struct AttentionQuery {
  int32_t position = 0;
  const int32_t* block_table = nullptr;
  int32_t n_blocks = 0;
};

void paged_attention(const float* q, int64_t ldq, int64_t n_tokens, const AttentionQuery* queries,
                     const PagedKvLayer& kv, int n_head, int n_head_kv, int head_dim, float scale, float* out,
                     int64_t ldo, ThreadPool& pool);

}  // namespace tandem::kernels
