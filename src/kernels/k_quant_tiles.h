// The q4_K, q5_K and q6_K GEMM tiles (k_quants.h), shared by the AVX2 and AVX-512
// variants: included by each inside its own anonymous namespace (see
// gemm_driver.h), after its hsum256, with a DotLanes policy for the one step
// the two do differently.
//
// Per activation block of 32 the product is an exact int32 sum, computed as
// eight int32 lanes of four products each: vpdpbusd on AVX-512 VNNI,
// vpmaddubsw + vpmaddwd on AVX2 (no pair can saturate: weights are at most
// 63, activations at most 127 in magnitude), the same integers either way.
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

// The scales of the eight activation blocks of one 256-element block.
inline __m256 block_scales(const BlockQ8_0Act* x) {
  return _mm256_setr_ps(x[0].d, x[1].d, x[2].d, x[3].d, x[4].d, x[5].d, x[6].d, x[7].d);
}

inline __m256 f16_broadcast(uint16_t h) { return _mm256_set1_ps(_cvtsh_ss(h)); }

// Eight bytes as eight floats.
inline __m256 u8x8_to_ps(uint64_t bytes) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(bytes))));
}

// One q4_K or q5_K block unpacked: q by sub-block, d * scale_j and dmin * min_j.
struct Q4KRow {
  __m256i q[8];
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

struct Q4KUnpack {
  using Block = BlockQ4_K;
  static constexpr int64_t kChunk = kQ4KChunkBytes;
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

// Prefetches the block `ahead` bytes past b (chunk bytes long) for a decode tile.
inline void prefetch_block(const void* b, int64_t ahead, int64_t chunk) {
  for (int64_t off = 0; off < chunk; off += 64) _mm_prefetch(prefetch_address(b, ahead + off), _MM_HINT_T0);
}

constexpr int64_t kKQuantPrefetchBlocks = 4;

// q4_K and q5_K (Unpack: Q4KUnpack, Q5KUnpack).
template <typename Dot, typename Unpack, int R, int T>
inline void tile_q45_k(const GemmArgs& a, int64_t r0, int64_t t0) {
  constexpr int64_t kChunk = Unpack::kChunk;
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  const uint8_t* w[R];
  for (int r = 0; r < R; ++r) w[r] = gemm_row(a, r0 + r, kChunk);
  const BlockQ8_0Act* x[T];
  for (int t = 0; t < T; ++t) x[t] = a.xq + (t0 + t) * a.ldxq;
  const int64_t n_super = a.k / kSuperBlock;
  const int64_t stride = kChunk * a.w_group;
  const __m256i ones = _mm256_set1_epi8(1);
  for (int64_t s = 0; s < n_super; ++s) {
    // Per token: the blocks' scales dx, and dx times the sum of each block's
    // values (what the mins multiply).
    __m256 dx[T], dx_sum[T];
    for (int t = 0; t < T; ++t) {
      const BlockQ8_0Act* xs = x[t] + 8 * s;
      __m256i v[8];
      for (int j = 0; j < 8; ++j) v[j] = Dot::lanes(ones, load_x(xs[j]));
      dx[t] = block_scales(xs);
      dx_sum[t] = _mm256_mul_ps(_mm256_cvtepi32_ps(sum_lanes8(v)), dx[t]);
    }
    for (int r = 0; r < R; ++r) {
      const auto* b = reinterpret_cast<const typename Unpack::Block*>(w[r] + s * stride);
      if constexpr (T == 1) prefetch_block(b, kKQuantPrefetchBlocks * stride, kChunk);
      Q4KRow q;
      Unpack::unpack(b, q);
      for (int t = 0; t < T; ++t) {
        const BlockQ8_0Act* xs = x[t] + 8 * s;
        __m256i v[8];
        for (int j = 0; j < 8; ++j) v[j] = Dot::lanes(q.q[j], load_x(xs[j]));
        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum_lanes8(v)), _mm256_mul_ps(q.scale, dx[t]), acc[r][t]);
        acc[r][t] = _mm256_fnmadd_ps(q.min, dx_sum[t], acc[r][t]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) a.y[(t0 + t) * a.ldy + r0 + r] = hsum256(acc[r][t]);
}

// One q6_K block unpacked: q - 32 by activation block, its magnitude, and
// per block the two scales of its halves as 16 int16 (8 of each).
struct Q6KRow {
  __m256i q[8], q_abs[8], scales[8];
  __m256 d;
};

inline void unpack_q6_k(const BlockQ6_K* b, Q6KRow& w) {
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
  // Scales as int16 pairs (s[2k], s[2k+1]) in int32 lane k; block k takes
  // lane k everywhere, then its first int16 in the low half, the second in the high.
  const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b->scales)));
  const __m256i halves = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,  //
                                          2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
  for (int k = 0; k < 8; ++k) {
    w.q[k] = _mm256_sub_epi8(w.q[k], offset);
    w.q_abs[k] = _mm256_abs_epi8(w.q[k]);
    w.scales[k] = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(sc16, _mm256_set1_epi32(k)), halves);
  }
  w.d = f16_broadcast(b->d);
}

