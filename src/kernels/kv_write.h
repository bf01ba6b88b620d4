// The fused RoPE -> KV write: each K row is rotated, narrowed to the pool
// dtype and placed into its slot of the (transposed) K part while it is in
// cache; each V row's heads are narrowed into the V part. Neither is kept as
// f32 afterwards: attention reads the pool. Both work on a range of heads, so
// that the thread that has just computed those heads' K or V rows (a matmul
// epilogue) writes them. The layout inside a block is kv_layout.h's.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"
#include "kernels/kv_layout.h"
#include "kernels/ops.h"

namespace tandem::kernels {

// Where one batch row's K and V go: the layer's K and V parts of its block,
// and its slot in that block.
struct KvSlot {
  uint8_t* k = nullptr;
  uint8_t* v = nullptr;
  int slot = -1;  // must be set: the writes assert it lies in the block
};

// Heads [head_begin, head_end) of n_rows K rows, ld floats apart: rotated in
// place and stored into each row's K slot.
void rope_write_k(float* k, int64_t ld, int64_t n_rows, int head_begin, int head_end, const KvBlockShape& shape,
                  const RopeParams& rope, const float* cos_t, const float* sin_t, const KvSlot* slots, DType dtype);

// Heads [head_begin, head_end) of n_rows V rows, ld floats apart, stored into
// each row's V slot.
void write_v(const float* v, int64_t ld, int64_t n_rows, int head_begin, int head_end, const KvBlockShape& shape,
             const KvSlot* slots, DType dtype);

}  // namespace tandem::kernels
