// The bandwidth probe's inner loop, one per instruction set: reads `bytes`
// (a multiple of 512, from a 64-byte aligned `p`) as eight independent
// 64-byte streams of loads into eight accumulators, the way a tuned
// streaming kernel reads, and returns their sum (so the loads stay).
#pragma once

#include <cstddef>
#include <cstdint>

namespace tandem::kernels {

uint64_t read_stream_scalar(const uint8_t* p, size_t bytes);
uint64_t read_stream_avx2(const uint8_t* p, size_t bytes);
uint64_t read_stream_avx512(const uint8_t* p, size_t bytes);

}  // namespace tandem::kernels
