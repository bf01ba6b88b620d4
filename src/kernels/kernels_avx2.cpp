// AVX2 + FMA + F16C kernels, for CPUs without AVX-512.
//
// Reduction order per output element: one 8-lane accumulator, lane j sums
// k = j, j+8, ... in increasing k; a tail shorter than 8 is zero-padded into
// one more step; then a fixed horizontal sum. On panels (f32/f16/bf16), one
// FMA chain per output in plain k order. Q8_0 uses the same int32 lane
// grouping (4 products per lane) as the AVX-512 variant.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/gemm_driver.h"
#include "kernels/isa_kernels.h"
#include "util/error.h"
#include "util/fp16.h"

namespace tandem::kernels {
namespace {

// See kernels_avx512.cpp: the decode GEMV prefetches each weight row ahead.
constexpr int64_t kPrefetchLines = 8;

inline float hsum256(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  __m128 sh = _mm_movehl_ps(lo, lo);
  lo = _mm_add_ps(lo, sh);
  sh = _mm_movehdup_ps(lo);
  lo = _mm_add_ss(lo, sh);
  return _mm_cvtss_f32(lo);
}

struct LoadF32 {
  static constexpr int kBytes = 4;
  static __m256 load(const uint8_t* p) { return _mm256_loadu_ps(reinterpret_cast<const float*>(p)); }
};
struct LoadF16 {
  static constexpr int kBytes = 2;
  static __m256 load(const uint8_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
};
struct LoadBF16 {
  static constexpr int kBytes = 2;
  static __m256 load(const uint8_t* p) {
    __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
};

// Loads the last n (< 8) elements zero-padded to a full vector.
template <typename L>
inline __m256 load_tail(const uint8_t* p, int64_t n) {
  alignas(32) uint8_t buf[32] = {};
  std::memcpy(buf, p, static_cast<size_t>(n) * L::kBytes);
  return L::load(buf);
}

template <typename L, int R, int T>
inline void tile_float(const GemmArgs& a, int64_t r0, int64_t t0) {
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  const uint8_t* w[R];
  for (int r = 0; r < R; ++r) w[r] = gemm_row(a, r0 + r, kFloatChunkBytes);
  const float* x[T];
  for (int t = 0; t < T; ++t) x[t] = a.x + (t0 + t) * a.ldx;
  const int64_t prefetch = kPrefetchLines * kFloatChunkBytes * a.w_group;
  const int64_t k8 = a.k & ~int64_t{7};
  for (int64_t k = 0; k < k8; k += 8) {
    __m256 xv[T];
    for (int t = 0; t < T; ++t) xv[t] = _mm256_loadu_ps(x[t] + k);
    const size_t off = float_offset(a, k * L::kBytes);
    for (int r = 0; r < R; ++r) {
      if constexpr (T == 1) _mm_prefetch(prefetch_address(w[r] + off, prefetch), _MM_HINT_T0);
      __m256 wv = L::load(w[r] + off);
      for (int t = 0; t < T; ++t) acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
    }
  }
  if (k8 < a.k) {
    __m256 xv[T];
    for (int t = 0; t < T; ++t) xv[t] = load_tail<LoadF32>(reinterpret_cast<const uint8_t*>(x[t] + k8), a.k - k8);
    for (int r = 0; r < R; ++r) {
      __m256 wv = load_tail<L>(w[r] + float_offset(a, k8 * L::kBytes), a.k - k8);
      for (int t = 0; t < T; ++t) acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) a.y[(t0 + t) * a.ldy + r0 + r] = hsum256(acc[r][t]);
}

// Panels (see kernels_avx512.cpp): a group's 16 rows at one k are two
// vectors, multiplied by each token's broadcast activation; every output is
// one FMA chain in plain k order. A chunk holds kK values of k per row
// (bf16: a pair, split into two vectors of the even and the odd k).
template <typename L>
struct PanelFloat {
  static constexpr int kK = 1;
  static constexpr int64_t kChunkBytes = L::kBytes;
  static __m256 load(const uint8_t* p, int64_t /*sub*/) { return L::load(p); }
};

struct PanelBf16 {
  static constexpr int kK = 2;
  static constexpr int64_t kChunkBytes = 4;
  static __m256 load(const uint8_t* p, int64_t sub) {
    const __m256i pairs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm256_castsi256_ps(sub == 0 ? _mm256_slli_epi32(pairs, 16)
                                        : _mm256_and_si256(pairs, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
  }
};

template <typename P, int G, int T>
inline void tile_panel(const GemmArgs& a, int64_t g0, int64_t t0, const PanelTileJob& job) {
  __m256 acc[G][2][T];
  for (int g = 0; g < G; ++g)
    for (int h = 0; h < 2; ++h)
      for (int t = 0; t < T; ++t) acc[g][h][t] = _mm256_setzero_ps();
  const int64_t group_bytes = kPanelRows * static_cast<int64_t>(a.w_row_bytes);
  const uint8_t* w = a.w + g0 * group_bytes;
  const float* x[T];
  for (int t = 0; t < T; ++t) x[t] = a.x + (t0 + t) * a.ldx;
  constexpr int64_t kStep = kPanelRows * P::kChunkBytes;  // bytes of a group's chunk
  const uint8_t* pf = job.prefetch;
  int64_t pf_left = job.prefetch_lines;
  for (int64_t k = 0; k < a.k; ++k) {
    const int64_t off = k / P::kK * kStep;
    if constexpr (T == 1) {
      if (off % 64 == 0 && k % P::kK == 0)
        for (int g = 0; g < G; ++g)
          _mm_prefetch(prefetch_address(w + g * group_bytes + off, kPrefetchLines * 64), _MM_HINT_T0);
    } else if (pf_left > 0) {
      _mm_prefetch(reinterpret_cast<const char*>(pf), _MM_HINT_T0);
      pf += 64;
      --pf_left;
    }
    __m256 wv[G][2];
    for (int g = 0; g < G; ++g)
      for (int h = 0; h < 2; ++h) wv[g][h] = P::load(w + g * group_bytes + off + h * kStep / 2, k % P::kK);
    for (int t = 0; t < T; ++t) {
      const __m256 b = _mm256_broadcast_ss(x[t] + k);
      for (int g = 0; g < G; ++g)
        for (int h = 0; h < 2; ++h) acc[g][h][t] = _mm256_fmadd_ps(wv[g][h], b, acc[g][h][t]);
    }
  }
  for (int g = 0; g < G; ++g) {
    const auto [lo, hi] = stored_rows(job, g0 + g);
    for (int t = 0; t < T; ++t) {
      float* y = a.y + (t0 + t) * a.ldy + (g0 + g) * kPanelRows;
      if (lo == 0 && hi == kPanelRows) {
        _mm256_storeu_ps(y, acc[g][0][t]);
        _mm256_storeu_ps(y + 8, acc[g][1][t]);
      } else {
        alignas(32) float buf[kPanelRows];
        _mm256_store_ps(buf, acc[g][0][t]);
        _mm256_store_ps(buf + 8, acc[g][1][t]);
        for (int64_t r = lo; r < hi; ++r) y[r] = buf[r];
      }
    }
  }
}

template <typename P>
struct PanelTile {
  template <int G, int T>
  struct Fn {
    static void run(const GemmArgs& a, int64_t g, int64_t t, const PanelTileJob& job) { tile_panel<P, G, T>(a, g, t, job); }
  };
};

inline __m256i dot_block_i32(const int8_t* wq, const int8_t* xq) {
  __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wq));
  __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
  // |w| * (x * sign(w)) pairs fit int16 without saturation (|q| <= 127).
  __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(xv, wv));
  return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}

template <int R, int T>
inline void tile_q8_0(const GemmArgs& a, int64_t r0, int64_t t0) {
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  const auto [w, x] = TileRows<R, T>(a, r0, t0, kQ8ChunkBytes);
  const int64_t n_blocks = a.k / 32;
  const size_t block_stride = static_cast<size_t>(kQ8ChunkBytes * a.w_group);
  const size_t prefetch = kPrefetchLines * kFloatChunkBytes * static_cast<size_t>(a.w_group);
  for (int64_t b = 0; b < n_blocks; ++b) {
    for (int r = 0; r < R; ++r) {
      const auto* blk = reinterpret_cast<const BlockQ8_0*>(w[r] + static_cast<size_t>(b) * block_stride);
      if constexpr (T == 1) _mm_prefetch(prefetch_address(blk, static_cast<int64_t>(prefetch)), _MM_HINT_T0);
      const float dw = _cvtsh_ss(blk->d);
      for (int t = 0; t < T; ++t) {
        __m256 s = _mm256_cvtepi32_ps(dot_block_i32(blk->qs, x[t][b].qs));
        acc[r][t] = _mm256_fmadd_ps(s, _mm256_set1_ps(dw * x[t][b].d), acc[r][t]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) a.y[(t0 + t) * a.ldy + r0 + r] = hsum256(acc[r][t]);
}

template <typename L>
struct FloatTile {
  template <int R, int T>
  struct Fn {
    static void run(const GemmArgs& a, int64_t r, int64_t t) { tile_float<L, R, T>(a, r, t); }
  };
};

template <int R, int T>
struct Q8Tile {
  static void run(const GemmArgs& a, int64_t r, int64_t t) { tile_q8_0<R, T>(a, r, t); }
};

// Tiles of 4 rows x 5 tokens over 32-row and 125-token blocks.
constexpr GemmPlan kPlan{4, 5, 8, 32, 125};

// Panels: prompt tiles of one group x 6 tokens (15 of the 16 registers);
// decode tiles of two groups (two streams).
constexpr PanelPlan kPanelPlan{1, 6, 2, 126};

template <typename L, typename P>
void gemm_float(const GemmArgs& a, int64_t b, int64_t e) {
  if (is_panel(a, P::kChunkBytes)) {
    TANDEM_ASSERT(a.k % P::kK == 0, "bf16 panels need an even row length");
    panel_driver<PanelTile<P>::template Fn, kPanelPlan>(a, b, e);
  } else {
    gemm_driver<FloatTile<L>::template Fn, kPlan>(a, b, e);
  }
}

void gemm_f32(const GemmArgs& a, int64_t b, int64_t e) { gemm_float<LoadF32, PanelFloat<LoadF32>>(a, b, e); }
void gemm_f16(const GemmArgs& a, int64_t b, int64_t e) { gemm_float<LoadF16, PanelFloat<LoadF16>>(a, b, e); }
void gemm_bf16(const GemmArgs& a, int64_t b, int64_t e) { gemm_float<LoadBF16, PanelBf16>(a, b, e); }
void gemm_q8_0(const GemmArgs& a, int64_t b, int64_t e) { gemm_driver<Q8Tile, kPlan>(a, b, e); }

// quantize_q8_reference's blocks, 8 lanes at a time: the same |x| maximum,
// d = amax / 127 and 1 / d, then x * (1 / d) converted with the default
// rounding (nearest even, as the reference's 1.5 * 2^23 trick).
void quantize_q8_avx2(const float* x, BlockQ8_0Act* out, int32_t* sums, int64_t n) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* xb = x + b * 32;
    __m256 v[4];
    for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(xb + 8 * i);
    __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], abs_mask), _mm256_and_ps(v[1], abs_mask)),
                             _mm256_max_ps(_mm256_and_ps(v[2], abs_mask), _mm256_and_ps(v[3], abs_mask)));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    const float d = _mm_cvtss_f32(h) / 127.0f;
    const __m256 id = _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
    __m256i q[4];
    for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], id));
    // |q| <= 127: the saturating packs are exact; they interleave 128-bit
    // lanes, which the permute puts back in order.
    const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[b].qs), _mm256_permutevar8x32_epi32(packed, order));
    out[b].d = d;
    if (sums != nullptr) {
      const __m256i s8 = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
      __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
      sums[b] = _mm_cvtsi128_si32(s4);
    }
  }
}

