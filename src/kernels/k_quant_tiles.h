// The GEMM tiles of the 256-element types (k_quants.h), shared by the AVX2 and AVX-512
// variants: included by each inside its own anonymous namespace (see
// gemm_driver.h), after its hsum256, with a DotLanes policy for the one step
// the two do differently.
//
// Per activation block of 32 the product is an exact int32 sum, computed as
// eight int32 lanes of four products each: vpdpbusd on AVX-512 VNNI,
// vpmaddubsw + vpmaddwd on AVX2 (no pair can saturate: weights and
// activations are at most 127 in magnitude), the same integers either way.
// The signed types move w's sign onto x first.
// The eight blocks of a 256-element block are then summed lane-wise into one
// vector whose lane j is block j's sum, and every float step after that is
// one 8-lane FMA chain per output, so a result is the same in both variants,
// in any tile, for any number of tokens (batch invariance).
#pragma once

#include <immintrin.h>

#include <cstring>

#include "kernels/gemm_driver.h"
#include "kernels/isa_kernels.h"
#include "kernels/k_quants.h"
#include "kernels/legacy_quants.h"
#include "kernels/ops.h"

namespace tandem::kernels {
namespace {  // NOLINT(google-build-namespaces): see gemm_driver.h

// Lane j of the result is the sum of v[j]'s eight lanes.
inline __m256i sum_lanes8(const __m256i v[8]) {
  const __m256i a0 = _mm256_hadd_epi32(v[0], v[1]);
  const __m256i a1 = _mm256_hadd_epi32(v[2], v[3]);
  const __m256i a2 = _mm256_hadd_epi32(v[4], v[5]);
  const __m256i a3 = _mm256_hadd_epi32(v[6], v[7]);
  // Per 128-bit half: lanes 0-3 of v0..v3 (low half), lanes 4-7 (high half).
  const __m256i b0 = _mm256_hadd_epi32(a0, a1);
  const __m256i b1 = _mm256_hadd_epi32(a2, a3);
  return _mm256_add_epi32(_mm256_permute2x128_si256(b0, b1, 0x20), _mm256_permute2x128_si256(b0, b1, 0x31));
}

inline __m256i load_x(const BlockQ8_0Act& x) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs)); }

// Writes each accumulator's sum: row r0 + r of token t0 + t.
template <int R, int T>
inline void store_tile(const GemmArgs& a, int64_t r0, int64_t t0, const __m256 (&acc)[R][T]) {
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) a.y[(t0 + t) * a.ldy + r0 + r] = hsum256(acc[r][t]);
}

// The scales of the eight activation blocks of one 256-element block.
inline __m256 block_scales(const BlockQ8_0Act* x) {
  return _mm256_setr_ps(x[0].d, x[1].d, x[2].d, x[3].d, x[4].d, x[5].d, x[6].d, x[7].d);
}

inline __m256 f16_broadcast(uint16_t h) { return _mm256_set1_ps(_cvtsh_ss(h)); }

// Eight bytes as eight floats.
inline __m256 u8x8_to_ps(uint64_t bytes) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(bytes))));
}

// The 16 bytes of nibbles as 32 bytes: element j's nibble in byte j (the
// order of iq4_nl's and iq4_xs's blocks of 32, and of the legacy types').
inline __m256i nibbles32(const uint8_t* qs) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i low = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), low), _mm_and_si128(v, low));
}

// iq4_nl's levels at the nibbles.
inline __m256i iq4_levels(__m256i nibbles) {
  const __m128i levels = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4NlLevels));
  return _mm256_shuffle_epi8(_mm256_set_m128i(levels, levels), nibbles);
}

// Bits [shift, shift + 2) of every byte (a 16-bit shift: what crosses the
// byte boundary is masked off).
inline __m256i two_bits(__m256i v, int shift) {
  return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(shift)), _mm256_set1_epi8(3));
}

