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
  static __m256 load(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
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

// A panel tile's float sums (store_panel_tile), zeroed. (A tile indexes
// its sums only through `unrolled`, which lets GCC keep them in registers.)
template <int G, int T>
inline void zero(__m256 (&acc)[G][2][T]) {
  unrolled<G, 2, T>([&](auto g, auto h, auto t) { acc[g][h][t] = _mm256_setzero_ps(); });
}

// A panel tile's sums: token t0 + t of group g0 + g's rows 0-7 in
// acc[g][0][t] and 8-15 in acc[g][1][t]; the rows the job stores.
template <int G, int T>
inline void store_panel_tile(const GemmArgs& a, int64_t g0, int64_t t0, const PanelTileJob& job,
                             const __m256 (&acc)[G][2][T]) {
  unrolled<G>([&](auto g) {
    const auto [lo, hi] = stored_rows(job, g0 + g);
    unrolled<T>([&](auto t) {
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
    });
  });
}

template <typename P, int G, int T>
inline void tile_panel(const GemmArgs& a, int64_t g0, int64_t t0, const PanelTileJob& job) {
  __m256 acc[G][2][T];
  zero(acc);
  const int64_t group_bytes = kPanelRows * static_cast<int64_t>(a.w_row_bytes);
  const uint8_t* w = a.w + g0 * group_bytes;
  const float* x[T];
  for (int t = 0; t < T; ++t) x[t] = a.x + (t0 + t) * a.ldx;
  constexpr int64_t kStep = kPanelRows * P::kChunkBytes;  // bytes of a group's chunk
  const auto step = [&](int64_t k, int64_t off) {
    __m256 wv[G][2];
    unrolled<G, 2>([&](auto g, auto h) { wv[g][h] = P::load(w + g * group_bytes + off + h * kStep / 2, k % P::kK); });
    unrolled<T>([&](auto t) {
      const __m256 b = _mm256_broadcast_ss(x[t] + k);
      unrolled<G, 2>([&](auto g, auto h) { acc[g][h][t] = _mm256_fmadd_ps(wv[g][h], b, acc[g][h][t]); });
    });
  };
  int64_t k = 0;
  if constexpr (T == 1) {
    for (; k < a.k; ++k) {
      const int64_t off = k / P::kK * kStep;
      if (off % 64 == 0 && k % P::kK == 0)
        for (int g = 0; g < G; ++g)
          _mm_prefetch(prefetch_address(w + g * group_bytes + off, kPrefetchLines * 64), _MM_HINT_T0);
      step(k, off);
    }
  } else {
    // The next panel's slice, a line a step, then the steps alone (with
    // the prefetch's branch in every step, GCC stored every accumulator
    // to the stack at every k).
    const uint8_t* pf = job.prefetch;
    for (; k < std::min(a.k, job.prefetch_lines); ++k, pf += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(pf), _MM_HINT_T0);
      step(k, k / P::kK * kStep);
    }
    for (; k < a.k; ++k) step(k, k / P::kK * kStep);
  }
  store_panel_tile(a, g0, t0, job, acc);
}

template <typename P>
struct PanelTile {
  template <int G, int T>
  struct Fn {
    static void run(const GemmArgs& a, int64_t g, int64_t t, const PanelTileJob& job) {
      tile_panel<P, G, T>(a, g, t, job);
    }
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

// Panels: prompt tiles of one group x 4 tokens (8 accumulators); decode
// tiles of two groups (two streams). Tiles of 6 tokens (12 accumulators,
// 15 of the 16 registers with the weights and a broadcast) had GCC store
// every accumulator to the stack at every k: small F16 pp64 on 2 threads
// 183-198 tokens/s against 241-254 with 4 tokens (1 x 5: 190-205; 2
// groups x 2 tokens and 1 x 3 within noise of 1 x 4).
constexpr PanelPlan kPanelPlan{1, 4, 2, 128};

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
  const __m256 inf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* xb = x + b * 32;
    __m256 v[4];
    for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(xb + 8 * i);
    __m256 a[4];
    for (int i = 0; i < 4; ++i) a[i] = _mm256_and_ps(v[i], abs_mask);
    // Not below infinity: an infinity or a NaN.
    const __m256 bad = _mm256_or_ps(
        _mm256_or_ps(_mm256_cmp_ps(a[0], inf, _CMP_NLT_UQ), _mm256_cmp_ps(a[1], inf, _CMP_NLT_UQ)),
        _mm256_or_ps(_mm256_cmp_ps(a[2], inf, _CMP_NLT_UQ), _mm256_cmp_ps(a[3], inf, _CMP_NLT_UQ)));
    if (_mm256_movemask_ps(bad) != 0) {
      quantize_q8_nonfinite_block(out[b], sums != nullptr ? &sums[b] : nullptr);
      continue;
    }
    __m256 m = _mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3]));
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
  static V load_kv(const uint8_t* p) {
    return load_kv_with<LoadF32, LoadF16, LoadBF16, T>(p);
  }
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
      for (; i < n; ++i)
        d16[i] = static_cast<uint16_t>(_cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
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

#include "kernels/block_panel_tile.h"
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

// The block panels' decode tiles of one group (one stream a thread) fetch
// it this far ahead, as AVX-512's (kernels_avx512.cpp); tiles of several,
// each stream kBlockPanelStreamPrefetchBytes ahead.
constexpr int64_t kBlockPanelPrefetchBytes = 6144;
constexpr int64_t kBlockPanelStreamPrefetchBytes = 2048;
template <int G, int T>
using BlockPanelTile = BlockPanelTileWith<G, T, kBlockPanelPrefetchBytes, kBlockPanelStreamPrefetchBytes>;

// The 16-bit pair sums (vpmaddubsw's) of T tokens added into their int32
// dot products (each row's lane), and restarted.
template <int T>
inline void widen_pair_sums(__m256i (&dot)[T], __m256i (&sum16)[T]) {
  unrolled<T>([&](auto t) {
    dot[t] = _mm256_add_epi32(dot[t], _mm256_madd_epi16(sum16[t], _mm256_set1_epi16(1)));
    sum16[t] = _mm256_setzero_si256();
  });
}

// The int32 lanes of signed bytes w times x, four products each, with w's
// sign moved onto x (|w| <= 128 and |x| <= 127: vpmaddubsw's pairs cannot
// saturate; an x of -128, which the activations' quantizer never writes,
// would not negate).
inline __m256i signed_dot_lanes(__m256i w, __m256i x) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w)), _mm256_set1_epi16(1));
}

