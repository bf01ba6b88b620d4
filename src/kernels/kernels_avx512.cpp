// AVX-512 kernels (F/BW/VL/DQ, VNNI). Compiled only into this file; selected at
// run time when the CPU has them.
//
// Reduction order, fixed for every output element whatever the tile shape:
// on plain rows and chunk groups, one 16-lane accumulator, lane j sums k = j,
// j+16, j+32, ... in increasing k (the tail handled by a masked step), then
// _mm512_reduce_add_ps; on panels (see tile_panel), one chain over k: an FMA
// per k for f32/f16, a vdpbf16ps per k pair for bf16. Tiles of several rows
// and tokens only interleave independent accumulators, so a token's result
// never depends on what else is in the batch.
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <type_traits>
#include <utility>
#include <cstring>
#include <vector>

#include "kernels/gemm_driver.h"
#include "kernels/isa_kernels.h"
#include "util/error.h"

namespace tandem::kernels {
namespace {

// Decode reads each weight row once, so the GEMV is bound by how early the
// loads are issued: a software prefetch this many 64-byte chunks ahead of each
// row's stream (8 chunks = 512 bytes of a plain row) took batch-1 generation
// on the small F16 model from 32 to 46 tokens/s (256 bytes: 39, 1024: 45,
// 2048: 27). In an 8-row chunk group a chunk step is w_group lines; the
// panels' decode tiles have their own distances (kPanelPrefetchBytes,
// kBlockPanelPrefetchBytes).
constexpr int64_t kPrefetchLines = 8;

// The Q8_0 decode tile (one stream of an 8-row group) fetches further ahead,
// 32 x 64 x w_group bytes (16 KB of the group's stream, about 60 blocks), and
// into L2 only (small Q8_0
// tg128, medians of 5 alternating pairs: 16 steps +2 % against 8, 32 steps
// +3 % against 16; into L2 instead of L1, +11 % and +14 % in two sets, 9 of
// 10 pairs faster).
constexpr int64_t kQ8PrefetchLines = 32;

// A float panel's decode tile fetches each of its streams this far ahead
// (small F16 tg64, alternating pairs on a host whose bandwidth other tenants
// were taking: 8 streams 2 KB ahead against 4 streams 512 bytes ahead, median
// ratio 1.17 for F16 and 1.08 for F32; on the quiet host within noise; 4
// streams 2 KB ahead, kPanelPlan, later beat 8).
// Panels laid side by side for one sequential stream that the hardware
// prefetcher leads were measured too: 0.61-0.74 of this on the same host.
constexpr int64_t kPanelPrefetchBytes = 2048;

// The block panels' decode tiles of one group (one stream per thread: a
// thread's last groups short of kBlockPanelDecodeGroups) fetch it this far
// ahead; tiles of several fetch each kBlockPanelStreamPrefetchBytes ahead.
// A stream of cold matmuls of 1024 columns on 2 threads, with the prefetch
// into L1, 10 alternating rounds, against 4096 bytes: 1024 rows, q4_0
// 1.033, q8_0 0.982, q4_K 1.041, q5_K 1.087, q6_K 1.068 (8192: 1.025,
// 1.000, 1.028, 1.059, 1.034); 2816 rows at 8192: 0.966-1.090 against
// 4096. With the prefetch into L2, on a 2-core Intel Xeon VM, decode tiles
// of one group, small Q4_K_M / Q4_0 tg64 against 6144, 3 alternating
// rounds: 1024 bytes 0.71 / 0.72, 2048 0.81 / 0.82, 3072 0.91 / 0.92, 8192
// 1.04 / 0.97, 12288 0.98 / 0.98, 16384 1.02 / 0.99. (Tiles of four
// streams: 2 KB ahead each; 4 KB measured 1.003 on Q4_K_M.)
constexpr int64_t kBlockPanelPrefetchBytes = 6144;
constexpr int64_t kBlockPanelStreamPrefetchBytes = 2048;

// A decode tile of R > w_group rows streams R / w_group interleaved groups
// side by side, and the next tile's groups follow in memory. A stream's
// prefetch that runs past the end of its own group would land in the tile's
// next group, which is being read already; skipping the tile's other groups
// sends it to the matching group of the next tile instead, so that tile does
// not start cold.
inline int64_t prefetch_skip(const GemmArgs& a, int rows) {
  return a.w_group > 1 && rows > a.w_group ? (rows / a.w_group - 1) * a.w_group * static_cast<int64_t>(a.w_row_bytes)
                                           : 0;
}

// 16 elements at p (load) or the first elements selected by m (load_tail), as f32.
struct LoadF32 {
  static constexpr int kBytes = 4;
  static __m512 load(const uint8_t* p) { return _mm512_loadu_ps(p); }
  static __m512 load_tail(const uint8_t* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
};

struct LoadF16 {
  static constexpr int kBytes = 2;
  static __m512 load(const uint8_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static __m512 load_tail(const uint8_t* p, __mmask16 m) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }
};

struct LoadBF16 {
  static constexpr int kBytes = 2;
  static __m512 widen(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static __m512 load(const uint8_t* p) { return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static __m512 load_tail(const uint8_t* p, __mmask16 m) { return widen(_mm256_maskz_loadu_epi16(m, p)); }
};


// _mm512_reduce_add_ps of four registers at once, bitwise the same: the same
// pairwise tree (element j + j+8, then + j+4, then + j+2, then + j+1), with
// each level's shuffles shared by the four. Returns {sum a, sum b, sum c, sum d}.
inline __m128 reduce_add_4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(3, 2, 3, 2)));
  __m512 s = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)),
                           _mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));
  s = _mm512_add_ps(s, _mm512_permute_ps(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm512_add_ps(s, _mm512_permute_ps(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), s));
}

// Stores the tile's sums: four rows of a token at once where the tile has them.
template <int R, int T>
inline void store_tile(const GemmArgs& a, int64_t r0, int64_t t0, __m512 (&acc)[R][T]) {
  for (int t = 0; t < T; ++t) {
    float* y = a.y + (t0 + t) * a.ldy + r0;
    int r = 0;
    for (; r + 4 <= R; r += 4) _mm_storeu_ps(y + r, reduce_add_4(acc[r][t], acc[r + 1][t], acc[r + 2][t], acc[r + 3][t]));
    for (; r < R; ++r) y[r] = _mm512_reduce_add_ps(acc[r][t]);
  }
}

template <typename L, int R, int T>
inline void tile_float(const GemmArgs& a, int64_t r0, int64_t t0) {
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  const uint8_t* w[R];
  for (int r = 0; r < R; ++r) w[r] = gemm_row(a, r0 + r, kFloatChunkBytes);
  const float* x[T];
  for (int t = 0; t < T; ++t) x[t] = a.x + (t0 + t) * a.ldx;
  const int64_t prefetch = kPrefetchLines * kFloatChunkBytes * a.w_group;
  const int64_t skip = prefetch_skip(a, R);
  const int64_t group_bytes = a.w_group * static_cast<int64_t>(a.w_row_bytes);
  const int64_t k16 = a.k & ~int64_t{15};
  for (int64_t k = 0; k < k16; k += 16) {
    __m512 xv[T];
    for (int t = 0; t < T; ++t) xv[t] = _mm512_loadu_ps(x[t] + k);
    const size_t off = float_offset(a, L::kBytes * k);
    for (int r = 0; r < R; ++r) {
      if constexpr (T == 1) prefetch_ahead(w[r], static_cast<int64_t>(off) + prefetch, group_bytes, skip);
      __m512 wv = L::load(w[r] + off);
      for (int t = 0; t < T; ++t) acc[r][t] = _mm512_fmadd_ps(wv, xv[t], acc[r][t]);
    }
  }
  if (k16 < a.k) {
    const __mmask16 m = static_cast<__mmask16>((1u << (a.k - k16)) - 1u);
    __m512 xv[T];
    for (int t = 0; t < T; ++t) xv[t] = _mm512_maskz_loadu_ps(m, x[t] + k16);
    for (int r = 0; r < R; ++r) {
      __m512 wv = L::load_tail(w[r] + float_offset(a, L::kBytes * k16), m);
      for (int t = 0; t < T; ++t) acc[r][t] = _mm512_fmadd_ps(wv, xv[t], acc[r][t]);
    }
  }
  store_tile<R, T>(a, r0, t0, acc);
}

// Panels (GemmArgs): per k, one vector holds a group's 16 rows, multiplied by
// each token's activation broadcast: every output is one chain in plain k
// order. Against the chunked tiles above, each FMA needs about a third of the
// loaded bytes (f16, a 4 x 6 tile: 4 x 32 bytes of weights and 6 x 4 bytes of
// broadcasts per 24 FMAs, against 8 x 32 + 3 x 64 for the 8 x 3 tile),
// so a prompt's tiles run from L2 at 75-90 % of the FMA peak. What a step
// multiplies (P): f32/f16, one k by FMA; bf16, a pair of k by vdpbf16ps
// (the panel's chunks are the rows' pairs, the broadcast is the pair of
// activations).
template <typename L>
struct PanelFloat {
  static constexpr int kK = 1;  // k per step
  static constexpr int64_t kStepBytes = kPanelRows * L::kBytes;
  using X = float;
  using W = __m512;
  using B = __m512;
  static const X* x_row(const GemmArgs& a, int64_t t) { return a.x + t * a.ldx; }
  static W load(const uint8_t* p) { return L::load(p); }
  static B broadcast(const X* x) { return _mm512_set1_ps(*x); }
  static __m512 madd(__m512 acc, W w, B b) { return _mm512_fmadd_ps(w, b, acc); }
};