// One block of q4_K, q5_K or iq4_xs unpacked: values by sub-block of 32
// (and their magnitudes, for the signed iq4_xs), the sub-blocks' scales
// and (q4_K, q5_K) dmin * min_j.
struct Q4KRow {
  __m256i q[8], q_abs[8];
  __m256 scale, min;
};

// The 6-bit scales and mins of q4_k_scale_min, four bytes at a time.
inline void unpack_scales_mins(const uint8_t* scales, uint16_t d, uint16_t dmin, Q4KRow& w) {
  uint32_t u[3];
  std::memcpy(u, scales, 12);
  const uint32_t sc_lo = u[0] & 0x3f3f3f3fu, mn_lo = u[1] & 0x3f3f3f3fu;
  const uint32_t sc_hi = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);
  const uint32_t mn_hi = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4);
  w.scale = _mm256_mul_ps(f16_broadcast(d), u8x8_to_ps(sc_lo | (uint64_t{sc_hi} << 32)));
  w.min = _mm256_mul_ps(f16_broadcast(dmin), u8x8_to_ps(mn_lo | (uint64_t{mn_hi} << 32)));
}

// The low nibbles of qs[32 c ..] are sub-block 2 c, the high ones 2 c + 1.
inline void unpack_nibbles(const uint8_t* qs, Q4KRow& w) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  for (int c = 0; c < 4; ++c) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * c));
    w.q[2 * c] = _mm256_and_si256(v, low);
    w.q[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
  }
}

// The unpackings (Block, kChunk, whether values are signed, whether mins follow).
struct Q4KUnpack {
  using Block = BlockQ4_K;
  static constexpr int64_t kChunk = kQ4KChunkBytes;
  static constexpr bool kSigned = false, kMins = true;
  static void unpack(const BlockQ4_K* b, Q4KRow& w) {
    unpack_nibbles(b->qs, w);
    unpack_scales_mins(b->scales, b->d, b->dmin, w);
  }
};

// q5_K: bit j of qh[l] is bit 4 of element l of sub-block j. A 16-bit shift
// by j moves bit j of both bytes to their bit 0 (the bits shifted across
// the byte boundary are masked off).
struct Q5KUnpack {
  using Block = BlockQ5_K;
  static constexpr int64_t kChunk = kQ5KChunkBytes;
  static constexpr bool kSigned = false, kMins = true;
  static void unpack(const BlockQ5_K* b, Q4KRow& w) {
    unpack_nibbles(b->qs, w);
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->qh));
    const __m256i one = _mm256_set1_epi8(1);
    for (int j = 0; j < 8; ++j) {
      const __m256i bit = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(j)), one);
      w.q[j] = _mm256_or_si256(w.q[j], _mm256_slli_epi16(bit, 4));
    }
    unpack_scales_mins(b->scales, b->d, b->dmin, w);
  }
};

struct IQ4XSUnpack {
  using Block = BlockIQ4_XS;
  static constexpr int64_t kChunk = kIQ4XSChunkBytes;
  static constexpr bool kSigned = true, kMins = false;
  static void unpack(const BlockIQ4_XS* b, Q4KRow& w) {
    alignas(32) int32_t ls[8];
    for (int j = 0; j < 8; ++j) {
      w.q[j] = iq4_levels(nibbles32(b->qs + 16 * j));
      w.q_abs[j] = _mm256_abs_epi8(w.q[j]);
      ls[j] = iq4_xs_scale(*b, j);
    }
    w.scale = _mm256_mul_ps(f16_broadcast(b->d),
                            _mm256_cvtepi32_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(ls))));
  }
};

// Prefetches the block `ahead` bytes past b (chunk bytes long) for a decode tile.
inline void prefetch_block(const void* b, int64_t ahead, int64_t chunk) {
  for (int64_t off = 0; off < chunk; off += 64) _mm_prefetch(prefetch_address(b, ahead + off), _MM_HINT_T0);
}