// Four activations at column c (elements 4c..4c+3) of a block, broadcast.
inline __m256i x_column(const BlockQ8_0Act& x, int c) { return _mm256_set1_epi32(x_column_lane(x, c)); }

// The panel tile of the 32-element types (q4_0, q4_1, q5_0, q5_1, iq4_nl,
// q8_0; panels: legacy_quants.h): AVX-512's tile_legacy_panel
// with vpmaddubsw + vpmaddwd for vpdpbusd. A 64-byte vector of 16 rows' 4
// codes at one column is two halves of 8 rows. Per half, the u8 code x s8
// activation pairs (each at most 2 * 31 * 127 in magnitude) are summed in
// 16-bit lanes over as many columns as cannot overflow (4-bit codes: all 8
// of a block, 8 * 3810 < 2^15; 5-bit: 4, 4 * 7874), then widened into each
// row's int32 sum, which starts at -offset * sum(x): the exact integer
// AVX-512 computes, followed by the same float steps, so both variants give
// the same bits. iq4_nl's levels + 128 would saturate vpmaddubsw: its
// signed levels (a byte shuffle of the nibbles) take the sign onto x, and
// each column's pairs are widened at once, from 0 (the same integer);
// q8_0's values + 128 likewise: its signed values, one vector a column.
// Against the chunk-group tiles (per row and block: unpack, a dot product,
// a conversion, a scale and an FMA), a block's float steps cost once per 8
// rows.
template <typename F, int G, int T>
inline void tile_legacy_panel(const GemmArgs& a, int64_t g0, int64_t t0, const PanelTileJob& job) {
  constexpr int64_t kPanelBytes = kLegacyPanelRows * F::kBytes;
  // (static: GCC 12 warns of a constexpr local that a lambda reads as uninitialized)
  static constexpr LegacyPanelLayout l = legacy_panel_layout(F::kType);
  constexpr bool kFifth = l.qh >= 0;
  constexpr bool kLevels = F::kType == DType::kIQ4_NL;
  constexpr bool kQ8 = F::kType == DType::kQ8_0;
  constexpr int kColumnPairsPerWidening = kFifth ? 2 : 4;  // pairs (a low and a high column) summed in int16
  BlockPanelTile<G, T> tile(a, g0, t0, job);
  const auto& x = tile.x;
  const auto& xs = tile.xs;
  __m256 acc[G][2][T];
  zero(acc);
  const int64_t n_blocks = a.k / 32;
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  [[maybe_unused]] const __m256i levels =
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4NlLevels)));
  for (int64_t b = 0; b < n_blocks; ++b) {
    const int64_t off = b * kPanelBytes;
    tile.fetch(off, kPanelBytes);
    unrolled<G>([&](auto g) {
      const uint8_t* pb = tile.at(g, off);
      unrolled<2>([&](auto h) {
        __m256i dot[T], sum16[T];
        unrolled<T>([&](auto t) {
          dot[t] = _mm256_set1_epi32(kLevels || kQ8 ? 0 : -F::kOffset * xs[t][b]);
          sum16[t] = _mm256_setzero_si256();
        });
        if constexpr (kQ8) {  // a vector of values per column, signed
          for (int j = 0; j < 8; ++j) {
            const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb + l.qs + 64 * j + 32 * h));
            unrolled<T>([&](auto t) { dot[t] = _mm256_add_epi32(dot[t], signed_dot_lanes(w, x_column(x[t][b], j))); });
          }
        }
        for (int j = 0; j < (kQ8 ? 0 : 4); ++j) {
          const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb + l.qs + 64 * j + 32 * h));
          __m256i lo = _mm256_and_si256(packed, low4);
          __m256i hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low4);
          if constexpr (kLevels) {
            lo = _mm256_shuffle_epi8(levels, lo);
            hi = _mm256_shuffle_epi8(levels, hi);
            unrolled<T>([&](auto t) {
              dot[t] = _mm256_add_epi32(dot[t], _mm256_add_epi32(signed_dot_lanes(lo, x_column(x[t][b], j)),
                                                                 signed_dot_lanes(hi, x_column(x[t][b], 4 + j))));
            });
          } else {
            if constexpr (kFifth) {  // bit 4 from masks j and 4 + j (this half's 32 bits of each)
              lo = _mm256_or_si256(lo, fifth_bits32(pb + l.qh + 8 * j + 4 * h));
              hi = _mm256_or_si256(hi, fifth_bits32(pb + l.qh + 8 * (4 + j) + 4 * h));
            }
            unrolled<T>([&](auto t) {
              sum16[t] =
                  _mm256_add_epi16(sum16[t], _mm256_add_epi16(_mm256_maddubs_epi16(lo, x_column(x[t][b], j)),
                                                              _mm256_maddubs_epi16(hi, x_column(x[t][b], 4 + j))));
            });
            if ((j + 1) % kColumnPairsPerWidening == 0) widen_pair_sums(dot, sum16);
          }
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(pb + l.d + 16 * h)));
        [[maybe_unused]] __m256 m;
        if constexpr (F::kMin)
          m = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(pb + l.m + 16 * h)));
        unrolled<T>([&](auto t) {
          const float dx = x[t][b].d;
          acc[g][h][t] =
              _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[t]), _mm256_mul_ps(d, _mm256_set1_ps(dx)), acc[g][h][t]);
          if constexpr (F::kMin)
            acc[g][h][t] = _mm256_fmadd_ps(m, _mm256_set1_ps(dx * static_cast<float>(xs[t][b])), acc[g][h][t]);
        });
      });
    });
  }
  store_panel_tile(a, g0, t0, job, acc);
}

