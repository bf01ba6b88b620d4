// The multiply-peak probe's loops do the multiply-adds they count: each
// returns the sum multiply_loops.h states for its chains, lanes and
// per-iteration gain (so the MAC count behind bench model's compute limit
// is the arithmetic done); the probe reports every pass and its spread. No
// timing is asserted: figures belong in docs/BENCHMARKS.md.
#include <gtest/gtest.h>

#include "kernels/isa.h"
#include "kernels/multiply_peak.h"
#include "model/decode_limits.h"
#include "util/thread_pool.h"

namespace tandem::kernels {
namespace {

struct Expected {
  MultiplyInstruction m;
  Isa isa;
  int products_per_lane;
  double gain_per_iteration;  // added to every lane by one iteration
};

TEST(MultiplyPeak, EveryLoopDoesTheMultiplyAddsItCounts) {
  const Expected all[] = {
      {MultiplyInstruction::kScalarF32, Isa::kScalar, 1, 1.0 / 1024},
      {MultiplyInstruction::kFmaF32Avx2, Isa::kAvx2, 1, 1.0 / 1024},
      {MultiplyInstruction::kInt8DotAvx2, Isa::kAvx2, 4, 8},
      {MultiplyInstruction::kFmaF32Avx512, Isa::kAvx512, 1, 1.0 / 1024},
      {MultiplyInstruction::kBf16DotAvx512, Isa::kAvx512, 2, 1.0 / 512},
      {MultiplyInstruction::kInt8DotAvx512, Isa::kAvx512, 4, 8},
  };
  for (const Expected& e : all) {
    if (!isa_supported(e.isa)) continue;
    const MultiplyLoop loop = multiply_loop(e.m);
    EXPECT_EQ(loop.products_per_lane, e.products_per_lane) << multiply_instruction_name(e.m);
    EXPECT_EQ(loop.multiply_adds_per_iteration(), int64_t{loop.chains} * loop.lanes * e.products_per_lane);
    EXPECT_EQ(loop.lanes, e.isa == Isa::kAvx512 ? 16 : e.isa == Isa::kAvx2 ? 8 : 1);
    for (int64_t n : {0, 1, 777}) {
      // Chain c holds c + n * gain in every lane (exact at these sizes).
      const double chains = loop.chains;
      const double want = loop.lanes * (chains * (chains - 1) / 2 + chains * static_cast<double>(n) * e.gain_per_iteration);
      EXPECT_EQ(loop.run(n), want) << multiply_instruction_name(e.m) << ", " << n << " iterations";
    }
  }
}

TEST(MultiplyPeak, EachWeightTypeUsesItsKernelsInstruction) {
  EXPECT_EQ(multiply_instruction(DType::kF16, Isa::kAvx512), MultiplyInstruction::kFmaF32Avx512);
  EXPECT_EQ(multiply_instruction(DType::kF32, Isa::kAvx512), MultiplyInstruction::kFmaF32Avx512);
  EXPECT_EQ(multiply_instruction(DType::kBF16, Isa::kAvx512), MultiplyInstruction::kBf16DotAvx512);
  EXPECT_EQ(multiply_instruction(DType::kBF16, Isa::kAvx2), MultiplyInstruction::kFmaF32Avx2);
  for (DType t : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_K, DType::kQ6_K, DType::kIQ4_XS}) {
    EXPECT_EQ(multiply_instruction(t, Isa::kAvx512), MultiplyInstruction::kInt8DotAvx512) << dtype_name(t);
    EXPECT_EQ(multiply_instruction(t, Isa::kAvx2), MultiplyInstruction::kInt8DotAvx2) << dtype_name(t);
    EXPECT_EQ(multiply_instruction(t, Isa::kScalar), MultiplyInstruction::kScalarF32) << dtype_name(t);
  }
}

TEST(MultiplyPeak, TheProbeReportsEveryPassAndItsSpread) {
  ThreadPool pool(2);
  const MultiplyPeak p = measure_multiply_peak(pool, MultiplyInstruction::kScalarF32, 4, 2);
  ASSERT_EQ(p.runs_per_s.size(), 4u);
  EXPECT_GT(p.worst_per_s, 0);
  EXPECT_LE(p.worst_per_s, p.median_per_s);
  EXPECT_LE(p.median_per_s, p.best_per_s);
  EXPECT_EQ(p.instruction, MultiplyInstruction::kScalarF32);
}

}  // namespace
}  // namespace tandem::kernels

namespace tandem {
namespace {

// 100 MB of weights, 0.1 MB of KV per sequence, 50 M multiply-adds a token,
// 50 GB/s and 1 T multiply-adds/s: one sequence at 500 tokens/s of reads,
// 20000 of multiplies; they meet at 1e12 * 1e8 / (5e10 * 5e7) = 40.
TEST(DecodeLimits, SmallBatchesAreBoundByReadsAndLargeOnesByMultiplies) {
  const DecodeLimits one = decode_limits(1, 1e8, 1e5, 5e7, 5e10, 1e12);
  EXPECT_DOUBLE_EQ(one.memory_tps, 5e10 / (1e8 + 1e5));
  EXPECT_DOUBLE_EQ(one.compute_tps, 2e4);
  EXPECT_FALSE(one.compute_bound());
  EXPECT_DOUBLE_EQ(one.bound_tps(), one.memory_tps);
  const DecodeLimits many = decode_limits(64, 1e8, 1e5, 5e7, 5e10, 1e12);
  EXPECT_DOUBLE_EQ(many.memory_tps, 64 * 5e10 / (1e8 + 64e5));
  EXPECT_TRUE(many.compute_bound());
  EXPECT_DOUBLE_EQ(many.bound_tps(), 2e4);
  EXPECT_DOUBLE_EQ(limits_crossover_batch(1e8, 5e7, 5e10, 1e12), 40);
  // At the crossover (no KV) the two limits are equal.
  const DecodeLimits at = decode_limits(40, 1e8, 0, 5e7, 5e10, 1e12);
  EXPECT_DOUBLE_EQ(at.memory_tps, at.compute_tps);
}

}  // namespace
}  // namespace tandem
