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
      // Read the way a decode GEMV does: several streams at once, each
      // prefetched ahead, so the probe measures the memory system rather
      // than one stream's latency (a single stream read 38.5 GB/s on a VM
      // whose 8-row GEMV streamed 42-47 GB/s).
      constexpr int kStreams = 8;
      constexpr int64_t kLineWords = 64 / sizeof(uint64_t);
      constexpr int64_t kAheadWords = 512 / sizeof(uint64_t);
      const int64_t len = (e - b) / (kStreams * kLineWords) * kLineWords;
      uint64_t s[kStreams][kLineWords] = {};
      const uint64_t* base = buf.data() + b;
      for (int64_t i = 0; i < len; i += kLineWords) {
        for (int j = 0; j < kStreams; ++j) {
          const uint64_t* p = base + j * len + i;
          __builtin_prefetch(p + kAheadWords);
          for (int64_t w = 0; w < kLineWords; ++w) s[j][w] += p[w];
        }
      }
      uint64_t total = 0;
      for (int64_t i = b + kStreams * len; i < e; ++i) total += buf[static_cast<size_t>(i)];
      for (const auto& stream : s)
        for (uint64_t v : stream) total += v;
      sink.fetch_add(total, std::memory_order_relaxed);
    });
    best = std::max(best, static_cast<double>(n * sizeof(uint64_t)) / sw.elapsed_s());
  }
  return best;
}

}  // namespace tandem::kernels
