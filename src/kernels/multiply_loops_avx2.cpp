#include <immintrin.h>

#include "kernels/multiply_loops.h"

namespace tandem::kernels {

namespace {

template <typename V>
V opaque(V v) {
  asm volatile("" : "+x"(v));
  return v;
}

}  // namespace

double multiply_loop_avx2_f32(int64_t iterations) {
  constexpr int kChains = kMultiplyChainsAvx2F32;
  __m256 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(static_cast<float>(c));
  const __m256 one = opaque(_mm256_set1_ps(1.0f)), step = opaque(_mm256_set1_ps(1.0f / 1024));
  for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 16
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], one, step);
  }
  double s = 0;
  for (int c = 0; c < kChains; ++c) {
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, acc[c]);
    for (float v : lanes) s += v;
  }
  return s;
}

// The AVX2 block-type kernels' dot: vpmaddubsw (u8 x s8 pairs to s16), then
// vpmaddwd by ones (pairs to s32). Its operands do not depend on the chain,
// so each use re-hides one of them: otherwise the product is computed once.
double multiply_loop_avx2_int8(int64_t iterations) {
  constexpr int kChains = kMultiplyChainsAvx2Int8;
  __m256i acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_epi32(c);
  __m256i u = _mm256_set1_epi8(1);
  const __m256i s = opaque(_mm256_set1_epi8(2)), ones = opaque(_mm256_set1_epi16(1));
  for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 16
    for (int c = 0; c < kChains; ++c) {
      u = opaque(u);
      acc[c] = _mm256_add_epi32(acc[c], _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), ones));
    }
  }
  double sum = 0;
  for (int c = 0; c < kChains; ++c) {
    alignas(32) int32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc[c]);
    for (int32_t v : lanes) sum += v;
  }
  return sum;
}

}  // namespace tandem::kernels
