// AVX2 + FMA + F16C kernels, for CPUs without AVX-512.
//
// Reduction order per output element: one 8-lane accumulator, lane j sums
// k = j, j+8, ... in increasing k; a tail shorter than 8 is zero-padded into
// one more step; then a fixed horizontal sum. Q8_0 uses the same int32 lane
// grouping (4 products per lane) as the AVX-512 variant.
#include <immintrin.h>

#include <cstring>

#include "kernels/gemm_driver.h"
#include "kernels/isa_kernels.h"

namespace tandem::kernels {
namespace {

// See kernels_avx512.cpp: the decode GEMV prefetches each weight row ahead.
constexpr int kPrefetchBytes = 512;

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
  for (int r = 0; r < R; ++r) w[r] = a.w + static_cast<size_t>(r0 + r) * a.w_row_bytes;
  const float* x[T];
  for (int t = 0; t < T; ++t) x[t] = a.x + (t0 + t) * a.ldx;
  const int64_t k8 = a.k & ~int64_t{7};
  for (int64_t k = 0; k < k8; k += 8) {
    __m256 xv[T];
    for (int t = 0; t < T; ++t) xv[t] = _mm256_loadu_ps(x[t] + k);
    for (int r = 0; r < R; ++r) {
      if constexpr (T == 1) _mm_prefetch(reinterpret_cast<const char*>(w[r] + k * L::kBytes) + kPrefetchBytes, _MM_HINT_T0);
      __m256 wv = L::load(w[r] + k * L::kBytes);
      for (int t = 0; t < T; ++t) acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
    }
  }
  if (k8 < a.k) {
    __m256 xv[T];
    for (int t = 0; t < T; ++t) xv[t] = load_tail<LoadF32>(reinterpret_cast<const uint8_t*>(x[t] + k8), a.k - k8);
    for (int r = 0; r < R; ++r) {
      __m256 wv = load_tail<L>(w[r] + k8 * L::kBytes, a.k - k8);
      for (int t = 0; t < T; ++t) acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) a.y[(t0 + t) * a.ldy + r0 + r] = hsum256(acc[r][t]);
}

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
  const BlockQ8_0* w[R];
  for (int r = 0; r < R; ++r)
    w[r] = reinterpret_cast<const BlockQ8_0*>(a.w + static_cast<size_t>(r0 + r) * a.w_row_bytes);
  const BlockQ8_0Act* x[T];
  for (int t = 0; t < T; ++t) x[t] = a.xq + (t0 + t) * a.ldxq;
  const int64_t n_blocks = a.k / 32;
  for (int64_t b = 0; b < n_blocks; ++b) {
    for (int r = 0; r < R; ++r) {
      if constexpr (T == 1) _mm_prefetch(reinterpret_cast<const char*>(w[r] + b) + kPrefetchBytes, _MM_HINT_T0);
      const float dw = _cvtsh_ss(w[r][b].d);
      for (int t = 0; t < T; ++t) {
        __m256 s = _mm256_cvtepi32_ps(dot_block_i32(w[r][b].qs, x[t][b].qs));
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

void gemm_f32(const GemmArgs& a, int64_t b, int64_t e) { gemm_driver<FloatTile<LoadF32>::Fn>(a, b, e); }
void gemm_f16(const GemmArgs& a, int64_t b, int64_t e) { gemm_driver<FloatTile<LoadF16>::Fn>(a, b, e); }
void gemm_bf16(const GemmArgs& a, int64_t b, int64_t e) { gemm_driver<FloatTile<LoadBF16>::Fn>(a, b, e); }
void gemm_q8_0(const GemmArgs& a, int64_t b, int64_t e) { gemm_driver<Q8Tile>(a, b, e); }

template <typename L>
float dot(const float* x, const void* bptr, int64_t n) {
  const auto* b = static_cast<const uint8_t*>(bptr);
  __m256 acc = _mm256_setzero_ps();
  const int64_t n8 = n & ~int64_t{7};
  for (int64_t i = 0; i < n8; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), L::load(b + i * L::kBytes), acc);
  if (n8 < n) {
    acc = _mm256_fmadd_ps(load_tail<LoadF32>(reinterpret_cast<const uint8_t*>(x + n8), n - n8),
                          load_tail<L>(b + n8 * L::kBytes, n - n8), acc);
  }
  return hsum256(acc);
}

template <typename L>
void axpy(float alpha, const void* xptr, float* y, int64_t n) {
  const auto* x = static_cast<const uint8_t*>(xptr);
  const __m256 av = _mm256_set1_ps(alpha);
  const int64_t n8 = n & ~int64_t{7};
  for (int64_t i = 0; i < n8; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, L::load(x + i * L::kBytes), _mm256_loadu_ps(y + i)));
  for (int64_t i = n8; i < n; ++i) {
    __m256 xv = load_tail<L>(x + i * L::kBytes, 1);
    y[i] = _mm_cvtss_f32(_mm_fmadd_ss(_mm256_castps256_ps128(av), _mm256_castps256_ps128(xv), _mm_set_ss(y[i])));
  }
}

}  // namespace

const IsaKernels kAvx2Kernels = {
    gemm_f32,      gemm_f16,      gemm_bf16,      gemm_q8_0,
    dot<LoadF32>,  dot<LoadF16>,  dot<LoadBF16>,
    axpy<LoadF32>, axpy<LoadF16>, axpy<LoadBF16>,
};

}  // namespace tandem::kernels
