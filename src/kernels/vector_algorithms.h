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
#include "kernels/kv_layout.h"

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

// log(sum_i exp(x[i])), the log-partition of a logit row: a pass for the
// max, then one for the exponentials, summed per lane in float within a
// chunk and across chunks in double (a 152k vocabulary stays within about
// 1e-6 of the double-precision sum). An infinite or NaN input gives NaN:
// x * 0 is 0 only for finite x, and the clamping exp would hide them.
float log_sum_exp_vec(const float* x, int64_t n) {
  constexpr int W = Vec::kWidth;
  constexpr int64_t kChunk = 1024;
  auto vmax = Vec::set1(x[0]);
  auto bad = Vec::zero();
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    const auto v = Vec::load(x + i);
    vmax = Vec::max(vmax, v);
    bad = Vec::fmadd(v, Vec::zero(), bad);
  }
  float m = Vec::reduce_max(vmax);
  float bad_tail = Vec::reduce_add(bad);
  for (; i < n; ++i) {
    m = std::max(m, x[i]);
    bad_tail += x[i] * 0.0f;
  }
  if (bad_tail != 0.0f || !std::isfinite(m)) return std::numeric_limits<float>::quiet_NaN();
  const auto vm = Vec::set1(m);
  double sum = 0.0;
  i = 0;
  while (i + W <= n) {
    const int64_t end = std::min(n - (n - i) % W, i + kChunk);
    auto acc = Vec::zero();
    for (; i < end; i += W) acc = Vec::add(acc, Vec::exp(Vec::sub(Vec::load(x + i), vm)));
    sum += static_cast<double>(Vec::reduce_add(acc));
  }
  for (; i < n; ++i) sum += static_cast<double>(Vec::first(Vec::exp(Vec::set1(x[i] - m))));
  return static_cast<float>(static_cast<double>(m) + std::log(sum));
}

// One token of the gated delta rule on one head's state (rows j = value
// elements, each S key elements): per row, decayed, then corrected toward
// v_j along k by beta, then read by q. Two passes over a row: the decay with
// the dot against k, then the update with the dot against q.
void delta_rule_vec(float* state, int64_t s, const float* k, const float* q, const float* v, float decay, float beta,
                    float scale, float* out) {
  constexpr int W = Vec::kWidth;
  const auto vd = Vec::set1(decay);
  for (int64_t j = 0; j < s; ++j) {
    float* row = state + j * s;
    auto acc = Vec::zero();
    int64_t i = 0;
    for (; i + W <= s; i += W) {
      const auto x = Vec::mul(Vec::load(row + i), vd);
      Vec::store(row + i, x);
      acc = Vec::fmadd(x, Vec::load(k + i), acc);
    }
    float sk = Vec::reduce_add(acc);
    for (; i < s; ++i) sk += (row[i] *= decay) * k[i];
    const float d = (v[j] - sk) * beta;
    const auto vdelta = Vec::set1(d);
    acc = Vec::zero();
    i = 0;
    for (; i + W <= s; i += W) {
      const auto x = Vec::fmadd(Vec::load(k + i), vdelta, Vec::load(row + i));
      Vec::store(row + i, x);
      acc = Vec::fmadd(x, Vec::load(q + i), acc);
    }
    float sq = Vec::reduce_add(acc);
    for (; i < s; ++i) sq += (row[i] += k[i] * d) * q[i];
    out[j] = sq * scale;
  }
}

// What attend_block needs of the tile: the block's K (transposed, k_row
// elements per dimension, bs_pad positions of them used) and V (hd per
// position), both of element type KT (below), and per query its running max,
// running sum and unnormalised output.
struct AttentionBlockState {
  const uint8_t* k;
  const uint8_t* v;
  int k_row;
  int bs_pad;
  int hd;
  float scale;
  bool first_block;  // output sums start from zero
  float* scores;     // Q * bs_pad scratch
  float* run_max;
  float* run_sum;
  float* out;        // hd per query
};

