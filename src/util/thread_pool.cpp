#include "util/thread_pool.h"

#include <algorithm>

#include "util/clock.h"
#include "util/error.h"
#include "util/idle_fetch.h"

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
// The (n, grain) shapes whose balanced splits a pool keeps.
constexpr size_t kBalanceSlots = 16;
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
    IdleFetch& fetch = IdleFetch::this_thread();
    for (int spin = 0; gen == seen && spin < kSpinIterations; ++spin) {
      if (!fetch.step()) TANDEM_CPU_RELAX();
      gen = generation_.load(std::memory_order_acquire);
    }
    while (gen == seen) {
      generation_.wait(seen, std::memory_order_acquire);
      gen = generation_.load(std::memory_order_acquire);
    }
    seen = gen;
    if (stop_.load(std::memory_order_acquire)) return;
    job_(index, n_threads_);
    finish_.pending.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::run(FunctionRef<void(int, int)> fn) {
  if (n_threads_ == 1) {
    fn(0, 1);
    return;
  }
  TANDEM_ASSERT(finish_.pending.load() == 0, "ThreadPool::run is not reentrant");
  job_ = fn;
  finish_.pending.store(n_threads_ - 1, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  fn(0, n_threads_);
  // Spin briefly, then yield: when other processes or threads share the
  // cores (an HTTP server, a load generator) a worker may be descheduled, and
  // spinning for a whole time slice would keep it from running.
  IdleFetch& fetch = IdleFetch::this_thread();
  for (int spin = 0; finish_.pending.load(std::memory_order_acquire) != 0; ++spin) {
    if (fetch.step()) continue;
    if (spin < kSpinIterations) TANDEM_CPU_RELAX();
    else std::this_thread::yield();
  }
  job_ = {};
}

std::pair<int64_t, int64_t> ThreadPool::even_range(int64_t n, int64_t grain, int64_t units, int t, int nt) {
  return {std::min(n, units * t / nt * grain), std::min(n, units * (t + 1) / nt * grain)};
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
    const auto [b, e] = even_range(n, grain, units, t, nt);
    if (b < e) fn(b, e);
  });
}

}  // namespace tandem

namespace tandem {

const ThreadPool::BalanceSlot* ThreadPool::find_balance_slot(int64_t n, int64_t grain) const {
  for (const BalanceSlot& s : balance_)
    if (s.n == n && s.grain == grain) return &s;
  return nullptr;
}

ThreadPool::BalanceSlot& ThreadPool::balance_slot(int64_t n, int64_t grain) {
  for (BalanceSlot& s : balance_)
    if (s.n == n && s.grain == grain) return s;
  // A new shape takes the oldest slot and starts from an even split.
  if (balance_.size() < kBalanceSlots) return balance_.emplace_back(BalanceSlot{n, grain, SplitBalance(n_threads_)});
  BalanceSlot& s = balance_[next_balance_slot_];
  next_balance_slot_ = (next_balance_slot_ + 1) % balance_.size();
  s = BalanceSlot{n, grain, SplitBalance(n_threads_)};
  return s;
}

std::pair<int64_t, int64_t> ThreadPool::balanced_range(int64_t n, int64_t grain, int t) const {
  if (n <= 0) return {0, 0};
  grain = std::max<int64_t>(grain, 1);
  const int64_t units = (n + grain - 1) / grain;
  TANDEM_ASSERT(t >= 0 && t < n_threads_);
  if (n_threads_ == 1 || units == 1) return t == 0 ? std::pair<int64_t, int64_t>{0, n} : std::pair<int64_t, int64_t>{n, n};
  if (!balances(units)) return even_range(n, grain, units, t, n_threads_);
  const BalanceSlot* slot = find_balance_slot(n, grain);
  const SplitBalance::Cuts cut = slot != nullptr ? slot->split.cuts(units) : SplitBalance(n_threads_).cuts(units);
  return {std::min(n, cut[static_cast<size_t>(t)] * grain), std::min(n, cut[static_cast<size_t>(t) + 1] * grain)};
}

void ThreadPool::parallel_for_balanced(int64_t n, int64_t grain, FunctionRef<void(int, int64_t, int64_t)> fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t units = (n + grain - 1) / grain;
  const int nt = n_threads_;
  if (nt == 1 || units == 1) {
    fn(0, 0, n);
    return;
  }
  if (!balances(units)) {
    run([=](int t, int) {
      const auto [b, e] = even_range(n, grain, units, t, nt);
      fn(t, b, e);
    });
    return;
  }
  BalanceSlot& slot = balance_slot(n, grain);
  const SplitBalance::Cuts cut = slot.split.cuts(units);
  const int64_t start_ns = monotonic_ns();
  int64_t caller_end_ns = start_ns;
  // By value but for the caller's own end time, which no worker touches.
  run([=, this, &caller_end_ns](int t, int) {
    fn(t, std::min(n, cut[static_cast<size_t>(t)] * grain), std::min(n, cut[static_cast<size_t>(t) + 1] * grain));
    const int64_t end = monotonic_ns();
    if (t == 0) caller_end_ns = end;
    else finish_.worker_end_ns[static_cast<size_t>(t - 1)].store(end, std::memory_order_relaxed);
  });
  std::array<int64_t, SplitBalance::kMaxThreads> elapsed_ns{};
  elapsed_ns[0] = caller_end_ns - start_ns;
  for (int t = 1; t < nt; ++t)
    elapsed_ns[static_cast<size_t>(t)] = finish_.worker_end_ns[static_cast<size_t>(t - 1)].load(std::memory_order_relaxed) - start_ns;
  slot.split.record(cut, elapsed_ns);
}

}  // namespace tandem
