// Every vectorized kernel agrees with the scalar reference within a stated
// tolerance, on odd shapes; and every variant is batch-invariant (a row's
// result is bitwise the same whatever else is computed with it).
#include <gtest/gtest.h>

#include <limits>

#include <algorithm>
#include <cstddef>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "kernels/isa.h"
#include "kernels/isa_kernels.h"
#include "kernels/k_quants.h"
#include "kernels/kv_layout.h"
#include "kernels/kv_write.h"
#include "kernels/legacy_quants.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "util/fp16.h"
#include "util/thread_pool.h"

namespace tandem::kernels {
namespace {

constexpr DType kAllTypes[] = {DType::kF32,  DType::kF16,  DType::kBF16,   DType::kQ8_0, DType::kQ4_K,
                               DType::kQ6_K, DType::kQ4_0, DType::kQ4_1,   DType::kQ5_0, DType::kQ5_1,
                               DType::kIQ4_NL, DType::kQ5_K, DType::kQ2_K, DType::kQ3_K, DType::kIQ4_XS};
static_assert(std::size(kAllTypes) == kDTypeCount);

// The block types besides q8_0, whose kernels are checked against the product
// of ggml's dequantization.
constexpr DType kLowBitTypes[] = {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kIQ4_NL, DType::kQ2_K,
                                  DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kIQ4_XS};

bool is_k_quant(DType t) { return dtype_block_elements(t) == 256; }

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  for (Isa i : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512})
    if (isa_supported(i)) out.push_back(i);
  return out;
}

const IsaKernels& table(Isa i) {
  return i == Isa::kAvx512 ? kAvx512Kernels : i == Isa::kAvx2 ? kAvx2Kernels : kScalarKernels;
}

struct Problem {
  DType type;
  int64_t rows, cols, tokens;
  std::vector<uint8_t> w;
  std::vector<float> w_deq;  // the weights as the kernels see them
  std::vector<float> x;
  std::vector<BlockQ8_0Act> xq;
  std::vector<uint16_t> xb;
  int64_t group = 1;  // the weight layout (GemmArgs)
  int64_t chunk_bytes = 64;

  Problem(DType t, int64_t r, int64_t c, int64_t n, uint64_t seed) : type(t), rows(r), cols(c), tokens(n) {
    std::mt19937 rng(static_cast<uint32_t>(seed));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const size_t rb = dtype_row_bytes(t, c);
    w.resize(rb * static_cast<size_t>(r));
    w_deq.resize(static_cast<size_t>(r * c));
    std::vector<float> row(static_cast<size_t>(c));
    for (int64_t i = 0; i < r; ++i) {
      for (auto& v : row) v = u(rng);
      convert_row(row.data(), t, w.data() + static_cast<size_t>(i) * rb, c);
      if (t == DType::kQ8_0)  // -128, which the quantizer never writes but a file may hold
        for (int64_t b = (i % 3); b < c / 32; b += 3)
          w[static_cast<size_t>(i) * rb + static_cast<size_t>(b) * sizeof(BlockQ8_0) + 2 + static_cast<size_t>(b % 32)] = 0x80;
      dequantize_row(t, w.data() + static_cast<size_t>(i) * rb, w_deq.data() + i * c, c);
    }
    x.resize(static_cast<size_t>(n * c));
    for (auto& v : x) v = u(rng);
    if (t == DType::kBF16) {  // bf16 weights take activations rounded to bf16 (see GemmArgs)
      xb.resize(x.size());
      round_row_bf16(x.data(), xb.data(), x.data(), static_cast<int64_t>(x.size()));
    }
    if (takes_q8_activations(t)) {
      xq.resize(static_cast<size_t>(n * c / 32));
      for (int64_t i = 0; i < n; ++i) quantize_row_q8_0(x.data() + i * c, xq.data() + i * (c / 32), c);
    }
  }

  GemmArgs args(float* y) const {
    return GemmArgs{w.data(), dtype_row_bytes(type, cols), cols, x.data(), cols,        xq.data(), cols / 32,
                    xb.data(), cols,                        tokens, y,     rows, group, chunk_bytes};
  }

  // The same problem with its weights in the interleaved layout of its type.
  // (The layout chosen for the kernels of `isa`.)
  Problem interleaved(Isa isa = active_isa()) const {
    Problem p = *this;
    const WeightMatrix plain{type, w.data(), rows, cols, dtype_row_bytes(type, cols)};
    EXPECT_TRUE(can_interleave(plain, isa));
    const WeightMatrix m = interleave_rows(plain, p.w.data(), isa);
    p.group = m.group;
    p.chunk_bytes = m.chunk_bytes;
    return p;
  }

  std::vector<float> run(Isa isa) const {
    std::vector<float> y(static_cast<size_t>(tokens * rows), NAN);
    gemm_for(table(isa), type)(args(y.data()), 0, rows);
    return y;
  }

  // Bound on the rounding error of a length-k float dot product: a generous
  // multiple of k * eps * sum |x_i w_i|.
  float tolerance(int64_t t, int64_t r) const {
    double abs_sum = 0;
    for (int64_t k = 0; k < cols; ++k) abs_sum += std::fabs(x[static_cast<size_t>(t * cols + k)] * w_deq[static_cast<size_t>(r * cols + k)]);
    return static_cast<float>(abs_sum * 4e-7 * static_cast<double>(cols) + 1e-6);
  }
};

TEST(Fp16, KnownConversions) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(70000.0f), 0x7c00);  // overflow saturates to inf
  EXPECT_EQ(f32_to_f16(1e-9f), 0x0000);
  EXPECT_EQ(f32_to_f16(5.9604645e-8f), 0x0001);  // smallest subnormal
  EXPECT_EQ(f16_to_f32(0x0001), 5.9604645e-8f);
  EXPECT_EQ(f16_to_f32(0x3555), 0.333251953125f);
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(NAN))));
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(0x4049), 3.140625f);
  // Every half value survives a round trip through f32.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16(f), h) << h;
  }
  // Round to nearest even between two halves.
  EXPECT_EQ(f32_to_f16(1.0f + 1.0f / 2048.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(1.0f + 3.0f / 2048.0f), 0x3c02);
}

TEST(Kernels, GemmMatchesScalarReferenceOnOddShapes) {
  for (DType t : kAllTypes) {
    const std::vector<int64_t> cols = dtype_block_elements(t) == 32 ? std::vector<int64_t>{32, 96, 160}
                                      : is_k_quant(t)     ? std::vector<int64_t>{256, 768}
                                                          : std::vector<int64_t>{1, 7, 15, 16, 17, 64, 100};
    for (int64_t c : cols) {
      for (int64_t r : {1, 3, 8, 13, 37}) {
        for (int64_t n : {1, 2, 6, 7, 10, 11}) {
          Problem p(t, r, c, n, static_cast<uint64_t>(c * 1000 + r * 10 + n));
          const std::vector<float> ref = p.run(Isa::kScalar);
          for (Isa isa : supported_isas()) {
            const std::vector<float> y = p.run(isa);
            for (int64_t tok = 0; tok < n; ++tok)
              for (int64_t row = 0; row < r; ++row) {
                const size_t i = static_cast<size_t>(tok * r + row);
                ASSERT_NEAR(y[i], ref[i], p.tolerance(tok, row))
                    << dtype_name(t) << " " << isa_name(isa) << " rows=" << r << " cols=" << c << " n=" << n;
              }
          }
        }
      }
    }
  }
}

TEST(Kernels, Q8_0ReferenceMatchesDequantizedProduct) {
  // The q8_0 product equals the product of the dequantized weights with the
  // quantized activations' values, up to float rounding.
  Problem p(DType::kQ8_0, 5, 128, 3, 7);
  const std::vector<float> y = p.run(Isa::kScalar);
  for (int64_t t = 0; t < 3; ++t)
    for (int64_t r = 0; r < 5; ++r) {
      double exact = 0;
      for (int64_t k = 0; k < 128; ++k) {
        const BlockQ8_0Act& b = p.xq[static_cast<size_t>(t * 4 + k / 32)];
        exact += static_cast<double>(p.w_deq[static_cast<size_t>(r * 128 + k)]) * b.d * b.qs[k % 32];
      }
      EXPECT_NEAR(y[static_cast<size_t>(t * 5 + r)], exact, 1e-4 * (1 + std::fabs(exact)));
    }
}

