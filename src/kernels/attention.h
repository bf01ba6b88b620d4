// Causal attention of query rows over a paged KV cache.
//
// Work is split into tiles of up to kAttentionTileRows consecutive rows of one
// sequence times the query heads of one KV head; a tile reads each KV block it
// needs once (in decode, a tile is one token: every block is read once per
// step). Each query visits positions 0..position in one fixed order, so its
// result depends only on the query and the cached K/V, never on which other
// tokens share the batch, how the prompt was chunked, or the thread count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

#include "kernels/dtype.h"

namespace tandem {
class ThreadPool;
}

namespace tandem::kernels {

// Where one layer's K and V live in a block-major pool: block b starts at
// base + b * block_bytes, the layer's K part at + k_offset and its V part at
// + v_offset, each laid out per head as kv_layout.h says.
struct PagedKvLayer {
  const uint8_t* base = nullptr;
  size_t block_bytes = 0;
  size_t k_offset = 0;
  size_t v_offset = 0;
  int block_size = 0;
  DType dtype = DType::kF16;
};

// One sequence's query rows [first_row, first_row + n_rows), at consecutive
// positions from first_position, and its block table (n_blocks entries
// covering every position up to the last row's).
struct AttentionSequence {
  int32_t first_row = 0;
  int32_t n_rows = 0;
  int32_t first_position = 0;
  const int32_t* block_table = nullptr;
  int32_t n_blocks = 0;
};

constexpr int kAttentionTileRows = 16;

struct BlockQ8_0Act;

// Where attention also writes its output rows quantized to q8_0 blocks (the
// input of the output projection's block-type weights), by the thread that
// computed them instead of by the caller after the region: row r's blocks at
// xq + r * ldq, their sums at xsum + r * ldq. A KV head's query heads' output
// columns must be whole blocks (group * head_dim a multiple of 32).
struct AttentionQ8Out {
  BlockQ8_0Act* xq = nullptr;
  int32_t* xsum = nullptr;
  int64_t ldq = 0;
};

// Attention of every query head over the pool, or (tensor parallelism) only
// of KV heads [kv_head_begin, kv_head_end) and their query heads, whose
// columns of `out` alone are written (and quantized into q8_out when given). One sequence of one row (a batch-1
// decode step) has its KV heads cut across threads as decode_kv_heads says,
// so that each thread can fetch its heads' KV ahead (prefetch_decode_kv);
// otherwise tiles are handed out longest first.
void paged_attention(const float* q, int64_t ldq, std::span<const AttentionSequence> sequences,
                     const PagedKvLayer& kv, int n_head, int n_head_kv, int head_dim, float scale, float* out,
                     int64_t ldo, ThreadPool& pool, int kv_head_begin = 0, int kv_head_end = -1,
                     const AttentionQ8Out* q8_out = nullptr);

// The KV heads of [kv_head_begin, kv_head_end) that thread t of n_threads
// attends in a one-row, one-sequence paged_attention.
std::pair<int, int> decode_kv_heads(int kv_head_begin, int kv_head_end, int t, int n_threads);

// Fetches into L2 the K and V of KV heads [kv_head_begin, kv_head_end) that a
// one-row query of `seq` reads (its blocks up to the row's position), up to
// max_bytes: from another region, so that attention finds them in cache
// instead of waiting on memory a block at a time.
void prefetch_decode_kv(const AttentionSequence& seq, const PagedKvLayer& kv, int head_dim, int kv_head_begin,
                        int kv_head_end, size_t max_bytes);

}  // namespace tandem::kernels