struct PanelBf16 {
  static constexpr int kK = 2;
  static constexpr int64_t kStepBytes = kPanelRows * 4;
  using X = uint16_t;
  using W = __m512bh;
  using B = __m512bh;
  static const X* x_row(const GemmArgs& a, int64_t t) { return a.xb + t * a.ldxb; }
  static W load(const uint8_t* p) { return (__m512bh)_mm512_loadu_si512(p); }
  static B broadcast(const X* x) {
    uint32_t pair;
    std::memcpy(&pair, x, 4);
    return (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
  }
  static __m512 madd(__m512 acc, W w, B b) { return _mm512_dpbf16_ps(acc, w, b); }
};

template <int G, int T>
inline void zero(__m512 (&acc)[G][T]) {
  for (int g = 0; g < G; ++g)
    for (int t = 0; t < T; ++t) acc[g][t] = _mm512_setzero_ps();
}

// A panel tile's sums: token t0 + t of group g0 + g's rows in acc[g][t], of
// which the job's rows are stored.
template <int G, int T>
inline void store_panel_tile(const GemmArgs& a, int64_t g0, int64_t t0, const PanelTileJob& job,
                             const __m512 (&acc)[G][T]) {
  for (int g = 0; g < G; ++g) {
    const auto [lo, hi] = stored_rows(job, g0 + g);
    const auto m = static_cast<__mmask16>(((1u << hi) - 1u) & ~((1u << lo) - 1u));
    for (int t = 0; t < T; ++t) _mm512_mask_storeu_ps(a.y + (t0 + t) * a.ldy + (g0 + g) * kPanelRows, m, acc[g][t]);
  }
}

template <typename P, int G, int T>
inline void tile_panel(const GemmArgs& a, int64_t g0, int64_t t0, const PanelTileJob& job) {
  __m512 acc[G][T];
  zero(acc);
  const int64_t group_bytes = kPanelRows * static_cast<int64_t>(a.w_row_bytes);
  const uint8_t* w = a.w + g0 * group_bytes;
  const typename P::X* x[T];
  for (int t = 0; t < T; ++t) x[t] = P::x_row(a, t0 + t);
  const uint8_t* pf = job.prefetch;
  int64_t pf_left = job.prefetch_lines;
  for (int64_t k = 0; k < a.k; k += P::kK) {
    const int64_t off = k / P::kK * P::kStepBytes;
    if constexpr (T == 1) {
      // Decode: each group is a stream; fetch ahead of it (past its end, into
      // the next tile's group rather than this tile's next one).
      if (off % 64 == 0)
        for (int g = 0; g < G; ++g)
          prefetch_ahead(w + g * group_bytes, off + kPanelPrefetchBytes, group_bytes, (G - 1) * group_bytes);
    } else if (pf_left > 0) {
      _mm_prefetch(reinterpret_cast<const char*>(pf), _MM_HINT_T0);
      pf += 64;
      --pf_left;
    }
    typename P::W wv[G];
    for (int g = 0; g < G; ++g) wv[g] = P::load(w + g * group_bytes + off);
    for (int t = 0; t < T; ++t) {
      const typename P::B b = P::broadcast(x[t] + k);
      for (int g = 0; g < G; ++g) acc[g][t] = P::madd(acc[g][t], wv[g], b);
    }
  }
  store_panel_tile(a, g0, t0, job, acc);
}

// Q8_0: per block an exact int32 dot product in 8 lanes (4 products each),
// converted to float and accumulated lane-wise with the block's scale, then a
// fixed horizontal sum.
inline __m256i dot_block_i32(const int8_t* wq, const int8_t* xq) {
  __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wq));
  __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
  // vpdpbusd multiplies unsigned by signed: move w's sign onto x.
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(wv), _mm256_sign_epi8(xv, wv));
}

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

// Tokens are taken in pairs, one per 256-bit half of a zmm register: one
// vpdpbusd, one conversion and one FMA serve two tokens. Each half computes
// exactly what the single-token path computes (the same int32 lane sums, the
// same float product dw * dx, the same FMA, the same final hsum256), so a
// token's result does not depend on whether it was paired.
// Decode (one token): rows are taken in pairs the same way, one row per half,
// against the token's block broadcast to both halves.
template <int R>
inline void tile_q8_0_rows(const GemmArgs& a, int64_t r0, int64_t t0) {
  static_assert(R % 2 == 0);
  __m512 acc[R / 2];
  for (int p = 0; p < R / 2; ++p) acc[p] = _mm512_setzero_ps();
  const uint8_t* w[R];
  for (int r = 0; r < R; ++r) w[r] = gemm_row(a, r0 + r, kQ8ChunkBytes);
  const BlockQ8_0Act* x = a.xq + t0 * a.ldxq;
  const int64_t n_blocks = a.k / 32;
  const size_t block_stride = static_cast<size_t>(kQ8ChunkBytes * a.w_group);
  const size_t prefetch = kQ8PrefetchLines * kFloatChunkBytes * static_cast<size_t>(a.w_group);
  // Lanes 0-7 take the first row's scale, lanes 8-15 the second's.
  const __m512i pair_lanes = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  const __m512i bias128 = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t b = 0; b < n_blocks; ++b) {
    const __m512i xv = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs)));
    // x + 128 as unsigned bytes: sum (x + 128) w - 128 sum w = sum x w, the
    // same exact int32 lane sums as the sign trick of the prompt tiles, in
    // three instructions per row pair instead of four.
    const __m512i x_biased = _mm512_xor_si512(xv, bias128);
    const __m512 dx = _mm512_set1_ps(x[b].d);
    for (int p = 0; p < R / 2; ++p) {
      const auto* b0 = reinterpret_cast<const BlockQ8_0*>(w[2 * p] + static_cast<size_t>(b) * block_stride);
      const auto* b1 = reinterpret_cast<const BlockQ8_0*>(w[2 * p + 1] + static_cast<size_t>(b) * block_stride);
      _mm_prefetch(prefetch_address(b0, static_cast<int64_t>(prefetch)), _MM_HINT_T1);
      _mm_prefetch(prefetch_address(b1, static_cast<int64_t>(prefetch)), _MM_HINT_T1);
      const __m512i wv =
          _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0->qs))),
                             _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b1->qs)), 1);
      const __m512i sum_w128 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias128, wv);
      const __m512 s = _mm512_cvtepi32_ps(
          _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), x_biased, wv), sum_w128));
      // Both scales widened by one conversion (exact, as _cvtsh_ss).
      const __m128i d_pair = _mm_insert_epi16(_mm_cvtsi32_si128(b0->d), b1->d, 1);
      const __m512 dw = _mm512_permutexvar_ps(pair_lanes, _mm512_castps128_ps512(_mm_cvtph_ps(d_pair)));
      acc[p] = _mm512_fmadd_ps(s, _mm512_mul_ps(dw, dx), acc[p]);
    }
  }
  for (int p = 0; p < R / 2; ++p) {
    a.y[t0 * a.ldy + r0 + 2 * p] = hsum256(_mm512_castps512_ps256(acc[p]));
    a.y[t0 * a.ldy + r0 + 2 * p + 1] = hsum256(_mm512_extractf32x8_ps(acc[p], 1));
  }
}

template <int R, int T>
inline void tile_q8_0_tokens(const GemmArgs& a, int64_t r0, int64_t t0);

template <int R, int T>
inline void tile_q8_0(const GemmArgs& a, int64_t r0, int64_t t0) {
  if constexpr (T == 1 && R % 2 == 0) {
    tile_q8_0_rows<R>(a, r0, t0);
  } else {
    tile_q8_0_tokens<R, T>(a, r0, t0);
  }
}

template <int R, int T>
inline void tile_q8_0_tokens(const GemmArgs& a, int64_t r0, int64_t t0) {
  constexpr int P = T / 2;
  constexpr bool kOdd = T % 2 == 1;
  __m512 acc2[R][P > 0 ? P : 1];
  __m256 acc1[R];
  for (int r = 0; r < R; ++r) {
    for (int p = 0; p < P; ++p) acc2[r][p] = _mm512_setzero_ps();
    acc1[r] = _mm256_setzero_ps();
  }
  const auto [w, x] = TileRows<R, T>(a, r0, t0, kQ8ChunkBytes);
  const int64_t n_blocks = a.k / 32;
  const size_t block_stride = static_cast<size_t>(kQ8ChunkBytes * a.w_group);
  const size_t prefetch = kPrefetchLines * kFloatChunkBytes * static_cast<size_t>(a.w_group);
  for (int64_t b = 0; b < n_blocks; ++b) {
    __m512i xp[P > 0 ? P : 1];
    __m512 dxp[P > 0 ? P : 1];
    for (int p = 0; p < P; ++p) {
      const BlockQ8_0Act& x0 = x[2 * p][b];
      const BlockQ8_0Act& x1 = x[2 * p + 1][b];
      xp[p] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x0.qs))),
                                 _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x1.qs)), 1);
      dxp[p] = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(x0.d)), _mm256_set1_ps(x1.d), 1);
    }
    for (int r = 0; r < R; ++r) {
      const auto* blk = reinterpret_cast<const BlockQ8_0*>(w[r] + static_cast<size_t>(b) * block_stride);
      if constexpr (T == 1) _mm_prefetch(prefetch_address(blk, static_cast<int64_t>(prefetch)), _MM_HINT_T0);
      const float dw = _cvtsh_ss(blk->d);
      if constexpr (P > 0) {
        const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->qs));
        const __m512i wabs = _mm512_broadcast_i64x4(_mm256_abs_epi8(wv));
        const __mmask64 wneg = _mm512_movepi8_mask(_mm512_broadcast_i64x4(wv));
        const __m512 dwv = _mm512_set1_ps(dw);
        for (int p = 0; p < P; ++p) {
          // x * sign(w) (where w is 0 the product is 0 either way).
          const __m512i xs = _mm512_mask_sub_epi8(xp[p], wneg, _mm512_setzero_si512(), xp[p]);
          const __m512 s = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), wabs, xs));
          acc2[r][p] = _mm512_fmadd_ps(s, _mm512_mul_ps(dwv, dxp[p]), acc2[r][p]);
        }
      }
      if constexpr (kOdd) {
        const BlockQ8_0Act& xl = x[T - 1][b];
        const __m256 s = _mm256_cvtepi32_ps(dot_block_i32(blk->qs, xl.qs));
        acc1[r] = _mm256_fmadd_ps(s, _mm256_set1_ps(dw * xl.d), acc1[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int p = 0; p < P; ++p) {
      a.y[(t0 + 2 * p) * a.ldy + r0 + r] = hsum256(_mm512_castps512_ps256(acc2[r][p]));
      a.y[(t0 + 2 * p + 1) * a.ldy + r0 + r] = hsum256(_mm512_extractf32x8_ps(acc2[r][p], 1));
    }
    if constexpr (kOdd) a.y[(t0 + T - 1) * a.ldy + r0 + r] = hsum256(acc1[r]);
  }
}