// Blocks of random bytes (every bit pattern of the packed scales, the high
// bits and the nibbles), their f16 scales (and mins) set to finite values.
void randomize_blocks(Problem& p, uint32_t seed) {
  std::mt19937 rng(seed);
  for (uint8_t& b : p.w) b = static_cast<uint8_t>(rng());
  const size_t block = dtype_block_bytes(p.type);
  // Offsets of the f16 fields: d first (q6_K: last), then dmin or m.
  std::vector<size_t> halves{0};
  if (p.type == DType::kQ6_K) halves = {offsetof(BlockQ6_K, d)};
  if (p.type == DType::kQ3_K) halves = {offsetof(BlockQ3_K, d)};
  if (p.type == DType::kQ2_K) halves = {offsetof(BlockQ2_K, d), offsetof(BlockQ2_K, dmin)};
  if (p.type == DType::kQ4_K || p.type == DType::kQ5_K || p.type == DType::kQ4_1 || p.type == DType::kQ5_1)
    halves = {0, 2};
  std::uniform_real_distribution<float> scale(-0.02f, 0.02f);
  for (size_t off = 0; off < p.w.size(); off += block)
    for (size_t h : halves) {
      const uint16_t v = f32_to_f16(scale(rng));
      std::memcpy(p.w.data() + off + h, &v, 2);
    }
  const size_t rb = dtype_row_bytes(p.type, p.cols);
  for (int64_t r = 0; r < p.rows; ++r)
    dequantize_row(p.type, p.w.data() + static_cast<size_t>(r) * rb, p.w_deq.data() + r * p.cols, p.cols);
}

// The kernels of the block types below 8 bits equal the product of the
// weights as ggml dequantizes them (gguf/dequantize, bit-identical to ggml)
// with the quantized activations, up to float rounding, in every variant;
// the AVX2 and AVX-512 variants compute the same integers and the same float
// steps, so they agree bitwise with each other.
TEST(Kernels, LowBitKernelsMatchTheDequantizedProduct) {
  for (DType t : kLowBitTypes) {
    for (bool random_bytes : {false, true}) {
      for (int64_t tokens : {5, 1}) {  // prompt tiles, and decode tiles (AVX-512: their own for the 32-element types)
        Problem p(t, 21, 768, tokens, 21);
        if (random_bytes) randomize_blocks(p, 77);
        std::vector<std::vector<float>> by_isa;
        for (Isa isa : supported_isas()) {
          const std::vector<float> y = p.run(isa);
          for (int64_t tok = 0; tok < p.tokens; ++tok)
            for (int64_t r = 0; r < p.rows; ++r) {
              double exact = 0, magnitude = 0;
              for (int64_t k = 0; k < p.cols; ++k) {
                const BlockQ8_0Act& b = p.xq[static_cast<size_t>(tok * (p.cols / 32) + k / 32)];
                const double term = static_cast<double>(p.w_deq[static_cast<size_t>(r * p.cols + k)]) * b.d * b.qs[k % 32];
                exact += term;
                magnitude += std::fabs(term);
              }
              ASSERT_NEAR(y[static_cast<size_t>(tok * p.rows + r)], exact, 1e-5 * magnitude + 1e-6)
                  << dtype_name(t) << " " << isa_name(isa) << (random_bytes ? " random blocks" : " quantized") << " token "
                  << tok << " row " << r;
            }
          if (isa != Isa::kScalar) by_isa.push_back(y);
        }
        for (size_t i = 1; i < by_isa.size(); ++i)
          EXPECT_EQ(std::memcmp(by_isa[i].data(), by_isa[0].data(), by_isa[0].size() * 4), 0)
              << dtype_name(t) << " tokens " << tokens;
      }
    }
  }
}

// tandem's own quantizers: what a row dequantizes to is near the row, by a
// bound on the RMS error relative to the row's RMS that the types' bits allow
// (normal values; measured: q2_K 0.333, q3_K 0.159, q4_K 0.078, q5_K 0.038,
// q6_K 0.019, iq4_xs 0.081, and with a scale per 32: q4_0 0.085, q4_1 0.078,
// q5_0 0.043, q5_1 0.038, iq4_nl 0.080).
TEST(Kernels, LowBitQuantizersKeepTheRowsErrorSmall) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto [t, bound] : {std::pair{DType::kQ4_K, 0.09}, std::pair{DType::kQ5_K, 0.045}, std::pair{DType::kQ6_K, 0.025},
                          std::pair{DType::kQ4_0, 0.11}, std::pair{DType::kQ4_1, 0.1}, std::pair{DType::kQ5_0, 0.055},
                          std::pair{DType::kQ5_1, 0.05}, std::pair{DType::kIQ4_NL, 0.1}, std::pair{DType::kQ2_K, 0.4},
                          std::pair{DType::kQ3_K, 0.2}, std::pair{DType::kIQ4_XS, 0.1}}) {
    std::vector<float> x(4096), back(x.size());
    for (size_t i = 0; i < x.size(); ++i) x[i] = normal(rng) * (i < 2048 ? 1.0f : 0.01f);  // two magnitudes
    std::vector<uint8_t> q(dtype_row_bytes(t, 4096));
    convert_row(x.data(), t, q.data(), 4096);
    dequantize_row(t, q.data(), back.data(), 4096);
    for (int half = 0; half < 2; ++half) {
      double err = 0, ref = 0;
      for (size_t i = 2048 * static_cast<size_t>(half); i < 2048 * static_cast<size_t>(half + 1); ++i) {
        err += (back[i] - x[i]) * (back[i] - x[i]);
        ref += x[i] * x[i];
      }
      EXPECT_LT(std::sqrt(err / ref), bound) << dtype_name(t) << " half " << half;
    }
  }
}

// A panel block of 16 rows' blocks gives each row's block back byte for
// byte, and depends on nothing but those blocks (every panel byte written,
// including those of the bit masks of q3_K's high bits and q5_0's and
// q5_1's fifth bits, which are set bit by bit).
TEST(Kernels, PanelBlocksGiveBackTheBlocksTheyWerePackedFrom) {
  std::mt19937 rng(7);
  for (DType t : kAllTypes) {
    const bool k_quant = has_k_quant_panels(t);
    if (!k_quant && !has_legacy_panels(t)) continue;
    const auto pack = k_quant ? pack_k_quant_panel : pack_legacy_panel;
    const auto unpack = k_quant ? unpack_k_quant_panel_row : unpack_legacy_panel_row;
    const size_t bytes = dtype_block_bytes(t);
    std::vector<uint8_t> blocks(16 * bytes);
    for (uint8_t& b : blocks) b = static_cast<uint8_t>(rng());
    const uint8_t* rows[16];
    for (int r = 0; r < 16; ++r) rows[r] = blocks.data() + static_cast<size_t>(r) * bytes;
    std::vector<uint8_t> zeros(16 * bytes, 0x00), ones(16 * bytes, 0xFF);
    pack(t, rows, zeros.data());
    pack(t, rows, ones.data());
    EXPECT_EQ(zeros, ones) << dtype_name(t) << ": a panel byte kept what was there before";
    for (int r = 0; r < 16; ++r) {
      std::vector<uint8_t> back(bytes, 0xA5);
      unpack(t, zeros.data(), r, back.data());
      EXPECT_EQ(std::memcmp(back.data(), rows[r], bytes), 0) << dtype_name(t) << " row " << r;
    }
  }
}

// Interleaving a slice of whole groups at a time writes the same bytes as the
// whole matrix at once, and hands back every source byte once, in order.
TEST(Kernels, InterleavingInSlicesWritesTheSameBytes) {
  for (DType t : kAllTypes) {
    for (Isa isa : supported_isas()) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " " + std::string(isa_name(isa)));
      const int64_t cols = 256, rows = 80;
      const Problem p(t, rows, cols, 1, 7);
      const WeightMatrix plain{t, p.w.data(), rows, cols, dtype_row_bytes(t, cols)};
      std::vector<uint8_t> whole(p.w.size()), sliced(p.w.size(), 0xAA);
      const WeightMatrix a = interleave_rows(plain, whole.data(), isa);
      const auto group_bytes = static_cast<int64_t>(plain.row_bytes) * a.group;
      for (int64_t slice_bytes : {int64_t{1}, 3 * group_bytes, 3 * group_bytes + 5, int64_t{1} << 30}) {
        std::fill(sliced.begin(), sliced.end(), 0xAA);
        const uint8_t* next = p.w.data();
        const WeightMatrix b = interleave_rows_in_slices(plain, sliced.data(), slice_bytes, [&](const uint8_t* done, size_t n) {
          EXPECT_EQ(done, next);
          EXPECT_EQ(n % static_cast<size_t>(group_bytes), 0u);
          next = done + n;
        }, isa);
        EXPECT_EQ(next, p.w.data() + p.w.size());
        EXPECT_EQ(sliced, whole) << "slices of at most " << slice_bytes << " bytes";
        EXPECT_EQ(b.data, sliced.data());
        EXPECT_EQ(b.rows, a.rows);
        EXPECT_EQ(b.group, a.group);
        EXPECT_EQ(b.chunk_bytes, a.chunk_bytes);
      }
    }
  }
}