constexpr int64_t kKQuantPrefetchBlocks = 4;

// q4_K, q5_K and iq4_xs (Unpack: Q4KUnpack, Q5KUnpack, IQ4XSUnpack).
template <typename Dot, typename Unpack, int R, int T>
inline void tile_q45_k(const GemmArgs& a, int64_t r0, int64_t t0) {
  constexpr int64_t kChunk = Unpack::kChunk;
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  const auto [w, x] = TileRows<R, T>(a, r0, t0, kChunk);
  const int64_t n_super = a.k / kSuperBlock;
  const int64_t stride = kChunk * a.w_group;
  [[maybe_unused]] const __m256i ones = _mm256_set1_epi8(1);
  for (int64_t s = 0; s < n_super; ++s) {
    // Per token: the blocks' scales dx, and dx times the sum of each block's
    // values (what the mins multiply).
    __m256 dx[T];
    [[maybe_unused]] __m256 dx_sum[T];
    for (int t = 0; t < T; ++t) {
      const BlockQ8_0Act* xs = x[t] + 8 * s;
      dx[t] = block_scales(xs);
      if constexpr (Unpack::kMins) {
        __m256i v[8];
        for (int j = 0; j < 8; ++j) v[j] = Dot::lanes(ones, load_x(xs[j]));
        dx_sum[t] = _mm256_mul_ps(_mm256_cvtepi32_ps(sum_lanes8(v)), dx[t]);
      }
    }
    for (int r = 0; r < R; ++r) {
      const auto* b = reinterpret_cast<const typename Unpack::Block*>(w[r] + s * stride);
      if constexpr (T == 1) prefetch_block(b, kKQuantPrefetchBlocks * stride, kChunk);
      Q4KRow q;
      Unpack::unpack(b, q);
      for (int t = 0; t < T; ++t) {
        const BlockQ8_0Act* xs = x[t] + 8 * s;
        __m256i v[8];
        for (int j = 0; j < 8; ++j) {
          if constexpr (Unpack::kSigned) {
            v[j] = Dot::lanes(q.q_abs[j], _mm256_sign_epi8(load_x(xs[j]), q.q[j]));
          } else {
            v[j] = Dot::lanes(q.q[j], load_x(xs[j]));
          }
        }
        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum_lanes8(v)), _mm256_mul_ps(q.scale, dx[t]), acc[r][t]);
        if constexpr (Unpack::kMins) acc[r][t] = _mm256_fnmadd_ps(q.min, dx_sum[t], acc[r][t]);
      }
    }
  }
  store_tile(a, r0, t0, acc);
}

// One block of q2_K, q3_K or q6_K unpacked: values by activation block of
// 32 (and their magnitudes), per activation block the scales of its two
// 16-element halves as 16 int16 (8 of each), and for q2_K the mins likewise.
struct Q16Row {
  __m256i q[8], q_abs[8], scales[8], mins[8];
  __m256 d, dmin;
};

// 16 int8 scales as int16 pairs (s[2k], s[2k+1]) in int32 lane k; block k
// takes lane k everywhere, then its first int16 in the low half, the second
// in the high.
inline void pair_scales(const int8_t* s16, __m256i* out) {
  const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s16)));
  const __m256i halves = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,  //
                                          2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
  for (int k = 0; k < 8; ++k) out[k] = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(sc16, _mm256_set1_epi32(k)), halves);
}

