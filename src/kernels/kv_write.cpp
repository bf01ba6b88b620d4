#include "kernels/kv_write.h"

#include <cstring>
#include <vector>

#include "kernels/isa_kernels.h"
#include "util/error.h"

namespace tandem::kernels {

namespace {

// One row's narrowed K values (heads [head_begin, head_end), row-major) to
// their transposed places, one Bytes-wide element per store.
template <size_t Bytes>
void scatter_k(const uint8_t* src, int head_begin, int head_end, const KvBlockShape& s, const KvSlot& slot) {
  TANDEM_ASSERT(slot.slot >= 0 && slot.slot < s.block_size, "KV slot outside its block");
  const uint8_t* p = src;
  for (int h = head_begin; h < head_end; ++h)
    for (int d = 0; d < s.head_dim; ++d, p += Bytes)
      std::memcpy(slot.k + static_cast<size_t>(kv_k_index(s, h, d, slot.slot)) * Bytes, p, Bytes);
}

}  // namespace

void rope_write_k(float* k, int64_t ld, int64_t n_rows, int head_begin, int head_end, const KvBlockShape& shape,
                  const RopeParams& rope, const float* cos_t, const float* sin_t, const KvSlot* slots, DType dtype) {
  TANDEM_ASSERT(is_float_dtype(dtype), "the KV cache is f32, f16 or bf16");
  const NarrowFn narrow = active_kernels().narrow;
  const int64_t col = static_cast<int64_t>(head_begin) * shape.head_dim;
  const int64_t width = static_cast<int64_t>(head_end - head_begin) * shape.head_dim;
  const int half = rope.n_rot / 2;
  // A row narrowed in a row-major scratch first (the vector conversion), then
  // placed element by element into the transposed K.
  const size_t elt = dtype_row_bytes(dtype, 1);  // 4 or 2
  thread_local std::vector<uint8_t> row;
  row.resize(elt * static_cast<size_t>(width));
  for (int64_t t = 0; t < n_rows; ++t) {
    float* kr = k + t * ld + col;
    rope_apply(kr, ld, 1, head_end - head_begin, shape.head_dim, rope, cos_t + t * half, sin_t + t * half);
    narrow(dtype, kr, row.data(), width);
    if (elt == 4) scatter_k<4>(row.data(), head_begin, head_end, shape, slots[t]);
    else scatter_k<2>(row.data(), head_begin, head_end, shape, slots[t]);
  }
}

void write_v(const float* v, int64_t ld, int64_t n_rows, int head_begin, int head_end, const KvBlockShape& shape,
             const KvSlot* slots, DType dtype) {
  TANDEM_ASSERT(is_float_dtype(dtype), "the KV cache is f32, f16 or bf16");
  const NarrowFn narrow = active_kernels().narrow;
  const size_t elt = dtype_row_bytes(dtype, 1);
  for (int64_t t = 0; t < n_rows; ++t) {
    TANDEM_ASSERT(slots[t].slot >= 0 && slots[t].slot < shape.block_size, "KV slot outside its block");
    for (int h = head_begin; h < head_end; ++h)
      narrow(dtype, v + t * ld + static_cast<int64_t>(h) * shape.head_dim,
             slots[t].v + elt * static_cast<size_t>(kv_v_index(shape, h, 0, slots[t].slot)), shape.head_dim);
  }
}

}  // namespace tandem::kernels