// BF16: vdpbf16ps adds two bf16 products per lane per instruction (32 per
// register), so the reduction is in steps of 32: lane j sums k = 2j, 2j+1,
// 2j+32, 2j+33, ... (the tail zero-masked), then _mm512_reduce_add_ps.
template <int R, int T>
inline void tile_bf16(const GemmArgs& a, int64_t r0, int64_t t0) {
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  const uint8_t* w[R];
  for (int r = 0; r < R; ++r) w[r] = gemm_row(a, r0 + r, kFloatChunkBytes);
  const uint16_t* x[T];
  for (int t = 0; t < T; ++t) x[t] = a.xb + (t0 + t) * a.ldxb;
  const int64_t k32 = a.k & ~int64_t{31};
  const int64_t chunk_stride = kFloatChunkBytes * a.w_group;
  const int64_t prefetch = kPrefetchLines * chunk_stride;
  const int64_t skip = prefetch_skip(a, R);
  const int64_t group_bytes = a.w_group * static_cast<int64_t>(a.w_row_bytes);
  for (int64_t k = 0; k < k32; k += 32) {
    __m512bh xv[T];
    for (int t = 0; t < T; ++t) xv[t] = (__m512bh)_mm512_loadu_si512(x[t] + k);
    const int64_t off = k / 32 * chunk_stride;  // 32 bf16 = one 64-byte chunk
    for (int r = 0; r < R; ++r) {
      if constexpr (T == 1) prefetch_ahead(w[r], off + prefetch, group_bytes, skip);
      const __m512bh wv = (__m512bh)_mm512_loadu_si512(w[r] + off);
      for (int t = 0; t < T; ++t) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], wv, xv[t]);
    }
  }
  if (k32 < a.k) {
    const __mmask32 m = static_cast<__mmask32>((uint64_t{1} << (a.k - k32)) - 1u);
    __m512bh xv[T];
    for (int t = 0; t < T; ++t) xv[t] = (__m512bh)_mm512_maskz_loadu_epi16(m, x[t] + k32);
    for (int r = 0; r < R; ++r) {
      const __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(m, w[r] + k32 / 32 * chunk_stride);
      for (int t = 0; t < T; ++t) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], wv, xv[t]);
    }
  }
  store_tile<R, T>(a, r0, t0, acc);
}

template <int R, int T>
struct Bf16Tile {
  static void run(const GemmArgs& a, int64_t r, int64_t t) { tile_bf16<R, T>(a, r, t); }
};

template <typename L>
struct FloatTile {
  template <int R, int T>
  struct Fn {
    static void run(const GemmArgs& a, int64_t r, int64_t t) { tile_float<L, R, T>(a, r, t); }
  };
};

template <typename P>
struct PanelTile {
  template <int G, int T>
  struct Fn {
    static void run(const GemmArgs& a, int64_t g, int64_t t, const PanelTileJob& job) { tile_panel<P, G, T>(a, g, t, job); }
  };
};

template <int R, int T>
struct Q8Tile {
  static void run(const GemmArgs& a, int64_t r, int64_t t) { tile_q8_0<R, T>(a, r, t); }
};

// Float types on plain rows (panels take the rest, below; these figures were
// measured when F16 came in 8-row chunk groups): decode tiles of 16 rows, two
// memory streams per thread (small F16 tg128 64-65 -> 68-71 tokens/s); prompt
// tiles of 8 rows x 3 tokens over 16-row blocks and 128-token blocks (one
// thread, small F16 gate/up 130 -> 160 GFLOP/s, BF16 222 -> 260, against
// 4 x 5 tiles over 32-row blocks; 4-row tiles measured slowest of all shapes
// even on L1-resident data).
constexpr GemmPlan kFloatPlan{8, 3, 16, 16, 128};
// Q8_0 pairs tokens, so its prompt tiles are 6 tokens wide (three pairs). Its
// decode tiles stay at 8 rows: 16 measured slower (small Q8_0 tg128 90-92
// against 110-124 tokens/s, three runs each, same session).
constexpr GemmPlan kQ8_0Plan{4, 6, 8, 32, 126};

// Panels: prompt tiles of 4 groups x 6 tokens (29 of the 32 registers), over
// 126-token blocks. On one thread, small F16 x64 gate/up 134-163 -> 175-199
// GFLOP/s, down 147-167 -> 182-215, against the chunked 8 x 3 tiles (two
// alternating runs each). Decode tiles of 4 groups, four memory streams each
// 2 KB ahead, as the block panels: one cold 268 MB F16 matrix on 2 threads
// streamed 79-84 % of the probe in tiles of 8 groups, 84-99 % in tiles of 4
// (alternating sets); small tg64 in alternating rounds, 4 against 8: F16
// 1.05, BF16 1.08, F32 1.01. (Tiles of 8 had measured 1.17 against 4
// groups fetched 512 bytes ahead, on a contended host.)
constexpr PanelPlan kPanelPlan{4, 6, 4, 128};

template <typename P, template <int, int> class ChunkTile>
void gemm_float(const GemmArgs& a, int64_t b, int64_t e) {
  if (is_panel(a, P::kStepBytes / kPanelRows)) {
    TANDEM_ASSERT(a.k % P::kK == 0, "bf16 panels need an even row length");
    panel_driver<PanelTile<P>::template Fn, kPanelPlan>(a, b, e);
  } else {
    gemm_driver<ChunkTile, kFloatPlan>(a, b, e);
  }
}

void gemm_f32(const GemmArgs& a, int64_t b, int64_t e) { gemm_float<PanelFloat<LoadF32>, FloatTile<LoadF32>::Fn>(a, b, e); }
void gemm_f16(const GemmArgs& a, int64_t b, int64_t e) { gemm_float<PanelFloat<LoadF16>, FloatTile<LoadF16>::Fn>(a, b, e); }
void gemm_bf16(const GemmArgs& a, int64_t b, int64_t e) { gemm_float<PanelBf16, Bf16Tile>(a, b, e); }
void gemm_q8_0(const GemmArgs& a, int64_t b, int64_t e) { gemm_driver<Q8Tile, kQ8_0Plan>(a, b, e); }

// quantize_q8_reference's blocks, 16 lanes at a time (see quantize_q8_avx2).
void quantize_q8_avx512(const float* x, BlockQ8_0Act* out, int32_t* sums, int64_t n) {
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  const __m512 inf = _mm512_set1_ps(std::numeric_limits<float>::infinity());
  for (int64_t b = 0; b < n / 32; ++b) {
    const __m512 lo = _mm512_loadu_ps(x + b * 32), hi = _mm512_loadu_ps(x + b * 32 + 16);
    const __m512 abs_lo = _mm512_and_ps(lo, abs_mask), abs_hi = _mm512_and_ps(hi, abs_mask);
    // Not below infinity: an infinity or a NaN.
    if ((_mm512_cmp_ps_mask(abs_lo, inf, _CMP_NLT_UQ) | _mm512_cmp_ps_mask(abs_hi, inf, _CMP_NLT_UQ)) != 0) {
      quantize_q8_nonfinite_block(out[b], sums != nullptr ? &sums[b] : nullptr);
      continue;
    }
    const float d = _mm512_reduce_max_ps(_mm512_max_ps(abs_lo, abs_hi)) / 127.0f;
    const __m512 id = _mm512_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
    const __m512i q_lo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, id)), q_hi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, id));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out[b].qs), _mm512_cvtsepi32_epi8(q_lo));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out[b].qs + 16), _mm512_cvtsepi32_epi8(q_hi));
    out[b].d = d;
    if (sums != nullptr) sums[b] = _mm512_reduce_add_epi32(_mm512_add_epi32(q_lo, q_hi));
  }
}

