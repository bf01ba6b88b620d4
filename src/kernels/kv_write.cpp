#include "kernels/kv_write.h"

#include "kernels/isa_kernels.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace tandem::kernels {

void rope_write_kv(float* k, const float* v, int64_t ld, int64_t n_rows, int n_heads_kv, int head_dim,
                   const RopeParams& rope, const float* cos_t, const float* sin_t, const KvSlot* slots, DType dtype,
                   ThreadPool& pool) {
  TANDEM_ASSERT(dtype != DType::kQ8_0, "the KV cache is f32, f16 or bf16");
  const NarrowFn narrow = active_kernels().narrow;
  const int64_t width = static_cast<int64_t>(n_heads_kv) * head_dim;
  const int half = rope.n_rot / 2;
  // Rows per thread chunk: enough to amortise the dispatch, few enough to share a prompt.
  constexpr int64_t kRowGrain = 16;
  auto rows = [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* kr = k + t * ld;
      rope_apply(kr, ld, 1, n_heads_kv, head_dim, rope, cos_t + t * half, sin_t + t * half);
      narrow(dtype, kr, slots[t].k, width);
      narrow(dtype, v + t * ld, slots[t].v, width);
    }
  };
  // A decode step (up to kRowGrain rows) is one chunk, which parallel_for runs inline.
  pool.parallel_for(n_rows, kRowGrain, rows);
}

}  // namespace tandem::kernels
