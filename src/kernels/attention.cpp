#include "kernels/attention.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/isa_kernels.h"
#include "kernels/ops.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace tandem::kernels {

void paged_attention(const float* q, int64_t ldq, int64_t n_tokens, const AttentionQuery* queries,
                     const PagedKvLayer& kv, int n_head, int n_head_kv, int head_dim, float scale, float* out,
                     int64_t ldo, ThreadPool& pool) {
  TANDEM_ASSERT(n_head_kv > 0 && n_head % n_head_kv == 0);
  TANDEM_ASSERT(kv.dtype != DType::kQ8_0, "the KV cache is f32, f16 or bf16");
  const IsaKernels& isa = active_kernels();
  const DotF32Fn dot = kv.dtype == DType::kF32 ? isa.dot_f32 : kv.dtype == DType::kF16 ? isa.dot_f16 : isa.dot_bf16;
  const AxpyFn axpy = kv.dtype == DType::kF32 ? isa.axpy_f32 : kv.dtype == DType::kF16 ? isa.axpy_f16 : isa.axpy_bf16;
  const size_t head_bytes = dtype_row_bytes(kv.dtype, head_dim);
  const int group = n_head / n_head_kv;

  pool.parallel_for(n_tokens * n_head, 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scores;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / n_head;
      const int h = static_cast<int>(item % n_head);
      const AttentionQuery& query = queries[t];
      const int64_t n_pos = static_cast<int64_t>(query.position) + 1;
      TANDEM_ASSERT(query.position >= 0 && n_pos <= static_cast<int64_t>(query.n_blocks) * kv.block_size,
                    "block table does not cover the query position");
      const float* qh = q + t * ldq + static_cast<int64_t>(h) * head_dim;
      const size_t head_offset = static_cast<size_t>(h / group) * head_bytes;
      if (scores.size() < static_cast<size_t>(n_pos)) scores.resize(static_cast<size_t>(n_pos));
      for (int64_t j = 0; j < n_pos; ++j) {
        const uint8_t* block = kv.base + static_cast<size_t>(query.block_table[j / kv.block_size]) * kv.block_bytes;
        const uint8_t* k = block + kv.k_offset + static_cast<size_t>(j % kv.block_size) * kv.row_bytes + head_offset;
        scores[static_cast<size_t>(j)] = dot(qh, k, head_dim) * scale;
      }
      softmax(scores.data(), n_pos);
      float* oh = out + t * ldo + static_cast<int64_t>(h) * head_dim;
      std::memset(oh, 0, sizeof(float) * static_cast<size_t>(head_dim));
      for (int64_t j = 0; j < n_pos; ++j) {
        const uint8_t* block = kv.base + static_cast<size_t>(query.block_table[j / kv.block_size]) * kv.block_bytes;
        const uint8_t* v = block + kv.v_offset + static_cast<size_t>(j % kv.block_size) * kv.row_bytes + head_offset;
        axpy(scores[static_cast<size_t>(j)], v, oh, head_dim);
      }
    }
  });
}

}  // namespace tandem::kernels