// The interleaved layouts (matmul.h) only move bytes. Chunk groups (the
// block types in the scalar reference's layout) give bitwise the products
// of plain rows in every variant. Panels (f32, f16, bf16; the block types
// in AVX-512's and AVX2's layouts) do in the scalar reference, whose order is the same for every
// layout, and agree within the rounding bound in the vector variants, whose
// panel tiles reduce in one chain over k (or k pairs, or blocks); the block
// types' panels give bitwise the same in AVX2 as in AVX-512. Row ranges start or end
// inside a group.
TEST(Kernels, InterleavedWeightsGiveTheSameProducts) {
  for (DType t : kAllTypes) {
    for (Isa layout_isa : supported_isas()) {
      const InterleavedLayout layout = interleaved_layout(t, layout_isa);
      const bool panel = is_panel_layout(t, layout.group);
      // AVX-512 and AVX2 have panel tiles for every block type.
      EXPECT_EQ(panel, is_float_dtype(t) || layout_isa != Isa::kScalar) << dtype_name(t) << " " << isa_name(layout_isa);
      EXPECT_EQ(layout.group, panel ? kPanelRows : 8);
      for (int64_t rows : {16, 48, 80}) {  // (80 on panels: a decode tile of 4 groups, then one of 1)
        for (int64_t cols : {32, 96, 256}) {
          if (cols % dtype_block_elements(t) != 0) cols = dtype_block_elements(t) * (cols / 32);
          for (int64_t n : {1, 6, 11}) {
            const Problem p(t, rows, cols, n, static_cast<uint64_t>(rows * 100 + cols + n));
            const Problem inter = p.interleaved(layout_isa);
            EXPECT_EQ(inter.group, layout.group);
            if (panel || static_cast<int64_t>(dtype_row_bytes(t, cols)) > layout.chunk_bytes) {  // (one block per row: the same order)
              EXPECT_NE(inter.w, p.w);
            }
            std::vector<float> avx512_result;
            for (Isa isa : supported_isas()) {
              const std::vector<float> want = p.run(isa);
              std::vector<float> y(want.size(), NAN);
              const GemmArgs a = inter.args(y.data());
              gemm_for(table(isa), t)(a, 0, 5);
              gemm_for(table(isa), t)(a, 5, rows);
              const std::string where = std::string(dtype_name(t)) + " " + isa_name(isa) + " on " +
                                        isa_name(layout_isa) + "'s layout, rows=" + std::to_string(rows) +
                                        " cols=" + std::to_string(cols) + " n=" + std::to_string(n);
              if (!panel || isa == Isa::kScalar) {
                EXPECT_EQ(std::memcmp(y.data(), want.data(), y.size() * 4), 0) << where;
                continue;
              }
              for (int64_t tok = 0; tok < n; ++tok)
                for (int64_t r = 0; r < rows; ++r) {
                  const size_t i = static_cast<size_t>(tok * rows + r);
                  ASSERT_NEAR(y[i], want[i], p.tolerance(tok, r)) << where;
                }
              if (isa == Isa::kAvx512) avx512_result = y;
            }
            if (panel && has_block_panels(t) && !avx512_result.empty()) {
              std::vector<float> y(avx512_result.size(), NAN);
              gemm_for(table(Isa::kAvx2), t)(inter.args(y.data()), 0, rows);
              EXPECT_EQ(std::memcmp(y.data(), avx512_result.data(), y.size() * 4), 0) << dtype_name(t) << " avx2 vs avx512";
            }
          }
        }
      }
    }
  }
  // Shapes that cannot be interleaved stay plain.
  std::vector<uint8_t> bytes(4096);
  EXPECT_FALSE(can_interleave(WeightMatrix{DType::kQ8_0, bytes.data(), 13, 32, dtype_row_bytes(DType::kQ8_0, 32)}));
  EXPECT_FALSE(can_interleave(WeightMatrix{DType::kBF16, bytes.data(), 16, 17, dtype_row_bytes(DType::kBF16, 17)}));
  EXPECT_FALSE(can_interleave(WeightMatrix{DType::kF16, bytes.data(), 8, 32, dtype_row_bytes(DType::kF16, 32)}));
  EXPECT_TRUE(can_interleave(WeightMatrix{DType::kF16, bytes.data(), 16, 17, dtype_row_bytes(DType::kF16, 17)}));
}

// Panels on odd reduction lengths (any length for f32/f16, any even one for
// bf16 pairs), many row counts and cut row ranges, against the scalar
// reference on plain rows.
TEST(Kernels, PanelGemmMatchesScalarReferenceOnOddShapes) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    const std::vector<int64_t> cols = t == DType::kBF16 ? std::vector<int64_t>{2, 18, 34, 100} : std::vector<int64_t>{1, 7, 17, 100};
    for (int64_t c : cols) {
      for (int64_t r : {16, 48, 80, 96, 176}) {  // (176: decode tiles of 4 panels, then single ones)
        for (int64_t n : {1, 2, 6, 7, 13}) {
          const Problem p(t, r, c, n, static_cast<uint64_t>(c * 1000 + r * 10 + n));
          const std::vector<float> ref = p.run(Isa::kScalar);
          const Problem inter = p.interleaved();
          for (Isa isa : supported_isas()) {
            std::vector<float> y(ref.size(), NAN);
            const GemmArgs a = inter.args(y.data());
            // Cuts inside the first and the last group.
            gemm_for(table(isa), t)(a, 0, 3);
            gemm_for(table(isa), t)(a, 3, r - 13);
            gemm_for(table(isa), t)(a, r - 13, r);
            for (int64_t tok = 0; tok < n; ++tok)
              for (int64_t row = 0; row < r; ++row) {
                const size_t i = static_cast<size_t>(tok * r + row);
                ASSERT_NEAR(y[i], ref[i], p.tolerance(tok, row))
                    << dtype_name(t) << " " << isa_name(isa) << " rows=" << r << " cols=" << c << " n=" << n;
              }
          }
        }
      }
    }
  }
}

TEST(Kernels, GemmIsBatchInvariantInEveryVariant) {
  for (Isa isa : supported_isas()) {
    for (DType t : kAllTypes) {
      for (bool interleaved : {false, true}) {
        // 256 tokens: three token blocks in every plan (gemm_driver.h), so
        // tiles on both sides of a block boundary and short last tiles (the
        // AVX-512 float plan: 87 + 87 + 82 tokens, 82 = 26 x 3 + 2 x 2).
        // Interleaved: 176 rows, eleven panels of 16 (AVX-512: 4-group
        // prompt tiles and a 3-group one; in the last range decode tiles of
        // 4 groups and single groups) or 22 chunk groups of 8.
        const Problem plain(t, interleaved ? 176 : 45, is_k_quant(t) ? 512 : 160, 256, 99);
        const Problem p = interleaved ? plain.interleaved() : plain;
        const std::vector<float> all = p.run(isa);
        // Each token alone, each row range separately (cut inside groups).
        Problem single = p;  // (copied once: a copy per token would cost more than the products)
        single.tokens = 1;
        for (int64_t tok = 0; tok < p.tokens; ++tok) {
          single.x.assign(p.x.begin() + tok * p.cols, p.x.begin() + (tok + 1) * p.cols);
          if (t == DType::kBF16) single.xb.assign(p.xb.begin() + tok * p.cols, p.xb.begin() + (tok + 1) * p.cols);
          if (takes_q8_activations(t)) single.xq.assign(p.xq.begin() + tok * p.cols / 32, p.xq.begin() + (tok + 1) * p.cols / 32);
          std::vector<float> y(static_cast<size_t>(p.rows), NAN);
          const GemmArgs a = single.args(y.data());
          gemm_for(table(isa), t)(a, 0, 19);
          gemm_for(table(isa), t)(a, 19, 20);
          gemm_for(table(isa), t)(a, 20, p.rows);
          for (int64_t r = 0; r < p.rows; ++r)
            ASSERT_EQ(std::memcmp(&y[static_cast<size_t>(r)], &all[static_cast<size_t>(tok * p.rows + r)], 4), 0)
                << isa_name(isa) << " " << dtype_name(t) << (interleaved ? " interleaved" : " plain") << " token " << tok
                << " row " << r;
        }
      }
    }
  }
}

