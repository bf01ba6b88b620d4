// Kernels written once over a vector type and compiled once per ISA.
//
// Each per-ISA file (kernels_scalar.cpp, kernels_avx2.cpp, kernels_avx512.cpp)
// defines a struct `Vec` of static operations on its register type (width 1,
// 8 or 16 floats), then includes this header. As with gemm_driver.h, the
// anonymous namespace gives every ISA its own copy.
//
// The vector `exp` is a polynomial (Cephes' expf coefficients, about 2 ulp);
// the scalar variant uses std::exp. Within one variant every result is a fixed
// function of its inputs, which is all batch invariance needs.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/isa_kernels.h"

namespace tandem::kernels {
namespace {  // NOLINT(google-build-namespaces): see gemm_driver.h

// g = silu(g) * u = g / (1 + exp(-g)) * u.
void silu_mul_vec(float* g, const float* u, int64_t n) {
  constexpr int W = Vec::kWidth;
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    const auto x = Vec::load(g + i);
    const auto e = Vec::exp(Vec::sub(Vec::zero(), x));
    Vec::store(g + i, Vec::mul(Vec::div(x, Vec::add(Vec::set1(1.0f), e)), Vec::load(u + i)));
  }
  for (; i < n; ++i) {
    const float x = g[i];
    g[i] = x / (1.0f + Vec::first(Vec::exp(Vec::set1(-x)))) * u[i];
  }
}

// One tile of causal attention: rows [0, n_rows) of one sequence (consecutive
// positions from first_position) times the `group` query heads that share KV
// head `kv_head`, against that head's K and V through the block table.
//
// Flash-style: KV blocks are visited in order; each block's K (transposed) and
// V are widened to f32 once and then used by every query row of the tile, with
// a running max and sum per query (online softmax). A query at position p
// visits blocks 0..p / block_size and, in each, positions up to p, in the same
// order whatever the tile holds, so its result depends only on its position
// and the cached K/V (batch and chunk invariance).
void attention_tile_vec(const AttentionTileArgs& a) {
  constexpr int W = Vec::kWidth;
  const PagedKvLayer& kv = *a.kv;
  const int bs = kv.block_size;
  const int bs_pad = (bs + W - 1) / W * W;
  const int hd = a.head_dim;
  const int64_t n_queries = static_cast<int64_t>(a.n_rows) * a.group;
  const size_t head_bytes = dtype_row_bytes(kv.dtype, hd);
  const size_t head_offset = static_cast<size_t>(a.kv_head) * head_bytes;
  const int hd_vec = hd / W * W;

  thread_local std::vector<float> kt, kf, vf, scores, out, run_max, run_sum;
  // Stale values in kt's padding lanes and in `out` are never used: padding
  // scores are overwritten with -inf, and block 0 (which every query visits
  // first) starts its output sums from zero.
  kt.resize(static_cast<size_t>(hd) * static_cast<size_t>(bs_pad));
  vf.resize(static_cast<size_t>(bs) * static_cast<size_t>(hd));
  kf.resize(static_cast<size_t>(bs) * static_cast<size_t>(hd));
  scores.resize(static_cast<size_t>(bs_pad));
  out.resize(static_cast<size_t>(n_queries * hd));
  run_max.assign(static_cast<size_t>(n_queries), -std::numeric_limits<float>::infinity());
  run_sum.assign(static_cast<size_t>(n_queries), 0.0f);

  const int32_t last_position = a.first_position + a.n_rows - 1;
  const int32_t n_blocks = last_position / bs + 1;
  // This head's K and V rows of a block are short pieces (head_bytes) a row
  // apart, usually not in cache in decode: ask for a block's lines one block
  // ahead, or the loads below wait on memory one after another.
  auto prefetch_block = [&](int32_t b) {
    const uint8_t* block = kv.base + static_cast<size_t>(a.block_table[b]) * kv.block_bytes;
    const int rows = std::min(bs, last_position - b * bs + 1);
    for (int j = 0; j < rows; ++j) {
      for (size_t off = 0; off < head_bytes; off += 64) {
        __builtin_prefetch(block + kv.k_offset + static_cast<size_t>(j) * kv.row_bytes + head_offset + off);
        __builtin_prefetch(block + kv.v_offset + static_cast<size_t>(j) * kv.row_bytes + head_offset + off);
      }
    }
  };
  prefetch_block(0);
  for (int32_t b = 0; b < n_blocks; ++b) {
    if (b + 1 < n_blocks) prefetch_block(b + 1);
    const int32_t block_first = b * bs;
    const int n_valid = std::min(bs, last_position - block_first + 1);
    const uint8_t* block = kv.base + static_cast<size_t>(a.block_table[b]) * kv.block_bytes;
    // Widen every K row first and transpose afterwards: reading a value back
    // right after its vector store stalls store-to-load forwarding (it cost
    // most of the attention time when done row by row).
    for (int j = 0; j < n_valid; ++j) {
      Vec::widen(kv.dtype, block + kv.k_offset + static_cast<size_t>(j) * kv.row_bytes + head_offset,
                 kf.data() + static_cast<size_t>(j) * static_cast<size_t>(hd), hd);
      Vec::widen(kv.dtype, block + kv.v_offset + static_cast<size_t>(j) * kv.row_bytes + head_offset,
                 vf.data() + static_cast<size_t>(j) * static_cast<size_t>(hd), hd);
    }
    for (int j = 0; j < n_valid; ++j)
      for (int d = 0; d < hd; ++d) kt[static_cast<size_t>(d * bs_pad + j)] = kf[static_cast<size_t>(j * hd + d)];
    // Rows before the block's first position do not reach it.
    const int first_row = std::max(0, block_first - a.first_position);
    for (int t = first_row; t < a.n_rows; ++t) {
      const int limit = std::min(n_valid, a.first_position + t - block_first + 1);
      for (int g = 0; g < a.group; ++g) {
        const int64_t qi = static_cast<int64_t>(t) * a.group + g;
        const float* q = a.q + t * a.ldq + static_cast<int64_t>(a.kv_head * a.group + g) * hd;
        // Scores of this block's positions, W at a time; four partial sums
        // over d keep four FMA chains in flight.
        auto vmax = Vec::set1(-std::numeric_limits<float>::infinity());
        for (int c = 0; c < bs_pad; c += W) {
          auto s0 = Vec::zero(), s1 = Vec::zero(), s2 = Vec::zero(), s3 = Vec::zero();
          const float* k = kt.data() + c;
          int d = 0;
          for (; d + 4 <= hd; d += 4) {
            s0 = Vec::fmadd(Vec::set1(q[d]), Vec::load(k + (d + 0) * bs_pad), s0);
            s1 = Vec::fmadd(Vec::set1(q[d + 1]), Vec::load(k + (d + 1) * bs_pad), s1);
            s2 = Vec::fmadd(Vec::set1(q[d + 2]), Vec::load(k + (d + 2) * bs_pad), s2);
            s3 = Vec::fmadd(Vec::set1(q[d + 3]), Vec::load(k + (d + 3) * bs_pad), s3);
          }
          for (; d < hd; ++d) s0 = Vec::fmadd(Vec::set1(q[d]), Vec::load(k + d * bs_pad), s0);
          const auto s = Vec::mul(Vec::add(Vec::add(s0, s1), Vec::add(s2, s3)), Vec::set1(a.scale));
          Vec::store(scores.data() + c, s);
        }
        for (int j = limit; j < bs_pad; ++j) scores[static_cast<size_t>(j)] = -std::numeric_limits<float>::infinity();
        for (int c = 0; c < bs_pad; c += W) vmax = Vec::max(vmax, Vec::load(scores.data() + c));
        const float new_max = std::max(run_max[static_cast<size_t>(qi)], Vec::reduce_max(vmax));
        const float correction = std::exp(run_max[static_cast<size_t>(qi)] - new_max);
        auto vsum = Vec::zero();
        for (int c = 0; c < bs_pad; c += W) {
          const auto p = Vec::exp(Vec::sub(Vec::load(scores.data() + c), Vec::set1(new_max)));
          Vec::store(scores.data() + c, p);
        }
        for (int j = limit; j < bs_pad; ++j) scores[static_cast<size_t>(j)] = 0.0f;
        for (int c = 0; c < bs_pad; c += W) vsum = Vec::add(vsum, Vec::load(scores.data() + c));
        run_sum[static_cast<size_t>(qi)] = run_sum[static_cast<size_t>(qi)] * correction + Vec::reduce_add(vsum);
        run_max[static_cast<size_t>(qi)] = new_max;
        // out = out * correction + sum_j p_j * V_j.
        float* o = out.data() + qi * hd;
        for (int d = 0; d < hd_vec; d += W) {
          auto acc = b == 0 ? Vec::zero() : Vec::mul(Vec::load(o + d), Vec::set1(correction));
          for (int j = 0; j < limit; ++j)
            acc = Vec::fmadd(Vec::set1(scores[static_cast<size_t>(j)]), Vec::load(vf.data() + j * hd + d), acc);
          Vec::store(o + d, acc);
        }
        for (int d = hd_vec; d < hd; ++d) {
          float acc = b == 0 ? 0.0f : o[d] * correction;
          for (int j = 0; j < limit; ++j) acc = std::fma(scores[static_cast<size_t>(j)], vf[static_cast<size_t>(j * hd + d)], acc);
          o[d] = acc;
        }
      }
    }
  }
  for (int t = 0; t < a.n_rows; ++t) {
    for (int g = 0; g < a.group; ++g) {
      const int64_t qi = static_cast<int64_t>(t) * a.group + g;
      const float inv = 1.0f / run_sum[static_cast<size_t>(qi)];
      float* dst = a.out + t * a.ldo + static_cast<int64_t>(a.kv_head * a.group + g) * hd;
      for (int d = 0; d < hd; ++d) dst[d] = out[static_cast<size_t>(qi * hd + d)] * inv;
    }
  }
}

}  // namespace
}  // namespace tandem::kernels