// The vector type of vector_algorithms.h.
struct Vec {
  using V = __m512;
  static constexpr int kWidth = 16;
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  // kWidth elements of a KV row of type T at p, as f32 (exact).
  template <DType T>
  static V load_kv(const uint8_t* p) { return load_kv_with<LoadF32, LoadF16, LoadBF16, T>(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V div(V a, V b) { return _mm512_div_ps(a, b); }
  static V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V max(V a, V b) { return _mm512_max_ps(a, b); }
  static float reduce_add(V v) { return _mm512_reduce_add_ps(v); }
  static float reduce_max(V v) { return _mm512_reduce_max_ps(v); }
  static float first(V v) { return _mm512_cvtss_f32(v); }
  // e^x: x = n ln2 + r with |r| <= ln2 / 2, e^r by Cephes' polynomial, then
  // scaled by 2^n. Inputs are clamped to where the result is a normal float.
  static V exp(V x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
    const V n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    V r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    V p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
  }
  // n f32 values to a KV row (f32, f16 or bf16), round to nearest even.
  static void narrow(DType t, const float* src, uint8_t* dst, int64_t n) {
    const int64_t n16 = n & ~int64_t{15};
    const __mmask16 m = static_cast<__mmask16>((1u << (n - n16)) - 1u);
    auto* d16 = reinterpret_cast<uint16_t*>(dst);
    switch (t) {
      case DType::kF16:
        for (int64_t i = 0; i < n16; i += 16)
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(d16 + i), _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        if (n16 < n)
          _mm256_mask_storeu_epi16(d16 + n16, m, _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, src + n16), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        return;
      case DType::kBF16:
        for (int64_t i = 0; i < n16; i += 16)
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(d16 + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(src + i)));
        if (n16 < n) _mm256_mask_storeu_epi16(d16 + n16, m, (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, src + n16)));
        return;
      default:
        std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
        return;
    }
  }
  // n elements of a KV row (f32, f16 or bf16) to f32.
  static void widen(DType t, const uint8_t* src, float* dst, int64_t n) {
    const int64_t n16 = n & ~int64_t{15};
    const __mmask16 m = static_cast<__mmask16>((1u << (n - n16)) - 1u);
    switch (t) {
      case DType::kF16:
        for (int64_t i = 0; i < n16; i += 16) _mm512_storeu_ps(dst + i, LoadF16::load(src + 2 * i));
        if (n16 < n) _mm512_mask_storeu_ps(dst + n16, m, LoadF16::load_tail(src + 2 * n16, m));
        return;
      case DType::kBF16:
        for (int64_t i = 0; i < n16; i += 16) _mm512_storeu_ps(dst + i, LoadBF16::load(src + 2 * i));
        if (n16 < n) _mm512_mask_storeu_ps(dst + n16, m, LoadBF16::load_tail(src + 2 * n16, m));
        return;
      default:
        for (int64_t i = 0; i < n16; i += 16) _mm512_storeu_ps(dst + i, LoadF32::load(src + 4 * i));
        if (n16 < n) _mm512_mask_storeu_ps(dst + n16, m, LoadF32::load_tail(src + 4 * n16, m));
        return;
    }
  }
};

}  // namespace
}  // namespace tandem::kernels

#include "kernels/block_panel_tile.h"
#include "kernels/k_quant_tiles.h"
#include "kernels/legacy_quant_tiles.h"
#include "kernels/vector_algorithms.h"

namespace tandem::kernels {
namespace {

struct DotLanes {
  static __m256i lanes(__m256i u, __m256i s) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s); }
};

// The 32-element types' decode tile: two rows per zmm (one per 256-bit
// half) against the token's block broadcast to both. vpdpbusd multiplies
// the unsigned codes, and code . x - offset * sum(x) is exactly the lane sums
// of the shared tile's w . x; the float steps per half are the shared tile's
// too (d * dx, then the min's m * dx), so the results are bitwise those of
// tile_legacy (and of AVX2), in about half the instructions per row.
template <typename F, int R>
inline void tile_legacy_rows(const GemmArgs& a, int64_t r0, int64_t t0) {
  static_assert(R % 2 == 0 && (F::kOffset == 0 || std::has_single_bit(static_cast<unsigned>(F::kOffset))));
  __m512 acc[R / 2];
  for (int p = 0; p < R / 2; ++p) acc[p] = _mm512_setzero_ps();
  const uint8_t* w[R];
  for (int r = 0; r < R; ++r) w[r] = gemm_row(a, r0 + r, F::kBytes);
  const BlockQ8_0Act* x = a.xq + t0 * a.ldxq;
  const int64_t n_blocks = a.k / 32;
  const int64_t stride = F::kBytes * a.w_group;
  const __m512i ones = _mm512_set1_epi8(1);
  // Lanes 0-7 take the first row's scale, lanes 8-15 the second's.
  const __m512i pair_lanes = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  const auto pair_f16 = [&](const uint8_t* p0, const uint8_t* p1) {
    uint16_t h0, h1;
    std::memcpy(&h0, p0, 2);
    std::memcpy(&h1, p1, 2);
    const __m128i pair = _mm_insert_epi16(_mm_cvtsi32_si128(h0), h1, 1);
    return _mm512_permutexvar_ps(pair_lanes, _mm512_castps128_ps512(_mm_cvtph_ps(pair)));
  };
  for (int64_t b = 0; b < n_blocks; ++b) {
    if constexpr (R == 8)
      if (b % 4 == 0) prefetch_block(w[0] + b * stride, kLegacyPrefetchBlocks * stride, 4 * stride);
    const __m512i xv = _mm512_broadcast_i64x4(load_x(x[b]));
    const __m512i xsum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, xv);
    // offset * sum(x): the offsets are powers of two.
    [[maybe_unused]] const __m512i xoff = _mm512_slli_epi32(xsum, std::countr_zero(static_cast<unsigned>(F::kOffset)));
    const __m512 dx = _mm512_set1_ps(x[b].d);
    for (int p = 0; p < R / 2; ++p) {
      const uint8_t* b0 = w[2 * p] + b * stride;
      const uint8_t* b1 = w[2 * p + 1] + b * stride;
      const __m512i codes = _mm512_inserti64x4(_mm512_castsi256_si512(F::codes(b0)), F::codes(b1), 1);
      __m512i lanes = _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes, xv);
      if constexpr (F::kOffset != 0) lanes = _mm512_sub_epi32(lanes, xoff);
      acc[p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lanes), _mm512_mul_ps(pair_f16(b0, b1), dx), acc[p]);
      if constexpr (F::kMin)
        acc[p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(xsum), _mm512_mul_ps(pair_f16(b0 + 2, b1 + 2), dx), acc[p]);
    }
  }
  for (int p = 0; p < R / 2; ++p) {
    a.y[t0 * a.ldy + r0 + 2 * p] = hsum256(_mm512_castps512_ps256(acc[p]));
    a.y[t0 * a.ldy + r0 + 2 * p + 1] = hsum256(_mm512_extractf32x8_ps(acc[p], 1));
  }
}

// The 32-element types' prompt tile: tokens in pairs, one per 256-bit half,
// against the row's codes broadcast to both; an odd last token takes a
// 256-bit step of the same arithmetic. Per token the same int32 lanes and
// float steps as tile_legacy, so bitwise its results.
template <typename F, int R, int T>
inline void tile_legacy_tokens(const GemmArgs& a, int64_t r0, int64_t t0) {
  constexpr int P = T / 2;
  constexpr bool kOdd = T % 2 == 1;
  constexpr int kShift = std::countr_zero(static_cast<unsigned>(F::kOffset));
  __m512 acc2[R][P > 0 ? P : 1];
  __m256 acc1[R];
  for (int r = 0; r < R; ++r) {
    for (int p = 0; p < P; ++p) acc2[r][p] = _mm512_setzero_ps();
    acc1[r] = _mm256_setzero_ps();
  }
  const auto [w, x] = TileRows<R, T>(a, r0, t0, F::kBytes);
  const int64_t n_blocks = a.k / 32;
  const int64_t stride = F::kBytes * a.w_group;
  for (int64_t b = 0; b < n_blocks; ++b) {
    __m512i xp[P > 0 ? P : 1], xoff[P > 0 ? P : 1];
    __m512 dxp[P > 0 ? P : 1], xsum_f[P > 0 ? P : 1];
    for (int p = 0; p < P; ++p) {
      const BlockQ8_0Act& x0 = x[2 * p][b];
      const BlockQ8_0Act& x1 = x[2 * p + 1][b];
      xp[p] = _mm512_inserti64x4(_mm512_castsi256_si512(load_x(x0)), load_x(x1), 1);
      const __m512i xs = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), xp[p]);
      xoff[p] = _mm512_slli_epi32(xs, kShift);
      xsum_f[p] = _mm512_cvtepi32_ps(xs);
      dxp[p] = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(x0.d)), _mm256_set1_ps(x1.d), 1);
    }
    [[maybe_unused]] __m256i x_last, xoff_last;
    [[maybe_unused]] __m256 xsum_last;
    if constexpr (kOdd) {
      x_last = load_x(x[T - 1][b]);
      const __m256i xs = DotLanes::lanes(_mm256_set1_epi8(1), x_last);
      xoff_last = _mm256_slli_epi32(xs, kShift);
      xsum_last = _mm256_cvtepi32_ps(xs);
    }
    for (int r = 0; r < R; ++r) {
      const uint8_t* blk = w[r] + b * stride;
      const __m256i codes = F::codes(blk);
      const float d = f16_at(blk);
      [[maybe_unused]] const float m = F::kMin ? f16_at(blk + 2) : 0.0f;
      if constexpr (P > 0) {
        const __m512i cb = _mm512_broadcast_i64x4(codes);
        const __m512 dv = _mm512_set1_ps(d);
        for (int p = 0; p < P; ++p) {
          __m512i lanes = _mm512_dpbusd_epi32(_mm512_setzero_si512(), cb, xp[p]);
          if constexpr (F::kOffset != 0) lanes = _mm512_sub_epi32(lanes, xoff[p]);
          acc2[r][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lanes), _mm512_mul_ps(dv, dxp[p]), acc2[r][p]);
          if constexpr (F::kMin)
            acc2[r][p] = _mm512_fmadd_ps(xsum_f[p], _mm512_mul_ps(_mm512_set1_ps(m), dxp[p]), acc2[r][p]);
        }
      }
      if constexpr (kOdd) {
        const float dx = x[T - 1][b].d;
        __m256i lanes = DotLanes::lanes(codes, x_last);
        if constexpr (F::kOffset != 0) lanes = _mm256_sub_epi32(lanes, xoff_last);
        acc1[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), _mm256_set1_ps(d * dx), acc1[r]);
        if constexpr (F::kMin) acc1[r] = _mm256_fmadd_ps(xsum_last, _mm256_set1_ps(m * dx), acc1[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int p = 0; p < P; ++p) {
      a.y[(t0 + 2 * p) * a.ldy + r0 + r] = hsum256(_mm512_castps512_ps256(acc2[r][p]));
      a.y[(t0 + 2 * p + 1) * a.ldy + r0 + r] = hsum256(_mm512_extractf32x8_ps(acc2[r][p], 1));
    }
    if constexpr (kOdd) a.y[(t0 + T - 1) * a.ldy + r0 + r] = hsum256(acc1[r]);
  }
}