// The vector type of vector_algorithms.h.
struct Vec {
  using V = __m256;
  static constexpr int kWidth = 8;
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  // kWidth elements of a KV row of type T at p, as f32 (exact).
  template <DType T>
  static V load_kv(const uint8_t* p) { return load_kv_with<LoadF32, LoadF16, LoadBF16, T>(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V div(V a, V b) { return _mm256_div_ps(a, b); }
  static V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V max(V a, V b) { return _mm256_max_ps(a, b); }
  static float reduce_add(V v) { return hsum256(v); }
  static float reduce_max(V v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
  }
  static float first(V v) { return _mm256_cvtss_f32(v); }
  // e^x as in kernels_avx512.cpp, with 2^n built in the exponent bits.
  static V exp(V x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    const V n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    V r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    V p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i scale = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(scale));
  }
  // n elements of a KV row (f32, f16 or bf16) to f32.
  template <typename L>
  static void widen_as(const uint8_t* src, float* dst, int64_t n) {
    const int64_t n8 = n & ~int64_t{7};
    for (int64_t i = 0; i < n8; i += 8) _mm256_storeu_ps(dst + i, L::load(src + i * L::kBytes));
    if (n8 < n) {
      alignas(32) float tail[8];
      _mm256_store_ps(tail, load_tail<L>(src + n8 * L::kBytes, n - n8));
      std::memcpy(dst + n8, tail, static_cast<size_t>(n - n8) * sizeof(float));
    }
  }
  // n f32 values to a KV row; f16 by F16C, bf16 (no AVX2 instruction) as the scalar code does.
  static void narrow(DType t, const float* src, uint8_t* dst, int64_t n) {
    if (t == DType::kF32) return static_cast<void>(std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float)));
    auto* d16 = reinterpret_cast<uint16_t*>(dst);
    int64_t i = 0;
    if (t == DType::kF16) {
      for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d16 + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      for (; i < n; ++i) d16[i] = static_cast<uint16_t>(_cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      return;
    }
    for (; i < n; ++i) d16[i] = f32_to_bf16(src[i]);
  }
  static void widen(DType t, const uint8_t* src, float* dst, int64_t n) {
    if (t == DType::kF16) return widen_as<LoadF16>(src, dst, n);
    if (t == DType::kBF16) return widen_as<LoadBF16>(src, dst, n);
    widen_as<LoadF32>(src, dst, n);
  }
};

}  // namespace
}  // namespace tandem::kernels

