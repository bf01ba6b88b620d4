// The bandwidth probe's inner loops, per instruction set. Each reads `bytes`
// (a multiple of 512, from a 64-byte aligned `p`) with eight independent
// accumulators and returns their sum (so the loads stay), the way a tuned
// streaming kernel reads; they differ in how they stream:
//  - plain: one sequential stream of loads;
//  - + L2 prefetch: the same, each line also asked for kProbePrefetchBytes
//    ahead into L2, as a decode tile's one-stream tail does;
//  - N streams + L2 prefetch: the bytes cut into N parts read side by side,
//    each fetched kProbeStreamPrefetchBytes ahead into L2, as the decode
//    tiles of several groups do (kBlockPanelDecodeGroups, kernels_avx512.cpp).
// Which reads fastest depends on the machine, so the probe reads with each
// and counts the fastest (memory_bandwidth.h). On a 2-core Intel Xeon VM
// (AVX-512, AMX), 1 GiB, 2 threads, medians of 3 x 8 passes: plain 31.4,
// + L2 prefetch 1 KB ahead 35.8 (2 KB 35.3, 4 KB 29.8, 8 KB 30.7), 2
// streams 2 KB ahead 39.3, 4 streams 34.4 (1 KB ahead 34.2, 4 KB 32.7), 8
// streams 33.0 GB/s: there a core's demand misses alone keep fewer lines in
// flight than its L2 prefetcher can.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace tandem::kernels {

constexpr size_t kProbePrefetchBytes = 1024;
constexpr size_t kProbeStreamPrefetchBytes = 2048;

struct ReadLoop {
  uint64_t (*read)(const uint8_t* p, size_t bytes);
  const char* isa;      // "avx512", "avx2", "scalar"
  const char* variant;  // how it streams ("" for plain)
  std::string name() const { return std::string(isa) + variant; }
};

uint64_t read_stream_scalar(const uint8_t* p, size_t bytes);
// Every loop of the ISA, plain first (the CPU must support the ISA;
// read_stream_loops.h).
std::span<const ReadLoop> read_loops_avx2();
std::span<const ReadLoop> read_loops_avx512();

}  // namespace tandem::kernels
