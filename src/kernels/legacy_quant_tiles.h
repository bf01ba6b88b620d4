// The GEMM tiles of the 32-element block types (legacy_quants.h: q4_0, q4_1,
// q5_0, q5_1, iq4_nl; and q8_0's panels), shared by the AVX2 and AVX-512 variants: included by
// each after k_quant_tiles.h (whose helpers it uses), inside its own
// anonymous namespace (see gemm_driver.h), with the same DotLanes policy.
//
// A block unpacks to 32 int8 values w in one vector. Per activation block
// the product sum(w x) is an exact int32 sum in eight lanes (the symmetric
// types move w's sign onto x, as the q8_0 tiles do; the types with a min
// have w >= 0 and multiply it directly), followed by one 8-lane FMA with
// d * dx and, with a min, one with m * dx on the lanes of sum(x). The same
// steps in both variants and in every tile: bitwise the same results, and
// batch invariance.
#pragma once

#include <immintrin.h>

#include <cstring>

#include "kernels/gemm_driver.h"
#include "kernels/isa_kernels.h"
#include "kernels/k_quant_tiles.h"
#include "kernels/legacy_quants.h"

namespace tandem::kernels {
namespace {  // NOLINT(google-build-namespaces): see gemm_driver.h

// Bit j of the 4 bytes at `bits_at` as `value` in byte j (0 where the bit is clear).
inline __m256i marked_bytes32(const uint8_t* bits_at, char value) {
  uint32_t bits;
  std::memcpy(&bits, bits_at, 4);
  // Byte j takes byte j / 8 of the bits, then tests its bit j % 8.
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(value));
}

// Bit j of the 4 bytes at qh as 0x10 in byte j (bit 4 of element j).
inline __m256i fifth_bits32(const uint8_t* qh) { return marked_bytes32(qh, 0x10); }

// iq4_nl's levels + 128 (all in [1, 241]): unsigned codes whose offset is 128.
inline constexpr uint8_t kIq4NlBiasedLevels[16] = {1, 24, 45, 63, 79, 93, 106, 118, 129, 141, 153, 166, 181, 197, 217, 241};

// The formats: block bytes, whether a min follows d, and the block's values
// as unsigned codes (w = code - kOffset; the types with a min have no offset).
struct Q4_0Format {
  static constexpr DType kType = DType::kQ4_0;
  static constexpr int64_t kBytes = sizeof(BlockQ4_0);
  static constexpr bool kMin = false;
  static constexpr int kOffset = 8;
  static __m256i codes(const uint8_t* b) { return nibbles32(b + 2); }
};
struct Q4_1Format {
  static constexpr DType kType = DType::kQ4_1;
  static constexpr int64_t kBytes = sizeof(BlockQ4_1);
  static constexpr bool kMin = true;
  static constexpr int kOffset = 0;
  static __m256i codes(const uint8_t* b) { return nibbles32(b + 4); }
};
struct Q5_0Format {
  static constexpr DType kType = DType::kQ5_0;
  static constexpr int64_t kBytes = sizeof(BlockQ5_0);
  static constexpr bool kMin = false;
  static constexpr int kOffset = 16;
  static __m256i codes(const uint8_t* b) { return _mm256_or_si256(nibbles32(b + 6), fifth_bits32(b + 2)); }
};
struct Q5_1Format {
  static constexpr DType kType = DType::kQ5_1;
  static constexpr int64_t kBytes = sizeof(BlockQ5_1);
  static constexpr bool kMin = true;
  static constexpr int kOffset = 0;
  static __m256i codes(const uint8_t* b) { return _mm256_or_si256(nibbles32(b + 8), fifth_bits32(b + 4)); }
};
struct IQ4NLFormat {
  static constexpr DType kType = DType::kIQ4_NL;
  static constexpr int64_t kBytes = sizeof(BlockIQ4_NL);
  static constexpr bool kMin = false;
  static constexpr int kOffset = 128;
  static __m256i codes(const uint8_t* b) {
    const __m128i levels = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4NlBiasedLevels));
    return _mm256_shuffle_epi8(_mm256_set_m128i(levels, levels), nibbles32(b + 2));
  }
};

