#include "kernels/multiply_peak.h"

#include <algorithm>
#include <atomic>

#include "kernels/multiply_loops.h"
#include "util/clock.h"
#include "util/percentile.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace tandem::kernels {

double multiply_loop_scalar_f32(int64_t iterations) {
  float acc[kMultiplyChainsScalar];
  for (int c = 0; c < kMultiplyChainsScalar; ++c) acc[c] = static_cast<float>(c);
  float one = 1.0f, step = 1.0f / 1024;
  asm volatile("" : "+m"(one), "+m"(step));  // not folded into an add
  for (int64_t i = 0; i < iterations; ++i)
    for (float& a : acc) a = a * one + step;
  double s = 0;
  for (float a : acc) s += a;
  return s;
}

MultiplyInstruction multiply_instruction(DType weights, Isa isa) {
  const bool int8 = takes_q8_activations(weights);
  switch (isa) {
    case Isa::kScalar: return MultiplyInstruction::kScalarF32;
    case Isa::kAvx2: return int8 ? MultiplyInstruction::kInt8DotAvx2 : MultiplyInstruction::kFmaF32Avx2;
    case Isa::kAvx512:
      if (int8) return MultiplyInstruction::kInt8DotAvx512;
      return weights == DType::kBF16 ? MultiplyInstruction::kBf16DotAvx512 : MultiplyInstruction::kFmaF32Avx512;
  }
  return MultiplyInstruction::kScalarF32;
}

const char* multiply_instruction_name(MultiplyInstruction m) {
  switch (m) {
    case MultiplyInstruction::kScalarF32: return "scalar f32 mul+add";
    case MultiplyInstruction::kFmaF32Avx2: return "avx2 f32 vfmadd";
    case MultiplyInstruction::kInt8DotAvx2: return "avx2 int8 vpmaddubsw+vpmaddwd";
    case MultiplyInstruction::kFmaF32Avx512: return "avx512 f32 vfmadd";
    case MultiplyInstruction::kBf16DotAvx512: return "avx512 bf16 vdpbf16ps";
    case MultiplyInstruction::kInt8DotAvx512: return "avx512 int8 vpdpbusd";
  }
  return "?";
}

MultiplyLoop multiply_loop(MultiplyInstruction m) {
  switch (m) {
    case MultiplyInstruction::kScalarF32: return {multiply_loop_scalar_f32, kMultiplyChainsScalar, 1, 1};
    case MultiplyInstruction::kFmaF32Avx2: return {multiply_loop_avx2_f32, kMultiplyChainsAvx2F32, 8, 1};
    case MultiplyInstruction::kInt8DotAvx2: return {multiply_loop_avx2_int8, kMultiplyChainsAvx2Int8, 8, 4};
    case MultiplyInstruction::kFmaF32Avx512: return {multiply_loop_avx512_f32, kMultiplyChainsAvx512, 16, 1};
    case MultiplyInstruction::kBf16DotAvx512: return {multiply_loop_avx512_bf16, kMultiplyChainsAvx512, 16, 2};
    case MultiplyInstruction::kInt8DotAvx512: return {multiply_loop_avx512_int8, kMultiplyChainsAvx512, 16, 4};
  }
  return {multiply_loop_scalar_f32, kMultiplyChainsScalar, 1, 1};
}

namespace {

Isa instruction_isa(MultiplyInstruction m) {
  switch (m) {
    case MultiplyInstruction::kScalarF32: return Isa::kScalar;
    case MultiplyInstruction::kFmaF32Avx2:
    case MultiplyInstruction::kInt8DotAvx2: return Isa::kAvx2;
    default: return Isa::kAvx512;
  }
}

}  // namespace

MultiplyPeak measure_multiply_peak(ThreadPool& pool, MultiplyInstruction m, int repeats, double pass_ms) {
  if (!isa_supported(instruction_isa(m)))
    throw Error(std::string("this CPU cannot run ") + multiply_instruction_name(m));
  const MultiplyLoop loop = multiply_loop(m);
  MultiplyPeak r;
  r.instruction = m;
  std::atomic<uint64_t> sink{0};
  auto pass_s = [&](int64_t iterations) {
    Stopwatch sw;
    pool.run([&](int, int) {
      // Non-zero always; the atomic keeps the result (and so the loop) alive.
      if (loop.run(iterations) != 0) sink.fetch_add(1, std::memory_order_relaxed);
    });
    return sw.elapsed_s();
  };
  // Calibrate: grow the pass until it takes at least a tenth of pass_ms,
  // then scale to pass_ms (long enough to drown the region's start-up).
  int64_t iterations = 1024;
  double s = pass_s(iterations);
  while (s * 1e3 < pass_ms / 10 && iterations < (int64_t{1} << 40)) s = pass_s(iterations *= 4);
  iterations = std::max<int64_t>(iterations, static_cast<int64_t>(static_cast<double>(iterations) * pass_ms / 1e3 / s));
  const double per_pass = static_cast<double>(iterations) * static_cast<double>(loop.multiply_adds_per_iteration()) *
                          static_cast<double>(pool.size());
  for (int rep = 0; rep < repeats; ++rep) r.runs_per_s.push_back(per_pass / pass_s(iterations));
  const RateSpread spread = rate_spread(r.runs_per_s);
  r.best_per_s = spread.best, r.median_per_s = spread.median, r.worst_per_s = spread.worst;
  return r;
}

}  // namespace tandem::kernels