// The output update of attend_block for H W-wide pieces of d from d0: per
// element out * correction (zero on the first block), then p_j * V_j added
// for j ascending.
template <DType KT, int Q, int H>
inline void accumulate_values(const AttentionBlockState& st, const float* const* p, float* const* o,
                              const float* correction, int limit, int d0) {
  constexpr int W = Vec::kWidth;
  constexpr int64_t kElt = KT == DType::kF32 ? 4 : 2;
  typename Vec::V acc[Q][H];
  for (int i = 0; i < Q; ++i)
    for (int h = 0; h < H; ++h)
      acc[i][h] = st.first_block ? Vec::zero() : Vec::mul(Vec::load(o[i] + d0 + h * W), Vec::set1(correction[i]));
  for (int j = 0; j < limit; ++j) {
    typename Vec::V v[H];
    for (int h = 0; h < H; ++h) v[h] = Vec::template load_kv<KT>(st.v + kElt * (int64_t{j} * st.hd + d0 + h * W));
    for (int i = 0; i < Q; ++i) {
      const auto pj = Vec::set1(p[i][j]);
      for (int h = 0; h < H; ++h) acc[i][h] = Vec::fmadd(pj, v[h], acc[i][h]);
    }
  }
  for (int i = 0; i < Q; ++i)
    for (int h = 0; h < H; ++h) Vec::store(o[i] + d0 + h * W, acc[i][h]);
}

