// The table of per-ISA kernel entry points. Internal to src/kernels: callers
// use matmul.h, attention.h and ops.h, which dispatch through this table.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/attention.h"
#include "kernels/dtype.h"
#include "kernels/ops.h"
#include "kernels/isa.h"
#include "kernels/k_quants.h"
#include "kernels/matmul.h"
#include "util/fp16.h"

namespace tandem::kernels {

// One Q8_0 block as stored in GGUF: a half-precision scale and 32 int8 values.
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[32];
};
static_assert(sizeof(BlockQ8_0) == 34);


// y[t * ldy + r] = dot(x row t, weight row r) for r in [row_begin, row_end),
// t in [0, n_tokens). Each output element is reduced in one fixed order that
// does not depend on n_tokens, the row range or the tiling, which is what makes
// the forward pass batch-invariant. The order may depend on the weight layout
// (below), which is fixed per matrix at load.
//
// Weight layout: rows are stored in groups of w_group rows (1 = plain
// row-major). Each row is cut into chunks of w_chunk_bytes and a group stores
// chunk 0 of its rows, then chunk 1, ...:
//  - chunk groups (WeightMatrix::group, matmul.h): 8 rows by 64-byte chunks
//    (the block types: whole blocks), so a decode tile of 8 rows streams one
//    contiguous range; the arithmetic is that of plain rows;
//  - panels: 16 rows by single elements (f32, f16) or pairs (bf16), so the
//    16 rows' values at one k (pair) are one vector. The vector kernels then
//    multiply it by a broadcast activation (an outer-product tile, see
//    kernels_avx512.cpp) and reduce each output in one chain over k (bf16 on
//    AVX-512: over k pairs, as vdpbf16ps adds a pair).
struct GemmArgs {
  const uint8_t* w = nullptr;  // weight rows (w_row_bytes of data per row)
  size_t w_row_bytes = 0;
  int64_t k = 0;               // reduction length (weight row length)
  const float* x = nullptr;    // activations, ldx floats apart (f32/f16/bf16 weights)
  int64_t ldx = 0;
  const BlockQ8_0Act* xq = nullptr;  // activations quantized per row (the block types' weights)
  int64_t ldxq = 0;                  // blocks between two token rows of xq
  // bf16 weights multiply activations rounded to bf16 (in every variant, so
  // that they agree): x then holds the rounded values as f32, and xb the same
  // values as bf16 for the AVX-512 dot-product instructions.
  const uint16_t* xb = nullptr;
  int64_t ldxb = 0;
  int64_t n_tokens = 0;
  float* y = nullptr;
  int64_t ldy = 0;
  int64_t w_group = 1;          // rows per interleaved group
  int64_t w_chunk_bytes = 64;   // bytes of a row chunk in a group (any, for plain rows)
  // The sum of each block of xq (ldxq apart), for the 32-element types'
  // panel tiles; when null, those compute it themselves.
  const int32_t* xsum = nullptr;
};

// xsum (GemmArgs) of n_tokens rows of n_blocks blocks each, ld_blocks apart.
void sum_q8_blocks(const BlockQ8_0Act* xq, int64_t ld_blocks, int64_t n_tokens, int64_t n_blocks, int32_t* xsum);

constexpr int64_t kFloatChunkBytes = 64;
constexpr int64_t kQ8ChunkBytes = 34;
// The other block types' rows interleave by whole blocks too (k_quants.h,
// legacy_quants.h), as q8_0 rows do.
constexpr int64_t kQ2KChunkBytes = sizeof(BlockQ2_K);
constexpr int64_t kQ3KChunkBytes = sizeof(BlockQ3_K);
constexpr int64_t kIQ4XSChunkBytes = sizeof(BlockIQ4_XS);
constexpr int64_t kQ4KChunkBytes = sizeof(BlockQ4_K);
constexpr int64_t kQ5KChunkBytes = sizeof(BlockQ5_K);
constexpr int64_t kQ6KChunkBytes = sizeof(BlockQ6_K);

// Where chunk 0 of row r starts; chunk c is c * w_group * chunk_bytes further.
inline const uint8_t* gemm_row(const GemmArgs& a, int64_t r, int64_t chunk_bytes) {
  const int64_t g = a.w_group;
  return a.w + static_cast<size_t>(r / g * g) * a.w_row_bytes + static_cast<size_t>((r % g) * chunk_bytes);
}

// Byte offset, from gemm_row, of the element at byte `byte` of a float-type
// row in 64-byte chunks (a load must not cross a chunk boundary: vector loads
// start at multiples of their width, and 64 is a multiple of every width).
inline size_t float_offset(const GemmArgs& a, int64_t byte) {
  return static_cast<size_t>((byte / kFloatChunkBytes) * a.w_group * kFloatChunkBytes + byte % kFloatChunkBytes);
}

// Element i of a KV row of cache type T at p, as f32 (exact).
template <DType T>
inline float kv_element(const uint8_t* p, int64_t i) {
  if constexpr (T == DType::kF32) {
    float f;
    std::memcpy(&f, p + 4 * i, 4);
    return f;
  } else {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    return T == DType::kF16 ? f16_to_f32(h) : bf16_to_f32(h);
  }
}

// A vector of a KV row of cache type T at p, as f32 (exact), by an ISA's
// loaders of f32, f16 and bf16 elements (the vector variants' Vec::load_kv).
template <typename F32, typename F16, typename BF16, DType T>
inline auto load_kv_with(const uint8_t* p) {
  if constexpr (T == DType::kF16) {
    return F16::load(p);
  } else if constexpr (T == DType::kBF16) {
    return BF16::load(p);
  } else {
    static_assert(T == DType::kF32);
    return F32::load(p);
  }
}