template <typename F>
struct LegacyPanelTile {
  template <int G, int T>
  struct Fn {
    static void run(const GemmArgs& a, int64_t g, int64_t t, const PanelTileJob& job) {
      tile_legacy_panel<F, G, T>(a, g, t, job);
    }
  };
};

// q4_K's and q5_K's panel tile (panels: k_quants.h), AVX-512's
// tile_q45_k_panel as tile_legacy_panel is AVX-512's: per sub-block j of 32
// and half of 8 rows, the 4-bit codes' pairs summed in 16 bits over all 8
// columns (5-bit: over 4), widened into each row's exact int32 dot product,
// then the same float steps: one FMA with (d * sc_j) * dx and one of
// -(dmin * m_j) with dx * sum(x). (Both sub-blocks of a byte at once, the
// low and the high nibbles, measured slower: 22 -> 28 us a 1024 x 1024
// q4_K matmul from cache.)
template <DType kType, int G, int T>
inline void tile_q45_k_panel(const GemmArgs& a, int64_t g0, int64_t t0, const PanelTileJob& job) {
  constexpr bool kQ5 = kType == DType::kQ5_K;
  constexpr int64_t kPanelBytes = kPanelRows * (kQ5 ? kQ5KChunkBytes : kQ4KChunkBytes);
  constexpr int64_t kQs = kQ5 ? kQ5KPanelQs : kQ4KPanelQs;
  constexpr int64_t kSubBlockBytes = kPanelBytes / 8;
  constexpr int kColumnsPerWidening = kQ5 ? 4 : 8;
  BlockPanelTile<G, T> tile(a, g0, t0, job);
  const auto& x = tile.x;
  const auto& xs = tile.xs;
  __m256 acc[G][2][T];
  zero(acc);
  const int64_t n_super = a.k / kSuperBlock;
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i low6 = _mm256_set1_epi32(63);
  const __m256i low4_32 = _mm256_set1_epi32(0x0F);
  const __m256i low2_32 = _mm256_set1_epi32(3);
  for (int64_t s = 0; s < n_super; ++s) {
    const int64_t off = s * kPanelBytes;
    for (int j = 0; j < 8; ++j) {
      tile.fetch(off + j * kSubBlockBytes, kSubBlockBytes);
      const int shift = 8 * (j % 4);
      unrolled<G>([&](auto g) {
        const uint8_t* pb = tile.at(g, off);
        unrolled<2>([&](auto h) {
          const auto scales = [&](int v) {
            return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb + kQ4KPanelScales + 64 * v + 32 * h));
          };
          __m256i sc, m;
          if (j < 4) {
            sc = _mm256_and_si256(_mm256_srli_epi32(scales(0), shift), low6);
            m = _mm256_and_si256(_mm256_srli_epi32(scales(1), shift), low6);
          } else {
            const __m256i hi_sc = _mm256_and_si256(_mm256_srli_epi32(scales(0), shift + 6), low2_32);
            const __m256i hi_m = _mm256_and_si256(_mm256_srli_epi32(scales(1), shift + 6), low2_32);
            sc = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(scales(2), shift), low4_32),
                                 _mm256_slli_epi32(hi_sc, 4));
            m = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(scales(2), shift + 4), low4_32),
                                _mm256_slli_epi32(hi_m, 4));
          }
          const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(pb + 16 * h)));
          const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(pb + 32 + 16 * h)));
          const __m256 dsc = _mm256_mul_ps(d, _mm256_cvtepi32_ps(sc));
          const __m256 dmm = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(m));
          __m256i dot[T], sum16[T];
          unrolled<T>([&](auto t) { dot[t] = sum16[t] = _mm256_setzero_si256(); });
          for (int c = 0; c < 8; ++c) {
            const __m256i packed =
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb + kQs + 64 * (8 * (j / 2) + c) + 32 * h));
            __m256i codes = _mm256_and_si256(j % 2 == 0 ? packed : _mm256_srli_epi16(packed, 4), low4);
            if constexpr (kQ5) {  // bit j of each byte of the column's qh to bit 4
              const __m256i qh =
                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb + kQ5KPanelQh + 64 * c + 32 * h));
              const __m256i fifth = j <= 4 ? _mm256_slli_epi16(qh, 4 - j) : _mm256_srli_epi16(qh, j - 4);
              codes = _mm256_or_si256(codes, _mm256_and_si256(fifth, _mm256_set1_epi8(0x10)));
            }
            unrolled<T>([&](auto t) {
              sum16[t] = _mm256_add_epi16(sum16[t], _mm256_maddubs_epi16(codes, x_column(x[t][8 * s + j], c)));
            });
            if ((c + 1) % kColumnsPerWidening == 0) widen_pair_sums(dot, sum16);
          }
          unrolled<T>([&](auto t) {
            const float dx = x[t][8 * s + j].d;
            const __m256 dx_sum = _mm256_set1_ps(dx * static_cast<float>(xs[t][8 * s + j]));
            acc[g][h][t] =
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[t]), _mm256_mul_ps(dsc, _mm256_set1_ps(dx)), acc[g][h][t]);
            acc[g][h][t] = _mm256_fnmadd_ps(dmm, dx_sum, acc[g][h][t]);
          });
        });
      });
    }
  }
  store_panel_tile(a, g0, t0, job, acc);
}