// Q queries that see the same `limit` positions of one KV block: q[i] is the
// query vector, qi[i] its index into the running state. Each query's
// arithmetic is exactly the one-query computation (the same partial sums in
// the same order); doing Q together only shares the K and V loads and keeps
// 4 * Q independent FMA chains in flight instead of 4.
template <DType KT, int Q>
inline void attend_block(const AttentionBlockState& st, const float* const* q, const int64_t* qi, int limit) {
  constexpr int W = Vec::kWidth;
  constexpr int64_t kElt = KT == DType::kF32 ? 4 : 2;
  const int bs_pad = st.bs_pad;
  const int hd = st.hd;
  // Scores of this block's positions, W at a time; per query four partial
  // sums over d (d mod 4), combined as (s0 + s1) + (s2 + s3).
  for (int c = 0; c < bs_pad; c += W) {
    typename Vec::V s[Q][4];
    for (int i = 0; i < Q; ++i)
      for (int p = 0; p < 4; ++p) s[i][p] = Vec::zero();
    const uint8_t* k = st.k + kElt * c;
    int d = 0;
    for (; d + 4 <= hd; d += 4) {
      for (int p = 0; p < 4; ++p) {
        const auto kd = Vec::template load_kv<KT>(k + kElt * (d + p) * st.k_row);
        for (int i = 0; i < Q; ++i) s[i][p] = Vec::fmadd(Vec::set1(q[i][d + p]), kd, s[i][p]);
      }
    }
    for (; d < hd; ++d) {
      const auto kd = Vec::template load_kv<KT>(k + kElt * d * st.k_row);
      for (int i = 0; i < Q; ++i) s[i][0] = Vec::fmadd(Vec::set1(q[i][d]), kd, s[i][0]);
    }
    for (int i = 0; i < Q; ++i)
      Vec::store(st.scores + i * bs_pad + c,
                 Vec::mul(Vec::add(Vec::add(s[i][0], s[i][1]), Vec::add(s[i][2], s[i][3])), Vec::set1(st.scale)));
  }
  // Online softmax, per query.
  float correction[Q];
  const float* p[Q];
  for (int i = 0; i < Q; ++i) {
    float* sc = st.scores + i * bs_pad;
    for (int j = limit; j < bs_pad; ++j) sc[j] = -std::numeric_limits<float>::infinity();
    auto vmax = Vec::set1(-std::numeric_limits<float>::infinity());
    for (int c = 0; c < bs_pad; c += W) vmax = Vec::max(vmax, Vec::load(sc + c));
    const float old_max = st.run_max[qi[i]];
    const float new_max = std::max(old_max, Vec::reduce_max(vmax));
    // (exp(0) is exactly 1: skipping the call when the max holds changes nothing.)
    correction[i] = old_max == new_max ? 1.0f : std::exp(old_max - new_max);
    for (int c = 0; c < bs_pad; c += W) Vec::store(sc + c, Vec::exp(Vec::sub(Vec::load(sc + c), Vec::set1(new_max))));
    for (int j = limit; j < bs_pad; ++j) sc[j] = 0.0f;
    auto vsum = Vec::zero();
    for (int c = 0; c < bs_pad; c += W) vsum = Vec::add(vsum, Vec::load(sc + c));
    st.run_sum[qi[i]] = st.run_sum[qi[i]] * correction[i] + Vec::reduce_add(vsum);
    st.run_max[qi[i]] = new_max;
    p[i] = sc;
  }
  // out = out * correction + sum_j p_j * V_j, j ascending; two W-wide pieces
  // of d at a time, then one.
  float* o[Q];
  for (int i = 0; i < Q; ++i) o[i] = st.out + qi[i] * hd;
  const int hd_vec = hd / W * W;
  int d = 0;
  for (; d + 2 * W <= hd_vec; d += 2 * W) accumulate_values<KT, Q, 2>(st, p, o, correction, limit, d);
  for (; d < hd_vec; d += W) accumulate_values<KT, Q, 1>(st, p, o, correction, limit, d);
  for (int i = 0; i < Q; ++i) {
    for (int dd = hd_vec; dd < hd; ++dd) {
      float acc = st.first_block ? 0.0f : o[i][dd] * correction[i];
      for (int j = 0; j < limit; ++j) acc = std::fma(p[i][j], kv_element<KT>(st.v, int64_t{j} * hd + dd), acc);
      o[i][dd] = acc;
    }
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
// and the cached K/V (batch and chunk invariance). Queries that see the same
// positions of a block go through it four at a time (attend_block).
constexpr int kQueriesPerPass = 4;

// The tile, reading K and V as KT: the pool's own pieces (in_place; KT is the
// pool's dtype) or f32 copies widened once per block.
template <DType KT>
void attention_tile_as(const AttentionTileArgs& a, bool in_place) {
  constexpr int W = Vec::kWidth;
  const PagedKvLayer& kv = *a.kv;
  const int bs = kv.block_size;
  const int bs_pad = (bs + W - 1) / W * W;
  const int hd = a.head_dim;
  const int64_t n_queries = static_cast<int64_t>(a.n_rows) * a.group;
  // This head's K and V pieces in every block (kv_layout.h).
  const KvBlockShape shape{hd, bs};
  const size_t elt = dtype_row_bytes(kv.dtype, 1);  // f32, f16 or bf16
  const size_t piece_bytes = elt * static_cast<size_t>(kv_head_elements(shape));
  const size_t k_piece = kv.k_offset + static_cast<size_t>(a.kv_head) * piece_bytes;
  const size_t v_piece = kv.v_offset + static_cast<size_t>(a.kv_head) * piece_bytes;

  thread_local std::vector<float> kt, vf, scores, out, run_max, run_sum;
  // Stale values in kt's padding lanes (and in its slots past the block's
  // last valid one) and in `out` are never used: scores past a query's limit
  // are overwritten with -inf, and block 0 (which every query visits first)
  // starts its output sums from zero.
  if (!in_place) {
    kt.resize(static_cast<size_t>(hd) * static_cast<size_t>(bs_pad));
    vf.resize(static_cast<size_t>(bs) * static_cast<size_t>(hd));
  }
  scores.resize(static_cast<size_t>(kQueriesPerPass * bs_pad));
  out.resize(static_cast<size_t>(n_queries * hd));
  run_max.assign(static_cast<size_t>(n_queries), -std::numeric_limits<float>::infinity());
  run_sum.assign(static_cast<size_t>(n_queries), 0.0f);
  AttentionBlockState st{reinterpret_cast<const uint8_t*>(kt.data()),
                         reinterpret_cast<const uint8_t*>(vf.data()),
                         in_place ? bs : bs_pad,
                         bs_pad,
                         hd,
                         a.scale,
                         true,
                         scores.data(),
                         run_max.data(),
                         run_sum.data(),
                         out.data()};

  const int32_t last_position = a.first_position + a.n_rows - 1;
  const int32_t n_blocks = last_position / bs + 1;
  // In decode the pieces are usually not in cache: ask for a block's lines
  // one block ahead, or the loads below wait on memory one after another.
  auto valid_in = [&](int32_t b) { return std::min(bs, last_position - b * bs + 1); };
  auto prefetch_block = [&](int32_t b) {
    const uint8_t* block = kv.base + static_cast<size_t>(a.block_table[b]) * kv.block_bytes;
    const size_t v_bytes = elt * static_cast<size_t>(valid_in(b) * hd);
    for (size_t off = 0; off < piece_bytes; off += 64) __builtin_prefetch(block + k_piece + off);
    for (size_t off = 0; off < v_bytes; off += 64) __builtin_prefetch(block + v_piece + off);
  };
  prefetch_block(0);
  for (int32_t b = 0; b < n_blocks; ++b) {
    if (b + 1 < n_blocks) prefetch_block(b + 1);
    const int32_t block_first = b * bs;
    const int n_valid = valid_in(b);
    const uint8_t* block = kv.base + static_cast<size_t>(a.block_table[b]) * kv.block_bytes;
    // K arrives transposed, one row of bs slots per dimension: read where it
    // is, or widened as it is when rows fill whole vectors, else row by row
    // into the padded rows.
    if (in_place) {
      st.k = block + k_piece;
      st.v = block + v_piece;
    } else if (bs == bs_pad) {
      Vec::widen(kv.dtype, block + k_piece, kt.data(), kv_head_elements(shape));
    } else {
      for (int d = 0; d < hd; ++d)
        Vec::widen(kv.dtype, block + k_piece + elt * static_cast<size_t>(d * bs),
                   kt.data() + static_cast<size_t>(d) * static_cast<size_t>(bs_pad), bs);
    }
    if (!in_place) Vec::widen(kv.dtype, block + v_piece, vf.data(), int64_t{n_valid} * hd);
    st.first_block = b == 0;
    // Rows before the block's first position do not reach it. Queries are
    // taken in tile order (row, then head of the group); a pass holds
    // consecutive queries that see the same number of positions.
    const int first_row = std::max(0, block_first - a.first_position);
    auto limit_of = [&](int64_t q) {
      return std::min(n_valid, a.first_position + static_cast<int>(q / a.group) - block_first + 1);
    };
    auto query = [&](int64_t q) {
      return a.q + (q / a.group) * a.ldq + static_cast<int64_t>(a.kv_head * a.group + q % a.group) * hd;
    };
    int64_t q0 = static_cast<int64_t>(first_row) * a.group;
    while (q0 < n_queries) {
      const int limit = limit_of(q0);
      if (q0 + kQueriesPerPass <= n_queries && limit_of(q0 + kQueriesPerPass - 1) == limit) {
        const float* qs[kQueriesPerPass];
        int64_t qis[kQueriesPerPass];
        for (int i = 0; i < kQueriesPerPass; ++i) {
          qs[i] = query(q0 + i);
          qis[i] = q0 + i;
        }
        attend_block<KT, kQueriesPerPass>(st, qs, qis, limit);
        q0 += kQueriesPerPass;
      } else {
        const float* qs[1] = {query(q0)};
        const int64_t qis[1] = {q0};
        attend_block<KT, 1>(st, qs, qis, limit);
        ++q0;
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

// Widening a block's K and V to f32 first costs a pass that stores them and
// is worth it when many queries reuse the copy (a prompt tile: up to 16 rows
// of a group of heads). A decode tile's few queries read the pool's pieces
// where they are, converting as they load: the same f32 values, so the same
// results, without the copy, whose stores wait on the pieces' loads from
// memory (small Q4_K_M tg512, alternating runs: attention 0.69-0.74 ms per
// step before, 0.61-0.65 after; docs/BENCHMARKS.md).
void attention_tile_vec(const AttentionTileArgs& a) {
  const int bs = a.kv->block_size;
  const bool in_place = bs % Vec::kWidth == 0 && int64_t{a.n_rows} * a.group <= 2 * kQueriesPerPass;
  if (!in_place) return attention_tile_as<DType::kF32>(a, false);
  switch (a.kv->dtype) {
    case DType::kF16: return attention_tile_as<DType::kF16>(a, true);
    case DType::kBF16: return attention_tile_as<DType::kBF16>(a, true);
    default: return attention_tile_as<DType::kF32>(a, true);
  }
}

}  // namespace
}  // namespace tandem::kernels
