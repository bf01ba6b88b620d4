// Memory a thread fetches while it waits in the thread pool, for a region's
// other threads to finish or for the next region to start. A batch-1 decode
// matmul queues the thread's share of the matmul that comes next
// (kernels::next_share), so the time one thread waits for the other, and the
// caller's serial work between regions, stream part of that share into the
// thread's L2 instead of being lost, and the share does not start cold.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

namespace tandem {

class IdleFetch {
 public:
  struct Range {
    const uint8_t* data = nullptr;
    int64_t bytes = 0;
  };
  static constexpr int kMaxRanges = 8;
  struct Ranges {
    std::array<Range, kMaxRanges> range{};
    int n = 0;
  };
  // What one wait-loop iteration fetches: 16 lines, so that a thread notices
  // a region's start or end within a few lines' latency.
  static constexpr int64_t kStepBytes = 1024;

  // Replaces what is queued by `ranges`, fetched in order, at most
  // max_bytes in all.
  void queue(const Ranges& ranges, int64_t max_bytes) {
    ranges_ = ranges;
    i_ = 0;
    offset_ = 0;
    left_bytes_ = max_bytes;
  }
  // Fetches the next kStepBytes of what is queued into L2 (a prefetch, so
  // nothing waits on it); false when nothing is left.
  bool step() {
    const Range r = take_step();
    for (int64_t b = 0; b < r.bytes; b += 64) __builtin_prefetch(r.data + b, 0, 2);
    return r.bytes > 0;
  }
  // The bytes the next step fetches, taken off the queue (empty when
  // nothing is left).
  Range take_step() {
    while (i_ < ranges_.n && offset_ >= ranges_.range[static_cast<size_t>(i_)].bytes) {
      ++i_;
      offset_ = 0;
    }
    if (i_ >= ranges_.n || left_bytes_ <= 0) return {};
    const Range& r = ranges_.range[static_cast<size_t>(i_)];
    const Range out{r.data + offset_, std::min({kStepBytes, r.bytes - offset_, left_bytes_})};
    offset_ += out.bytes;
    left_bytes_ -= out.bytes;
    return out;
  }

  // The calling thread's queue, which the pool's wait loops step.
  static IdleFetch& this_thread() {
    thread_local IdleFetch fetch;
    return fetch;
  }

 private:
  Ranges ranges_;
  int i_ = 0;
  int64_t offset_ = 0;
  int64_t left_bytes_ = 0;
};

}  // namespace tandem
