// A persistent pool of worker threads for the kernels.
//
// The forward pass issues a few hundred parallel regions per token, so a region
// must start in microseconds: workers spin briefly on a generation counter
// before parking on it (C++20 atomic wait), and the caller takes part as
// thread 0. Work is split statically by index, never by reduction, so results
// do not depend on the number of threads.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <thread>
#include <utility>
#include <vector>

#include "util/function_ref.h"
#include "util/split_balance.h"

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

  // As parallel_for, but the ranges follow how fast each thread finished its
  // range in earlier calls with the same (n, grain) (split_balance.h). Any
  // range split gives the same results (fn's ranges are independent), so
  // only the time moves. fn(thread, begin, end) runs on every thread, with an
  // empty range where a thread has none (one grain: on the caller alone).
  // Pools of more than SplitBalance::kMaxThreads threads, and calls of fewer
  // than 4 grains a thread, split evenly.
  void parallel_for_balanced(int64_t n, int64_t grain, FunctionRef<void(int, int64_t, int64_t)> fn);

  // The range thread t would take in a parallel_for_balanced(n, grain) call
  // made now (to fetch its weights ahead, from inside another region).
  std::pair<int64_t, int64_t> balanced_range(int64_t n, int64_t grain, int t) const;

  static int hardware_threads();

 private:
  void worker_loop(int index);

  // The split of one (n, grain) of parallel_for_balanced.
  struct BalanceSlot {
    int64_t n = 0;
    int64_t grain = 0;
    SplitBalance split;
  };
  // Thread t's range of nt in an even split of n (units grains).
  static std::pair<int64_t, int64_t> even_range(int64_t n, int64_t grain, int64_t units, int t, int nt);
  const BalanceSlot* find_balance_slot(int64_t n, int64_t grain) const;
  BalanceSlot& balance_slot(int64_t n, int64_t grain);
  bool balances(int64_t units) const {
    return n_threads_ > 1 && n_threads_ <= SplitBalance::kMaxThreads && units >= 4 * n_threads_;
  }

  int n_threads_;
  std::vector<std::thread> workers_;
  // What a worker reads to start a region, in one cache line of its own.
  alignas(64) FunctionRef<void(int, int)> job_;
  std::atomic<uint64_t> generation_{0};
  // What the caller waits on at a region's end, and when each thread of a
  // balanced region finished (monotonic ns), in the same cache line: the
  // caller reads the times in the transfer that tells it the region is done.
  struct alignas(64) Finish {
    std::atomic<int> pending{0};
    std::array<std::atomic<int64_t>, SplitBalance::kMaxThreads - 1> worker_end_ns{};
  };
  Finish finish_;
  std::atomic<bool> stop_{false};
  // The shapes met most recently (a decode step has a handful).
  std::vector<BalanceSlot> balance_;
  size_t next_balance_slot_ = 0;
};

}  // namespace tandem
