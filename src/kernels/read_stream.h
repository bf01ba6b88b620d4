// The bandwidth probe's inner loops, per instruction set: each reads `bytes`
// (a multiple of 512, from a 64-byte aligned `p`) as eight independent
// 64-byte streams of loads into eight accumulators, the way a tuned
// streaming kernel reads, and returns their sum (so the loads stay).
//
// The _l2_prefetch loops also ask for each line kProbePrefetchBytes ahead
// into L2, as the decode tiles do. On some machines that reads more than
// the plain loop: on a 2-core Intel Xeon VM (AVX-512, AMX), 1 GiB, 2
// threads, medians of 2 x 8 passes, 35.9 GB/s against the plain loop's 31
// (2 KB ahead 35.3, 4 KB 29.8, 8 KB 30.7; 1 thread 19.2 against 16.8):
// there a core's demand misses alone keep fewer lines in flight than its
// L2 prefetcher can. The probe takes the faster loop (memory_bandwidth.h).
#pragma once

#include <cstddef>
#include <cstdint>

namespace tandem::kernels {

uint64_t read_stream_scalar(const uint8_t* p, size_t bytes);
uint64_t read_stream_avx2(const uint8_t* p, size_t bytes);
uint64_t read_stream_avx512(const uint8_t* p, size_t bytes);
uint64_t read_stream_avx2_l2_prefetch(const uint8_t* p, size_t bytes);
uint64_t read_stream_avx512_l2_prefetch(const uint8_t* p, size_t bytes);

constexpr size_t kProbePrefetchBytes = 1024;

// The line kProbePrefetchBytes past byte `offset` of p (it may lie past the
// buffer: formed as an integer, and a prefetch never faults).
inline const char* probe_prefetch_address(const uint8_t* p, size_t offset) {
  return reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(p) + offset + kProbePrefetchBytes);
}

}  // namespace tandem::kernels
