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
// 4 rows x 5 tokens. Every tile computes each element in the same order, so
// the tiling never changes a result.
template <template <int, int> class Tile>
void gemm_driver(const GemmArgs& a, int64_t row_begin, int64_t row_end) {
  if (a.n_tokens == 1) {
    int64_t r = row_begin;
    for (; r + 8 <= row_end; r += 8) Tile<8, 1>::run(a, r, 0);
    for (; r < row_end; ++r) Tile<1, 1>::run(a, r, 0);
    return;
  }
  constexpr int64_t kRowBlock = 32;
  for (int64_t rb = row_begin; rb < row_end; rb += kRowBlock) {
    const int64_t re = std::min(row_end, rb + kRowBlock);
    int64_t t = 0;
    for (; t + 5 <= a.n_tokens; t += 5) {
      int64_t r = rb;
      for (; r + 4 <= re; r += 4) Tile<4, 5>::run(a, r, t);
      for (; r < re; ++r) Tile<1, 5>::run(a, r, t);
    }
    for (; t < a.n_tokens; ++t) {
      int64_t r = rb;
      for (; r + 4 <= re; r += 4) Tile<4, 1>::run(a, r, t);
      for (; r < re; ++r) Tile<1, 1>::run(a, r, t);
    }
  }
}

}  // namespace
}  // namespace tandem::kernels