template <typename F>
struct LegacyTile512 {
  template <int R, int T>
  struct Fn {
    static void run(const GemmArgs& a, int64_t r, int64_t t) {
      if constexpr (T == 1 && R % 2 == 0) {
        tile_legacy_rows<F, R>(a, r, t);
      } else if constexpr (T >= 2) {
        tile_legacy_tokens<F, R, T>(a, r, t);
      } else {
        tile_legacy<DotLanes, F, R, T>(a, r, t);
      }
    }
  };
};

// Prompt tiles of 4 rows x 6 tokens (three pairs), as Q8_0's.
constexpr GemmPlan kLegacyPlan{4, 6, 8, 32, 126};

template <int G, int T>
using BlockPanelTile = BlockPanelTileWith<G, T, kBlockPanelPrefetchBytes, kBlockPanelStreamPrefetchBytes>;

// Four activations at column c (elements 4c..4c+3) of a block, broadcast.
inline __m512i x_column(const BlockQ8_0Act& x, int c) { return _mm512_set1_epi32(x_column_lane(x, c)); }

// The 32-element types' panel tile (panels: legacy_quants.h; q8_0's too,
// its values + 128 as the codes): G groups of
// 16 rows x T tokens. A vector of 16 rows' 4 codes at one column of a block
// meets the token's 4 activations at that column broadcast (vpdpbusd), so
// each lane sums its row's exact integer dot product of the block, started
// at -offset * sum(x); then per block one FMA with d * dx (and, with a min,
// one of m with dx * sum(x)). Against
// the tiles of plain rows, a block costs its float steps once per 16 rows
// instead of once per row.
template <typename F, int G, int T>
inline void tile_legacy_panel(const GemmArgs& a, int64_t g0, int64_t t0, const PanelTileJob& job) {
  constexpr int64_t kPanelBytes = kLegacyPanelRows * F::kBytes;
  constexpr LegacyPanelLayout l = legacy_panel_layout(F::kType);
  BlockPanelTile<G, T> tile(a, g0, t0, job);
  const auto& x = tile.x;
  const auto& xs = tile.xs;
  __m512 acc[G][T];
  zero(acc);
  const int64_t n_blocks = a.k / 32;
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i bit4 = _mm512_set1_epi8(0x10);
  [[maybe_unused]] const __m512i bias128 = _mm512_set1_epi8(static_cast<char>(0x80));
  [[maybe_unused]] const __m512i levels =
      _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4NlBiasedLevels)));
  for (int64_t b = 0; b < n_blocks; ++b) {
    const int64_t off = b * kPanelBytes;
    tile.fetch(off, kPanelBytes);
    __m512i dot[G][T];
    for (int t = 0; t < T; ++t) {
      const __m512i start = _mm512_set1_epi32(-F::kOffset * xs[t][b]);
      for (int g = 0; g < G; ++g) dot[g][t] = start;
    }
    if constexpr (F::kType == DType::kQ8_0) {
      for (int j = 0; j < 8; ++j)
        for (int g = 0; g < G; ++g) {
          const __m512i codes = _mm512_xor_si512(_mm512_loadu_si512(tile.at(g, off + l.qs + 64 * j)), bias128);
          for (int t = 0; t < T; ++t) dot[g][t] = _mm512_dpbusd_epi32(dot[g][t], codes, x_column(x[t][b], j));
        }
    }
    for (int j = 0; j < (F::kType == DType::kQ8_0 ? 0 : 4); ++j) {
      for (int g = 0; g < G; ++g) {
        const uint8_t* pb = tile.at(g, off);
        const __m512i packed = _mm512_loadu_si512(pb + l.qs + 64 * j);
        __m512i lo, hi;
        if constexpr (l.qh >= 0) {
          // Bit 4 of each code from its mask: masks j and 4 + j mark the
          // low and high nibbles.
          uint64_t lo_bits, hi_bits;
          std::memcpy(&lo_bits, pb + l.qh + 8 * j, 8);
          std::memcpy(&hi_bits, pb + l.qh + 8 * (4 + j), 8);
          lo = _mm512_ternarylogic_epi32(packed, low4, _mm512_maskz_mov_epi8(_cvtu64_mask64(lo_bits), bit4), 0xEA);
          hi = _mm512_ternarylogic_epi32(_mm512_srli_epi16(packed, 4), low4, _mm512_maskz_mov_epi8(_cvtu64_mask64(hi_bits), bit4),
                                         0xEA);  // (nibble & 0x0F) | fifth
        } else {
          lo = _mm512_and_si512(packed, low4);
          hi = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low4);
        }
        if constexpr (F::kType == DType::kIQ4_NL) {
          lo = _mm512_shuffle_epi8(levels, lo);
          hi = _mm512_shuffle_epi8(levels, hi);
        }
        for (int t = 0; t < T; ++t) {
          dot[g][t] = _mm512_dpbusd_epi32(dot[g][t], lo, x_column(x[t][b], j));
          dot[g][t] = _mm512_dpbusd_epi32(dot[g][t], hi, x_column(x[t][b], 4 + j));
        }
      }
    }
    for (int g = 0; g < G; ++g) {
      const uint8_t* pb = tile.at(g, off);
      const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb + l.d)));
      [[maybe_unused]] __m512 m;
      if constexpr (F::kMin) m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb + l.m)));
      for (int t = 0; t < T; ++t) {
        const float dx = x[t][b].d;
        acc[g][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[g][t]), _mm512_mul_ps(d, _mm512_set1_ps(dx)), acc[g][t]);
        if constexpr (F::kMin)
          acc[g][t] = _mm512_fmadd_ps(m, _mm512_set1_ps(dx * static_cast<float>(xs[t][b])), acc[g][t]);
      }
    }
  }
  store_panel_tile(a, g0, t0, job, acc);
}

