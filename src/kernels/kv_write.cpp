#include "kernels/kv_write.h"

#include "kernels/isa_kernels.h"
#include "util/error.h"

namespace tandem::kernels {

void rope_write_k(float* k, int64_t ld, int64_t n_rows, int head_begin, int head_end, int head_dim,
                  const RopeParams& rope, const float* cos_t, const float* sin_t, const KvSlot* slots, DType dtype) {
  TANDEM_ASSERT(dtype != DType::kQ8_0, "the KV cache is f32, f16 or bf16");
  const NarrowFn narrow = active_kernels().narrow;
  const int64_t col = static_cast<int64_t>(head_begin) * head_dim;
  const int64_t width = static_cast<int64_t>(head_end - head_begin) * head_dim;
  const size_t offset = dtype_row_bytes(dtype, col);
  const int half = rope.n_rot / 2;
  for (int64_t t = 0; t < n_rows; ++t) {
    float* kr = k + t * ld + col;
    rope_apply(kr, ld, 1, head_end - head_begin, head_dim, rope, cos_t + t * half, sin_t + t * half);
    narrow(dtype, kr, slots[t].k + offset, width);
  }
}

void write_v(const float* v, int64_t ld, int64_t n_rows, int head_begin, int head_end, int head_dim,
             const KvSlot* slots, DType dtype) {
  TANDEM_ASSERT(dtype != DType::kQ8_0, "the KV cache is f32, f16 or bf16");
  const NarrowFn narrow = active_kernels().narrow;
  const int64_t col = static_cast<int64_t>(head_begin) * head_dim;
  const int64_t width = static_cast<int64_t>(head_end - head_begin) * head_dim;
  const size_t offset = dtype_row_bytes(dtype, col);
  for (int64_t t = 0; t < n_rows; ++t) narrow(dtype, v + t * ld + col, slots[t].v + offset, width);
}

}  // namespace tandem::kernels
