#include "kernels/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "gguf/dequantize.h"
#include "kernels/isa_kernels.h"
#include "kernels/k_quants.h"
#include "kernels/legacy_quants.h"
#include "util/error.h"
#include "util/fp16.h"

namespace tandem::kernels {

namespace {

// 1 / rms of a row. Double accumulation: the sum of squares of a few thousand
// values is where f32 would lose the most. Eight partial sums (element i into
// sum i % 8, combined in a fixed tree), not one chain: one chain of double
// adds made a decode step's norm of 1024 values about a microsecond, and the
// norms run on one thread while the others wait.
float rms_scale(const float* x, int64_t n, float eps) {
  double part[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) part[j] += static_cast<double>(x[i + j]) * x[i + j];
  for (int j = 0; i < n; ++i, ++j) part[j] += static_cast<double>(x[i]) * x[i];
  const double sum = ((part[0] + part[4]) + (part[2] + part[6])) + ((part[1] + part[5]) + (part[3] + part[7]));
  return static_cast<float>(1.0 / std::sqrt(sum / static_cast<double>(n) + eps));
}

}  // namespace

void rms_norm(const float* x, int64_t ldx, const float* weight, float* out, int64_t ldo, int64_t n_rows,
              int64_t n, float eps) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * ldx;
    float* o = out + r * ldo;
    const float scale = rms_scale(xr, n, eps);
    for (int64_t i = 0; i < n; ++i) o[i] = xr[i] * scale * weight[i];
  }
}

void rms_norm_q8_0(const float* x, int64_t ldx, const float* weight, BlockQ8_0Act* out, int64_t ldq, int64_t n_rows,
                   int64_t n, float eps, int32_t* sums) {
  TANDEM_ASSERT(n % 32 == 0);
  // A row at a time through a buffer that stays in L1 (the vector quantizer
  // wants whole rows); the values are rms_norm's.
  thread_local std::vector<float> row;
  row.resize(static_cast<size_t>(n));
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * ldx;
    const float scale = rms_scale(xr, n, eps);
    for (int64_t i = 0; i < n; ++i) row[static_cast<size_t>(i)] = xr[i] * scale * weight[i];
    quantize_row_q8_0(row.data(), out + r * ldq, n, sums != nullptr ? sums + r * ldq : nullptr);
  }
}

void rope_angles(const int32_t* positions, int64_t n_rows, const RopeParams& p, float* cos_out,
                 float* sin_out) {
  TANDEM_ASSERT(p.n_rot > 0 && p.n_rot % 2 == 0);
  const int half = p.n_rot / 2;
  for (int64_t r = 0; r < n_rows; ++r) {
    const double pos = positions[r];
    for (int i = 0; i < half; ++i) {
      double freq = std::pow(static_cast<double>(p.freq_base), -2.0 * i / p.n_rot);
      if (p.freq_factors != nullptr) freq /= p.freq_factors[i];
      const double theta = pos * freq;
      cos_out[r * half + i] = static_cast<float>(std::cos(theta));
      sin_out[r * half + i] = static_cast<float>(std::sin(theta));
    }
  }
}

void rope_apply(float* x, int64_t ldx, int64_t n_rows, int n_heads, int head_dim, const RopeParams& p,
                const float* cos_t, const float* sin_t) {
  TANDEM_ASSERT(p.n_rot > 0 && p.n_rot % 2 == 0 && p.n_rot <= head_dim);
  const int half = p.n_rot / 2;
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* c = cos_t + r * half;
    const float* s = sin_t + r * half;
    float* row = x + r * ldx;
    for (int h = 0; h < n_heads; ++h) {
      float* v = row + static_cast<int64_t>(h) * head_dim;
      for (int i = 0; i < half; ++i) {
        const int a = p.neox ? i : 2 * i;
        const int b = p.neox ? i + half : 2 * i + 1;
        const float x0 = v[a];
        const float x1 = v[b];
        v[a] = x0 * c[i] - x1 * s[i];
        v[b] = x0 * s[i] + x1 * c[i];
      }
    }
  }
}

void silu_mul(float* g, const float* u, int64_t n) { active_kernels().silu_mul(g, u, n); }