// q4_K's and q5_K's panel tile (panels: k_quants.h): G groups of 16 rows x
// T tokens, as the 32-element types' (tile_legacy_panel), per sub-block j
// of 32: each lane's exact integer dot product, then one FMA with (d *
// sc_j) * dx and one of -(dmin * m_j) with dx * sum(x). q5_K's fifth bits come from its qh vector of the column.
template <DType kType, int G, int T>
inline void tile_q45_k_panel(const GemmArgs& a, int64_t g0, int64_t t0, const PanelTileJob& job) {
  constexpr bool kQ5 = kType == DType::kQ5_K;
  constexpr int64_t kPanelBytes = kPanelRows * (kQ5 ? kQ5KChunkBytes : kQ4KChunkBytes);
  constexpr int64_t kQs = kQ5 ? kQ5KPanelQs : kQ4KPanelQs;
  constexpr int64_t kSubBlockBytes = kPanelBytes / 8;
  BlockPanelTile<G, T> tile(a, g0, t0, job);
  const auto& x = tile.x;
  const auto& xs = tile.xs;
  __m512 acc[G][T];
  zero(acc);
  const int64_t n_super = a.k / kSuperBlock;
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i low6 = _mm512_set1_epi32(63);
  const __m512i low4_32 = _mm512_set1_epi32(0x0F);
  const __m512i low2_32 = _mm512_set1_epi32(3);
  for (int64_t s = 0; s < n_super; ++s) {
    const int64_t off = s * kPanelBytes;
    __m512 d[G], dmin[G];
    __m512i sw[G][3];
    for (int g = 0; g < G; ++g) {
      const uint8_t* pb = tile.at(g, off);
      d[g] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb)));
      dmin[g] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb + 32)));
      for (int v = 0; v < 3; ++v) sw[g][v] = _mm512_loadu_si512(pb + kQ4KPanelScales + 64 * v);
    }
    for (int j = 0; j < 8; ++j) {
      tile.fetch(off + j * kSubBlockBytes, kSubBlockBytes);
      const int shift = 8 * (j % 4);
      __m512 dsc[G], dmm[G];
      for (int g = 0; g < G; ++g) {
        __m512i sc, m;
        if (j < 4) {
          sc = _mm512_and_si512(_mm512_srli_epi32(sw[g][0], shift), low6);
          m = _mm512_and_si512(_mm512_srli_epi32(sw[g][1], shift), low6);
        } else {
          const __m512i hi_sc = _mm512_and_si512(_mm512_srli_epi32(sw[g][0], shift + 6), low2_32);
          const __m512i hi_m = _mm512_and_si512(_mm512_srli_epi32(sw[g][1], shift + 6), low2_32);
          sc = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(sw[g][2], shift), low4_32), _mm512_slli_epi32(hi_sc, 4));
          m = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(sw[g][2], shift + 4), low4_32), _mm512_slli_epi32(hi_m, 4));
        }
        dsc[g] = _mm512_mul_ps(d[g], _mm512_cvtepi32_ps(sc));
        dmm[g] = _mm512_mul_ps(dmin[g], _mm512_cvtepi32_ps(m));
      }
      __m512i dot[G][T];
      for (int g = 0; g < G; ++g)
        for (int t = 0; t < T; ++t) dot[g][t] = _mm512_setzero_si512();
      for (int c = 0; c < 8; ++c) {
        for (int g = 0; g < G; ++g) {
          const __m512i packed = _mm512_loadu_si512(tile.at(g, off + kQs + 64 * (8 * (j / 2) + c)));
          __m512i codes = _mm512_and_si512(j % 2 == 0 ? packed : _mm512_srli_epi16(packed, 4), low4);
          if constexpr (kQ5) {
            // Bit j of each byte to bit 4 (16-bit shifts: what crosses a
            // byte is masked off), or'ed into the nibble.
            const __m512i qh = _mm512_loadu_si512(tile.at(g, off + kQ5KPanelQh + 64 * c));
            const __m512i fifth = j <= 4 ? _mm512_slli_epi16(qh, 4 - j) : _mm512_srli_epi16(qh, j - 4);
            codes = _mm512_ternarylogic_epi32(codes, fifth, _mm512_set1_epi8(0x10), 0xF8);  // codes | (fifth & 0x10)
          }
          for (int t = 0; t < T; ++t) dot[g][t] = _mm512_dpbusd_epi32(dot[g][t], codes, x_column(x[t][8 * s + j], c));
        }
      }
      for (int t = 0; t < T; ++t) {
        const float dx = x[t][8 * s + j].d;
        const __m512 dxv = _mm512_set1_ps(dx);
        const __m512 dx_sum = _mm512_set1_ps(dx * static_cast<float>(xs[t][8 * s + j]));
        for (int g = 0; g < G; ++g) {
          acc[g][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[g][t]), _mm512_mul_ps(dsc[g], dxv), acc[g][t]);
          acc[g][t] = _mm512_fnmadd_ps(dmm[g], dx_sum, acc[g][t]);
        }
      }
    }
  }
  store_panel_tile(a, g0, t0, job, acc);
}

// Block 4h + 3's codes from the top 2 bits of the half's vectors a, b, c:
// a >> 6 into bits 0-1, b >> 4 into 2-3, c >> 2 into 4-5. Shifting 16-bit
// lanes brings the next byte's low bits in above those bits; the two
// selects and the last mask drop them.
inline __m512i q6_k_fourth_code(__m512i a, __m512i b, __m512i c) {
  constexpr int kSelect = 0xE4;  // third operand ? first : second, bitwise
  const __m512i ab = _mm512_ternarylogic_epi32(_mm512_srli_epi16(a, 6), _mm512_srli_epi16(b, 4), _mm512_set1_epi8(0x03), kSelect);
  const __m512i abc = _mm512_ternarylogic_epi32(ab, _mm512_srli_epi16(c, 2), _mm512_set1_epi8(0x0F), kSelect);
  return _mm512_and_si512(abc, _mm512_set1_epi8(0x3F));
}

// Block 4h + i's codes at column c, from the half's code vectors at v.
inline __m512i q6_k_code(const uint8_t* v, int i) {
  if (i < 3) return _mm512_and_si512(_mm512_loadu_si512(v + 64 * i), _mm512_set1_epi8(0x3F));
  return q6_k_fourth_code(_mm512_loadu_si512(v), _mm512_loadu_si512(v + 64), _mm512_loadu_si512(v + 128));
}

// d * scale 2 k + e of q6_K block k for 16 rows: byte 2 (k % 2) + e of scales
// vector k / 2, sign-extended (read from the panel block when needed: kept
// in registers, a tile's scales would crowd out its accumulators).
inline __m512 q6_k_scale(const uint8_t* panel, int k, int e) {
  const int byte = 2 * (k % 2) + e;
  const __m512i sv = _mm512_loadu_si512(panel + kQ6KPanelScales + 64 * (k / 2));
  const __m512i sc = _mm512_srai_epi32(_mm512_sll_epi32(sv, _mm_cvtsi32_si128(24 - 8 * byte)), 24);
  const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + kQ6KPanelD)));
  return _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc));
}

// q6_K's panel tile (panels: k_quants.h): G groups of 16 rows x T tokens.
// Per 16-element half e of activation block k, each lane's exact integer
// dot product of its row's q (0..63) with x, started at -32 times the
// half's sum(x), then one FMA with (d * sc_{2k+e}) * dx; in the order h
// (the 128-element half of the block), e, then k = 4 h + i for i = 0, 2,
// 1, 3. A decode tile takes the four blocks of
// a half together, from the same three code vectors per column, two groups
// at a time (four blocks of four groups would not leave registers for the
// rest).
template <int G, int T>
inline void tile_q6_k_panel(const GemmArgs& a, int64_t g0, int64_t t0, const PanelTileJob& job) {
  constexpr int64_t kPanelBytes = kPanelRows * kQ6KChunkBytes;
  constexpr int64_t kQuarterBytes = kPanelBytes / 4;
  BlockPanelTile<G, T> tile(a, g0, t0, job);
  const auto& x = tile.x;
  const auto& xs = tile.xs;
  __m512 acc[G][T];
  zero(acc);
  const int64_t n_super = a.k / kSuperBlock;
  for (int64_t s = 0; s < n_super; ++s) {
    const int64_t off = s * kPanelBytes;
    // The half sums of every token's eight activation blocks: [t][k][e].
    int32_t half[T][8][2];
    for (int t = 0; t < T; ++t)
      for (int k = 0; k < 8; ++k) {
        half[t][k][0] = first_half_sum(x[t][8 * s + k]);
        half[t][k][1] = xs[t][8 * s + k] - half[t][k][0];
      }
    // Block k's dot products, started, and their FMAs.
    const auto start = [&](int k, int e, int t) { return _mm512_set1_epi32(-32 * half[t][k][e]); };
    const auto add = [&](int k, int e, int g, int t, __m512i dot) {
      const __m512 dx = _mm512_set1_ps(x[t][8 * s + k].d);
      acc[g][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(q6_k_scale(tile.at(g, off), k, e), dx), acc[g][t]);
    };
    // (h and e stay a loop: unrolled too, a block's four quarters streamed
    // 20 % slower from memory, though faster from cache.)
    for (int h = 0; h < 2; ++h) {
      for (int e = 0; e < 2; ++e) {
        tile.fetch(off + (2 * h + e) * kQuarterBytes, kQuarterBytes);
        if constexpr (T == 1) {
          static_assert(G == 1 || G % 2 == 0, "a decode tile takes its groups in pairs");
          for (int gp = 0; gp < G; gp += 2) {
            constexpr int kPair = G < 2 ? G : 2;
            __m512i dot[4][kPair];
            for (int i = 0; i < 4; ++i)
              for (int g = 0; g < kPair; ++g) dot[i][g] = start(4 * h + i, e, 0);
            unrolled<4>([&](auto c_) {
              const int c = 4 * e + decltype(c_)::value;
              __m512i xc[4];
              for (int i = 0; i < 4; ++i) xc[i] = x_column(x[0][8 * s + 4 * h + i], c);
              for (int g = 0; g < kPair; ++g) {
                const uint8_t* v = q6_k_code_vectors(tile.at(gp + g, off), h, c);
                const __m512i va = _mm512_loadu_si512(v), vb = _mm512_loadu_si512(v + 64), vc = _mm512_loadu_si512(v + 128);
                const __m512i low6 = _mm512_set1_epi8(0x3F);
                dot[0][g] = _mm512_dpbusd_epi32(dot[0][g], _mm512_and_si512(va, low6), xc[0]);
                dot[1][g] = _mm512_dpbusd_epi32(dot[1][g], _mm512_and_si512(vb, low6), xc[1]);
                dot[2][g] = _mm512_dpbusd_epi32(dot[2][g], _mm512_and_si512(vc, low6), xc[2]);
                dot[3][g] = _mm512_dpbusd_epi32(dot[3][g], q6_k_fourth_code(va, vb, vc), xc[3]);
              }
            });
            for (int g = 0; g < kPair; ++g)
              for (int i : {0, 2, 1, 3}) add(4 * h + i, e, gp + g, 0, dot[i][g]);
          }
        } else {
          for (int i : {0, 2, 1, 3}) {
            const int k = 4 * h + i;
            __m512i dot[G][T];
            for (int t = 0; t < T; ++t)
              for (int g = 0; g < G; ++g) dot[g][t] = start(k, e, t);
            unrolled<4>([&](auto c_) {
              const int c = 4 * e + decltype(c_)::value;
              for (int g = 0; g < G; ++g) {
                const __m512i code = q6_k_code(q6_k_code_vectors(tile.at(g, off), h, c), i);
                for (int t = 0; t < T; ++t) dot[g][t] = _mm512_dpbusd_epi32(dot[g][t], code, x_column(x[t][8 * s + k], c));
              }
            });
            for (int g = 0; g < G; ++g)
              for (int t = 0; t < T; ++t) add(k, e, g, t, dot[g][t]);
          }
        }
      }
    }
  }
  store_panel_tile(a, g0, t0, job, acc);
}