// A call writes its row range and nothing else: threads own disjoint row
// ranges, and an epilogue may already have changed the rows next to its own.
// Panels compute whole groups of 16, so their stores are masked.
TEST(Kernels, GemmWritesOnlyItsRowRange) {
  for (DType t : kAllTypes) {
    for (bool interleaved : {false, true}) {
      for (int64_t n : {1, 7}) {
        const Problem plain(t, 64, is_k_quant(t) ? 256 : 64, n, 5);
        const Problem p = interleaved ? plain.interleaved() : plain;
        for (Isa isa : supported_isas()) {
          std::vector<float> y(static_cast<size_t>(n * 64), -12345.0f);
          gemm_for(table(isa), t)(p.args(y.data()), 19, 37);
          for (int64_t tok = 0; tok < n; ++tok)
            for (int64_t r = 0; r < 64; ++r) {
              const float v = y[static_cast<size_t>(tok * 64 + r)];
              if (r >= 19 && r < 37) {
                EXPECT_NE(v, -12345.0f);
              } else {
                ASSERT_EQ(v, -12345.0f) << dtype_name(t) << " " << isa_name(isa) << (interleaved ? " interleaved" : " plain")
                                        << " n=" << n << " row " << r;
              }
            }
        }
      }
    }
  }
}

TEST(Kernels, MatmulGroupSameForOneAndTwoThreads) {
  Problem a(DType::kF16, 40, 64, 9, 1);
  Problem b(DType::kF16, 24, 64, 9, 2);
  b.x = a.x;
  WeightMatrix wa{DType::kF16, a.w.data(), a.rows, a.cols, dtype_row_bytes(DType::kF16, 64)};
  WeightMatrix wb{DType::kF16, b.w.data(), b.rows, b.cols, dtype_row_bytes(DType::kF16, 64)};
  std::vector<float> ya1(40 * 9), yb1(24 * 9), ya2(40 * 9), yb2(24 * 9);
  ThreadPool one(1), two(2);
  const MatmulOutput g1[] = {{&wa, ya1.data(), 40}, {&wb, yb1.data(), 24}};
  const MatmulOutput g2[] = {{&wa, ya2.data(), 40}, {&wb, yb2.data(), 24}};
  matmul(g1, a.x.data(), 64, 9, one);
  matmul(g2, a.x.data(), 64, 9, two);
  EXPECT_EQ(std::memcmp(ya1.data(), ya2.data(), ya1.size() * 4), 0);
  EXPECT_EQ(std::memcmp(yb1.data(), yb2.data(), yb1.size() * 4), 0);
  // And the grouped product equals the reference.
  const std::vector<float> ref = a.run(Isa::kScalar);
  for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(ya1[i], ref[i], 1e-4);
}

// A decode matmul told what comes next computes what it computes without,
// and what each thread queues to fetch while it waits is its share of the
// next group as its tiles read it: its rows of each output it covers, in
// output order, whole groups of rows, nothing of any other thread's rows.
TEST(Kernels, ADecodeMatmulQueuesEachThreadsNextShare) {
  for (DType t : {DType::kF16, DType::kQ8_0, DType::kQ4_K, DType::kQ6_K, DType::kQ4_0}) {
    SCOPED_TRACE(dtype_name(t));
    const int64_t cols = 256;
    const Problem q = Problem(t, 512, cols, 1, 1).interleaved(), k = Problem(t, 128, cols, 1, 2).interleaved(),
                  v = Problem(t, 128, cols, 1, 3).interleaved();
    const size_t rb = dtype_row_bytes(t, cols);
    const WeightMatrix wq{t, q.w.data(), q.rows, cols, rb, q.group, q.chunk_bytes};
    const WeightMatrix wk{t, k.w.data(), k.rows, cols, rb, k.group, k.chunk_bytes};
    const WeightMatrix wv{t, v.w.data(), v.rows, cols, rb, v.group, v.chunk_bytes};
    ThreadPool two(2), three(3);
    for (ThreadPool* pool : {&two, &three}) {
      for (bool same_rows : {false, true}) {
        const std::vector<const WeightMatrix*> outputs =
            same_rows ? std::vector<const WeightMatrix*>{&wk, &wv} : std::vector<const WeightMatrix*>{&wq, &wk, &wv};
        const NextMatmul next{outputs, MatmulSplit{.row_grain = 64, .same_rows = same_rows}};
        const int64_t rows = same_rows ? 128 : 768;
        for (int th = 0; th < pool->size(); ++th) {
          SCOPED_TRACE(th);
          const auto [b, e] = pool->balanced_range(rows, 64, th);
          const IdleFetch::Ranges s = next_share(next, *pool, th);
          // The expected ranges: rows [b, e) of each output, or of their concatenation.
          std::vector<IdleFetch::Range> want;
          int64_t first = 0;
          for (const WeightMatrix* m : outputs) {
            const int64_t rb_ = same_rows ? b : std::max(b, first) - first;
            const int64_t re_ = same_rows ? e : std::min(e, first + m->rows) - first;
            first += m->rows;
            if (rb_ < re_) want.push_back({m->data + rb_ * static_cast<int64_t>(rb), (re_ - rb_) * static_cast<int64_t>(rb)});
          }
          ASSERT_EQ(s.n, static_cast<int>(want.size()));
          for (int i = 0; i < s.n; ++i) {
            EXPECT_EQ(s.range[static_cast<size_t>(i)].data, want[static_cast<size_t>(i)].data) << "range " << i;
            EXPECT_EQ(s.range[static_cast<size_t>(i)].bytes, want[static_cast<size_t>(i)].bytes) << "range " << i;
          }
        }
      }
    }
    // The products do not change for being told what comes next.
    const MatmulInput in = takes_q8_activations(t) ? MatmulInput{nullptr, 0, q.xq.data(), cols / 32} : MatmulInput{q.x.data(), cols};
    std::vector<float> plain(512), told(512);
    const MatmulOutput without[] = {{&wq, plain.data(), 512}};
    const MatmulOutput with[] = {{&wq, told.data(), 512}};
    const NextMatmul next{{&wk, &wv}, {}};
    matmul(without, in, 1, two);
    matmul(with, in, 1, two, {}, {}, {.early = {}, .next = &next});
    EXPECT_EQ(std::memcmp(plain.data(), told.data(), plain.size() * 4), 0);
    // The thread's share of the next group is queued when its share ends (on
    // one thread, whose region has no wait to fetch it in).
    ThreadPool one(1);
    IdleFetch::this_thread().queue({}, 0);
    matmul(with, in, 1, one, {}, {}, {.early = {}, .next = &next});
    EXPECT_EQ(IdleFetch::this_thread().take_step().data, next_share(next, one, 0).range[0].data);
  }
}

TEST(Kernels, DecodeKvHeadsGiveEveryThreadItsOwnHeadsCoveringEachOnce) {
  for (int n_threads : {1, 2, 3, 5}) {
    for (auto [b, e] : {std::pair{0, 4}, std::pair{2, 8}, std::pair{0, 1}}) {
      int next = b;
      for (int t = 0; t < n_threads; ++t) {
        const auto [h0, h1] = decode_kv_heads(b, e, t, n_threads);
        EXPECT_EQ(h0, next) << n_threads << " threads, thread " << t;
        EXPECT_LE(h0, h1);
        next = h1;
      }
      EXPECT_EQ(next, e);
    }
  }
}

