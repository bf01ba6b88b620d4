// Where a K or V element lives inside one layer's part of a KV pool block.
//
// A block holds block_size token slots. Per layer it stores K, then V, each
// head after head:
//  - a head's K is transposed, [head_dim][block_size]: attention scores W
//    slots per vector (each dimension's row times the query's element), so it
//    widens the piece as it is, with no transposition per block;
//  - a head's V is [block_size][head_dim], the rows the output update adds.
// Either way one head's K (or V) in a block is one contiguous piece of
// head_dim * block_size elements: an attention item (one KV head) reads two
// pieces per block, which the hardware prefetchers follow, instead of
// block_size short pieces a row of all heads apart.
#pragma once

#include <cstdint>

namespace tandem::kernels {

struct KvBlockShape {
  int head_dim = 0;
  int block_size = 0;
};

// Elements of one head's K (or V) piece in a block.
inline int64_t kv_head_elements(const KvBlockShape& s) { return int64_t{s.head_dim} * s.block_size; }

// Index, in elements from the layer's K part, of head h's dimension d at slot s.
inline int64_t kv_k_index(const KvBlockShape& s, int h, int d, int slot) {
  return h * kv_head_elements(s) + int64_t{d} * s.block_size + slot;
}

// Index, in elements from the layer's V part, of head h's dimension d at slot s.
inline int64_t kv_v_index(const KvBlockShape& s, int h, int d, int slot) {
  return h * kv_head_elements(s) + int64_t{slot} * s.head_dim + d;
}

}  // namespace tandem::kernels
