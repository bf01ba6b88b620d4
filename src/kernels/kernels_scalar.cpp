// Scalar reference kernels: the definition every vectorized variant is tested
// against. Plain sequential sums, no tricks.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "kernels/isa_kernels.h"
#include "kernels/k_quants.h"
#include "kernels/legacy_quants.h"
#include "util/fp16.h"

namespace tandem::kernels {
namespace {

inline float load_f16(const void* p, int64_t i) {
  uint16_t h;
  std::memcpy(&h, static_cast<const uint8_t*>(p) + 2 * i, 2);
  return f16_to_f32(h);
}

inline float load_bf16(const void* p, int64_t i) {
  uint16_t h;
  std::memcpy(&h, static_cast<const uint8_t*>(p) + 2 * i, 2);
  return bf16_to_f32(h);
}

inline float load_f32(const void* p, int64_t i) {
  float f;
  std::memcpy(&f, static_cast<const uint8_t*>(p) + 4 * i, 4);
  return f;
}

template <float (*Load)(const void*, int64_t), int64_t Bytes>
void gemm_plain(const GemmArgs& a, int64_t row_begin, int64_t row_end) {
  for (int64_t t = 0; t < a.n_tokens; ++t) {
    const float* x = a.x + t * a.ldx;
    for (int64_t r = row_begin; r < row_end; ++r) {
      float acc = 0.0f;
      for (int64_t k = 0; k < a.k; ++k) acc += x[k] * Load(weight_byte(a, r, k * Bytes), 0);
      a.y[t * a.ldy + r] = acc;
    }
  }
}

// q8_0 in any layout (panels are read back into blocks).
void gemm_q8_0(const GemmArgs& a, int64_t row_begin, int64_t row_end) {
  const int64_t n_blocks = a.k / 32;
  const bool panel = is_panel_layout(DType::kQ8_0, a.w_group);
  for (int64_t t = 0; t < a.n_tokens; ++t) {
    const BlockQ8_0Act* xb = a.xq + t * a.ldxq;
    for (int64_t r = row_begin; r < row_end; ++r) {
      const uint8_t* row = gemm_row(a, r, kQ8ChunkBytes);
      const uint8_t* group = gemm_row(a, r / a.w_group * a.w_group, kQ8ChunkBytes);
      float acc = 0.0f;
      for (int64_t b = 0; b < n_blocks; ++b) {
        BlockQ8_0 wb;
        if (panel) {
          unpack_legacy_panel_row(DType::kQ8_0, group + b * kQ8ChunkBytes * a.w_group, static_cast<int>(r % a.w_group),
                                  reinterpret_cast<uint8_t*>(&wb));
        } else {
          std::memcpy(&wb, row + b * kQ8ChunkBytes * a.w_group, sizeof wb);
        }
        int32_t sum = 0;
        for (int i = 0; i < 32; ++i) sum += static_cast<int32_t>(wb.qs[i]) * xb[b].qs[i];
        acc += static_cast<float>(sum) * (f16_to_f32(wb.d) * xb[b].d);
      }
      a.y[t * a.ldy + r] = acc;
    }
  }
}

// The 32-element types of legacy_quants.h: per block the exact integer sums
// of w x (and of x, for a min), then dx * (d * sum(w x)) [+ dx * m * sum(x)],
// in the same order whatever the layout (panels are read back into blocks).
template <DType kType>
void gemm_legacy(const GemmArgs& a, int64_t row_begin, int64_t row_end) {
  const int64_t n_blocks = a.k / 32;
  const auto chunk = static_cast<int64_t>(dtype_block_bytes(kType));
  const bool panel = is_panel_layout(kType, a.w_group);
  uint8_t plain[32];
  for (int64_t t = 0; t < a.n_tokens; ++t) {
    const BlockQ8_0Act* xb = a.xq + t * a.ldxq;
    for (int64_t r = row_begin; r < row_end; ++r) {
      const uint8_t* row = gemm_row(a, r, chunk);
      const uint8_t* group = gemm_row(a, r / a.w_group * a.w_group, chunk);
      float acc = 0.0f;
      for (int64_t b = 0; b < n_blocks; ++b) {
        LegacyBlock wb;
        const uint8_t* block = row + b * chunk * a.w_group;
        if (panel) {
          unpack_legacy_panel_row(kType, group + b * chunk * a.w_group, static_cast<int>(r % a.w_group), plain);
          block = plain;
        }
        unpack_legacy_block(kType, block, &wb);
        int32_t dot = 0, xsum = 0;
        for (int i = 0; i < 32; ++i) {
          dot += wb.w[i] * xb[b].qs[i];
          xsum += xb[b].qs[i];
        }
        acc += static_cast<float>(dot) * (wb.d * xb[b].d);
        if (legacy_quant_has_min(kType)) acc += static_cast<float>(xsum) * (wb.m * xb[b].d);
      }
      a.y[t * a.ldy + r] = acc;
    }
  }
}

// K-quants (k_quants.h): per activation block of 32 an exact integer sum,
// then its float terms, block after block. BlockTerms(block, q, j, x) is the
// contribution of activation block j of a weight block whose values are q.
template <DType kType, typename Block, void (*Values)(const Block&, uint8_t*), typename BlockTerms>
void gemm_k_quant(const GemmArgs& a, int64_t row_begin, int64_t row_end, BlockTerms terms) {
  constexpr auto kChunk = static_cast<int64_t>(sizeof(Block));
  const int64_t n_super = a.k / kSuperBlock;
  for (int64_t t = 0; t < a.n_tokens; ++t) {
    const BlockQ8_0Act* xb = a.xq + t * a.ldxq;
    for (int64_t r = row_begin; r < row_end; ++r) {
      const uint8_t* row = gemm_row(a, r, kChunk);
      float acc = 0.0f;
      for (int64_t s = 0; s < n_super; ++s) {
        Block wb;
        if (is_panel_layout(kType, a.w_group)) {  // (read back into a block)
          const uint8_t* group = gemm_row(a, r / a.w_group * a.w_group, kChunk);
          unpack_k_quant_panel_row(kType, group + s * kChunk * a.w_group, static_cast<int>(r % a.w_group),
                                   reinterpret_cast<uint8_t*>(&wb));
        } else {
          std::memcpy(&wb, row + s * kChunk * a.w_group, sizeof wb);
        }
        uint8_t q[256];
        Values(wb, q);
        for (int j = 0; j < 8; ++j) acc += terms(wb, q, j, xb[s * 8 + j]);
      }
      a.y[t * a.ldy + r] = acc;
    }
  }
}

// q4_K and q5_K: d * scale_j * q - dmin * min_j per sub-block j.
template <typename Block>
float scaled_min_terms(const Block& wb, const uint8_t* q, int j, const BlockQ8_0Act& x) {
  uint8_t sc, m;
  q4_k_scale_min(wb.scales, j, &sc, &m);
  int32_t dot = 0, xsum = 0;
  for (int i = 0; i < 32; ++i) {
    dot += q[32 * j + i] * x.qs[i];
    xsum += x.qs[i];
  }
  return static_cast<float>(dot) * (f16_to_f32(wb.d) * sc * x.d) -
         f16_to_f32(wb.dmin) * m * (x.d * static_cast<float>(xsum));
}

void gemm_q4_k(const GemmArgs& a, int64_t row_begin, int64_t row_end) {
  gemm_k_quant<DType::kQ4_K, BlockQ4_K, q4_k_values>(a, row_begin, row_end, scaled_min_terms<BlockQ4_K>);
}

void gemm_q5_k(const GemmArgs& a, int64_t row_begin, int64_t row_end) {
  gemm_k_quant<DType::kQ5_K, BlockQ5_K, q5_k_values>(a, row_begin, row_end, scaled_min_terms<BlockQ5_K>);
}

void gemm_q6_k(const GemmArgs& a, int64_t row_begin, int64_t row_end) {
  gemm_k_quant<DType::kQ6_K, BlockQ6_K, q6_k_values>(
      a, row_begin, row_end, [](const BlockQ6_K& wb, const uint8_t* q, int j, const BlockQ8_0Act& x) {
        int32_t dot = 0;
        for (int i = 0; i < 32; ++i) dot += wb.scales[2 * j + i / 16] * (q[32 * j + i] - 32) * x.qs[i];
        return static_cast<float>(dot) * (f16_to_f32(wb.d) * x.d);
      });
}

// q2_K: d * scale * q - dmin * min per 16-element half of the block.
void gemm_q2_k(const GemmArgs& a, int64_t row_begin, int64_t row_end) {
  gemm_k_quant<DType::kQ2_K, BlockQ2_K, q2_k_values>(
      a, row_begin, row_end, [](const BlockQ2_K& wb, const uint8_t* q, int j, const BlockQ8_0Act& x) {
        int32_t dot = 0, mins = 0;
        for (int i = 0; i < 32; ++i) {
          const uint8_t sm = wb.scales[2 * j + i / 16];
          dot += (sm & 0x0F) * q[32 * j + i] * x.qs[i];
          mins += (sm >> 4) * x.qs[i];
        }
        return static_cast<float>(dot) * (f16_to_f32(wb.d) * x.d) - static_cast<float>(mins) * (f16_to_f32(wb.dmin) * x.d);
      });
}

void gemm_q3_k(const GemmArgs& a, int64_t row_begin, int64_t row_end) {
  gemm_k_quant<DType::kQ3_K, BlockQ3_K, q3_k_values>(
      a, row_begin, row_end, [](const BlockQ3_K& wb, const uint8_t* q, int j, const BlockQ8_0Act& x) {
        const int scales[2] = {q3_k_scale(wb, 2 * j), q3_k_scale(wb, 2 * j + 1)};
        int32_t dot = 0;
        for (int i = 0; i < 32; ++i) dot += scales[i / 16] * (q[32 * j + i] - 4) * x.qs[i];
        return static_cast<float>(dot) * (f16_to_f32(wb.d) * x.d);
      });
}

void gemm_iq4_xs(const GemmArgs& a, int64_t row_begin, int64_t row_end) {
  gemm_k_quant<DType::kIQ4_XS, BlockIQ4_XS, iq4_xs_values>(
      a, row_begin, row_end, [](const BlockIQ4_XS& wb, const uint8_t* q, int j, const BlockQ8_0Act& x) {
        int32_t dot = 0;
        for (int i = 0; i < 32; ++i) dot += kIq4NlLevels[q[32 * j + i]] * x.qs[i];
        return static_cast<float>(dot) * (f16_to_f32(wb.d) * static_cast<float>(iq4_xs_scale(wb, j)) * x.d);
      });
}

// The vector type of vector_algorithms.h: one float, std::exp.
struct Vec {
  using V = float;
  static constexpr int kWidth = 1;
  static V zero() { return 0.0f; }
  static V set1(float x) { return x; }
  static V load(const float* p) { return *p; }
  // The element of a KV row of type T at p, as f32.
  template <DType T>
  static V load_kv(const uint8_t* p) { return kv_element<T>(p, 0); }
  static void store(float* p, V v) { *p = v; }
  static V add(V a, V b) { return a + b; }
  static V sub(V a, V b) { return a - b; }
  static V mul(V a, V b) { return a * b; }
  static V div(V a, V b) { return a / b; }
  static V fmadd(V a, V b, V c) { return a * b + c; }
  static V max(V a, V b) { return std::max(a, b); }
  static float reduce_add(V v) { return v; }
  static float reduce_max(V v) { return v; }
  static float first(V v) { return v; }
  static V exp(V x) { return std::exp(x); }
  static void narrow(DType t, const float* src, uint8_t* dst, int64_t n) {
    auto* d16 = reinterpret_cast<uint16_t*>(dst);
    if (t == DType::kF32) return static_cast<void>(std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float)));
    for (int64_t i = 0; i < n; ++i) d16[i] = t == DType::kF16 ? f32_to_f16(src[i]) : f32_to_bf16(src[i]);
  }
  static void widen(DType t, const uint8_t* src, float* dst, int64_t n) {
    for (int64_t i = 0; i < n; ++i)
      dst[i] = t == DType::kF16 ? load_f16(src, i) : t == DType::kBF16 ? load_bf16(src, i) : load_f32(src, i);
  }
};

}  // namespace
}  // namespace tandem::kernels

#include "kernels/vector_algorithms.h"

namespace tandem::kernels {

const IsaKernels kScalarKernels = {
    gemm_plain<load_f32, 4>,     gemm_plain<load_f16, 2>,     gemm_plain<load_bf16, 2>, gemm_q8_0,
    gemm_q4_k,                   gemm_q6_k,                   gemm_legacy<DType::kQ4_0>, gemm_legacy<DType::kQ4_1>,
    gemm_legacy<DType::kQ5_0>,   gemm_legacy<DType::kQ5_1>,   gemm_legacy<DType::kIQ4_NL>, gemm_q5_k,
    gemm_q2_k,                   gemm_q3_k,                   gemm_iq4_xs,
    attention_tile_vec,          silu_mul_vec,                Vec::narrow,              delta_rule_vec,
    quantize_q8_reference,
    log_sum_exp_vec,
};

}  // namespace tandem::kernels