struct Q6KUnpack {
  using Block = BlockQ6_K;
  static constexpr int64_t kChunk = kQ6KChunkBytes;
  static constexpr bool kSigned = true, kMins = false;
  static void unpack(const BlockQ6_K* b, Q16Row& w) {
    const __m256i low = _mm256_set1_epi8(0x0F), high = _mm256_set1_epi8(0x30), offset = _mm256_set1_epi8(32);
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->ql + 64 * h));
      const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->ql + 64 * h + 32));
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->qh + 32 * h));
      __m256i* q = w.q + 4 * h;
      q[0] = _mm256_or_si256(_mm256_and_si256(ql0, low), _mm256_and_si256(_mm256_slli_epi16(qh, 4), high));
      q[1] = _mm256_or_si256(_mm256_and_si256(ql1, low), _mm256_and_si256(_mm256_slli_epi16(qh, 2), high));
      q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low), _mm256_and_si256(qh, high));
      q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low),
                             _mm256_and_si256(_mm256_srli_epi16(qh, 2), high));
    }
    for (int k = 0; k < 8; ++k) {
      w.q[k] = _mm256_sub_epi8(w.q[k], offset);
      w.q_abs[k] = _mm256_abs_epi8(w.q[k]);
    }
    pair_scales(b->scales, w.scales);
    w.d = f16_broadcast(b->d);
  }
};

// q3_K: two low bits from the plane (BlockQ2_K's order), minus 4 unless the
// block's hmask bit is set.
struct Q3KUnpack {
  using Block = BlockQ3_K;
  static constexpr int64_t kChunk = kQ3KChunkBytes;
  static constexpr bool kSigned = true, kMins = false;
  static void unpack(const BlockQ3_K* b, Q16Row& w) {
    const __m256i hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->hmask));
    const __m256i one = _mm256_set1_epi8(1), four = _mm256_set1_epi8(4);
    for (int c = 0; c < 2; ++c) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->qs + 32 * c));
      for (int j = 0; j < 4; ++j) {
        const int k = 4 * c + j;
        const __m256i bit = _mm256_and_si256(_mm256_srl_epi16(hm, _mm_cvtsi32_si128(k)), one);
        w.q[k] = _mm256_sub_epi8(_mm256_or_si256(two_bits(v, 2 * j), _mm256_slli_epi16(bit, 2)), four);
        w.q_abs[k] = _mm256_abs_epi8(w.q[k]);
      }
    }
    int8_t scales[16];
    q3_k_scales(*b, scales);
    pair_scales(scales, w.scales);
    w.d = f16_broadcast(b->d);
  }
};

// q2_K: values 0..3 from the plane, 4-bit scales and mins.
struct Q2KUnpack {
  using Block = BlockQ2_K;
  static constexpr int64_t kChunk = kQ2KChunkBytes;
  static constexpr bool kSigned = false, kMins = true;
  static void unpack(const BlockQ2_K* b, Q16Row& w) {
    for (int c = 0; c < 2; ++c) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->qs + 32 * c));
      for (int j = 0; j < 4; ++j) w.q[4 * c + j] = two_bits(v, 2 * j);
    }
    int8_t scales[16], mins[16];
    for (int i = 0; i < 16; ++i) {
      scales[i] = static_cast<int8_t>(b->scales[i] & 0x0F);
      mins[i] = static_cast<int8_t>(b->scales[i] >> 4);
    }
    pair_scales(scales, w.scales);
    pair_scales(mins, w.mins);
    w.d = f16_broadcast(b->d);
    w.dmin = f16_broadcast(b->dmin);
  }
};

