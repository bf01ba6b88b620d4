#include "model/tensor_parallel.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "util/error.h"

namespace tandem {

ColumnBounds split_bounds(int64_t rows, int64_t grain, int size) {
  ColumnBounds b(static_cast<size_t>(size) + 1, 0);
  const int64_t units = rows / grain;
  for (int r = 1; r < size; ++r) b[static_cast<size_t>(r)] = units * r / size * grain;
  b[static_cast<size_t>(size)] = rows;
  return b;
}

TensorShards tensor_shards(const ModelConfig& c, int rank, int size) {
  TANDEM_ASSERT(size >= 1 && rank >= 0 && rank < size);
  TensorShards s;
  s.rank = rank;
  s.size = size;
  if (c.n_head_kv % size != 0)
    throw Error("tensor parallelism: the model's " + std::to_string(c.n_head_kv) +
                " KV heads do not split evenly over " + std::to_string(size) + " ranks; use a size that divides them");
  // A slice of Q, K or V must be whole panels of the interleaved layout, or
  // its dot products would reduce in another order than the whole matrix's.
  if (size > 1 && c.head_dim % kernels::kPanelRows != 0)
    throw Error("tensor parallelism: head_dim " + std::to_string(c.head_dim) + " is not a multiple of " +
                std::to_string(kernels::kPanelRows) + " (the weight panel), so a split would change the results");
  const int64_t kv_per_rank = c.n_head_kv / size;
  const int64_t group = c.n_head / c.n_head_kv;
  s.kv_head_begin = static_cast<int>(kv_per_rank * rank);
  s.kv_head_end = static_cast<int>(kv_per_rank * (rank + 1));
  for (int r = 0; r <= size; ++r) s.q_cols.push_back(kv_per_rank * r * group * c.head_dim);
  s.embd_cols = split_bounds(c.n_embd, kernels::kPanelRows, size);
  s.ff_cols = split_bounds(c.n_ff, kernels::kPanelRows, size);
  s.vocab_cols = split_bounds(c.n_vocab, kernels::kPanelRows, size);
  s.ff_exp_cols = split_bounds(c.n_ff_exp, kernels::kPanelRows, size);
  s.ff_shexp_cols = split_bounds(c.n_ff_shexp > 0 ? c.n_ff_shexp : c.n_ff, kernels::kPanelRows, size);
  s.rank0_embd.assign(static_cast<size_t>(size) + 1, c.n_embd);
  s.rank0_embd[0] = 0;
  return s;
}

kernels::WeightMatrix slice_rows(const kernels::WeightMatrix& w, int64_t begin, int64_t end) {
  TANDEM_ASSERT(w.group == 1 && begin >= 0 && begin <= end && end <= w.rows, "a row slice of a plain matrix");
  kernels::WeightMatrix s = w;
  s.data = w.data + static_cast<size_t>(begin) * w.row_bytes;
  s.rows = end - begin;
  return s;
}

void pack_columns(const float* buf, int64_t n, int64_t ld, int64_t b0, int64_t b1, float* out) {
  const int64_t w = b1 - b0;
  if (w == 0) return;
  for (int64_t t = 0; t < n; ++t) std::memcpy(out + t * w, buf + t * ld + b0, static_cast<size_t>(w) * sizeof(float));
}

void unpack_columns(const float* in, int64_t n, int64_t ld, int64_t b0, int64_t b1, float* buf) {
  const int64_t w = b1 - b0;
  if (w == 0) return;
  for (int64_t t = 0; t < n; ++t) std::memcpy(buf + t * ld + b0, in + t * w, static_cast<size_t>(w) * sizeof(float));
}

}  // namespace tandem
