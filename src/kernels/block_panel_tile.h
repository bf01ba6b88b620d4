// What the block panel tiles (legacy_quants.h's and k_quants.h's panels) of
// the vector variants share: the activations of a tile's T tokens (blocks
// and block sums, GemmArgs::xsum), the weights of its G groups, the fetching
// of what it streams, and the driver that makes the block sums when the
// caller gave none. Included by each variant inside its own anonymous
// namespace (see gemm_driver.h).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/gemm_driver.h"
#include "kernels/isa_kernels.h"

namespace tandem::kernels {
namespace {  // NOLINT(google-build-namespaces): see gemm_driver.h

// kAheadOne: how far ahead a decode tile of one group (one stream a
// thread) fetches it; kAheadEach: how far a decode tile of several fetches
// each (each variant's measured distances).
template <int G, int T, int64_t kAheadOne, int64_t kAheadEach>
struct BlockPanelTileWith {
  const BlockQ8_0Act* x[T];
  const int32_t* xs[T];
  const uint8_t* w;
  int64_t group_bytes;
  const uint8_t* pf;
  int64_t pf_left;

  BlockPanelTileWith(const GemmArgs& a, int64_t g0, int64_t t0, const PanelTileJob& job)
      : group_bytes(kPanelRows * static_cast<int64_t>(a.w_row_bytes)), pf(job.prefetch), pf_left(job.prefetch_lines) {
    w = a.w + g0 * group_bytes;
    for (int t = 0; t < T; ++t) {
      x[t] = a.xq + (t0 + t) * a.ldxq;
      xs[t] = a.xsum + (t0 + t) * a.ldxq;
    }
  }
  // Byte `off` of group g's panels.
  const uint8_t* at(int g, int64_t off) const { return w + g * group_bytes + off; }
  // Before a step over bytes [off, off + bytes) of each group's panels: a
  // decode tile fetches each group's stream ahead; a prompt tile fetches
  // its share of the next panel.
  void fetch(int64_t off, int64_t bytes) {
    if constexpr (T == 1) {
      constexpr int64_t kAhead = G == 1 ? kAheadOne : kAheadEach;
      for (int64_t line = 0; line < bytes; line += 64)
        for (int g = 0; g < G; ++g) prefetch_ahead(at(g, 0), off + line + kAhead, group_bytes, (G - 1) * group_bytes);
    } else {
      for (int64_t i = 0; i < (bytes * G + 63) / 64 && pf_left > 0; ++i, --pf_left, pf += 64)
        __builtin_prefetch(pf, 0, 3);
    }
  }
};

// The four activations at column c (elements 4c..4c+3) of a block, as one
// 32-bit lane (each variant's x_column broadcasts it).
inline int32_t x_column_lane(const BlockQ8_0Act& x, int c) {
  int32_t v;
  std::memcpy(&v, x.qs + 4 * c, 4);
  return v;
}

// The sum of the first 16 of a block's activations.
inline int32_t first_half_sum(const BlockQ8_0Act& x) {
  // (x + 128 is unsigned: psadbw sums it in two 8-byte halves.)
  const __m128i v = _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.qs)), _mm_set1_epi8(-128));
  const __m128i s = _mm_sad_epu8(v, _mm_setzero_si128());
  return _mm_cvtsi128_si32(s) + _mm_extract_epi32(s, 2) - 16 * 128;
}

// q6_K's code vectors of half h, column c of a panel block (k_quants.h).
inline const uint8_t* q6_k_code_vectors(const uint8_t* panel, int h, int c) { return panel + 64 * 3 * (8 * h + c); }

// Block panels with the activations' block sums (made here when the caller
// gave none), in tiles of Tile by plan P.
template <template <int, int> class Tile, PanelPlan P>
void block_panel_driver(const GemmArgs& a, int64_t b, int64_t e) {
  if (a.xsum != nullptr) {
    panel_driver<Tile, P>(a, b, e);
    return;
  }
  thread_local std::vector<int32_t> sums;
  sums.resize(static_cast<size_t>(a.n_tokens * a.ldxq));
  sum_q8_blocks(a.xq, a.ldxq, a.n_tokens, a.k / 32, sums.data());
  GemmArgs with_sums = a;
  with_sums.xsum = sums.data();
  panel_driver<Tile, P>(with_sums, b, e);
}

}  // namespace
}  // namespace tandem::kernels
