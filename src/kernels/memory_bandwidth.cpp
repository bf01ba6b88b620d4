#include "kernels/memory_bandwidth.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>

#include "kernels/isa.h"
#include "kernels/read_stream.h"
#include "util/anonymous_memory.h"
#include "util/clock.h"
#include "util/percentile.h"
#include "util/thread_pool.h"

namespace tandem::kernels {

uint64_t read_stream_scalar(const uint8_t* p, size_t bytes) {
  uint64_t a[8] = {};
  for (const uint8_t* end = p + bytes; p < end; p += 512)
    for (int j = 0; j < 8; ++j) {
      const auto* line = reinterpret_cast<const uint64_t*>(p + 64 * j);
      for (int w = 0; w < 8; ++w) a[j] += line[w];
    }
  uint64_t s = 0;
  for (uint64_t v : a) s += v;
  return s;
}

ReadBandwidth measure_read_bandwidth(ThreadPool& pool, size_t size_bytes, int repeats) {
  using Loop = uint64_t (*)(const uint8_t*, size_t);
  Loop loop = read_stream_scalar;
  ReadBandwidth r;
  r.loop = "scalar";
  if (isa_supported(Isa::kAvx512)) loop = read_stream_avx512, r.loop = "avx512";
  else if (isa_supported(Isa::kAvx2)) loop = read_stream_avx2, r.loop = "avx2";

  constexpr size_t kSliceAlign = 2 << 20;  // whole huge pages per thread
  const size_t threads = static_cast<size_t>(pool.size());
  const size_t slice = std::max(kSliceAlign, size_bytes / threads / kSliceAlign * kSliceAlign);
  r.size_bytes = slice * threads;
  AnonymousMemory buf(r.size_bytes);
  // Each thread touches (so faults in, on its own node) the slice it reads.
  pool.run([&](int t, int) {
    uint8_t* p = buf.data() + static_cast<size_t>(t) * slice;
    for (size_t i = 0; i < slice; i += 4096) std::memset(p + i, static_cast<int>(i >> 12), 64);
  });
  std::atomic<uint64_t> sink{0};
  for (int rep = 0; rep < repeats; ++rep) {
    Stopwatch sw;
    pool.run([&](int t, int) {
      sink.fetch_add(loop(buf.data() + static_cast<size_t>(t) * slice, slice), std::memory_order_relaxed);
    });
    r.runs_bps.push_back(static_cast<double>(r.size_bytes) / sw.elapsed_s());
  }
  const RateSpread spread = rate_spread(r.runs_bps);
  r.best_bps = spread.best, r.median_bps = spread.median, r.worst_bps = spread.worst;
  return r;
}

}  // namespace tandem::kernels