// A one-token group whose threads normalize its row themselves computes what
// the group gives on the row normalized and quantized before it.
TEST(Kernels, AMatmulOfARowEachThreadNormalizesEqualsOneOnTheNormalizedRow) {
  for (DType t : {DType::kQ8_0, DType::kQ4_K, DType::kQ6_K, DType::kQ4_0}) {
    SCOPED_TRACE(dtype_name(t));
    const int64_t cols = 512;
    const Problem a = Problem(t, 96, cols, 1, 7).interleaved(), b = Problem(t, 64, cols, 1, 8).interleaved();
    const size_t rb = dtype_row_bytes(t, cols);
    const WeightMatrix wa{t, a.w.data(), a.rows, cols, rb, a.group, a.chunk_bytes};
    const WeightMatrix wb{t, b.w.data(), b.rows, cols, rb, b.group, b.chunk_bytes};
    std::vector<float> norm_weight(static_cast<size_t>(cols));
    for (int64_t i = 0; i < cols; ++i) norm_weight[static_cast<size_t>(i)] = 0.5f + 0.01f * static_cast<float>(i % 37);
    std::vector<BlockQ8_0Act> xq(static_cast<size_t>(cols / 32));
    std::vector<int32_t> xsum(xq.size());
    rms_norm_q8_0(a.x.data(), cols, norm_weight.data(), xq.data(), cols / 32, 1, cols, 1e-5f, xsum.data());
    for (int threads : {1, 2, 3}) {
      ThreadPool pool(threads);
      std::vector<float> ya(96), yb(64), za(96), zb(64);
      const MatmulOutput before[] = {{&wa, ya.data(), 96}, {&wb, yb.data(), 64}};
      const MatmulOutput each[] = {{&wa, za.data(), 96}, {&wb, zb.data(), 64}};
      matmul(before, MatmulInput{nullptr, 0, xq.data(), cols / 32, xsum.data()}, 1, pool);
      const MatmulRowNorm norm{a.x.data(), norm_weight.data(), 1e-5f};
      matmul(each, MatmulInput{.x = nullptr, .ldx = 0, .xq = nullptr, .ldxq = 0, .xsum = nullptr, .norm = &norm}, 1, pool);
      EXPECT_EQ(std::memcmp(ya.data(), za.data(), ya.size() * 4), 0) << threads << " threads";
      EXPECT_EQ(std::memcmp(yb.data(), zb.data(), yb.size() * 4), 0) << threads << " threads";
    }
  }
}

// Tasks with their own inputs and token counts (the experts of a MoE layer)
// give, bitwise, what one matmul per task gives, on 1 and 2 threads, with the
// same_rows split and in the concatenated row space, for every weight type.
TEST(Kernels, MatmulTasksEqualOneMatmulPerTask) {
  for (DType t : kAllTypes) {
    SCOPED_TRACE(dtype_name(t));
    const int64_t cols = is_k_quant(t) ? 256 : 64, rows = 48;
    std::vector<Problem> experts;
    for (uint64_t e = 0; e < 4; ++e) experts.emplace_back(t, rows, cols, 1 + static_cast<int64_t>(e) * 3, 10 + e);
    std::vector<WeightMatrix> w;
    for (const Problem& p : experts) w.push_back({t, p.w.data(), rows, cols, dtype_row_bytes(t, cols)});
    ThreadPool one(1), two(2);
    std::vector<std::vector<float>> alone;
    for (size_t e = 0; e < experts.size(); ++e) {
      alone.emplace_back(static_cast<size_t>(rows * experts[e].tokens));
      matmul(w[e], experts[e].x.data(), cols, experts[e].tokens, alone[e].data(), rows, one);
    }
    for (ThreadPool* pool : {&one, &two}) {
      for (bool same_rows : {false, true}) {
        std::vector<std::vector<float>> y;
        std::vector<MatmulTask> tasks;
        for (size_t e = 0; e < experts.size(); ++e) y.emplace_back(alone[e].size(), -1.0f);
        for (size_t e = 0; e < experts.size(); ++e)
          tasks.push_back({{&w[e], y[e].data(), rows}, {experts[e].x.data(), cols}, experts[e].tokens});
        matmul_tasks(tasks, *pool, MatmulSplit{.same_rows = same_rows});
        for (size_t e = 0; e < experts.size(); ++e)
          EXPECT_EQ(std::memcmp(y[e].data(), alone[e].data(), y[e].size() * 4), 0) << "task " << e;
      }
    }
  }
}

// The gated delta rule's step in every variant against the formula in
// double, on a state size that leaves a tail in every vector width.
TEST(Kernels, DeltaRuleStepMatchesTheFormulaInEveryVariant) {
  const int64_t S = 37;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> state0(static_cast<size_t>(S * S)), k(static_cast<size_t>(S)), q(k.size()), v(k.size());
  for (auto* vec : {&state0, &k, &q, &v})
    for (float& x : *vec) x = u(rng);
  const float decay = 0.83f, beta = 0.61f, scale = 0.25f;
  std::vector<double> want_state(state0.begin(), state0.end()), want_out(static_cast<size_t>(S));
  for (int64_t j = 0; j < S; ++j) {
    double sk = 0, sq = 0;
    for (int64_t i = 0; i < S; ++i) sk += (want_state[static_cast<size_t>(j * S + i)] *= decay) * k[static_cast<size_t>(i)];
    const double d = (v[static_cast<size_t>(j)] - sk) * beta;
    for (int64_t i = 0; i < S; ++i) sq += (want_state[static_cast<size_t>(j * S + i)] += k[static_cast<size_t>(i)] * d) * q[static_cast<size_t>(i)];
    want_out[static_cast<size_t>(j)] = sq * scale;
  }
  for (Isa isa : supported_isas()) {
    std::vector<float> state = state0, out(static_cast<size_t>(S));
    table(isa).delta_rule(state.data(), S, k.data(), q.data(), v.data(), decay, beta, scale, out.data());
    for (size_t i = 0; i < state.size(); ++i) ASSERT_NEAR(state[i], want_state[i], 1e-5) << isa_name(isa) << " state " << i;
    for (size_t j = 0; j < out.size(); ++j) ASSERT_NEAR(out[j], want_out[j], 1e-5) << isa_name(isa) << " out " << j;
  }
}

// The vector exp inside SwiGLU stays within a few ulp of std::exp, including
// where it saturates, on a length that leaves a tail in every vector width.
TEST(Kernels, SiluMulMatchesFormulaInEveryVariant) {
  std::vector<float> g0, u;
  for (int i = 0; i < 45; ++i) {
    g0.push_back(static_cast<float>(i - 22) * (i % 3 == 0 ? 5.3f : 0.37f));
    u.push_back(0.5f + 0.01f * static_cast<float>(i));
  }
  for (Isa isa : supported_isas()) {
    std::vector<float> g = g0;
    table(isa).silu_mul(g.data(), u.data(), static_cast<int64_t>(g.size()));
    for (size_t i = 0; i < g.size(); ++i) {
      const double x = g0[i];
      const double want = x / (1.0 + std::exp(-x)) * u[i];
      EXPECT_NEAR(g[i], want, 4e-7 * std::fabs(want) + 1e-30) << isa_name(isa) << " x=" << x;
    }
  }
}

// The log-partition the sampler reports logprobs against: within 1e-6 of a
// double-precision sum on a vocabulary-sized row (and on odd lengths that
// leave tails), and NaN when a value is infinite or NaN.
TEST(Kernels, LogSumExpMatchesDoubleSumInEveryVariant) {
  for (const int64_t n : {int64_t{1}, int64_t{7}, int64_t{45}, int64_t{1031}, int64_t{151936}}) {
    std::vector<float> x(static_cast<size_t>(n));
    uint64_t state = 0x1234 + static_cast<uint64_t>(n);
    for (float& v : x) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      v = static_cast<float>(static_cast<int64_t>(state >> 40) % 4000) * 0.01f - 25.0f;
    }
    if (n > 100) x[static_cast<size_t>(n / 2)] = 31.0f;  // one dominant logit
    double m = x[0], sum = 0;
    for (float v : x) m = std::max(m, static_cast<double>(v));
    for (float v : x) sum += std::exp(static_cast<double>(v) - m);
    const double want = m + std::log(sum);
    for (Isa isa : supported_isas()) {
      EXPECT_NEAR(table(isa).log_sum_exp(x.data(), n), want, 1e-6 * std::fabs(want) + 1e-6)
          << isa_name(isa) << " n=" << n;
      for (const float poison : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                                 -std::numeric_limits<float>::infinity()}) {
        std::vector<float> bad = x;
        bad[static_cast<size_t>(n - 1)] = poison;
        EXPECT_TRUE(std::isnan(table(isa).log_sum_exp(bad.data(), n))) << isa_name(isa) << " n=" << n;
        bad = x;
        bad[0] = poison;
        EXPECT_TRUE(std::isnan(table(isa).log_sum_exp(bad.data(), n))) << isa_name(isa) << " n=" << n;
      }
    }
  }
}