#include "kernels/k_quant_tiles.h"
#include "kernels/legacy_quant_tiles.h"
#include "kernels/vector_algorithms.h"

namespace tandem::kernels {
namespace {

// Eight int32 lanes of four u8 x s8 products each, as vpdpbusd's.
struct DotLanes {
  static __m256i lanes(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
  }
};

template <typename F>
void gemm_legacy(const GemmArgs& a, int64_t b, int64_t e) {
  gemm_any_layout<LegacyPanelRow<DotLanes, F>, gemm_legacy_chunks<DotLanes, F>>(a, b, e);
}

}  // namespace

const IsaKernels kAvx2Kernels = {
    gemm_f32,
    gemm_f16,
    gemm_bf16,
    gemm_any_layout<LegacyPanelRow<DotLanes, Q8_0Format>, gemm_q8_0>,
    gemm_any_layout<Q4KPanelRow<DotLanes>, gemm_q45_k_chunks<DotLanes, Q4KUnpack>>,
    gemm_any_layout<Q6KPanelRow, gemm_q16_k<Q6KUnpack>>,
    gemm_legacy<Q4_0Format>,
    gemm_legacy<Q4_1Format>,
    gemm_legacy<Q5_0Format>,
    gemm_legacy<Q5_1Format>,
    gemm_legacy<IQ4NLFormat>,
    gemm_any_layout<Q5KPanelRow<DotLanes>, gemm_q45_k_chunks<DotLanes, Q5KUnpack>>,
    gemm_any_layout<Q23KPanelRow<DType::kQ2_K, BlockQ2_K>, gemm_q16_k<Q2KUnpack>>,
    gemm_any_layout<Q23KPanelRow<DType::kQ3_K, BlockQ3_K>, gemm_q16_k<Q3KUnpack>>,
    gemm_any_layout<IQ4XSPanelRow, gemm_q45_k_chunks<DotLanes, IQ4XSUnpack>>,
    attention_tile_vec,
    silu_mul_vec,
    Vec::narrow,
    delta_rule_vec,
    quantize_q8_avx2,
    log_sum_exp_vec,
};

}  // namespace tandem::kernels
