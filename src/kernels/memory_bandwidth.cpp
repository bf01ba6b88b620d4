#include "kernels/memory_bandwidth.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>

#include "kernels/isa.h"
#include "kernels/read_stream.h"
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

namespace {

constexpr size_t kSliceAlign = 2 << 20;  // whole huge pages per thread

size_t slice_for(size_t size_bytes, int threads) {
  return std::max(kSliceAlign, size_bytes / static_cast<size_t>(threads) / kSliceAlign * kSliceAlign);
}

}  // namespace

ReadProbe::ReadProbe(ThreadPool& pool, size_t size_bytes)
    : pool_(pool), slice_bytes_(slice_for(size_bytes, pool.size())), buf_(slice_bytes_ * static_cast<size_t>(pool.size())) {
  std::span<const ReadLoop> loops;
  if (isa_supported(Isa::kAvx512)) {
    loops = read_loops_avx512();
  } else if (isa_supported(Isa::kAvx2)) {
    loops = read_loops_avx2();
  }
  for (const ReadLoop& l : loops) loops_.push_back({l});
  if (loops_.empty()) loops_.push_back({{read_stream_scalar, "scalar", ""}});
  // Each thread touches (so faults in, on its own node) the slice it reads.
  pool_.run([&](int t, int) {
    uint8_t* p = buf_.data() + static_cast<size_t>(t) * slice_bytes_;
    for (size_t i = 0; i < slice_bytes_; i += 4096) std::memset(p + i, static_cast<int>(i >> 12), 64);
  });
}

double ReadProbe::read_bps(const ReadLoop& loop) {
  std::atomic<uint64_t> sum{0};
  Stopwatch sw;
  pool_.run([&](int t, int) {
    sum.fetch_add(loop.read(buf_.data() + static_cast<size_t>(t) * slice_bytes_, slice_bytes_), std::memory_order_relaxed);
  });
  const double bps = static_cast<double>(buf_.size()) / sw.elapsed_s();
  sink_ += sum.load();  // kept, so that the reads are not dead code
  return bps;
}

double ReadProbe::pass_bps() {
  double best = 0;
  for (size_t i = 0; i < loops_.size(); ++i) {
    Loop& l = loops_[i];
    const double bps = read_bps(l.loop);
    l.best_bps = std::max(l.best_bps, bps);
    if (l.best_bps > loops_[best_loop_].best_bps) best_loop_ = i;
    best = std::max(best, bps);
  }
  return best;
}

ReadBandwidth measure_read_bandwidth(ReadProbe& probe, int repeats) {
  ReadBandwidth r;
  r.size_bytes = probe.size_bytes();
  for (int rep = 0; rep < repeats; ++rep) r.runs_bps.push_back(probe.pass_bps());
  r.loop = probe.loop();
  const RateSpread spread = rate_spread(r.runs_bps);
  r.best_bps = spread.best, r.median_bps = spread.median, r.worst_bps = spread.worst;
  return r;
}

ReadBandwidth measure_read_bandwidth(ThreadPool& pool, size_t size_bytes, int repeats) {
  ReadProbe probe(pool, size_bytes);
  return measure_read_bandwidth(probe, repeats);
}

}  // namespace tandem::kernels