TEST(Kernels, RmsNormSiluSoftmaxMatchFormulas) {
  std::vector<float> x = {1, -2, 3, 0.5f}, w = {1, 2, 0.5f, -1}, out(4);
  rms_norm(x.data(), 4, w.data(), out.data(), 4, 1, 4, 1e-6f);
  const double rms = std::sqrt((1 + 4 + 9 + 0.25) / 4 + 1e-6);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(out[static_cast<size_t>(i)], x[static_cast<size_t>(i)] / rms * w[static_cast<size_t>(i)], 1e-6);
  std::vector<float> g = {-1, 0, 2}, up = {2, 3, -1};
  silu_mul(g.data(), up.data(), 3);
  EXPECT_NEAR(g[0], -1 / (1 + std::exp(1.0)) * 2, 1e-6);
  EXPECT_EQ(g[1], 0.0f);
  EXPECT_NEAR(g[2], 2 / (1 + std::exp(-2.0)) * -1, 1e-6);
  std::vector<float> s = {1000, 1001, 999};
  softmax(s.data(), 3);
  EXPECT_NEAR(s[0] + s[1] + s[2], 1.0, 1e-6);
  EXPECT_NEAR(s[1] / s[0], std::exp(1.0), 1e-4);
  EXPECT_EQ(argmax(s.data(), 3), 1);
}

TEST(Kernels, RopeRotatesTheRightPairs) {
  const int head_dim = 8;
  std::vector<float> base = {1, 2, 3, 4, 5, 6, 7, 8};
  const int32_t pos[] = {3};
  for (bool neox : {false, true}) {
    RopeParams p;
    p.n_rot = head_dim;
    p.neox = neox;
    p.freq_base = 100.0f;
    std::vector<float> c(4), s(4), v = base;
    rope_angles(pos, 1, p, c.data(), s.data());
    rope_apply(v.data(), head_dim, 1, 1, head_dim, p, c.data(), s.data());
    for (int i = 0; i < 4; ++i) {
      const double theta = 3.0 * std::pow(100.0, -2.0 * i / head_dim);
      const int a = neox ? i : 2 * i, b = neox ? i + 4 : 2 * i + 1;
      EXPECT_NEAR(v[static_cast<size_t>(a)], base[static_cast<size_t>(a)] * std::cos(theta) - base[static_cast<size_t>(b)] * std::sin(theta), 1e-5);
      EXPECT_NEAR(v[static_cast<size_t>(b)], base[static_cast<size_t>(a)] * std::sin(theta) + base[static_cast<size_t>(b)] * std::cos(theta), 1e-5);
    }
  }
}

// Llama-3-style scaled RoPE: GGUF files carry per-frequency divisors
// (rope_freqs.weight); each pair's angle is pos * base^(-2i/n) / factor_i.
TEST(Kernels, RopeFrequencyFactorsDivideTheAngles) {
  RopeParams p;
  p.n_rot = 8;
  p.freq_base = 500000.0f;
  const float factors[] = {1.0f, 2.0f, 8.0f, 32.0f};
  p.freq_factors = factors;
  const int32_t pos[] = {0, 7, 1000};
  std::vector<float> c(12), s(12);
  rope_angles(pos, 3, p, c.data(), s.data());
  for (int r = 0; r < 3; ++r)
    for (int i = 0; i < 4; ++i) {
      const double theta = pos[r] * std::pow(500000.0, -2.0 * i / 8) / factors[i];
      EXPECT_NEAR(c[static_cast<size_t>(r * 4 + i)], std::cos(theta), 1e-6);
      EXPECT_NEAR(s[static_cast<size_t>(r * 4 + i)], std::sin(theta), 1e-6);
    }
}

TEST(Kernels, Q8_0QuantizationErrorIsBoundedByHalfAStep) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-4, 4);
  std::vector<float> x(256), back(256);
  for (auto& v : x) v = u(rng);
  std::vector<uint8_t> q(dtype_row_bytes(DType::kQ8_0, 256));
  quantize_row_q8_0_weights(x.data(), q.data(), 256);
  dequantize_row(DType::kQ8_0, q.data(), back.data(), 256);
  for (int b = 0; b < 8; ++b) {
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[static_cast<size_t>(b * 32 + i)]));
    for (int i = 0; i < 32; ++i) EXPECT_LE(std::fabs(back[static_cast<size_t>(b * 32 + i)] - x[static_cast<size_t>(b * 32 + i)]), amax / 127 * 0.5 + amax * 1e-3);
  }
}

// The fused RMSNorm -> Q8_0 quantization gives bitwise the blocks of the two steps.
TEST(Kernels, RmsNormQ8_0EqualsNormThenQuantize) {
  const int64_t n = 96, rows = 5;
  std::mt19937 rng(21);
  std::uniform_real_distribution<float> u(-4, 4);
  std::vector<float> x(static_cast<size_t>(rows * n)), w(static_cast<size_t>(n)), xn(x.size());
  for (auto& f : x) f = u(rng);
  for (auto& f : w) f = u(rng);
  rms_norm(x.data(), n, w.data(), xn.data(), n, rows, n, 1e-5f);
  std::vector<BlockQ8_0Act> want(static_cast<size_t>(rows * n / 32)), got(want.size());
  for (int64_t r = 0; r < rows; ++r) quantize_row_q8_0(xn.data() + r * n, want.data() + r * (n / 32), n);
  std::vector<int32_t> sums(want.size(), -1);
  rms_norm_q8_0(x.data(), n, w.data(), got.data(), n / 32, rows, n, 1e-5f, sums.data());
  for (size_t b = 0; b < want.size(); ++b) {
    EXPECT_EQ(std::memcmp(&got[b].d, &want[b].d, sizeof(float)), 0) << b;
    EXPECT_EQ(std::memcmp(got[b].qs, want[b].qs, 32), 0) << b;
    int32_t sum = 0;
    for (int8_t q : want[b].qs) sum += q;
    EXPECT_EQ(sums[b], sum) << b;
  }
}

// Every ISA's activation quantizer gives the reference's bytes and block sums:
// random rows, a zero block, a block of one value, ties at half a step, and
// the largest magnitudes.
TEST(Kernels, QuantizeQ8EqualsReferenceInEveryVariant) {
  const int64_t n = 32 * 14;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-3, 3);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& f : x) f = u(rng);
  // A NaN and an infinity, each in a block of its own (the blocks after the
  // 12 of finite values): d = NaN, no quant.
  x[static_cast<size_t>(32 * 12 + 5)] = std::numeric_limits<float>::quiet_NaN();
  x[static_cast<size_t>(32 * 13 + 31)] = -std::numeric_limits<float>::infinity();
  std::fill_n(x.begin() + 32, 32, 0.0f);
  std::fill_n(x.begin() + 64, 32, -1.25f);
  // amax 127: d = 1, so these quants are exact ties (k + 0.5) that round to even.
  for (int i = 0; i < 32; ++i) x[static_cast<size_t>(96 + i)] = i == 0 ? 127.0f : static_cast<float>(i - 16) + 0.5f;
  for (int i = 0; i < 32; ++i) x[static_cast<size_t>(128 + i)] = i % 2 ? 3.0e38f : -1.0e-30f;
  const int64_t nb = n / 32;
  std::vector<BlockQ8_0Act> want(static_cast<size_t>(nb));
  std::vector<int32_t> want_sums(want.size());
  quantize_q8_reference(x.data(), want.data(), want_sums.data(), n);
  EXPECT_EQ(want[1].d, 0.0f);
  for (int64_t b : {12, 13}) {
    EXPECT_TRUE(std::isnan(want[b].d)) << b;
    EXPECT_TRUE(std::all_of(want[b].qs, want[b].qs + 32, [](int8_t q) { return q == 0; })) << b;
    EXPECT_EQ(want_sums[b], 0) << b;
  }
  EXPECT_TRUE(std::isfinite(want[11].d));
  for (Isa isa : supported_isas()) {
    SCOPED_TRACE(isa_name(isa));
    std::vector<BlockQ8_0Act> got(want.size());
    std::vector<int32_t> sums(want.size(), -1);
    table(isa).quantize_q8(x.data(), got.data(), sums.data(), n);
    for (int64_t b = 0; b < nb; ++b) {
      EXPECT_EQ(std::memcmp(&got[b].d, &want[b].d, sizeof(float)), 0) << b;
      EXPECT_EQ(std::memcmp(got[b].qs, want[b].qs, 32), 0) << b;
      int32_t sum = 0;
      for (int8_t q : got[b].qs) sum += q;
      EXPECT_EQ(sums[b], sum) << b;
      EXPECT_EQ(sums[b], want_sums[b]) << b;
    }
    // Without sums the quants are the same.
    std::vector<BlockQ8_0Act> bare(want.size());
    table(isa).quantize_q8(x.data(), bare.data(), nullptr, n);
    EXPECT_EQ(std::memcmp(bare.data(), got.data(), bare.size() * sizeof(BlockQ8_0Act)), 0);
  }
}