float log_sum_exp(const float* x, int64_t n) { return active_kernels().log_sum_exp(x, n); }

void delta_rule_step(float* state, int64_t s, const float* k, const float* q, const float* v, float decay, float beta,
                     float scale, float* out) {
  active_kernels().delta_rule(state, s, k, q, v, decay, beta, scale, out);
}

void add_inplace(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void softmax(float* x, int64_t n) {
  if (n <= 0) return;
  float max_v = x[0];
  for (int64_t i = 1; i < n; ++i) max_v = std::max(max_v, x[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max_v);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

int64_t argmax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

void dequantize_row(DType t, const uint8_t* row, float* out, int64_t n) {
  // GGUF's reference dequantization (bit-identical to ggml's) for every type.
  gguf::dequantize_row(gguf_tensor_type(t), row, out, n);
}

void convert_row(const float* x, DType t, uint8_t* out, int64_t n) {
  switch (t) {
    case DType::kF32: std::memcpy(out, x, static_cast<size_t>(n) * 4); return;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h = f32_to_f16(x[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h = f32_to_bf16(x[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
    case DType::kQ8_0: quantize_row_q8_0_weights(x, out, n); return;
    case DType::kQ4_K: quantize_row_q4_k(x, out, n); return;
    case DType::kQ5_K: quantize_row_q5_k(x, out, n); return;
    case DType::kQ6_K: quantize_row_q6_k(x, out, n); return;
    case DType::kQ2_K: quantize_row_q2_k(x, out, n); return;
    case DType::kQ3_K: quantize_row_q3_k(x, out, n); return;
    case DType::kIQ4_XS: quantize_row_iq4_xs(x, out, n); return;
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kIQ4_NL: quantize_row_legacy(t, x, out, n); return;
  }
}

namespace {

// One block of 32: scale d = max|x| / 127 and q = round(x / d), as llama.cpp's
// reference quantizer does. Returns d.
float quantize_block_32(const float* x, int8_t* q) {
  float amax = 0.0f;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int i = 0; i < 32; ++i) q[i] = static_cast<int8_t>(std::lround(x[i] * id));
  return d;
}

}  // namespace

void quantize_row_q8_0_weights(const float* x, uint8_t* out, int64_t n) {
  TANDEM_ASSERT(n % 32 == 0);
  for (int64_t b = 0; b < n / 32; ++b) {
    BlockQ8_0 blk;
    blk.d = f32_to_f16(quantize_block_32(x + b * 32, blk.qs));
    std::memcpy(out + b * sizeof(BlockQ8_0), &blk, sizeof blk);
  }
}

void round_row_bf16(const float* x, uint16_t* out_bf16, float* out_f32, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    out_bf16[i] = f32_to_bf16(x[i]);
    out_f32[i] = bf16_to_f32(out_bf16[i]);
  }
}

void quantize_q8_reference(const float* x, BlockQ8_0Act* out, int32_t* sums, int64_t n) {
  // Round half to even by the 1.5 * 2^23 trick (|v| <= 127), as the vector
  // variants' conversions do, after the same product x * (1 / d).
  constexpr float kRound = 12582912.0f;
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* xb = x + b * 32;
    float amax = 0.0f;
    bool finite = true;
    for (int i = 0; i < 32; ++i) {
      const float a = std::fabs(xb[i]);
      finite &= a <= std::numeric_limits<float>::max();  // (false for NaN too)
      amax = a > amax ? a : amax;
    }
    if (!finite) {
      quantize_q8_nonfinite_block(out[b], sums != nullptr ? &sums[b] : nullptr);
      continue;
    }
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int32_t sum = 0;
    for (int i = 0; i < 32; ++i) {
      const float v = xb[i] * id;
      out[b].qs[i] = static_cast<int8_t>(static_cast<int>((v + kRound) - kRound));
      sum += out[b].qs[i];
    }
    out[b].d = d;
    if (sums != nullptr) sums[b] = sum;
  }
}

void quantize_row_q8_0(const float* x, BlockQ8_0Act* out, int64_t n, int32_t* sums) {
  TANDEM_ASSERT(n % 32 == 0);
  active_kernels().quantize_q8(x, out, sums, n);
}

}  // namespace tandem::kernels