// Block 4h + 3's codes from the top 2 bits of q6_K's code vectors a, b, c
// (AVX-512's q6_k_fourth_code with masks for its selects).
inline __m256i q6_k_fourth_code(__m256i a, __m256i b, __m256i c) {
  const __m256i ab = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 6), _mm256_set1_epi8(0x03)),
                                     _mm256_and_si256(_mm256_srli_epi16(b, 4), _mm256_set1_epi8(0x0C)));
  return _mm256_or_si256(ab, _mm256_and_si256(_mm256_srli_epi16(c, 2), _mm256_set1_epi8(0x30)));
}

// d * scale 2 k + e of q6_K block k for the 8 rows of half rh (AVX-512's q6_k_scale).
inline __m256 q6_k_scale(const uint8_t* panel, int k, int e, int rh) {
  const int byte = 2 * (k % 2) + e;
  const __m256i sv =
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + kQ6KPanelScales + 64 * (k / 2) + 32 * rh));
  const __m256i sc = _mm256_srai_epi32(_mm256_sll_epi32(sv, _mm_cvtsi32_si128(24 - 8 * byte)), 24);
  const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(panel + kQ6KPanelD + 16 * rh)));
  return _mm256_mul_ps(d, _mm256_cvtepi32_ps(sc));
}

// The order in which a q6_K tile adds a 128-element half's four blocks (AVX-512's).
constexpr int kQ6KBlockOrder[4] = {0, 2, 1, 3};

