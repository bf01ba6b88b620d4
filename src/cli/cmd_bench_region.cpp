// `tandem bench region`: what a parallel region costs beyond its work, the
// fixed cost batch-1 decode pays on each of its ~100 matmuls per token. Three
// figures, each a median: one cache line's trip between two pool threads (the
// unit every region pays in: waking a worker, the worker reading what the
// caller just wrote, the caller seeing it finish), an empty ThreadPool::run,
// and a decode matmul (one token, activations quantized by the caller before
// each call, as the forward pass does) on weights small enough to stay in
// cache, so that what remains beyond the single thread's time split N ways is
// the region's own cost, not memory's.
#include <atomic>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cli/commands.h"
#include "kernels/dtype.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/percentile.h"
#include "util/thread_pool.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define TANDEM_BENCH_RELAX() _mm_pause()
#else
#define TANDEM_BENCH_RELAX() ((void)0)
#endif

namespace tandem::cli {
namespace {

struct RegionBenchArgs {
  int threads = 0;
  std::string dtype = "q4_k";
  int64_t cols = 1024;
  std::vector<int64_t> rows = {64, 256, 1024, 2048};
  int calls = 5000;
};

// Median one-way time of a cache line between two threads: a counter bounced
// between them, each waiting for the other's increment.
double line_transfer_ns(int round_trips) {
  alignas(64) std::atomic<int64_t> turn{0};
  std::thread other([&] {
    for (int64_t i = 0; i < round_trips; ++i) {
      while (turn.load(std::memory_order_acquire) != 2 * i + 1) TANDEM_BENCH_RELAX();
      turn.store(2 * i + 2, std::memory_order_release);
    }
  });
  const int64_t t0 = monotonic_ns();
  for (int64_t i = 0; i < round_trips; ++i) {
    turn.store(2 * i + 1, std::memory_order_release);
    while (turn.load(std::memory_order_acquire) != 2 * i + 2) TANDEM_BENCH_RELAX();
  }
  const int64_t elapsed = monotonic_ns() - t0;
  other.join();
  return static_cast<double>(elapsed) / (2.0 * round_trips);
}

template <typename F>
double median_us(int calls, F&& f) {
  std::vector<double> us;
  us.reserve(static_cast<size_t>(calls));
  for (int i = 0; i < calls; ++i) {
    const int64_t t0 = monotonic_ns();
    f();
    us.push_back(static_cast<double>(monotonic_ns() - t0) * 1e-3);
  }
  return percentile(us, 0.5);
}

void run(const RegionBenchArgs& a) {
  const kernels::DType t = kernels::parse_dtype(a.dtype);
  if (!kernels::takes_q8_activations(t))
    throw Error("bench region measures the quantized decode path: --dtype must be a quantized weight type, not " + a.dtype);
  if (a.cols % static_cast<int64_t>(kernels::dtype_block_elements(t)) != 0)
    throw Error("--cols must be a multiple of " + a.dtype + "'s block of " +
                std::to_string(kernels::dtype_block_elements(t)) + " elements");
  ThreadPool pool(a.threads);
  ThreadPool one(1);
  std::printf("parallel region cost: %d threads, %s weights of %lld columns in cache, median of %d calls\n", pool.size(),
              a.dtype.c_str(), static_cast<long long>(a.cols), a.calls);
  if (pool.size() > 1) std::printf("  cache line between two threads, one way: %.0f ns\n", line_transfer_ns(100'000));
  const auto nothing = [](int, int) {};
  std::printf("  empty region (ThreadPool::run): %.2f us\n", median_us(a.calls, [&] { pool.run(nothing); }));
  std::printf("  %8s %10s %12s %12s %16s\n", "rows", "MB", "1 thread us", "N threads us", "N-1thread/N us");
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(a.cols)), row(static_cast<size_t>(a.cols));
  for (float& v : x) v = uniform(rng);
  std::vector<kernels::BlockQ8_0Act> xq(static_cast<size_t>(a.cols / 32));
  std::vector<int32_t> xsum(xq.size());
  const size_t row_bytes = kernels::dtype_row_bytes(t, a.cols);
  for (int64_t rows : a.rows) {
    std::vector<uint8_t> plain(row_bytes * static_cast<size_t>(rows)), packed(plain.size());
    for (int64_t r = 0; r < rows; ++r) {
      for (float& v : row) v = 0.05f * uniform(rng);
      kernels::convert_row(row.data(), t, plain.data() + static_cast<size_t>(r) * row_bytes, a.cols);
    }
    kernels::WeightMatrix w{t, plain.data(), rows, a.cols, row_bytes};
    if (kernels::can_interleave(w, kernels::active_isa())) w = kernels::interleave_rows(w, packed.data(), kernels::active_isa());
    std::vector<float> y(static_cast<size_t>(rows));
    const kernels::MatmulOutput out{&w, y.data(), rows};
    auto call = [&](ThreadPool& p) {
      kernels::quantize_row_q8_0(x.data(), xq.data(), a.cols, xsum.data());
      kernels::MatmulInput in;
      in.xq = xq.data();
      in.ldxq = a.cols / 32;
      in.xsum = xsum.data();
      kernels::matmul(std::span<const kernels::MatmulOutput>(&out, 1), in, 1, p);
    };
    const double single = median_us(a.calls, [&] { call(one); });
    const double multi = median_us(a.calls, [&] { call(pool); });
    std::printf("  %8lld %10.3f %12.2f %12.2f %16.2f\n", static_cast<long long>(rows),
                static_cast<double>(plain.size()) / 1e6, single, multi, multi - single / pool.size());
  }
}

}  // namespace

void add_bench_region(CLI::App& bench) {
  auto a = std::make_shared<RegionBenchArgs>();
  CLI::App* cmd = bench.add_subcommand("region", "The fixed cost of a parallel region: thread wake-up and a decode matmul on weights in cache");
  cmd->add_option("-t,--threads", a->threads, "Threads (0 = one per core)")->check(CLI::Range(0, 1024));
  cmd->add_option("--dtype", a->dtype, "Weight type (a quantized one: the decode path's activations are quantized)");
  cmd->add_option("--cols", a->cols, "Columns (the reduction length)")->check(CLI::Range(32, 1 << 16));
  cmd->add_option("--rows", a->rows, "Row counts to measure")->delimiter(',')->check(CLI::Range(16, 1 << 16));
  cmd->add_option("--calls", a->calls, "Calls per figure (the median is reported)")->check(CLI::Range(10, 10'000'000));
  cmd->callback([a] { run(*a); });
}

}  // namespace tandem::cli
