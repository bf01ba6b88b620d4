// Tiling of a GEMM row range into micro-kernel calls, shared by the vector
// variants. Included only by the per-ISA files; it lives in an anonymous
// namespace so that each file gets its own copy compiled for its ISA (a shared
// inline template would let the linker pick one ISA's copy for all).
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/isa_kernels.h"

namespace tandem::kernels {
namespace {  // NOLINT(google-build-namespaces): see above

// Decode (one token) walks rows in tiles of 8 for memory-level parallelism;
// prefill walks blocks of 32 rows (kept in cache) and inside them tiles of
// 4 rows x kTokens tokens (the last tokens in one narrower tile). Every tile computes each element in the same order, so
// the tiling never changes a result.
// Rows [rb, re) of T tokens from t, in tiles of 4 rows.
template <template <int, int> class Tile, int T>
void tile_rows(const GemmArgs& a, int64_t rb, int64_t re, int64_t t) {
  int64_t r = rb;
  for (; r + 4 <= re; r += 4) Tile<4, T>::run(a, r, t);
  for (; r < re; ++r) Tile<1, T>::run(a, r, t);
}

template <template <int, int> class Tile, int kTokens = 5, int kDecodeRows = 8>
void gemm_driver(const GemmArgs& a, int64_t row_begin, int64_t row_end) {
  static_assert(kTokens >= 2 && kTokens <= 6);
  if (a.n_tokens == 1) {
    int64_t r = row_begin;
    if constexpr (kDecodeRows > 8)
      for (; r + kDecodeRows <= row_end; r += kDecodeRows) Tile<kDecodeRows, 1>::run(a, r, 0);
    for (; r + 8 <= row_end; r += 8) Tile<8, 1>::run(a, r, 0);
    for (; r < row_end; ++r) Tile<1, 1>::run(a, r, 0);
    return;
  }
  constexpr int64_t kRowBlock = 32;
  for (int64_t rb = row_begin; rb < row_end; rb += kRowBlock) {
    const int64_t re = std::min(row_end, rb + kRowBlock);
    int64_t t = 0;
    for (; t + kTokens <= a.n_tokens; t += kTokens) tile_rows<Tile, kTokens>(a, rb, re, t);
    // The last tokens in one tile of that width, so that no token pays for a
    // weight pass of its own (64 tokens: 30% of the time otherwise).
    switch (a.n_tokens - t) {
      case 5: if constexpr (kTokens > 5) tile_rows<Tile, 5>(a, rb, re, t); break;
      case 4: if constexpr (kTokens > 4) tile_rows<Tile, 4>(a, rb, re, t); break;
      case 3: if constexpr (kTokens > 3) tile_rows<Tile, 3>(a, rb, re, t); break;
      case 2: tile_rows<Tile, 2>(a, rb, re, t); break;
      case 1: tile_rows<Tile, 1>(a, rb, re, t); break;
      default: break;
    }
  }
}

}  // namespace
}  // namespace tandem::kernels
