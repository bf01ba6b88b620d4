// Measures this machine's sustained memory read bandwidth, the ceiling for
// batch-1 decode (which reads every weight once per token).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "util/anonymous_memory.h"

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

// A buffer of about `size_bytes` (much larger than the caches; transparent
// huge pages asked for; each thread's slice first touched by that thread),
// read a pass at a time: every pool thread reads one contiguous slice with the
// widest loop the CPU has (eight independent 64-byte streams into eight
// accumulators), as a tuned streaming kernel reads. Kept between passes so
// that a bench can interleave passes with the runs it judges against them.
class ReadProbe {
 public:
  ReadProbe(ThreadPool& pool, size_t size_bytes);
  double pass_bps();  // one pass, bytes per second
  size_t size_bytes() const { return buf_.size(); }
  const char* loop() const { return loop_name_; }

 private:
  ThreadPool& pool_;
  size_t slice_bytes_;
  AnonymousMemory buf_;
  uint64_t (*loop_)(const uint8_t*, size_t);
  const char* loop_name_;
  uint64_t sink_ = 0;
};

// `repeats` passes of `probe`, with their spread.
ReadBandwidth measure_read_bandwidth(ReadProbe& probe, int repeats);
// The same of a ReadProbe of `size_bytes` made for it.
ReadBandwidth measure_read_bandwidth(ThreadPool& pool, size_t size_bytes = size_t{1} << 30, int repeats = 8);

}  // namespace tandem::kernels