// q6_K's panel tile (panels: k_quants.h), AVX-512's tile_q6_k_panel for
// each half of 8 rows: the 6-bit codes' pairs (at most 2 * 63 * 127) summed
// in 16 bits over two columns, widened into each block half's exact int32
// dot product started at -32 * its activations' sum, then the same FMAs in
// the same order. A decode tile takes a column's four blocks at once (their
// fourth from the top bits of the other three's vectors).
template <int G, int T>
inline void tile_q6_k_panel(const GemmArgs& a, int64_t g0, int64_t t0, const PanelTileJob& job) {
  constexpr int64_t kPanelBytes = kPanelRows * kQ6KChunkBytes;
  constexpr int64_t kQuarterBytes = kPanelBytes / 4;
  BlockPanelTile<G, T> tile(a, g0, t0, job);
  const auto& x = tile.x;
  const auto& xs = tile.xs;
  __m256 acc[G][2][T];
  zero(acc);
  const int64_t n_super = a.k / kSuperBlock;
  const __m256i low6 = _mm256_set1_epi8(0x3F);
  for (int64_t s = 0; s < n_super; ++s) {
    const int64_t off = s * kPanelBytes;
    int32_t half[T][8][2];  // the half sums of every token's eight activation blocks
    unrolled<T>([&](auto t) {
      for (int k = 0; k < 8; ++k) {
        half[t][k][0] = first_half_sum(x[t][8 * s + k]);
        half[t][k][1] = xs[t][8 * s + k] - half[t][k][0];
      }
    });
    const auto add = [&](int k, int e, int g, int rh, int t, __m256i dot) {
      const __m256 dx = _mm256_set1_ps(x[t][8 * s + k].d);
      acc[g][rh][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(q6_k_scale(tile.at(g, off), k, e, rh), dx),
                                      acc[g][rh][t]);
    };
    for (int h = 0; h < 2; ++h) {  // (a loop, as AVX-512's: unrolled, it doubles the code)
      for (int e = 0; e < 2; ++e) {
        tile.fetch(off + (2 * h + e) * kQuarterBytes, kQuarterBytes);
        unrolled<G>([&](auto g) {
          unrolled<2>([&](auto rh) {
            if constexpr (T == 1) {
              __m256i dot[4], sum16[4];
              unrolled<4>([&](auto i) {
                dot[i] = _mm256_set1_epi32(-32 * half[0][4 * h + i][e]);
                sum16[i] = _mm256_setzero_si256();
              });
              unrolled<4>([&](auto c_) {
                constexpr int cc = decltype(c_)::value;
                const int c = 4 * e + cc;
                const uint8_t* v = q6_k_code_vectors(tile.at(g, off), h, c) + 32 * rh;
                const __m256i va = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v));
                const __m256i vb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + 64));
                const __m256i vc = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + 128));
                const __m256i codes[4] = {_mm256_and_si256(va, low6), _mm256_and_si256(vb, low6),
                                          _mm256_and_si256(vc, low6), q6_k_fourth_code(va, vb, vc)};
                unrolled<4>([&](auto i) {
                  sum16[i] =
                      _mm256_add_epi16(sum16[i], _mm256_maddubs_epi16(codes[i], x_column(x[0][8 * s + 4 * h + i], c)));
                });
                if constexpr (cc % 2 == 1) widen_pair_sums(dot, sum16);
              });
              unrolled<4>([&](auto n) { add(4 * h + kQ6KBlockOrder[n], e, g, rh, 0, dot[kQ6KBlockOrder[n]]); });
            } else {
              for (int i : kQ6KBlockOrder) {  // (a loop: unrolled, prompts ran 17 % slower)
                const int k = 4 * h + i;
                __m256i dot[T], sum16[T];
                unrolled<T>([&](auto t) {
                  dot[t] = _mm256_set1_epi32(-32 * half[t][k][e]);
                  sum16[t] = _mm256_setzero_si256();
                });
                unrolled<4>([&](auto c_) {
                  constexpr int cc = decltype(c_)::value;
                  const int c = 4 * e + cc;
                  const uint8_t* v = q6_k_code_vectors(tile.at(g, off), h, c) + 32 * rh;
                  const auto load = [&](int n) {
                    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + 64 * n));
                  };
                  const __m256i code =
                      i < 3 ? _mm256_and_si256(load(i), low6) : q6_k_fourth_code(load(0), load(1), load(2));
                  unrolled<T>([&](auto t) {
                    sum16[t] = _mm256_add_epi16(sum16[t], _mm256_maddubs_epi16(code, x_column(x[t][8 * s + k], c)));
                  });
                  if constexpr (cc % 2 == 1) widen_pair_sums(dot, sum16);
                });
                unrolled<T>([&](auto t) { add(k, e, g, rh, t, dot[t]); });
              }
            }
          });
        });
      }
    }
  }
  store_panel_tile(a, g0, t0, job, acc);
}