// q2_K's and q3_K's panel tile (panels: k_quants.h): G groups of 16 rows x
// T tokens. Per activation block k = 4c + j (sub-blocks 2k and 2k + 1, one
// per 16-element half h), each lane's exact integer sum over the block of
// scale * code * x, then one FMA with d * dx; q2_K adds one of -(dmin * dx)
// with the integer sum over the halves of min * sum(x).
//  - Codes are taken where they lie in the plane's bytes (bit pair j masked
//    in place, for q3_K with its high bit added above from a mask), so
//    they come out times 2^kQ23KCodeShift[q3][j]; dx is taken times its
//    inverse (a power of two: the same products).
//  - q2_K's two scale and min bytes come out of one byte shuffle; q3_K's 16
//    scales are unpacked into bytes once per block.
template <DType kType, int G, int T>
inline void tile_q23_k_panel(const GemmArgs& a, int64_t g0, int64_t t0, const PanelTileJob& job) {
  constexpr bool kQ3 = kType == DType::kQ3_K;
  constexpr int64_t kPanelBytes = kPanelRows * static_cast<int64_t>(kQ3 ? sizeof(BlockQ3_K) : sizeof(BlockQ2_K));
  constexpr int64_t kStepBytes = kPanelBytes / 8;  // (fetched per activation block)
  constexpr auto& kCodeShift = kQ23KCodeShift[kQ3 ? 1 : 0];
  BlockPanelTile<G, T> tile(a, g0, t0, job);
  const auto& x = tile.x;
  const auto& xs = tile.xs;
  __m512 acc[G][T];
  zero(acc);
  const int64_t n_super = a.k / kSuperBlock;
  const __m512i low4_32 = _mm512_set1_epi32(0x0F);
  for (int64_t s = 0; s < n_super; ++s) {
    const int64_t off = s * kPanelBytes;
    __m512 d[G], dmin[G];
    // q3_K: scale 4m + i (minus 32) of each row in byte i of its lane of scales[g][m].
    [[maybe_unused]] __m512i scales[G][4];
    for (int g = 0; g < G; ++g) {
      d[g] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile.at(g, off + (kQ3 ? kQ3KPanelD : kQ2KPanelD)))));
      if constexpr (!kQ3) {
        dmin[g] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile.at(g, off + kQ2KPanelDmin))));
      } else {
        // Scale is: low 4 bits from byte is % 8 (nibble is / 8), high 2 from
        // byte 8 + is % 4 (bits 2 (is / 4)).
        const __m512i low0 = _mm512_loadu_si512(tile.at(g, off + kQ3KPanelScales));
        const __m512i low1 = _mm512_loadu_si512(tile.at(g, off + kQ3KPanelScales + 64));
        const __m512i high = _mm512_loadu_si512(tile.at(g, off + kQ3KPanelScales + 128));
        const __m512i nibble = _mm512_set1_epi8(0x0F), bits45 = _mm512_set1_epi8(0x30), minus = _mm512_set1_epi8(32);
        const __m512i lows[4] = {low0, low1, _mm512_srli_epi16(low0, 4), _mm512_srli_epi16(low1, 4)};
        const __m512i highs[4] = {_mm512_slli_epi16(high, 4), _mm512_slli_epi16(high, 2), high, _mm512_srli_epi16(high, 2)};
        for (int m = 0; m < 4; ++m)  // (lows & 0x0F) | (highs & 0x30), minus 32
          scales[g][m] = _mm512_sub_epi8(_mm512_ternarylogic_epi32(_mm512_and_si512(lows[m], nibble), highs[m], bits45, 0xF8), minus);
      }
    }
    // (Unrolled: with k a variable, a block's offsets and masks took more
    // instructions than its products.)
    unrolled<8>([&](auto k_constant) {
      constexpr int k = k_constant, c = k / 4, j = k % 4;
      tile.fetch(off + k * kStepBytes, kStepBytes);
      // Each token's sum(x) over the two halves.
      int32_t half[T][2];
      for (int t = 0; t < T; ++t) {
        half[t][0] = first_half_sum(x[t][8 * s + k]);
        half[t][1] = xs[t][8 * s + k] - half[t][0];
      }
      // Each group's scales of the two halves (int32 lanes), and q2_K's
      // mins in the two 16-bit halves of each lane.
      __m512i sc[G][2];
      [[maybe_unused]] __m512i mins[G];
      for (int g = 0; g < G; ++g) {
        if constexpr (kQ3) {
          for (int h = 0; h < 2; ++h) {
            const int is = 2 * k + h, i = is % 4;  // (byte i of scales[g][is / 4], sign-extended)
            sc[g][h] = _mm512_srai_epi32(i == 3 ? scales[g][is / 4] : _mm512_slli_epi32(scales[g][is / 4], 24 - 8 * i), 24);
          }
        } else {
          // Bytes 2k % 4 and 2k % 4 + 1 of each lane (sub-blocks 2k and
          // 2k + 1) to bytes 0 and 2, zeros between.
          constexpr uint32_t b = 2 * (k % 2);
          const __m512i pick = _mm512_set1_epi32(static_cast<int32_t>(0x80008000u | b | (b + 1) << 16));
          const __m512i lane_base = _mm512_set_epi8(12, 12, 12, 12, 8, 8, 8, 8, 4, 4, 4, 4, 0, 0, 0, 0, 12, 12, 12, 12, 8, 8, 8, 8,
                                                    4, 4, 4, 4, 0, 0, 0, 0, 12, 12, 12, 12, 8, 8, 8, 8, 4, 4, 4, 4, 0, 0, 0, 0,
                                                    12, 12, 12, 12, 8, 8, 8, 8, 4, 4, 4, 4, 0, 0, 0, 0);
          const __m512i bytes = _mm512_shuffle_epi8(_mm512_loadu_si512(tile.at(g, off + kQ2KPanelScales + 64 * (k / 2))),
                                                    _mm512_or_si512(pick, lane_base));
          sc[g][0] = _mm512_and_si512(bytes, low4_32);
          sc[g][1] = _mm512_and_si512(_mm512_srli_epi32(bytes, 16), low4_32);
          mins[g] = _mm512_srli_epi16(bytes, 4);
        }
      }
      // Where code j lies in a plane byte: bits 2j, 2j + 1 (q3_K's fourth
      // code moved down to bits 2, 3), q3_K's high bit just above.
      constexpr int kLow = 2 * j - (kQ3 && j == 3 ? 4 : 0);
      const __m512i low_mask = _mm512_set1_epi8(static_cast<char>(3 << kLow));
      __m512i sum[G][T];
      for (int h = 0; h < 2; ++h) {
        __m512i dot[G][T];
        for (int g = 0; g < G; ++g)
          for (int t = 0; t < T; ++t)
            dot[g][t] = kQ3 ? _mm512_set1_epi32(-4 * half[t][h] * (1 << kCodeShift[j])) : _mm512_setzero_si512();
        for (int v = 0; v < 4; ++v) {
          __m512i xc[T];
          for (int t = 0; t < T; ++t) xc[t] = x_column(x[t][8 * s + k], 4 * h + v);
          for (int g = 0; g < G; ++g) {
            __m512i plane = _mm512_loadu_si512(tile.at(g, off + 64 * (8 * c + 4 * h + v)));
            if constexpr (kLow != 2 * j) plane = _mm512_srli_epi16(plane, 4);
            __m512i codes;
            if constexpr (kQ3) {
              // The high bits, as bit kLow + 2 of the codes they mark.
              uint64_t bits;
              std::memcpy(&bits, tile.at(g, off + kQ3KPanelHmask + 8 * (8 * k + 4 * h + v)), 8);
              const __m512i high = _mm512_maskz_mov_epi8(_cvtu64_mask64(bits), _mm512_set1_epi8(static_cast<char>(1 << (kLow + 2))));
              codes = _mm512_ternarylogic_epi32(plane, low_mask, high, 0xEA);  // (plane & low_mask) | high
            } else {
              codes = _mm512_and_si512(plane, low_mask);
            }
            for (int t = 0; t < T; ++t) dot[g][t] = _mm512_dpbusd_epi32(dot[g][t], codes, xc[t]);
          }
        }
        for (int g = 0; g < G; ++g)
          for (int t = 0; t < T; ++t) {
            const __m512i scaled = _mm512_mullo_epi32(dot[g][t], sc[g][h]);
            sum[g][t] = h == 0 ? scaled : _mm512_add_epi32(sum[g][t], scaled);
          }
      }
      for (int t = 0; t < T; ++t) {
        const float dx = x[t][8 * s + k].d;
        const __m512 dot_scale = _mm512_set1_ps(dx * code_scale_inverse(kCodeShift[j]));
        [[maybe_unused]] const __m512i half_sums = _mm512_set1_epi32(static_cast<int32_t>(
            (static_cast<uint32_t>(half[t][0]) & 0xFFFF) | static_cast<uint32_t>(half[t][1]) << 16));
        for (int g = 0; g < G; ++g) {
          acc[g][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[g][t]), _mm512_mul_ps(d[g], dot_scale), acc[g][t]);
          if constexpr (!kQ3)
            acc[g][t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(_mm512_madd_epi16(mins[g], half_sums)),
                                         _mm512_mul_ps(dmin[g], _mm512_set1_ps(dx)), acc[g][t]);
        }
      }
    });
  }
  store_panel_tile(a, g0, t0, job, acc);
}

