// Tensor parallelism: every matrix of a transformer layer split over the
// ranks so that no reduction is cut across ranks, which keeps the output
// bitwise the single-rank model's.
//
// Each rank holds the replicated residual stream and computes a block of
// every matrix's output rows (a "column split" of y = W x: each output
// element is one whole dot product, in the single-rank order), then an
// all-gather puts the blocks side by side on every rank:
//  - Q, K, V: whole KV heads (and the query heads of their group), so
//    attention is local to the rank, over its share of the KV pool;
//    gather 1: the attention output, by query heads;
//  - the output projection: a block of the model width; gather 2;
//  - gate and up: a block of the FFN width, SwiGLU local; gather 3;
//  - down: a block of the model width; gather 4; the residual adds are
//    replicated (the same adds in the same order on every rank);
//  - each routed expert (and the shared one) as a dense FFN: gate and up by a
//    block of its width, down by a block of the model width; one gather of
//    every routed row's activation and one of their outputs (two more for
//    the shared expert); the router and the weighted sum are replicated;
//  - the vocabulary projection: a block of the vocabulary, gathered to rank
//    0 only (which samples).
// A row split joined by an all-reduce would move less (one reduction per
// pair of matrices) but adds partial sums in the collective's order, which is
// not the single-rank order. A gated delta-net layer runs on rank 0 alone,
// which then broadcasts its output (a gather with every column on rank 0),
// since its recurrent state lives in one place in the pool (the state moves
// with the KV for P/D); splitting it by heads is later work.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/matmul.h"
#include "model/model_config.h"

namespace tandem {

// Column bounds: rank r holds [b[r], b[r + 1]).
using ColumnBounds = std::vector<int64_t>;

struct TensorShards {
  int rank = 0;
  int size = 1;
  int kv_head_begin = 0, kv_head_end = 0;  // this rank's KV heads
  ColumnBounds q_cols;      // over n_head * head_dim (attention output columns)
  ColumnBounds embd_cols;   // over n_embd
  ColumnBounds ff_cols;     // over n_ff
  ColumnBounds vocab_cols;  // over n_vocab
  ColumnBounds ff_exp_cols;    // over n_ff_exp (each routed expert's width)
  ColumnBounds ff_shexp_cols;  // over the shared expert's width
  ColumnBounds rank0_embd;  // every column of n_embd on rank 0 (the delta-net broadcast)
  bool active() const { return size > 1; }
  static int64_t begin(const ColumnBounds& b, int r) { return b[static_cast<size_t>(r)]; }
  static int64_t end(const ColumnBounds& b, int r) { return b[static_cast<size_t>(r) + 1]; }
};

// The shards of `c` for `rank` of `size`; throws tandem::Error naming the
// dimension when the model cannot be split that way (KV heads not divisible
// by the size, heads not whole panels of the interleaved layout).
TensorShards tensor_shards(const ModelConfig& c, int rank, int size);

// Bounds of `rows` rows over `size` ranks, each on a multiple of `grain` (the last ends at rows).
ColumnBounds split_bounds(int64_t rows, int64_t grain, int size);

// Rows [begin, end) of a plain (not yet interleaved) matrix, as a view.
kernels::WeightMatrix slice_rows(const kernels::WeightMatrix& w, int64_t begin, int64_t end);

// The all-gather the model calls between split matmuls: `buf` holds n rows
// of ld floats; rank r has filled columns bounds[r]..bounds[r + 1] of every
// row. On return every rank (root < 0) or only `root` has every column.
class TensorGather {
 public:
  virtual ~TensorGather() = default;
  virtual void all_gather(float* buf, int64_t n, int64_t ld, std::span<const int64_t> bounds, int root) = 0;
};

// Packs the n x (b1 - b0) block of columns [b0, b1) of `buf` (ld apart) into `out`, and back.
void pack_columns(const float* buf, int64_t n, int64_t ld, int64_t b0, int64_t b1, float* out);
void unpack_columns(const float* in, int64_t n, int64_t ld, int64_t b0, int64_t b1, float* buf);

}  // namespace tandem
