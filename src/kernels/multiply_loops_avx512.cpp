#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/multiply_loops.h"

namespace tandem::kernels {

namespace {

constexpr int kChains = kMultiplyChainsAvx512;

// Hides a value from the optimizer (no instruction), so a multiply by a
// known 1 is not folded into an add.
template <typename V>
V opaque(V v) {
  asm volatile("" : "+v"(v));
  return v;
}

// Each chain through `op` `iterations` times, the chains interleaved.
template <typename V, typename Op>
void run_chains(V (&acc)[kChains], int64_t iterations, Op op) {
  for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 16
    for (int c = 0; c < kChains; ++c) acc[c] = op(acc[c]);
  }
}

// The sum of every chain's lanes, read as Lane (float or int32).
template <typename Lane, typename V>
double sum_lanes(const V (&acc)[kChains]) {
  double s = 0;
  for (const V& v : acc) {
    Lane lanes[16];
    std::memcpy(lanes, &v, sizeof lanes);
    for (Lane x : lanes) s += x;
  }
  return s;
}

}  // namespace

double multiply_loop_avx512_f32(int64_t iterations) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c));
  const __m512 one = opaque(_mm512_set1_ps(1.0f)), step = opaque(_mm512_set1_ps(1.0f / 1024));
  run_chains(acc, iterations, [&](__m512 a) { return _mm512_fmadd_ps(a, one, step); });
  return sum_lanes<float>(acc);
}

double multiply_loop_avx512_bf16(int64_t iterations) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c));
  // 0x3d00 is 2^-5 in bf16.
  const __m512bh x = opaque((__m512bh)_mm512_set1_epi16(0x3d00));
  run_chains(acc, iterations, [&](__m512 a) { return _mm512_dpbf16_ps(a, x, x); });
  return sum_lanes<float>(acc);
}

double multiply_loop_avx512_int8(int64_t iterations) {
  __m512i acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_epi32(c);
  const __m512i u = opaque(_mm512_set1_epi8(1)), s = opaque(_mm512_set1_epi8(2));
  run_chains(acc, iterations, [&](__m512i a) { return _mm512_dpbusd_epi32(a, u, s); });
  return sum_lanes<int32_t>(acc);
}

}  // namespace tandem::kernels