// iq4_xs's panel tile (panels: k_quants.h): G groups of 16 rows x T
// tokens. Per sub-block j, each lane's exact integer dot product of its
// row's levels + 128 (a byte shuffle of the nibbles, as iq4_nl's) with x,
// started at -128 times sum(x), then one FMA with (d * (ls_j - 32)) * dx.
template <int G, int T>
inline void tile_iq4_xs_panel(const GemmArgs& a, int64_t g0, int64_t t0, const PanelTileJob& job) {
  constexpr int64_t kPanelBytes = kPanelRows * static_cast<int64_t>(sizeof(BlockIQ4_XS));
  constexpr int64_t kStepBytes = kPanelBytes / 8;
  BlockPanelTile<G, T> tile(a, g0, t0, job);
  const auto& x = tile.x;
  const auto& xs = tile.xs;
  __m512 acc[G][T];
  zero(acc);
  const int64_t n_super = a.k / kSuperBlock;
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i low4_32 = _mm512_set1_epi32(0x0F);
  const __m512i levels = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4NlBiasedLevels)));
  for (int64_t s = 0; s < n_super; ++s) {
    const int64_t off = s * kPanelBytes;
    __m512 d[G];
    __m512i scales_l[G], scales_h[G];
    for (int g = 0; g < G; ++g) {
      d[g] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile.at(g, off + kIQ4XSPanelD))));
      scales_l[g] = _mm512_loadu_si512(tile.at(g, off + kIQ4XSPanelScalesL));
      scales_h[g] = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile.at(g, off + kIQ4XSPanelScalesH))));
    }
    for (int j = 0; j < 8; ++j) {
      tile.fetch(off + j * kStepBytes, kStepBytes);
      __m512i dot[G][T];
      for (int t = 0; t < T; ++t) {
        const __m512i start = _mm512_set1_epi32(-128 * xs[t][8 * s + j]);
        for (int g = 0; g < G; ++g) dot[g][t] = start;
      }
      for (int v = 0; v < 4; ++v)
        for (int g = 0; g < G; ++g) {
          const __m512i packed = _mm512_loadu_si512(tile.at(g, off + 64 * (4 * j + v)));
          const __m512i lo = _mm512_shuffle_epi8(levels, _mm512_and_si512(packed, low4));
          const __m512i hi = _mm512_shuffle_epi8(levels, _mm512_and_si512(_mm512_srli_epi16(packed, 4), low4));
          for (int t = 0; t < T; ++t) {
            dot[g][t] = _mm512_dpbusd_epi32(dot[g][t], lo, x_column(x[t][8 * s + j], v));
            dot[g][t] = _mm512_dpbusd_epi32(dot[g][t], hi, x_column(x[t][8 * s + j], 4 + v));
          }
        }
      for (int g = 0; g < G; ++g) {
        // ls_j: nibble j % 2 of scales_l byte j / 2, and bits 2j, 2j+1 of scales_h as bits 4-5.
        const __m512i lo = _mm512_and_si512(_mm512_srli_epi32(scales_l[g], 8 * (j / 2) + 4 * (j % 2)), low4_32);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi32(scales_h[g], 2 * j), _mm512_set1_epi32(3));
        const __m512i ls = _mm512_sub_epi32(_mm512_or_si512(lo, _mm512_slli_epi32(hi, 4)), _mm512_set1_epi32(32));
        const __m512 dls = _mm512_mul_ps(d[g], _mm512_cvtepi32_ps(ls));
        for (int t = 0; t < T; ++t)
          acc[g][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[g][t]), _mm512_mul_ps(dls, _mm512_set1_ps(x[t][8 * s + j].d)), acc[g][t]);
      }
    }
  }
  store_panel_tile(a, g0, t0, job, acc);
}

// The panel tile of K type kType.
template <DType kType>
struct KQuantPanelTile {
  template <int G, int T>
  struct Fn {
    static void run(const GemmArgs& a, int64_t g, int64_t t, const PanelTileJob& job) {
      if constexpr (kType == DType::kQ2_K || kType == DType::kQ3_K) {
        tile_q23_k_panel<kType, G, T>(a, g, t, job);
      } else if constexpr (kType == DType::kQ4_K || kType == DType::kQ5_K) {
        tile_q45_k_panel<kType, G, T>(a, g, t, job);
      } else if constexpr (kType == DType::kQ6_K) {
        tile_q6_k_panel<G, T>(a, g, t, job);
      } else {
        static_assert(kType == DType::kIQ4_XS);
        tile_iq4_xs_panel<G, T>(a, g, t, job);
      }
    }
  };
};

template <typename F>
struct LegacyPanelTile {
  template <int G, int T>
  struct Fn {
    static void run(const GemmArgs& a, int64_t g, int64_t t, const PanelTileJob& job) {
      tile_legacy_panel<F, G, T>(a, g, t, job);
    }
  };
};

// Block panels: prompt tiles of 1 group x 8 tokens (8 int32 and 8 float
// accumulators); decode tiles of 4 groups, four memory streams a thread,
// each fetched kBlockPanelStreamPrefetchBytes ahead into L2. With the
// prefetch into L1, on the AMD EPYC VM, tiles of 1 group (one stream a
// thread, which the hardware prefetcher follows, 6 KB ahead) decoded the
// small Q4_K_M 1.31x, Q4_0 1.09x, Q6_K 1.21x as fast as 4 groups, but Q8_0
// 0.82x, so only q8_0 kept 4 groups. With the prefetch into L2
// (prefetch_ahead), on a 2-core Intel Xeon VM, small tg64 against 1 group,
// alternating rounds: Q4_K_M 1.076 (6 rounds; 2 groups 0.914, 8 groups
// 1.04 of 4 with 2 KB, 4 KB ahead 1.003), Q4_0 1.103 (4 rounds). (Not
// re-measured on the AMD VM with the prefetch into L2.) A thread's last
// groups short of four go in tiles of one (kBlockPanelPrefetchBytes ahead).
constexpr int kBlockPanelDecodeGroups = 4;
template <DType kType>
constexpr PanelPlan kBlockPanelPlan{1, 8, kBlockPanelDecodeGroups, 128};

// A block type's matmul: its panel tile where the weights are in panels,
// else ChunkGemm (the chunk-group and plain-row tiles). q8_0's panels, for
// one: per block 8 vectors of 16 rows' values against the token's
// activations broadcast, where its chunk-group tiles spend a conversion, a
// scale and an FMA per row pair and block.
template <template <int, int> class Tile, DType kType, void (*ChunkGemm)(const GemmArgs&, int64_t, int64_t)>
void gemm_block512(const GemmArgs& a, int64_t b, int64_t e) {
  if (is_panel_layout(kType, a.w_group)) {
    block_panel_driver<Tile, kBlockPanelPlan<kType>>(a, b, e);
  } else {
    ChunkGemm(a, b, e);
  }
}
template <typename F>
void gemm_legacy512(const GemmArgs& a, int64_t b, int64_t e) {
  gemm_block512<LegacyPanelTile<F>::template Fn, F::kType, gemm_driver<LegacyTile512<F>::template Fn, kLegacyPlan>>(a, b, e);
}
template <DType kType, void (*ChunkGemm)(const GemmArgs&, int64_t, int64_t)>
void gemm_k_quant512(const GemmArgs& a, int64_t b, int64_t e) {
  gemm_block512<KQuantPanelTile<kType>::template Fn, kType, ChunkGemm>(a, b, e);
}

}  // namespace

const IsaKernels kAvx512Kernels = {
    gemm_f32,
    gemm_f16,
    gemm_bf16,
    gemm_block512<LegacyPanelTile<Q8_0Format>::template Fn, DType::kQ8_0, gemm_q8_0>,
    gemm_k_quant512<DType::kQ4_K, gemm_q45_k_chunks<DotLanes, Q4KUnpack>>,
    gemm_k_quant512<DType::kQ6_K, gemm_q16_k<Q6KUnpack>>,
    gemm_legacy512<Q4_0Format>,
    gemm_legacy512<Q4_1Format>,
    gemm_legacy512<Q5_0Format>,
    gemm_legacy512<Q5_1Format>,
    gemm_legacy512<IQ4NLFormat>,
    gemm_k_quant512<DType::kQ5_K, gemm_q45_k_chunks<DotLanes, Q5KUnpack>>,
    gemm_k_quant512<DType::kQ2_K, gemm_q16_k<Q2KUnpack>>,
    gemm_k_quant512<DType::kQ3_K, gemm_q16_k<Q3KUnpack>>,
    gemm_k_quant512<DType::kIQ4_XS, gemm_q45_k_chunks<DotLanes, IQ4XSUnpack>>,
    attention_tile_vec,
    silu_mul_vec,
    Vec::narrow,
    delta_rule_vec,
    quantize_q8_avx512,
    log_sum_exp_vec,
};

}  // namespace tandem::kernels