template <int R, int T>
inline void tile_q6_k(const GemmArgs& a, int64_t r0, int64_t t0) {
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  const uint8_t* w[R];
  for (int r = 0; r < R; ++r) w[r] = gemm_row(a, r0 + r, kQ6KChunkBytes);
  const BlockQ8_0Act* x[T];
  for (int t = 0; t < T; ++t) x[t] = a.xq + (t0 + t) * a.ldxq;
  const int64_t n_super = a.k / kSuperBlock;
  const int64_t stride = kQ6KChunkBytes * a.w_group;
  for (int64_t s = 0; s < n_super; ++s) {
    __m256 dx[T];
    for (int t = 0; t < T; ++t) dx[t] = block_scales(x[t] + 8 * s);
    for (int r = 0; r < R; ++r) {
      const auto* b = reinterpret_cast<const BlockQ6_K*>(w[r] + s * stride);
      if constexpr (T == 1) prefetch_block(b, kKQuantPrefetchBlocks * stride, kQ6KChunkBytes);
      Q6KRow q;
      unpack_q6_k(b, q);
      for (int t = 0; t < T; ++t) {
        const BlockQ8_0Act* xs = x[t] + 8 * s;
        __m256i v[8];
        for (int k = 0; k < 8; ++k) {
          // |q| times x with q's sign: the products of (q - 32) and x, in pairs.
          const __m256i pairs = _mm256_maddubs_epi16(q.q_abs[k], _mm256_sign_epi8(load_x(xs[k]), q.q[k]));
          v[k] = _mm256_madd_epi16(pairs, q.scales[k]);
        }
        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum_lanes8(v)), _mm256_mul_ps(q.d, dx[t]), acc[r][t]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) a.y[(t0 + t) * a.ldy + r0 + r] = hsum256(acc[r][t]);
}

template <typename Dot, typename Unpack>
struct Q45KTile {
  template <int R, int T>
  struct Fn {
    static void run(const GemmArgs& a, int64_t r, int64_t t) { tile_q45_k<Dot, Unpack, R, T>(a, r, t); }
  };
};

template <int R, int T>
struct Q6KTile {
  static void run(const GemmArgs& a, int64_t r, int64_t t) { tile_q6_k<R, T>(a, r, t); }
};

// Prompt tiles of 4 rows x 2 tokens over 16-row blocks; decode tiles of 8
// rows (one interleaved group, a contiguous stream).
constexpr GemmPlan kKQuantPlan{4, 2, 8, 16, 128};

template <typename Dot>
void gemm_q4_k(const GemmArgs& a, int64_t b, int64_t e) {
  gemm_driver<Q45KTile<Dot, Q4KUnpack>::template Fn, kKQuantPlan>(a, b, e);
}
template <typename Dot>
void gemm_q5_k(const GemmArgs& a, int64_t b, int64_t e) {
  gemm_driver<Q45KTile<Dot, Q5KUnpack>::template Fn, kKQuantPlan>(a, b, e);
}
inline void gemm_q6_k(const GemmArgs& a, int64_t b, int64_t e) { gemm_driver<Q6KTile, kKQuantPlan>(a, b, e); }

}  // namespace
}  // namespace tandem::kernels