// The address `ahead` bytes past p, for a prefetch: it may lie past the end
// of the weights (a prefetch never faults), so it is formed as an integer,
// not by pointer arithmetic beyond the array.
inline const char* prefetch_address(const void* p, int64_t ahead) {
  return reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(ahead));
}

// A prefetch into L2 of byte `offset` of a group's stream that starts at
// row; past the group's end (group_bytes), `skip` more bytes on (over the
// other groups a tile streams beside it, to the next tile's matching group).
// Into L2, not L1: an L1 prefetch holds one of the core's few L1 miss
// buffers until its line arrives, so a decode tile's prefetches and its own
// loads queued behind each other. On a 2-core Intel Xeon VM (AVX-512, AMX)
// batch-1 decode of the small models went, in alternating rounds (medians
// of 3-4): Q4_K_M +20 %, Q4_0 +26 %, Q8_0 +2 %, F16 +2 %; a cold Q4_K matmul
// on one thread 10.3 -> 14.5 GB/s against a probe of 16.7. (The q8_0
// chunk-group tile had gone to L2 before, on the AMD EPYC VM: kQ8PrefetchLines.)
// The AVX2 block panels fetch through here too (block_panel_tile.h): under
// TANDEM_ISA=avx2 on the same VM, Q4_K_M +9 %, Q4_0 +29 %. AVX2's float and
// chunk-group tiles keep their L1 prefetch: into L2, F16 0.945, Q8_0 1.018.
inline void prefetch_ahead(const uint8_t* row, int64_t offset, int64_t group_bytes, int64_t skip) {
  if (offset >= group_bytes) offset += skip;
  __builtin_prefetch(prefetch_address(row, offset), 0, 2);  // prefetcht1
}

// The byte at `byte` of row r, in any layout.
inline const uint8_t* weight_byte(const GemmArgs& a, int64_t r, int64_t byte) {
  const int64_t c = a.w_chunk_bytes;
  return gemm_row(a, r, c) + static_cast<size_t>((byte / c) * a.w_group * c + byte % c);
}

// Whether the weights are in panels of chunk_bytes per row (see above).
inline bool is_panel(const GemmArgs& a, int64_t chunk_bytes) {
  return a.w_group == kPanelRows && a.w_chunk_bytes == chunk_bytes;
}

using GemmFn = void (*)(const GemmArgs& args, int64_t row_begin, int64_t row_end);

// One attention work item (see attention_tile_vec in vector_algorithms.h):
// n_rows consecutive query rows of one sequence, the `group` query heads of
// KV head kv_head.
struct AttentionTileArgs {
  const float* q = nullptr;  // the tile's first query row
  int64_t ldq = 0;
  int32_t first_position = 0;
  int n_rows = 0;
  const int32_t* block_table = nullptr;
  const PagedKvLayer* kv = nullptr;
  int kv_head = 0;
  int group = 1;
  int head_dim = 0;
  float scale = 1.0f;
  float* out = nullptr;  // the tile's first output row
  int64_t ldo = 0;
};

using AttentionTileFn = void (*)(const AttentionTileArgs& args);
using SiluMulFn = void (*)(float* g, const float* u, int64_t n);
using LogSumExpFn = float (*)(const float* x, int64_t n);
// One token of the gated delta rule on one head's S x S state (delta_rule_step in ops.h).
using DeltaRuleFn = void (*)(float* state, int64_t s, const float* k, const float* q, const float* v, float decay,
                             float beta, float scale, float* out);
// f32 to a KV dtype (f32, f16, bf16), rounding to nearest even.
using NarrowFn = void (*)(DType t, const float* x, uint8_t* out, int64_t n);
// n activations (a multiple of 32) to q8_0 blocks, and each block's sum of
// quants when sums is not null. Every variant gives quantize_q8_reference's bytes.
// A block with a NaN or an infinity is all zero quants with d = NaN, so
// that every product with it is NaN and the model's output shows it (the
// conversions would otherwise turn such a value into a finite quant, and the
// model's logits into finite garbage).
using QuantizeQ8Fn = void (*)(const float* x, BlockQ8_0Act* out, int32_t* sums, int64_t n);
void quantize_q8_reference(const float* x, BlockQ8_0Act* out, int32_t* sums, int64_t n);
// That block (sum: its sum of quants, when not null).
inline void quantize_q8_nonfinite_block(BlockQ8_0Act& out, int32_t* sum) {
  out.d = std::numeric_limits<float>::quiet_NaN();
  std::memset(out.qs, 0, sizeof out.qs);
  if (sum != nullptr) *sum = 0;
}

struct IsaKernels {
  GemmFn gemm_f32;
  GemmFn gemm_f16;
  GemmFn gemm_bf16;
  GemmFn gemm_q8_0;
  GemmFn gemm_q4_k;
  GemmFn gemm_q6_k;
  GemmFn gemm_q4_0;
  GemmFn gemm_q4_1;
  GemmFn gemm_q5_0;
  GemmFn gemm_q5_1;
  GemmFn gemm_iq4_nl;
  GemmFn gemm_q5_k;
  GemmFn gemm_q2_k;
  GemmFn gemm_q3_k;
  GemmFn gemm_iq4_xs;
  AttentionTileFn attention_tile;
  SiluMulFn silu_mul;
  NarrowFn narrow;
  DeltaRuleFn delta_rule;
  QuantizeQ8Fn quantize_q8;
  LogSumExpFn log_sum_exp;
};

extern const IsaKernels kScalarKernels;
extern const IsaKernels kAvx2Kernels;
extern const IsaKernels kAvx512Kernels;

const IsaKernels& active_kernels();

// The GEMM entry point of a table for a weight type.
GemmFn gemm_for(const IsaKernels& kernels, DType type);

}  // namespace tandem::kernels