// q2_K's and q3_K's panel tile (panels: k_quants.h), AVX-512's
// tile_q23_k_panel for each half of 8 rows. vpmaddubsw would saturate on
// codes taken where they lie in the byte (up to 3 << 6), so the codes are
// shifted down to bits 0-1 (q3_K's high bit added as bit 2) and their pair
// sums added in 16 bits over a half's 4 columns; the exact integer sum over
// the block of scale * code * x (q3_K's codes offset by -4 through -4 *
// sum(x)) is then shifted up by kQ23KCodeShift, which gives AVX-512's
// integer, followed by its float steps.
template <DType kType, int G, int T>
inline void tile_q23_k_panel(const GemmArgs& a, int64_t g0, int64_t t0, const PanelTileJob& job) {
  constexpr bool kQ3 = kType == DType::kQ3_K;
  constexpr int64_t kPanelBytes = kPanelRows * static_cast<int64_t>(kQ3 ? sizeof(BlockQ3_K) : sizeof(BlockQ2_K));
  constexpr int64_t kStepBytes = kPanelBytes / 8;  // (fetched per activation block)
  constexpr auto& kCodeShift = kQ23KCodeShift[kQ3 ? 1 : 0];
  BlockPanelTile<G, T> tile(a, g0, t0, job);
  const auto& x = tile.x;
  const auto& xs = tile.xs;
  __m256 acc[G][2][T];
  zero(acc);
  const int64_t n_super = a.k / kSuperBlock;
  const __m256i low2 = _mm256_set1_epi8(3);
  const __m256i low4_32 = _mm256_set1_epi32(0x0F);
  for (int64_t s = 0; s < n_super; ++s) {
    const int64_t off = s * kPanelBytes;
    // q3_K: scale 4m + i (minus 32) of each row of half rh in byte i of its lane of scales[g][rh][m].
    [[maybe_unused]] __m256i scales[G][2][4];
    if constexpr (kQ3) {
      for (int g = 0; g < G; ++g)
        for (int rh = 0; rh < 2; ++rh) {
          const auto load = [&](int n) {
            return _mm256_loadu_si256(
                reinterpret_cast<const __m256i*>(tile.at(g, off + kQ3KPanelScales + 64 * n + 32 * rh)));
          };
          const __m256i low0 = load(0), low1 = load(1), high = load(2);
          const __m256i lows[4] = {low0, low1, _mm256_srli_epi16(low0, 4), _mm256_srli_epi16(low1, 4)};
          const __m256i highs[4] = {_mm256_slli_epi16(high, 4), _mm256_slli_epi16(high, 2), high,
                                    _mm256_srli_epi16(high, 2)};
          for (int m = 0; m < 4; ++m)  // (lows & 0x0F) | (highs & 0x30), minus 32
            scales[g][rh][m] = _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(lows[m], _mm256_set1_epi8(0x0F)),
                                                               _mm256_and_si256(highs[m], _mm256_set1_epi8(0x30))),
                                               _mm256_set1_epi8(32));
        }
    }
    unrolled<8>([&](auto k_constant) {
      constexpr int k = k_constant, c = k / 4, j = k % 4;
      tile.fetch(off + k * kStepBytes, kStepBytes);
      int32_t half[T][2];  // each token's sum(x) over the two halves
      for (int t = 0; t < T; ++t) {
        half[t][0] = first_half_sum(x[t][8 * s + k]);
        half[t][1] = xs[t][8 * s + k] - half[t][0];
      }
      for (int g = 0; g < G; ++g) {
        const uint8_t* pb = tile.at(g, off);
        for (int rh = 0; rh < 2; ++rh) {
          // The scales of the two halves (int32 lanes), and q2_K's mins in
          // the two 16-bit halves of each lane.
          __m256i sc[2];
          [[maybe_unused]] __m256i mins;
          if constexpr (kQ3) {
            for (int h = 0; h < 2; ++h) {
              const int is = 2 * k + h, i = is % 4;  // (byte i of scales[g][rh][is / 4], sign-extended)
              sc[h] = _mm256_srai_epi32(
                  i == 3 ? scales[g][rh][is / 4] : _mm256_slli_epi32(scales[g][rh][is / 4], 24 - 8 * i), 24);
            }
          } else {
            constexpr uint32_t b = 2 * (k % 2);
            const __m256i pick = _mm256_set1_epi32(static_cast<int32_t>(0x80008000u | b | (b + 1) << 16));
            const __m256i lane_base = _mm256_set_epi8(12, 12, 12, 12, 8, 8, 8, 8, 4, 4, 4, 4, 0, 0, 0, 0, 12, 12, 12,
                                                      12, 8, 8, 8, 8, 4, 4, 4, 4, 0, 0, 0, 0);
            const __m256i bytes = _mm256_shuffle_epi8(
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb + kQ2KPanelScales + 64 * (k / 2) + 32 * rh)),
                _mm256_or_si256(pick, lane_base));
            sc[0] = _mm256_and_si256(bytes, low4_32);
            sc[1] = _mm256_and_si256(_mm256_srli_epi32(bytes, 16), low4_32);
            mins = _mm256_srli_epi16(bytes, 4);
          }
          __m256i sum[T];
          for (int h = 0; h < 2; ++h) {
            __m256i sum16[T];
            for (int t = 0; t < T; ++t) sum16[t] = _mm256_setzero_si256();
            for (int v = 0; v < 4; ++v) {
              const __m256i plane =
                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb + 64 * (8 * c + 4 * h + v) + 32 * rh));
              __m256i codes = _mm256_and_si256(j == 0 ? plane : _mm256_srli_epi16(plane, 2 * j), low2);
              if constexpr (kQ3)  // the high bit, as bit 2 of the codes it marks
                codes =
                    _mm256_or_si256(codes, marked_bytes32(pb + kQ3KPanelHmask + 8 * (8 * k + 4 * h + v) + 4 * rh, 4));
              for (int t = 0; t < T; ++t)
                sum16[t] =
                    _mm256_add_epi16(sum16[t], _mm256_maddubs_epi16(codes, x_column(x[t][8 * s + k], 4 * h + v)));
            }
            for (int t = 0; t < T; ++t) {
              __m256i dot = _mm256_madd_epi16(sum16[t], _mm256_set1_epi16(1));
              if constexpr (kQ3) dot = _mm256_sub_epi32(dot, _mm256_set1_epi32(4 * half[t][h]));
              const __m256i scaled = _mm256_mullo_epi32(dot, sc[h]);
              sum[t] = h == 0 ? scaled : _mm256_add_epi32(sum[t], scaled);
            }
          }
          const __m256 d = _mm256_cvtph_ps(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(pb + (kQ3 ? kQ3KPanelD : kQ2KPanelD) + 16 * rh)));
          for (int t = 0; t < T; ++t) {
            const float dx = x[t][8 * s + k].d;
            const __m256 dot_scale = _mm256_set1_ps(dx * code_scale_inverse(kCodeShift[j]));
            acc[g][rh][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_slli_epi32(sum[t], kCodeShift[j])),
                                            _mm256_mul_ps(d, dot_scale), acc[g][rh][t]);
            if constexpr (!kQ3) {
              const __m256i half_sums = _mm256_set1_epi32(static_cast<int32_t>(
                  (static_cast<uint32_t>(half[t][0]) & 0xFFFF) | static_cast<uint32_t>(half[t][1]) << 16));
              const __m256 dmin =
                  _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(pb + kQ2KPanelDmin + 16 * rh)));
              acc[g][rh][t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(mins, half_sums)),
                                               _mm256_mul_ps(dmin, _mm256_set1_ps(dx)), acc[g][rh][t]);
            }
          }
        }
      }
    });
  }
  store_panel_tile(a, g0, t0, job, acc);
}

