// How a parallel_for_balanced region cuts its work across threads: in
// proportion to each thread's speed on earlier calls of the same shape. On a
// VM whose cores run at different speeds (another tenant on a sibling
// thread, a core that is slower for minutes at a time), an even split leaves
// the faster thread waiting at every region's end. Sans-IO: the pool measures
// the times and hands them in, so the policy is testable on its own.
#pragma once

#include <array>
#include <cstdint>
#include <span>

namespace tandem {

class SplitBalance {
 public:
  static constexpr int kMaxThreads = 8;
  // Thread t takes units [cuts[t], cuts[t + 1]).
  using Cuts = std::array<int64_t, kMaxThreads + 1>;

  // An even split until record() says otherwise. 1 <= threads <= kMaxThreads.
  explicit SplitBalance(int threads);

  // `units` cut in proportion to the threads' speeds (each cut rounded to a unit).
  Cuts cuts(int64_t units) const;
  // A call cut as `cuts` whose threads finished elapsed_ns[t] after the
  // region began (a worker's wake-up counts against it): each thread's units
  // per ns, relative to the mean thread, moves its speed by
  // kSpeedUpdateWeight. A thread with no units or no time says nothing, and
  // the call is not counted.
  void record(const Cuts& cuts, std::span<const int64_t> elapsed_ns);

  // Thread t's relative speed (1 = the mean thread).
  double speed(int t) const { return speed_[static_cast<size_t>(t)]; }

  // About the last 8 calls count, so that a split follows a core that slows
  // within a token (~100 regions) without chasing one call's noise.
  static constexpr double kSpeedUpdateWeight = 0.125;
  // A thread descheduled for a time slice once keeps some units, so that it
  // can show it has recovered.
  static constexpr double kMinSpeed = 0.25;
  static constexpr double kMaxSpeed = 4.0;

 private:
  int threads_;
  std::array<double, kMaxThreads> speed_{};
};

}  // namespace tandem