// q8_0 in the panel tiles: its int8 values + 128 as the
// codes (its chunk-group tiles are its own, in each variant).
struct Q8_0Format {
  static constexpr DType kType = DType::kQ8_0;
  static constexpr int64_t kBytes = sizeof(BlockQ8_0);
  static constexpr bool kMin = false;
  static constexpr int kOffset = 128;
  static __m256i codes(const uint8_t* b) {
    return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2)), _mm256_set1_epi8(static_cast<char>(0x80)));
  }
};

// The signed values w of a block (the types with a min: its codes, >= 0).
template <typename F>
inline __m256i legacy_values(const uint8_t* b) {
  if constexpr (F::kOffset == 0) {
    return F::codes(b);
  } else {
    return _mm256_sub_epi8(F::codes(b), _mm256_set1_epi8(static_cast<char>(F::kOffset)));
  }
}

inline float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// A decode tile of one interleaved group streams its blocks contiguously:
// it prefetches this far ahead, four blocks' worth every fourth block.
constexpr int64_t kLegacyPrefetchBlocks = 16;

template <typename Dot, typename F, int R, int T>
inline void tile_legacy(const GemmArgs& a, int64_t r0, int64_t t0) {
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  const auto [w, x] = TileRows<R, T>(a, r0, t0, F::kBytes);
  const int64_t n_blocks = a.k / 32;
  const int64_t stride = F::kBytes * a.w_group;
  const __m256i ones = _mm256_set1_epi8(1);
  for (int64_t b = 0; b < n_blocks; ++b) {
    if constexpr (T == 1 && R == 8)
      if (b % 4 == 0) prefetch_block(w[0] + b * stride, kLegacyPrefetchBlocks * stride, 4 * stride);
    __m256i xv[T];
    __m256 xsum[T];
    float dx[T];
    for (int t = 0; t < T; ++t) {
      xv[t] = load_x(x[t][b]);
      dx[t] = x[t][b].d;
      if constexpr (F::kMin) xsum[t] = _mm256_cvtepi32_ps(Dot::lanes(ones, xv[t]));
    }
    for (int r = 0; r < R; ++r) {
      const uint8_t* blk = w[r] + b * stride;
      const __m256i q = legacy_values<F>(blk);
      const float d = f16_at(blk);
      if constexpr (F::kMin) {
        const float m = f16_at(blk + 2);
        for (int t = 0; t < T; ++t) {
          const __m256 s = _mm256_cvtepi32_ps(Dot::lanes(q, xv[t]));
          acc[r][t] = _mm256_fmadd_ps(s, _mm256_set1_ps(d * dx[t]), acc[r][t]);
          acc[r][t] = _mm256_fmadd_ps(xsum[t], _mm256_set1_ps(m * dx[t]), acc[r][t]);
        }
      } else {
        const __m256i q_abs = _mm256_abs_epi8(q);
        for (int t = 0; t < T; ++t) {
          const __m256 s = _mm256_cvtepi32_ps(Dot::lanes(q_abs, _mm256_sign_epi8(xv[t], q)));
          acc[r][t] = _mm256_fmadd_ps(s, _mm256_set1_ps(d * dx[t]), acc[r][t]);
        }
      }
    }
  }
  store_tile(a, r0, t0, acc);
}

template <typename Dot, typename F>
struct LegacyTile {
  template <int R, int T>
  struct Fn {
    static void run(const GemmArgs& a, int64_t r, int64_t t) { tile_legacy<Dot, F, R, T>(a, r, t); }
  };
};

// A 32-element type's chunk-group tiles.
template <typename Dot, typename F>
void gemm_legacy_chunks(const GemmArgs& a, int64_t b, int64_t e) {
  gemm_driver<LegacyTile<Dot, F>::template Fn, kKQuantPlan>(a, b, e);
}

}  // namespace
}  // namespace tandem::kernels
