// The fused RoPE -> KV write: K rows are rotated and stored into their KV
// slots in one pass per row (while the row is in cache), V rows are stored
// beside them, and neither is kept as f32 afterwards: attention reads the pool.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"
#include "kernels/ops.h"

namespace tandem {
class ThreadPool;
}

namespace tandem::kernels {

// Where one batch row's K and V go in the pool.
struct KvSlot {
  uint8_t* k = nullptr;
  uint8_t* v = nullptr;
};

// Rows of k (rotated in place) and v, ld floats apart, n_heads_kv heads of
// head_dim each; rows are split across threads.
void rope_write_kv(float* k, const float* v, int64_t ld, int64_t n_rows, int n_heads_kv, int head_dim,
                   const RopeParams& rope, const float* cos_t, const float* sin_t, const KvSlot* slots, DType dtype,
                   ThreadPool& pool);

}  // namespace tandem::kernels