// One token's K and V rows (n_kv heads of s.head_dim), converted to t
// element by element and stored at `slot` of a layer's K and V parts as
// kv_layout.h lays them out: what the KV write must produce, and what the
// attention tests read.
void store_kv_reference(const float* k, const float* v, DType t, const KvBlockShape& s, int n_kv, uint8_t* k_part,
                        uint8_t* v_part, int slot) {
  const size_t elt = dtype_row_bytes(t, 1);
  for (int h = 0; h < n_kv; ++h)
    for (int d = 0; d < s.head_dim; ++d) {
      const int64_t i = static_cast<int64_t>(h) * s.head_dim + d;
      convert_row(k + i, t, k_part + static_cast<size_t>(kv_k_index(s, h, d, slot)) * elt, 1);
      convert_row(v + i, t, v_part + static_cast<size_t>(kv_v_index(s, h, d, slot)) * elt, 1);
    }
}

TEST(Kernels, KvLayoutPlacesEveryElementOnce) {
  const KvBlockShape s{5, 3};
  const int n_kv = 2;
  std::vector<int> k_hits(static_cast<size_t>(n_kv * kv_head_elements(s)), 0), v_hits(k_hits.size(), 0);
  for (int h = 0; h < n_kv; ++h)
    for (int d = 0; d < s.head_dim; ++d)
      for (int slot = 0; slot < s.block_size; ++slot) {
        ++k_hits.at(static_cast<size_t>(kv_k_index(s, h, d, slot)));
        ++v_hits.at(static_cast<size_t>(kv_v_index(s, h, d, slot)));
      }
  for (size_t i = 0; i < k_hits.size(); ++i) {
    EXPECT_EQ(k_hits[i], 1) << i;
    EXPECT_EQ(v_hits[i], 1) << i;
  }
  // K is transposed per head (slots of one dimension adjacent), V is not (dimensions of one slot adjacent).
  EXPECT_EQ(kv_k_index(s, 1, 2, 1) + 1, kv_k_index(s, 1, 2, 2));
  EXPECT_EQ(kv_v_index(s, 1, 2, 1) + 1, kv_v_index(s, 1, 3, 1));
  EXPECT_EQ(kv_k_index(s, 1, 0, 0), kv_head_elements(s));
  EXPECT_EQ(kv_v_index(s, 1, 0, 0), kv_head_elements(s));
}

// The fused RoPE -> KV write stores bitwise what rotating and then converting
// each row gives, in the pool's layout, in every variant, for one row and
// many (over several blocks, the last one partly filled), written in two head
// ranges (as two threads' matmul epilogues do), with a partial rotation and a
// head size that leaves vector tails.
TEST(Kernels, RopeWriteKvEqualsRotateThenConvert) {
  const int n_kv = 3, hd = 20, bs = 16;
  const KvBlockShape shape{hd, bs};
  const int64_t width = n_kv * hd;
  RopeParams rope;
  rope.n_rot = 12;
  rope.neox = true;
  for (int64_t n_rows : {1, 40}) {
    std::vector<int32_t> pos(static_cast<size_t>(n_rows));
    for (int64_t i = 0; i < n_rows; ++i) pos[static_cast<size_t>(i)] = static_cast<int32_t>(3 * i + 1);
    std::vector<float> cs(static_cast<size_t>(n_rows * 6)), sn(cs.size());
    rope_angles(pos.data(), n_rows, rope, cs.data(), sn.data());
    std::mt19937 rng(static_cast<uint32_t>(n_rows));
    std::uniform_real_distribution<float> u(-3, 3);
    std::vector<float> k0(static_cast<size_t>(n_rows * width)), v(k0.size());
    for (auto& f : k0) f = u(rng);
    for (auto& f : v) f = u(rng);
    const int64_t n_blocks = (n_rows + bs - 1) / bs;
    for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
      const size_t part = dtype_row_bytes(t, width) * bs;
      // Row r goes to slot r % bs of block r / bs; a block is [K part, V part].
      auto k_part = [&](std::vector<uint8_t>& pool, int64_t r) { return pool.data() + static_cast<size_t>(r / bs * 2) * part; };
      auto v_part = [&](std::vector<uint8_t>& pool, int64_t r) { return k_part(pool, r) + part; };
      std::vector<float> k_rot = k0;
      rope_apply(k_rot.data(), width, n_rows, n_kv, hd, rope, cs.data(), sn.data());
      std::vector<uint8_t> want(part * static_cast<size_t>(2 * n_blocks), 0xEE);
      for (int64_t r = 0; r < n_rows; ++r)
        store_kv_reference(k_rot.data() + r * width, v.data() + r * width, t, shape, n_kv, k_part(want, r),
                           v_part(want, r), static_cast<int>(r % bs));
      for (Isa isa : supported_isas()) {
        set_active_isa(isa);
        std::vector<float> k = k0;
        std::vector<uint8_t> got(want.size(), 0xEE);
        std::vector<KvSlot> slots;
        for (int64_t r = 0; r < n_rows; ++r) slots.push_back({k_part(got, r), v_part(got, r), static_cast<int>(r % bs)});
        for (auto [h0, h1] : {std::pair{0, 1}, std::pair{1, n_kv}}) {
          rope_write_k(k.data(), width, n_rows, h0, h1, shape, rope, cs.data(), sn.data(), slots.data(), t);
          write_v(v.data(), width, n_rows, h0, h1, shape, slots.data(), t);
        }
        EXPECT_EQ(got, want) << isa_name(isa) << " " << dtype_name(t) << " rows " << n_rows;
      }
      set_active_isa(best_supported_isa());
    }
  }
}

// A paged KV layer holding positions 0..n_pos-1 of one sequence, and its queries.
struct AttentionProblem {
  int n_head, n_kv, hd, bs, n_pos;
  DType dtype;
  size_t row_bytes, block_bytes;
  std::vector<float> k, v, q;  // k, v: n_pos rows of n_kv * hd; q: n_pos rows of n_head * hd
  std::vector<int32_t> table;
  std::vector<uint8_t> pool;

  AttentionProblem(int heads, int kv_heads, int head_dim, int block_size, int positions, DType t,
                   std::vector<int32_t> block_table, uint64_t seed)
      : n_head(heads), n_kv(kv_heads), hd(head_dim), bs(block_size), n_pos(positions), dtype(t),
        table(std::move(block_table)) {
    row_bytes = dtype_row_bytes(t, n_kv * hd);
    block_bytes = row_bytes * static_cast<size_t>(bs) * 2;
    std::mt19937 rng(static_cast<uint32_t>(seed));
    std::uniform_real_distribution<float> u(-2, 2);
    k.resize(static_cast<size_t>(n_pos * n_kv * hd));
    v.resize(k.size());
    q.resize(static_cast<size_t>(n_pos * n_head * hd));
    for (auto& f : k) f = u(rng);
    for (auto& f : v) f = u(rng);
    for (auto& f : q) f = u(rng);
    const int32_t max_block = *std::max_element(table.begin(), table.end());
    // Slots no position was written to hold NaN (0xFF bytes in every dtype):
    // attention must never let them reach a result.
    pool.assign(block_bytes * static_cast<size_t>(max_block + 1), 0xFF);
    for (int p = 0; p < n_pos; ++p) {
      uint8_t* blk = pool.data() + static_cast<size_t>(table[static_cast<size_t>(p / bs)]) * block_bytes;
      store_kv_reference(k.data() + p * n_kv * hd, v.data() + p * n_kv * hd, t, KvBlockShape{hd, bs}, n_kv, blk,
                         blk + static_cast<size_t>(bs) * row_bytes, p % bs);
    }
  }

  PagedKvLayer layer() const {
    return PagedKvLayer{pool.data(), block_bytes, 0, static_cast<size_t>(bs) * row_bytes, bs, dtype};
  }

  // Query rows [first, first + count) as chunks of the given sizes, each its own sequence entry.
  std::vector<float> run(Isa isa, int first, int count, const std::vector<int>& chunks, int threads) const {
    set_active_isa(isa);
    ThreadPool tp(threads);
    std::vector<AttentionSequence> seqs;
    int row = 0;
    for (int c : chunks) {
      seqs.push_back({row, c, first + row, table.data(), static_cast<int32_t>(table.size())});
      row += c;
    }
    EXPECT_EQ(row, count);
    const int64_t ld = static_cast<int64_t>(n_head) * hd;
    std::vector<float> out(static_cast<size_t>(count * ld), NAN);
    paged_attention(q.data() + first * ld, ld, seqs, layer(), n_head, n_kv, hd, 0.3f, out.data(), ld, tp);
    set_active_isa(best_supported_isa());
    return out;
  }

