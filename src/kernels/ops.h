// Element-wise and row-wise operations of the transformer block. Each works on
// one row at a time with a fixed summation order, so results do not depend on
// batch composition.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"

namespace tandem::kernels {

// Activations quantized for the Q8_0 dot product (float scale for accuracy).
struct BlockQ8_0Act {
  float d;
  int8_t qs[32];
};

// out = x / sqrt(mean(x^2) + eps) * weight, for n_rows rows of n elements.
void rms_norm(const float* x, int64_t ldx, const float* weight, float* out, int64_t ldo, int64_t n_rows,
              int64_t n, float eps);

// rms_norm followed by quantize_row_q8_0, fused: no f32 copy of the
// normalised rows is written (bitwise the same blocks as the two steps).
// Rows go to out, ldq blocks apart, and their block sums, when sums is not
// null, to sums (ldq apart); n a multiple of 32.
void rms_norm_q8_0(const float* x, int64_t ldx, const float* weight, BlockQ8_0Act* out, int64_t ldq, int64_t n_rows,
                   int64_t n, float eps, int32_t* sums = nullptr);

// Rotary position embedding, in place, on n_heads heads of head_dim per row.
struct RopeParams {
  int n_rot = 0;       // rotated dimensions per head (<= head_dim, even)
  bool neox = false;   // pairs (i, i + n_rot/2) instead of (2i, 2i+1)
  float freq_base = 10000.0f;
  const float* freq_factors = nullptr;  // n_rot/2 divisors of the frequencies, or null
};
// The angles depend only on the position, so they are computed once per
// forward pass (rope_angles: n_rows x n_rot/2 cosines and sines) and applied to
// every layer's queries and keys (rope_apply).
void rope_angles(const int32_t* positions, int64_t n_rows, const RopeParams& params, float* cos_out,
                 float* sin_out);
void rope_apply(float* x, int64_t ldx, int64_t n_rows, int n_heads, int head_dim, const RopeParams& params,
                const float* cos_t, const float* sin_t);

// One token of the gated delta rule (qwen3next) on one head's S x S state,
// rows j over value elements, each S key elements: for each row j,
// row *= decay; d = (v[j] - row . k) * beta; row += d k; out[j] = (row . q) * scale.
void delta_rule_step(float* state, int64_t s, const float* k, const float* q, const float* v, float decay, float beta,
                     float scale, float* out);

// g = silu(g) * u, element-wise.
void silu_mul(float* g, const float* u, int64_t n);

// y += x, element-wise.
void add_inplace(float* y, const float* x, int64_t n);

// In-place softmax of n values (max-subtracted, sequential sum).
void softmax(float* x, int64_t n);

// log(sum exp(x[i])) over n >= 1 values; NaN when any is infinite or NaN.
float log_sum_exp(const float* x, int64_t n);

// Index of the largest value (the first one on ties).
int64_t argmax(const float* x, int64_t n);

// Converts one row of n elements of type t to f32.
void dequantize_row(DType t, const uint8_t* row, float* out, int64_t n);
// Converts f32 to t (floats: round to nearest even; quantized types: their quantizers).
void convert_row(const float* x, DType t, uint8_t* out, int64_t n);
// Quantizes f32 to q8_0 weight blocks (n a multiple of 32), as llama.cpp's reference does.
void quantize_row_q8_0_weights(const float* x, uint8_t* out, int64_t n);
// Rounds n activations to bf16 (nearest even), storing them as bf16 and as f32.
void round_row_bf16(const float* x, uint16_t* out_bf16, float* out_f32, int64_t n);
// Quantizes activations for the q8_0 dot product (n a multiple of 32), with
// each block's sum of quants in sums when it is not null (the block panels'
// tiles take them). Vectorized per ISA, every ISA giving the same bytes; a
// block with a NaN or an infinity gets d = NaN (isa_kernels.h), so the
// products show it.
void quantize_row_q8_0(const float* x, BlockQ8_0Act* out, int64_t n, int32_t* sums = nullptr);

}  // namespace tandem::kernels
