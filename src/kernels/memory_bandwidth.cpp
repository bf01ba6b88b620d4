#include "kernels/memory_bandwidth.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

#include "util/clock.h"
#include "util/thread_pool.h"

namespace tandem::kernels {

double measure_read_bandwidth(ThreadPool& pool, size_t size_bytes, int repeats) {
  const size_t n = size_bytes / sizeof(uint64_t);
  std::vector<uint64_t> buf(n);
  // Touch every page in parallel so the first timed pass is not page faults.
  pool.parallel_for(static_cast<int64_t>(n), 4096, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) buf[static_cast<size_t>(i)] = static_cast<uint64_t>(i);
  });
  std::atomic<uint64_t> sink{0};
  double best = 0.0;
  for (int rep = 0; rep < repeats; ++rep) {
    Stopwatch sw;
    pool.parallel_for(static_cast<int64_t>(n), 4096, [&](int64_t b, int64_t e) {
      uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      int64_t i = b;
      for (; i + 4 <= e; i += 4) {
        s0 += buf[static_cast<size_t>(i)];
        s1 += buf[static_cast<size_t>(i + 1)];
        s2 += buf[static_cast<size_t>(i + 2)];
        s3 += buf[static_cast<size_t>(i + 3)];
      }
      for (; i < e; ++i) s0 += buf[static_cast<size_t>(i)];
      sink.fetch_add(s0 + s1 + s2 + s3, std::memory_order_relaxed);
    });
    best = std::max(best, static_cast<double>(n * sizeof(uint64_t)) / sw.elapsed_s());
  }
  return best;
}

}  // namespace tandem::kernels
