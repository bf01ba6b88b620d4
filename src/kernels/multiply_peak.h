// Measures this machine's peak multiply-add rate for the instruction a
// weight type's matmul multiplies with: the compute ceiling of batched decode
// (which reads the weights once per step however many rows it carries, so
// past some batch size the multiplies, not the reads, bound it).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/isa.h"

namespace tandem {
class ThreadPool;
}

namespace tandem::kernels {

// The inner multiply of the matmul kernels, by ISA and weight type
// (kernels_*.cpp): f32/f16 weights by f32 FMA; bf16 by vdpbf16ps on AVX-512;
// the block types, whose activations are q8_0, by int8 dot products
// (vpdpbusd on AVX-512, vpmaddubsw + vpmaddwd on AVX2).
enum class MultiplyInstruction { kScalarF32, kFmaF32Avx2, kInt8DotAvx2, kFmaF32Avx512, kBf16DotAvx512, kInt8DotAvx512 };
MultiplyInstruction multiply_instruction(DType weights, Isa isa = active_isa());
const char* multiply_instruction_name(MultiplyInstruction m);

// One thread's loop: `iterations` rounds of one instruction on each of
// `chains` independent accumulators (enough to cover its latency). Returns
// the sum of the accumulators' lanes, so the work stays and a test can check
// it (the values: multiply_loops.h).
struct MultiplyLoop {
  double (*run)(int64_t iterations);
  int chains;
  int lanes;              // 32-bit accumulator lanes per instruction
  int products_per_lane;  // multiply-adds per lane per instruction
  int64_t multiply_adds_per_iteration() const { return int64_t{chains} * lanes * products_per_lane; }
};
MultiplyLoop multiply_loop(MultiplyInstruction m);

struct MultiplyPeak {
  double best_per_s = 0;  // multiply-adds per second, all threads; the limit uses this one
  double median_per_s = 0;
  double worst_per_s = 0;
  std::vector<double> runs_per_s;  // in the order measured
  MultiplyInstruction instruction = MultiplyInstruction::kScalarF32;
};

// Runs the loop on every pool thread at once, `repeats` passes of about
// `pass_ms` each (iterations calibrated on the first pass).
MultiplyPeak measure_multiply_peak(ThreadPool& pool, MultiplyInstruction m, int repeats = 8, double pass_ms = 50);

}  // namespace tandem::kernels
