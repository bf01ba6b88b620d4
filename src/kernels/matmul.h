// Matrix products against weight matrices of any DType (dtype.h).
//
// y[t][r] = dot(x[t], W[r]) for every token row t and weight row r. Work is
// split across threads by weight rows only (never along the reduction), so a
// result does not depend on the thread count or on the other rows of x.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/isa.h"
#include "util/function_ref.h"
#include "util/idle_fetch.h"

namespace tandem {
class ThreadPool;
}

namespace tandem::kernels {

struct BlockQ8_0Act;

// A weight matrix: `rows` rows of `cols` elements, row_bytes of data each (a
// view). group == 1: plain row-major, as in a GGUF file. group > 1: rows
// interleaved in groups by chunks of chunk_bytes, the layout the GEMV and GEMM
// tiles stream best (see GemmArgs): the block types in groups of 8 rows by
// whole blocks (q8_0: 34 bytes), which keeps the arithmetic of plain rows;
// f32, f16 and bf16 in panels of 16 rows by single elements (bf16: pairs),
// and for the AVX-512 kernels the 32-element block types (q8_0, q4_0, q4_1,
// q5_0, q5_1, iq4_nl) and the K types in panels of 16 rows by 4-byte columns of each
// block (legacy_quants.h, k_quants.h), whose vector kernels reduce in a different (fixed)
// order than on plain rows.
struct WeightMatrix {
  DType type = DType::kF32;
  const uint8_t* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  size_t row_bytes = 0;
  int64_t group = 1;
  int64_t chunk_bytes = 64;  // when group > 1
};

// Rows of a panel (the f32/f16/bf16 interleaved layout), the largest group.
constexpr int64_t kPanelRows = 16;

// The interleaved layout of a weight type for the kernels of an ISA: rows
// per group, bytes per chunk (a block type's panel: a block).
struct InterleavedLayout {
  int64_t group;
  int64_t chunk_bytes;
};
InterleavedLayout interleaved_layout(DType t, Isa isa = active_isa());
// Whether type t has a panel layout among the block types (q8_0, the 32-element
// types, the K types: every block type).
bool has_block_panels(DType t);
// Whether a matrix of type t in groups of `group` rows is in panels.
bool is_panel_layout(DType t, int64_t group);

// Whether w can be interleaved: plain, whole groups of rows, rows of whole chunks.
bool can_interleave(const WeightMatrix& w, Isa isa = active_isa());
// Writes w interleaved into dst (rows * row_bytes bytes, the same size) and
// returns the matrix viewed there.
WeightMatrix interleave_rows(const WeightMatrix& w, uint8_t* dst, Isa isa = active_isa());
// The same bytes, written a slice of whole groups (at most about
// max_slice_bytes) at a time, calling done(src, bytes) on each slice of w's
// bytes once it has been copied: a loader drops a large matrix's file pages
// as it goes, so the file's copy and the interleaved one are not both
// resident whole.
WeightMatrix interleave_rows_in_slices(const WeightMatrix& w, uint8_t* dst, int64_t max_slice_bytes,
                                       FunctionRef<void(const uint8_t*, size_t)> done, Isa isa = active_isa());

// One product in a group that shares its input x.
struct MatmulOutput {
  const WeightMatrix* w;
  float* y;     // n_tokens rows of w->rows floats, ldy apart
  int64_t ldy;
};

// An RMSNorm of a one-token group's input row that every thread applies
// itself at the start of its share, into q8_0 blocks of its own, instead of
// the caller before the region while the other threads wait: the same blocks
// (rms_norm_q8_0 of the same row). For groups whose weights all take q8_0
// activations.
struct MatmulRowNorm {
  const float* x = nullptr;  // the row, the group's cols wide
  const float* weight = nullptr;
  float eps = 0;
};

// The input rows of a matmul group: f32 (x, ldx floats apart) and/or already
// quantized for the block types' weights (xq, ldxq blocks apart, e.g. by
// rms_norm_q8_0). A group whose weights are all block types needs only xq;
// otherwise x is required, and xq, when absent, is made from x. Or, for one
// token, `norm` alone: the row each thread normalizes and quantizes itself.
struct MatmulInput {
  const float* x = nullptr;
  int64_t ldx = 0;
  const BlockQ8_0Act* xq = nullptr;
  int64_t ldxq = 0;
  const int32_t* xsum = nullptr;  // block sums of xq (ldxq apart), or null: made here when needed
  const MatmulRowNorm* norm = nullptr;
};

// How a group's rows are cut across threads.
struct MatmulSplit {
  // Thread ranges start and end on multiples of this: 16 keeps panels whole; a per-head epilogue needs whole heads (then every
  // output's rows but the last must be a multiple of it).
  int64_t row_grain = kPanelRows;
  // Outputs of equal rows (gate and up): each thread computes the same row
  // range of every output, so an epilogue can combine them.
  bool same_rows = false;
};

// Work a thread does on outputs it has just computed, in the same parallel
// region: rows [row_begin, row_end) of output `index`, for every token, called
// once per output range in output order. Element-wise steps that follow a
// matmul (bias, RoPE, the K/V write, SwiGLU, the residual add) go here instead
// of into a parallel region and a barrier of their own.
using MatmulEpilogue = std::function<void(size_t index, int64_t row_begin, int64_t row_end)>;

// The group a batch-1 decode step multiplies after this one (its weights, in
// the order of its outputs, and its split). A thread that has finished its
// share of a group given one queues the start of its share of the next
// (next_share) to be fetched into its L2 while it waits in the pool, for the
// region's other threads or for the next region (util/idle_fetch.h): a share
// that starts cold takes about 1 us longer on the development VM, on every one
// of a step's ~120 matmuls, and the time a thread waits is otherwise lost
// (docs/BENCHMARKS.md, "Waiting threads fetch their next share").
struct NextMatmul {
  std::vector<const WeightMatrix*> weights;
  MatmulSplit split;
};

// How much of its next share a thread fetches while it waits, at most: about
// half a core's L2 on the development VM (512 KB measured as well as a whole
// share of several MB, and better than 96-192 KB, within the host's noise).
constexpr int64_t kIdleFetchMaxBytes = 512 * 1024;

// Thread t of `pool`'s share of `next`, as its tiles will read it: the
// bytes of its rows in each output the share covers, in output order, at the
// rows the pool's balanced split would give it now.
IdleFetch::Ranges next_share(const NextMatmul& next, const ThreadPool& pool, int t);

// What each thread of a one-token group's region fetches for what comes
// after the region, besides its own products.
struct MatmulWarmup {
  // Called first on every thread (its index), before its products: for data
  // it reads once the region has ended (a decode step's KV for the heads the
  // thread attends next), fetched while its weights stream.
  std::function<void(int thread)> early;
  // The group that follows (see NextMatmul).
  const NextMatmul* next = nullptr;
};

// Computes every output of the group in one parallel region (e.g. Q, K and V
// together), so small products share one dispatch. `warmup` is for one
// token only (ignored otherwise).
void matmul(std::span<const MatmulOutput> outputs, const MatmulInput& in, int64_t n_tokens, ThreadPool& pool,
            const MatmulSplit& split = {}, const MatmulEpilogue& epilogue = {}, const MatmulWarmup& warmup = {});

inline void matmul(std::span<const MatmulOutput> outputs, const float* x, int64_t ldx, int64_t n_tokens,
                   ThreadPool& pool) {
  matmul(outputs, MatmulInput{x, ldx, nullptr, 0}, n_tokens, pool);
}

// One product of a group whose outputs take their own input rows (the routed
// experts of a MoE layer: each expert multiplies the rows sent to it).
struct MatmulTask {
  MatmulOutput out;
  MatmulInput in;
  int64_t n_tokens = 0;
};

// Computes every task in one parallel region, as matmul does a group (an
// epilogue gets the task's index). With same_rows, all tasks must have equal
// rows and each thread takes the same row range of each: balanced however
// the tokens fall across tasks.
void matmul_tasks(std::span<const MatmulTask> tasks, ThreadPool& pool, const MatmulSplit& split = {},
                  const MatmulEpilogue& epilogue = {});

// Whether every matrix of the group takes q8_0 activations (takes_q8_activations),
// so that it can take MatmulInput::xq alone.
bool all_take_q8_activations(std::span<const MatmulOutput> outputs);

inline void matmul(const WeightMatrix& w, const float* x, int64_t ldx, int64_t n_tokens, float* y,
                   int64_t ldy, ThreadPool& pool) {
  MatmulOutput out{&w, y, ldy};
  matmul(std::span<const MatmulOutput>(&out, 1), x, ldx, n_tokens, pool);
}

}  // namespace tandem::kernels
