// Measures this machine's sustained memory read bandwidth, the ceiling for
// batch-1 decode (which reads every weight once per token).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/read_stream.h"
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
  std::string loop;  // the inner loop that read fastest (read_stream.h)
};

// A buffer of about `size_bytes` (much larger than the caches; transparent
// huge pages asked for; each thread's slice first touched by that thread),
// read a pass at a time: every pool thread reads one contiguous slice with
// each loop of the widest ISA the CPU has (eight accumulators; one stream or
// several, with and without a prefetch into L2 ahead: read_stream.h), as a
// tuned streaming kernel reads. Kept between passes so that a bench can
// interleave passes with the runs it judges against them.
class ReadProbe {
 public:
  ReadProbe(ThreadPool& pool, size_t size_bytes);
  // One pass, bytes per second: the buffer read once with each loop, the
  // fastest read counted.
  double pass_bps();
  size_t size_bytes() const { return buf_.size(); }
  // The loop that has read fastest so far.
  std::string loop() const { return loops_[best_loop_].loop.name(); }

 private:
  struct Loop {
    ReadLoop loop;
    double best_bps = 0;
  };
  double read_bps(const ReadLoop& loop);

  ThreadPool& pool_;
  size_t slice_bytes_;
  AnonymousMemory buf_;
  std::vector<Loop> loops_;
  size_t best_loop_ = 0;
  uint64_t sink_ = 0;
};

// `repeats` passes of `probe`, with their spread.
ReadBandwidth measure_read_bandwidth(ReadProbe& probe, int repeats);
// The same of a ReadProbe of `size_bytes` made for it.
ReadBandwidth measure_read_bandwidth(ThreadPool& pool, size_t size_bytes = size_t{1} << 30, int repeats = 8);

}  // namespace tandem::kernels
