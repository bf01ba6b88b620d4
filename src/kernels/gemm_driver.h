// Tiling of a GEMM row range into micro-kernel calls, shared by the vector
// variants. Included only by the per-ISA files; it lives in an anonymous
// namespace so that each file gets its own copy compiled for its ISA (a shared
// inline template would let the linker pick one ISA's copy for all).
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>

#include "kernels/isa_kernels.h"

namespace tandem::kernels {
namespace {  // NOLINT(google-build-namespaces): see above

// f(std::integral_constant<int, i>) for i = 0, ..., N - 1, in that order, each
// call inlined. GCC leaves a loop of four column steps rolled when its body
// is large, and then copies every accumulator between registers around each
// iteration (seen in the Q6_K tiles). And an array of accumulators that a
// loop indexes (even one of constant trip count) is kept in memory: GCC 12
// holds it in registers inside the k loop but still stores every element
// to the stack at every step. Indexed only through `unrolled`, the array
// becomes registers.
template <int N, typename F>
[[gnu::always_inline]] inline void unrolled(F&& f) {
  [&]<int... I>(std::integer_sequence<int, I...>) { (f(std::integral_constant<int, I>{}), ...); }(std::make_integer_sequence<int, N>{});
}

// f(i, j) over [0, I) x [0, J), and f(i, j, k) over [0, I) x [0, J) x
// [0, K), in row-major order, each index a constant (see unrolled).
template <int I, int J, typename F>
[[gnu::always_inline]] inline void unrolled(F&& f) {
  unrolled<I>([&](auto i) { unrolled<J>([&](auto j) { f(i, j); }); });
}
template <int I, int J, int K, typename F>
[[gnu::always_inline]] inline void unrolled(F&& f) {
  unrolled<I>([&](auto i) { unrolled<J>([&](auto j) { unrolled<K>([&](auto k) { f(i, j, k); }); }); });
}

// How a variant tiles a GEMM (see gemm_driver).
struct GemmPlan {
  int tile_rows;       // rows of a prompt tile
  int tile_tokens;     // tokens of a prompt tile (2..6)
  int decode_rows;     // rows of a decode (one-token) tile: 8 or 16
  int64_t row_block;   // rows whose weights stay in L1 while a token block streams past
  int64_t token_block; // tokens whose activations stay in L2 while all rows stream past
};

// Decode (one token) walks rows in tiles of decode_rows for memory-level
// parallelism. A prompt is cut into token blocks whose activations fit in L2
// (512 f32 tokens of 1024 do not: small F16 gate/up went from 130 to 160
// GFLOP/s on one thread with blocks of 128); inside one, a row block's weights
// are kept in L1 while the block's tokens pass in tiles of tile_rows x
// tile_tokens (the last tokens in one narrower tile). Every tile computes each
// element in the same order, so the tiling never changes a result.

// The weight rows (in chunks of chunk_bytes) and the quantized activation
// rows that a tile of R rows x T tokens reads.
template <int R, int T>
struct TileRows {
  const uint8_t* w[R];
  const BlockQ8_0Act* x[T];
  TileRows(const GemmArgs& a, int64_t r0, int64_t t0, int64_t chunk_bytes) {
    for (int r = 0; r < R; ++r) w[r] = gemm_row(a, r0 + r, chunk_bytes);
    for (int t = 0; t < T; ++t) x[t] = a.xq + (t0 + t) * a.ldxq;
  }
};

// Tokens per block when n_tokens are cut into blocks of equal size, whole
// tiles of `tile` tokens, at most max_block (rounded down to whole tiles), so
// that the last block is not a sliver: 127 tokens go as 66 + 61, not 126 + 1.
inline int64_t equal_block_tokens(int64_t n_tokens, int64_t max_block, int64_t tile) {
  const int64_t block = max_block / tile * tile;
  const int64_t n_blocks = (n_tokens + block - 1) / block;
  return ((n_tokens + n_blocks - 1) / n_blocks + tile - 1) / tile * tile;
}

// Rows [rb, re) of T tokens from t: tiles of kRows rows, then 4, then 1.
template <template <int, int> class Tile, int kRows, int T>
void tile_rows(const GemmArgs& a, int64_t rb, int64_t re, int64_t t) {
  int64_t r = rb;
  for (; r + kRows <= re; r += kRows) Tile<kRows, T>::run(a, r, t);
  if constexpr (kRows > 4)
    for (; r + 4 <= re; r += 4) Tile<4, T>::run(a, r, t);
  for (; r < re; ++r) Tile<1, T>::run(a, r, t);
}

template <template <int, int> class Tile, GemmPlan P>
void gemm_driver(const GemmArgs& a, int64_t row_begin, int64_t row_end) {
  constexpr int kRows = P.tile_rows;
  constexpr int kTokens = P.tile_tokens;
  static_assert(kTokens >= 2 && kTokens <= 6);
  static_assert(P.decode_rows == 8 || P.decode_rows == 16);
  static_assert(P.token_block >= kTokens && P.row_block > 0);
  if (a.n_tokens == 1) {
    int64_t r = row_begin;
    if constexpr (P.decode_rows > 8)
      for (; r + P.decode_rows <= row_end; r += P.decode_rows) Tile<P.decode_rows, 1>::run(a, r, 0);
    for (; r + 8 <= row_end; r += 8) Tile<8, 1>::run(a, r, 0);
    for (; r < row_end; ++r) Tile<1, 1>::run(a, r, 0);
    return;
  }
  const int64_t block_tokens = equal_block_tokens(a.n_tokens, P.token_block, kTokens);
  for (int64_t tb = 0; tb < a.n_tokens; tb += block_tokens) {
    const int64_t te = std::min(a.n_tokens, tb + block_tokens);
    // A last tile of one token would cost about as much as a full one: the
    // last kTokens + 1 tokens go as two tiles of two instead (64 tokens in
    // tiles of 3: 20 x 3 + 2 x 2).
    const bool split_tail = kTokens == 3 && (te - tb) % 3 == 1 && te - tb > 3;
    const int64_t full_end = split_tail ? te - 4 : te - (te - tb) % kTokens;
    // tile_rows calls per row block (each prefetches its slice of the next block).
    const int64_t n_tiles = (full_end - tb) / kTokens + (split_tail ? 2 : te > full_end ? 1 : 0);
    for (int64_t rb = row_begin; rb < row_end; rb += P.row_block) {
      const int64_t re = std::min(row_end, rb + P.row_block);
      // The weights of the block that comes next, fetched a slice per tile:
      // otherwise its first tile waits for memory with nothing else to do
      // (small F16 batched decode x64: 402 -> 427 tokens/s, medians of 4
      // alternating runs).
      const int64_t next = re < row_end ? re : te < a.n_tokens ? row_begin : row_end;
      const int64_t next_end = std::min(row_end, next + P.row_block);
      const auto* next_w = a.w + static_cast<size_t>(next) * a.w_row_bytes;
      const int64_t next_lines = (next_end - next) * static_cast<int64_t>(a.w_row_bytes) / 64;
      int64_t tile = 0;
      auto prefetch_slice = [&] {
        for (int64_t l = next_lines * tile / n_tiles; l < next_lines * (tile + 1) / n_tiles; ++l)
          __builtin_prefetch(next_w + l * 64, 0, 3);
        ++tile;
      };
      int64_t t = tb;
      for (; t < full_end; t += kTokens) {
        prefetch_slice();
        tile_rows<Tile, kRows, kTokens>(a, rb, re, t);
      }
      if (split_tail) {
        prefetch_slice();
        tile_rows<Tile, kRows, 2>(a, rb, re, t);
        prefetch_slice();
        tile_rows<Tile, kRows, 2>(a, rb, re, t + 2);
        continue;
      }
      if (t < te) prefetch_slice();
      // The last tokens in one tile of that width, so that no token pays for a
      // weight pass of its own (64 tokens: 30% of the time otherwise).
      switch (te - t) {
        case 5: if constexpr (kTokens > 5) tile_rows<Tile, kRows, 5>(a, rb, re, t); break;
        case 4: if constexpr (kTokens > 4) tile_rows<Tile, kRows, 4>(a, rb, re, t); break;
        case 3: if constexpr (kTokens > 3) tile_rows<Tile, kRows, 3>(a, rb, re, t); break;
        case 2: tile_rows<Tile, kRows, 2>(a, rb, re, t); break;
        case 1: tile_rows<Tile, kRows, 1>(a, rb, re, t); break;
        default: break;
      }
    }
  }
}

// Panels (see GemmArgs): a tile is G groups of kPanelRows rows times T tokens;
// each accumulator holds one token's sums for a group's 16 rows, and every
// element is reduced in plain k order, so any tiling gives the same result.
struct PanelPlan {
  int tile_groups;      // groups of a prompt tile
  int tile_tokens;      // tokens of a prompt tile
  int decode_groups;    // groups of a decode (one-token) tile, one memory stream each
  int64_t token_block;  // tokens whose activations stay in L2 while all rows stream past
};

// What a panel tile needs besides its position: the row range to store (the
// first and last groups may be cut by a thread's range), and a slice of the
// next panel's weights to prefetch while it computes.
struct PanelTileJob {
  int64_t row_begin, row_end;
  const uint8_t* prefetch = nullptr;
  int64_t prefetch_lines = 0;
};

// The rows of group g that a tile stores: [lo, hi) of its kPanelRows.
struct GroupRows {
  int64_t lo, hi;
};
inline GroupRows stored_rows(const PanelTileJob& job, int64_t g) {
  const int64_t row0 = g * kPanelRows;
  return {std::max<int64_t>(0, job.row_begin - row0), std::min<int64_t>(kPanelRows, job.row_end - row0)};
}

// Tokens [t, te) of groups [g, g + G): tiles of T, then one narrower tile.
template <template <int, int> class Tile, int G, int T>
void panel_tokens(const GemmArgs& a, int64_t g, int64_t t, int64_t te, PanelTileJob job, int64_t lines_per_tile) {
  const uint8_t* pf = job.prefetch;
  const int64_t pf_end = job.prefetch_lines;
  int64_t pf_done = 0;
  auto slice = [&] {
    job.prefetch = pf + pf_done * 64;
    job.prefetch_lines = std::min(lines_per_tile, pf_end - pf_done);
    pf_done += job.prefetch_lines;
    return job;
  };
  for (; t + T <= te; t += T) Tile<G, T>::run(a, g, t, slice());
  switch (te - t) {
    case 7: if constexpr (T > 7) Tile<G, 7>::run(a, g, t, slice()); break;
    case 6: if constexpr (T > 6) Tile<G, 6>::run(a, g, t, slice()); break;
    case 5: if constexpr (T > 5) Tile<G, 5>::run(a, g, t, slice()); break;
    case 4: if constexpr (T > 4) Tile<G, 4>::run(a, g, t, slice()); break;
    case 3: if constexpr (T > 3) Tile<G, 3>::run(a, g, t, slice()); break;
    case 2: if constexpr (T > 2) Tile<G, 2>::run(a, g, t, slice()); break;
    case 1: if constexpr (T > 1) Tile<G, 1>::run(a, g, t, slice()); break;
    default: break;
  }
}

template <template <int, int> class Tile, PanelPlan P>
void panel_driver(const GemmArgs& a, int64_t row_begin, int64_t row_end) {
  constexpr int G = P.tile_groups;
  constexpr int T = P.tile_tokens;
  constexpr int D = P.decode_groups;
  static_assert(G >= 1 && G <= 4 && T >= 1 && T <= 8 && D >= 1 && D <= 8 && P.token_block >= T);
  const int64_t g_begin = row_begin / kPanelRows;
  const int64_t g_end = (row_end + kPanelRows - 1) / kPanelRows;
  const PanelTileJob rows{row_begin, row_end};
  if (a.n_tokens == 1) {
    int64_t g = g_begin;
    for (; g + D <= g_end; g += D) Tile<D, 1>::run(a, g, 0, rows);
    for (; g < g_end; ++g) Tile<1, 1>::run(a, g, 0, rows);
    return;
  }
  const int64_t block_tokens = equal_block_tokens(a.n_tokens, P.token_block, T);
  const int64_t group_bytes = kPanelRows * static_cast<int64_t>(a.w_row_bytes);
  for (int64_t tb = 0; tb < a.n_tokens; tb += block_tokens) {
    const int64_t te = std::min(a.n_tokens, tb + block_tokens);
    const int64_t n_tiles = (te - tb + T - 1) / T;
    for (int64_t g = g_begin; g < g_end; g += G) {
      const int64_t ge = std::min(g_end, g + G);
      // The next panel's weights, a slice per tile, so that its first tile
      // does not wait for memory with nothing else to do.
      const int64_t next = ge < g_end ? ge : te < a.n_tokens ? g_begin : g_end;
      const int64_t next_lines = (std::min(g_end, next + G) - next) * group_bytes / 64;
      PanelTileJob job = rows;
      job.prefetch = a.w + next * group_bytes;
      job.prefetch_lines = next_lines;
      const int64_t per_tile = (next_lines + n_tiles - 1) / n_tiles;
      switch (ge - g) {
        case 4: if constexpr (G >= 4) panel_tokens<Tile, 4, T>(a, g, tb, te, job, per_tile); break;
        case 3: if constexpr (G >= 3) panel_tokens<Tile, 3, T>(a, g, tb, te, job, per_tile); break;
        case 2: if constexpr (G >= 2) panel_tokens<Tile, 2, T>(a, g, tb, te, job, per_tile); break;
        default: panel_tokens<Tile, 1, T>(a, g, tb, te, job, per_tile); break;
      }
    }
  }
}

}  // namespace
}  // namespace tandem::kernels