// q2_K, q3_K and q6_K (Unpack: Q2KUnpack, Q3KUnpack, Q6KUnpack). Per
// activation block the scales ride in the madd of the pairs: the products of
// q and x (w's sign moved onto x for the signed types), in pairs, times
// their half's scale; q2_K's mins likewise against the pairs of x.
template <typename Unpack, int R, int T>
inline void tile_q16_k(const GemmArgs& a, int64_t r0, int64_t t0) {
  constexpr int64_t kChunk = Unpack::kChunk;
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  const auto [w, x] = TileRows<R, T>(a, r0, t0, kChunk);
  const int64_t n_super = a.k / kSuperBlock;
  const int64_t stride = kChunk * a.w_group;
  [[maybe_unused]] const __m256i ones = _mm256_set1_epi8(1);
  for (int64_t s = 0; s < n_super; ++s) {
    __m256 dx[T];
    for (int t = 0; t < T; ++t) dx[t] = block_scales(x[t] + 8 * s);
    for (int r = 0; r < R; ++r) {
      const auto* b = reinterpret_cast<const typename Unpack::Block*>(w[r] + s * stride);
      if constexpr (T == 1) prefetch_block(b, kKQuantPrefetchBlocks * stride, kChunk);
      Q16Row q;
      Unpack::unpack(b, q);
      for (int t = 0; t < T; ++t) {
        const BlockQ8_0Act* xs = x[t] + 8 * s;
        __m256i v[8];
        [[maybe_unused]] __m256i m[8];
        for (int k = 0; k < 8; ++k) {
          const __m256i xk = load_x(xs[k]);
          __m256i pairs;
          if constexpr (Unpack::kSigned) {
            pairs = _mm256_maddubs_epi16(q.q_abs[k], _mm256_sign_epi8(xk, q.q[k]));
          } else {
            pairs = _mm256_maddubs_epi16(q.q[k], xk);
          }
          v[k] = _mm256_madd_epi16(pairs, q.scales[k]);
          if constexpr (Unpack::kMins) m[k] = _mm256_madd_epi16(_mm256_maddubs_epi16(ones, xk), q.mins[k]);
        }
        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum_lanes8(v)), _mm256_mul_ps(q.d, dx[t]), acc[r][t]);
        if constexpr (Unpack::kMins)
          acc[r][t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(sum_lanes8(m)), _mm256_mul_ps(q.dmin, dx[t]), acc[r][t]);
      }
    }
  }
  store_tile(a, r0, t0, acc);
}

template <typename Dot, typename Unpack>
struct Q45KTile {
  template <int R, int T>
  struct Fn {
    static void run(const GemmArgs& a, int64_t r, int64_t t) { tile_q45_k<Dot, Unpack, R, T>(a, r, t); }
  };
};

template <typename Unpack>
struct Q16KTile {
  template <int R, int T>
  struct Fn {
    static void run(const GemmArgs& a, int64_t r, int64_t t) { tile_q16_k<Unpack, R, T>(a, r, t); }
  };
};

// Prompt tiles of 4 rows x 2 tokens over 16-row blocks; decode tiles of 8
// rows (one interleaved group, a contiguous stream).
constexpr GemmPlan kKQuantPlan{4, 2, 8, 16, 128};

// q2_K's and q3_K's codes as their panel tiles read them: code j of a
// plane byte masked where it lies (bits 2j, 2j + 1; q3_K's fourth at bits
// 2, 3, with its high bit above) is the code times 2^kQ23KCodeShift[q3][j],
// so the block's float step takes dx times code_scale_inverse(shift) (a
// power of two: exact, the same product).
constexpr int kQ23KCodeShift[2][4] = {{0, 2, 4, 6}, {0, 2, 4, 2}};
constexpr float code_scale_inverse(int shift) { return 1.0f / static_cast<float>(1 << shift); }

// The chunk-group tiles of q4_K, q5_K and iq4_xs (vpdpbusd-shaped lanes).
template <typename Dot, typename Unpack>
void gemm_q45_k_chunks(const GemmArgs& a, int64_t b, int64_t e) {
  gemm_driver<Q45KTile<Dot, Unpack>::template Fn, kKQuantPlan>(a, b, e);
}
// The chunk-group tiles of q2_K, q3_K and q6_K: maddubs + madd in both
// variants, the scales riding in the madd.
template <typename Unpack>
void gemm_q16_k(const GemmArgs& a, int64_t b, int64_t e) {
  gemm_driver<Q16KTile<Unpack>::template Fn, kKQuantPlan>(a, b, e);
}

}  // namespace
}  // namespace tandem::kernels
