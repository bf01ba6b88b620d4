// The bandwidth probe's inner loops read every byte they are given: the
// AVX2 and AVX-512 loops return the scalar loop's sum on the same buffer,
// and the probe reports each pass and its spread in order (no timing is
// asserted: figures belong in docs/BENCHMARKS.md).
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <string>

#include "kernels/isa.h"
#include "kernels/memory_bandwidth.h"
#include "kernels/read_stream.h"
#include "util/thread_pool.h"

namespace tandem::kernels {
namespace {

TEST(ReadStream, EveryLoopSumsEveryByteAsTheScalarLoopDoes) {
  constexpr size_t kBytes = 512 * 97;
  auto* buf = static_cast<uint8_t*>(std::aligned_alloc(64, kBytes));
  std::mt19937_64 rng(7);
  for (size_t i = 0; i < kBytes; ++i) buf[i] = static_cast<uint8_t>(rng());
  const uint64_t want = read_stream_scalar(buf, kBytes);
  EXPECT_NE(want, read_stream_scalar(buf, kBytes - 512)) << "the last 512 bytes count";
  if (isa_supported(Isa::kAvx2)) {
    for (const ReadLoop& l : read_loops_avx2()) EXPECT_EQ(l.read(buf, kBytes), want) << l.name();
  }
  if (isa_supported(Isa::kAvx512)) {
    for (const ReadLoop& l : read_loops_avx512()) EXPECT_EQ(l.read(buf, kBytes), want) << l.name();
  }
  std::free(buf);
}

TEST(ReadStream, TheProbeReportsEveryPassAndItsSpread) {
  ThreadPool pool(2);
  const ReadBandwidth b = measure_read_bandwidth(pool, size_t{8} << 20, 5);
  ASSERT_EQ(b.runs_bps.size(), 5u);
  EXPECT_EQ(b.size_bytes % (size_t{2} << 20), 0u) << "whole huge pages per thread";
  EXPECT_GE(b.size_bytes, size_t{8} << 20);
  EXPECT_GT(b.worst_bps, 0);
  EXPECT_LE(b.worst_bps, b.median_bps);
  EXPECT_LE(b.median_bps, b.best_bps);
  EXPECT_FALSE(b.loop.empty());
  if (isa_supported(Isa::kAvx2)) {
    EXPECT_NE(b.loop.find(isa_supported(Isa::kAvx512) ? "avx512" : "avx2"), std::string::npos) << b.loop;
  }
}

}  // namespace
}  // namespace tandem::kernels
