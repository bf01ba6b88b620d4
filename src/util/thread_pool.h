// A persistent pool of worker threads for the kernels.
//
// The forward pass issues a few hundred parallel regions per token, so a region
// must start in microseconds: workers spin briefly on a generation counter
// before parking on it (C++20 atomic wait), and the caller takes part as
// thread 0. Work is split statically by index, never by reduction, so results
// do not depend on the number of threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "util/function_ref.h"

namespace tandem {

class ThreadPool {
 public:
  // n_threads counts the calling thread; 0 means one per hardware core.
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn(thread_index, n_threads) once on every thread and returns when all
  // calls have returned. Not reentrant: fn must not call run() again.
  void run(FunctionRef<void(int, int)> fn);

  // Splits [0, n) into one contiguous range per thread (aligned to `grain`)
  // and calls fn(begin, end) for each non-empty range.
  void parallel_for(int64_t n, int64_t grain, FunctionRef<void(int64_t, int64_t)> fn);

  static int hardware_threads();

 private:
  void worker_loop(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  // What a worker reads to start a region, in one cache line of its own.
  alignas(64) FunctionRef<void(int, int)> job_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace tandem
