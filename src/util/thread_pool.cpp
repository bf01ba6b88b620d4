#include "util/thread_pool.h"

#include <algorithm>

#include "util/error.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define TANDEM_CPU_RELAX() _mm_pause()
#else
#define TANDEM_CPU_RELAX() ((void)0)
#endif

namespace tandem {

namespace {
// About 50-100 microseconds of spinning before a worker parks: long enough to
// cover the gap between two kernels of one forward pass.
constexpr int kSpinIterations = 20000;
}  // namespace

int ThreadPool::hardware_threads() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads > 0 ? n_threads : hardware_threads()) {
  TANDEM_ASSERT(n_threads_ >= 1 && n_threads_ <= 1024);
  workers_.reserve(static_cast<size_t>(n_threads_ - 1));
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t gen = generation_.load(std::memory_order_acquire);
    for (int spin = 0; gen == seen && spin < kSpinIterations; ++spin) {
      TANDEM_CPU_RELAX();
      gen = generation_.load(std::memory_order_acquire);
    }
    while (gen == seen) {
      generation_.wait(seen, std::memory_order_acquire);
      gen = generation_.load(std::memory_order_acquire);
    }
    seen = gen;
    if (stop_.load(std::memory_order_acquire)) return;
    job_(index, n_threads_);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::run(FunctionRef<void(int, int)> fn) {
  if (n_threads_ == 1) {
    fn(0, 1);
    return;
  }
  TANDEM_ASSERT(pending_.load() == 0, "ThreadPool::run is not reentrant");
  job_ = fn;
  pending_.store(n_threads_ - 1, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  fn(0, n_threads_);
  // Spin briefly, then yield: when other processes or threads share the
  // cores (an HTTP server, a load generator) a worker may be descheduled, and
  // spinning for a whole time slice would keep it from running.
  for (int spin = 0; pending_.load(std::memory_order_acquire) != 0; ++spin) {
    if (spin < kSpinIterations) TANDEM_CPU_RELAX();
    else std::this_thread::yield();
  }
  job_ = {};
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, FunctionRef<void(int64_t, int64_t)> fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  int64_t units = (n + grain - 1) / grain;
  if (n_threads_ == 1 || units == 1) {
    fn(0, n);
    return;
  }
  // By value: the worker reads this closure right after waking (FunctionRef).
  run([=](int t, int nt) {
    int64_t u0 = units * t / nt;
    int64_t u1 = units * (t + 1) / nt;
    int64_t b = std::min(n, u0 * grain);
    int64_t e = std::min(n, u1 * grain);
    if (b < e) fn(b, e);
  });
}

}  // namespace tandem
