// The multiply-peak probe's inner loops, one per instruction (multiply_peak.h).
// Chain c of a loop starts at c in every lane and each iteration adds to
// every lane: 2^-10 (f32 loops: x * 1 + 2^-10), 2^-9 (bf16: two products of
// 2^-5 * 2^-5) or 8 (int8: four products of 1 * 2); a loop returns the sum of
// every chain's lanes, so a test can check that it did the multiplies it counts.
#pragma once

#include <cstdint>

namespace tandem::kernels {

constexpr int kMultiplyChainsScalar = 8;
constexpr int kMultiplyChainsAvx2F32 = 12;  // of 16 ymm registers, with the two operands
constexpr int kMultiplyChainsAvx2Int8 = 8;
constexpr int kMultiplyChainsAvx512 = 16;   // covers latency x throughput (4-5 x 2) of FMA and vpdpbusd

double multiply_loop_scalar_f32(int64_t iterations);
double multiply_loop_avx2_f32(int64_t iterations);
double multiply_loop_avx2_int8(int64_t iterations);
double multiply_loop_avx512_f32(int64_t iterations);
double multiply_loop_avx512_bf16(int64_t iterations);
double multiply_loop_avx512_int8(int64_t iterations);

}  // namespace tandem::kernels