  // Double-precision softmax attention of query row `row`, head h, element i,
  // over the K/V as stored (rounded to the cache dtype).
  double reference(int row, int h, int i) const {
    const int g = h / (n_head / n_kv);
    auto stored = [&](const std::vector<float>& src, size_t idx) {
      uint8_t b[4];
      float f;
      convert_row(&src[idx], dtype, b, 1);
      dequantize_row(dtype, b, &f, 1);
      return static_cast<double>(f);
    };
    std::vector<double> s(static_cast<size_t>(row + 1));
    double mx = -1e300, sum = 0, o = 0;
    for (int p = 0; p <= row; ++p) {
      double d = 0;
      for (int e = 0; e < hd; ++e)
        d += q[static_cast<size_t>((row * n_head + h) * hd + e)] * stored(k, static_cast<size_t>((p * n_kv + g) * hd + e));
      mx = std::max(mx, s[static_cast<size_t>(p)] = d * 0.3);
    }
    for (auto& e : s) sum += (e = std::exp(e - mx));
    for (int p = 0; p <= row; ++p) o += s[static_cast<size_t>(p)] / sum * stored(v, static_cast<size_t>((p * n_kv + g) * hd + i));
    return o;
  }
};

// Every variant matches a double-precision reference on odd shapes (head
// sizes with a vector tail, odd block sizes, one position, MHA and GQA).
TEST(Kernels, PagedAttentionMatchesReferenceInEveryVariant) {
  struct Shape {
    int n_head, n_kv, hd, bs, n_pos;
  };
  for (const Shape& sh : {Shape{4, 2, 16, 4, 11}, Shape{3, 3, 20, 5, 23}, Shape{8, 2, 64, 16, 37}, Shape{2, 1, 7, 3, 1}}) {
    std::vector<int32_t> table;
    for (int b = 0; b * sh.bs < sh.n_pos; ++b) table.push_back(b);
    for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
      const AttentionProblem pr(sh.n_head, sh.n_kv, sh.hd, sh.bs, sh.n_pos, t, table, 7);
      for (Isa isa : supported_isas()) {
        const std::vector<float> out = pr.run(isa, 0, sh.n_pos, {sh.n_pos}, 2);
        for (int r = 0; r < sh.n_pos; ++r)
          for (int h = 0; h < sh.n_head; ++h)
            for (int i = 0; i < sh.hd; ++i)
              ASSERT_NEAR(out[static_cast<size_t>((r * sh.n_head + h) * sh.hd + i)], pr.reference(r, h, i), 2e-5)
                  << isa_name(isa) << " " << dtype_name(t) << " hd=" << sh.hd << " bs=" << sh.bs << " row " << r;
      }
    }
  }
}

// A row's output is bitwise the same whether it is computed alone, in one
// chunk with all rows, in uneven chunks, with 1 or 2 threads, or with its
// blocks scattered through the pool, in every variant.
TEST(Kernels, PagedAttentionIsBatchChunkAndPlacementInvariant) {
  const int n_pos = 45;  // three tiles of rows, the last one partial
  const AttentionProblem ordered(8, 2, 24, 4, n_pos, DType::kF16, [] {
    std::vector<int32_t> t;
    for (int b = 0; b < 12; ++b) t.push_back(b);
    return t;
  }(), 3);
  const AttentionProblem scattered(8, 2, 24, 4, n_pos, DType::kF16, {9, 3, 14, 0, 7, 12, 1, 5, 11, 2, 13, 6}, 3);
  const size_t ld = 8 * 24;
  for (Isa isa : supported_isas()) {
    const std::vector<float> whole = ordered.run(isa, 0, n_pos, {n_pos}, 2);
    EXPECT_EQ(whole, ordered.run(isa, 0, n_pos, {n_pos}, 1)) << isa_name(isa);
    EXPECT_EQ(whole, scattered.run(isa, 0, n_pos, {n_pos}, 2)) << isa_name(isa);
    // Rows 10..39 as uneven chunks (each chunk a separate sequence entry).
    const std::vector<float> part = ordered.run(isa, 10, 30, {1, 17, 5, 7}, 2);
    EXPECT_EQ(std::memcmp(part.data(), whole.data() + 10 * ld, part.size() * 4), 0) << isa_name(isa);
    for (int r : {0, 16, 44}) {
      const std::vector<float> alone = ordered.run(isa, r, 1, {1}, 2);
      EXPECT_EQ(std::memcmp(alone.data(), whole.data() + static_cast<size_t>(r) * ld, ld * 4), 0) << isa_name(isa) << " row " << r;
    }
  }
}

// A decode row (one row of a group of heads: its tile reads K and V where
// they are in the pool) computes bitwise what the same row computes inside a
// prompt tile (which widens each block to f32 first), for every cache dtype,
// with blocks that fill whole vectors, and a head size with a vector tail.
TEST(Kernels, PagedAttentionDecodeRowsMatchPromptTilesBitwise) {
  const int n_pos = 53;
  std::vector<int32_t> table = {3, 0, 2, 1};
  for (int hd : {64, 24}) {
    for (DType t : {DType::kF16, DType::kBF16, DType::kF32}) {
      const AttentionProblem pr(8, 2, hd, 16, n_pos, t, table, 5);
      const size_t ld = static_cast<size_t>(8 * hd);
      for (Isa isa : supported_isas()) {
        const std::vector<float> whole = pr.run(isa, 0, n_pos, {n_pos}, 2);
        for (int r : {0, 15, 16, 31, 40, 52}) {
          const std::vector<float> alone = pr.run(isa, r, 1, {1}, 2);
          EXPECT_EQ(std::memcmp(alone.data(), whole.data() + static_cast<size_t>(r) * ld, ld * 4), 0)
              << isa_name(isa) << " " << dtype_name(t) << " hd=" << hd << " row " << r;
        }
        // Two decode rows of different sequences in one call, as a batched step runs them.
        const std::vector<float> pair = pr.run(isa, 40, 2, {1, 1}, 2);
        EXPECT_EQ(std::memcmp(pair.data(), whole.data() + 40 * ld, 2 * ld * 4), 0) << isa_name(isa) << " " << dtype_name(t);
      }
    }
  }
}

// Attention that also quantizes its output (the output projection's input)
// writes the blocks and sums that quantizing its f32 output gives, for a
// prompt and for decode rows, on 1 and 2 threads.
TEST(Kernels, PagedAttentionQuantizesItsOutputAsTheOutputProjectionWould) {
  std::vector<int32_t> table = {3, 0, 2, 1};
  const AttentionProblem pr(8, 2, 64, 16, 53, DType::kF16, table, 5);
  const int64_t ld = 8 * 64;
  for (int threads : {1, 2}) {
    ThreadPool tp(threads);
    for (auto [first, chunks] : {std::pair{0, std::vector<int>{53}}, std::pair{40, std::vector<int>{1}},
                                 std::pair{40, std::vector<int>{1, 1}}}) {
      int count = 0;
      std::vector<AttentionSequence> seqs;
      for (int c : chunks) {
        seqs.push_back({count, c, first + count, table.data(), static_cast<int32_t>(table.size())});
        count += c;
      }
      std::vector<float> out(static_cast<size_t>(count * ld), NAN);
      std::vector<BlockQ8_0Act> xq(static_cast<size_t>(count * ld / 32));
      std::vector<int32_t> xsum(xq.size(), -1);
      const AttentionQ8Out q8{xq.data(), xsum.data(), ld / 32};
      paged_attention(pr.q.data() + first * ld, ld, seqs, pr.layer(), 8, 2, 64, 0.3f, out.data(), ld, tp, 0, -1, &q8);
      std::vector<BlockQ8_0Act> want(xq.size());
      std::vector<int32_t> want_sum(xq.size());
      quantize_row_q8_0(out.data(), want.data(), count * ld, want_sum.data());
      EXPECT_EQ(std::memcmp(xq.data(), want.data(), xq.size() * sizeof(BlockQ8_0Act)), 0) << threads << " threads, first " << first;
      EXPECT_EQ(xsum, want_sum) << threads << " threads, first " << first;
    }
  }
}

}  // namespace
}  // namespace tandem::kernels
