// Measures this machine's sustained memory read bandwidth, the ceiling for
// batch-1 decode (which reads every weight once per token).
#pragma once

#include <cstddef>
#include <vector>

namespace tandem {
class ThreadPool;
}

namespace tandem::kernels {

struct ReadBandwidth {
  double best_bps = 0;    // the roofline uses this one
  double median_bps = 0;
  double worst_bps = 0;
  std::vector<double> runs_bps;  // in the order measured
  size_t size_bytes = 0;
  const char* loop = "";  // which inner loop read (read_stream.h)
};

// Reads a buffer of `size_bytes` (much larger than the caches; transparent
// huge pages asked for; each thread's slice first touched by that thread)
// `repeats` times. Each pass: every pool thread reads one contiguous slice
// with the widest loop the CPU has (eight independent 64-byte streams into
// eight accumulators), as a tuned streaming kernel reads.
ReadBandwidth measure_read_bandwidth(ThreadPool& pool, size_t size_bytes = size_t{1} << 30, int repeats = 8);

}  // namespace tandem::kernels