// iq4_xs's panel tile (panels: k_quants.h), AVX-512's tile_iq4_xs_panel
// for each half of 8 rows, with the signed levels (a byte shuffle of the
// nibbles): levels + 128 would saturate vpmaddubsw, so the levels' sign
// moves onto x (as the chunk-group tiles do), and each column's pair sums
// (up to 2 * 127 * 127) are widened at once. The exact integer dot product
// of the sub-block (AVX-512's: its levels + 128 started at -128 * sum(x)),
// then the same FMA with (d * (ls_j - 32)) * dx.
template <int G, int T>
inline void tile_iq4_xs_panel(const GemmArgs& a, int64_t g0, int64_t t0, const PanelTileJob& job) {
  constexpr int64_t kPanelBytes = kPanelRows * static_cast<int64_t>(sizeof(BlockIQ4_XS));
  constexpr int64_t kStepBytes = kPanelBytes / 8;
  BlockPanelTile<G, T> tile(a, g0, t0, job);
  const auto& x = tile.x;
  __m256 acc[G][2][T];
  zero(acc);
  const int64_t n_super = a.k / kSuperBlock;
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i low4_32 = _mm256_set1_epi32(0x0F);
  const __m256i levels = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4NlLevels)));
  for (int64_t s = 0; s < n_super; ++s) {
    const int64_t off = s * kPanelBytes;
    for (int j = 0; j < 8; ++j) {
      tile.fetch(off + j * kStepBytes, kStepBytes);
      unrolled<G>([&](auto g) {
        const uint8_t* pb = tile.at(g, off);
        unrolled<2>([&](auto rh) {
          __m256i dot[T];
          unrolled<T>([&](auto t) { dot[t] = _mm256_setzero_si256(); });
          for (int v = 0; v < 4; ++v) {
            const __m256i packed =
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb + 64 * (4 * j + v) + 32 * rh));
            const __m256i lo = _mm256_shuffle_epi8(levels, _mm256_and_si256(packed, low4));
            const __m256i hi = _mm256_shuffle_epi8(levels, _mm256_and_si256(_mm256_srli_epi16(packed, 4), low4));
            unrolled<T>([&](auto t) {
              dot[t] =
                  _mm256_add_epi32(dot[t], _mm256_add_epi32(signed_dot_lanes(lo, x_column(x[t][8 * s + j], v)),
                                                            signed_dot_lanes(hi, x_column(x[t][8 * s + j], 4 + v))));
            });
          }
          // ls_j: nibble j % 2 of scales_l byte j / 2, and bits 2j, 2j+1 of scales_h as bits 4-5.
          const __m256i scales_l =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb + kIQ4XSPanelScalesL + 32 * rh));
          const __m256i scales_h = _mm256_cvtepu16_epi32(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(pb + kIQ4XSPanelScalesH + 16 * rh)));
          const __m256i ls_lo = _mm256_and_si256(_mm256_srli_epi32(scales_l, 8 * (j / 2) + 4 * (j % 2)), low4_32);
          const __m256i ls_hi = _mm256_and_si256(_mm256_srli_epi32(scales_h, 2 * j), _mm256_set1_epi32(3));
          const __m256i ls =
              _mm256_sub_epi32(_mm256_or_si256(ls_lo, _mm256_slli_epi32(ls_hi, 4)), _mm256_set1_epi32(32));
          const __m256 d =
              _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(pb + kIQ4XSPanelD + 16 * rh)));
          const __m256 dls = _mm256_mul_ps(d, _mm256_cvtepi32_ps(ls));
          unrolled<T>([&](auto t) {
            acc[g][rh][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[t]),
                                            _mm256_mul_ps(dls, _mm256_set1_ps(x[t][8 * s + j].d)), acc[g][rh][t]);
          });
        });
      });
    }
  }
  store_panel_tile(a, g0, t0, job, acc);
}

