// Measures this machine's sustained memory read bandwidth, the ceiling for
// batch-1 decode (which reads every weight once per token).
#pragma once

#include <cstddef>

namespace tandem {
class ThreadPool;
}

namespace tandem::kernels {

// Reads a buffer of `size_bytes` (much larger than the caches) with every pool
// thread, `repeats` times, and returns the best rate in bytes per second.
double measure_read_bandwidth(ThreadPool& pool, size_t size_bytes = size_t{1} << 30, int repeats = 5);

}  // namespace tandem::kernels