template <DType kType>
struct KQuantPanelTile {
  template <int G, int T>
  struct Fn {
    static void run(const GemmArgs& a, int64_t g, int64_t t, const PanelTileJob& job) {
      if constexpr (kType == DType::kQ6_K) {
        tile_q6_k_panel<G, T>(a, g, t, job);
      } else if constexpr (kType == DType::kQ2_K || kType == DType::kQ3_K) {
        tile_q23_k_panel<kType, G, T>(a, g, t, job);
      } else if constexpr (kType == DType::kIQ4_XS) {
        tile_iq4_xs_panel<G, T>(a, g, t, job);
      } else {
        tile_q45_k_panel<kType, G, T>(a, g, t, job);
      }
    }
  };
};

// Block panels: prompt tiles of 1 group x 3 tokens (6 float and 3 int16
// accumulators, of the 16 registers); decode tiles of one group, one
// stream a thread, as AVX-512's.
constexpr PanelPlan kBlockPanelPlan{1, 4, 1, 128};

// The block types: their panel tiles where they are in panels
// (interleaved_layout), else their chunk-group tiles (a layout built for
// the scalar reference: tests).
template <typename F, void (*ChunkGemm)(const GemmArgs&, int64_t, int64_t) = gemm_legacy_chunks<DotLanes, F>>
void gemm_legacy(const GemmArgs& a, int64_t b, int64_t e) {
  if (is_panel_layout(F::kType, a.w_group))
    return block_panel_driver<LegacyPanelTile<F>::template Fn, kBlockPanelPlan>(a, b, e);
  ChunkGemm(a, b, e);
}

template <DType kType, void (*ChunkGemm)(const GemmArgs&, int64_t, int64_t)>
void gemm_k_quant(const GemmArgs& a, int64_t b, int64_t e) {
  if (is_panel_layout(kType, a.w_group))
    return block_panel_driver<KQuantPanelTile<kType>::template Fn, kBlockPanelPlan>(a, b, e);
  ChunkGemm(a, b, e);
}

}  // namespace

const IsaKernels kAvx2Kernels = {
    gemm_f32,
    gemm_f16,
    gemm_bf16,
    gemm_legacy<Q8_0Format, gemm_q8_0>,
    gemm_k_quant<DType::kQ4_K, gemm_q45_k_chunks<DotLanes, Q4KUnpack>>,
    gemm_k_quant<DType::kQ6_K, gemm_q16_k<Q6KUnpack>>,
    gemm_legacy<Q4_0Format>,
    gemm_legacy<Q4_1Format>,
    gemm_legacy<Q5_0Format>,
    gemm_legacy<Q5_1Format>,
    gemm_legacy<IQ4NLFormat>,
    gemm_k_quant<DType::kQ5_K, gemm_q45_k_chunks<DotLanes, Q5KUnpack>>,
    gemm_k_quant<DType::kQ2_K, gemm_q16_k<Q2KUnpack>>,
    gemm_k_quant<DType::kQ3_K, gemm_q16_k<Q3KUnpack>>,
    gemm_k_quant<DType::kIQ4_XS, gemm_q45_k_chunks<DotLanes, IQ4XSUnpack>>,
    attention_tile_vec,
    silu_mul_vec,
    Vec::narrow,
    delta_rule_vec,
    quantize_q8_avx2,
    log_sum_exp_vec,
};

}  // namespace tandem::kernels
