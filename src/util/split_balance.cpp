#include "util/split_balance.h"

#include <algorithm>
#include <cmath>

#include "util/error.h"

namespace tandem {

SplitBalance::SplitBalance(int threads) : threads_(threads) {
  TANDEM_ASSERT(threads >= 1 && threads <= kMaxThreads);
  speed_.fill(1.0);
}

SplitBalance::Cuts SplitBalance::cuts(int64_t units) const {
  Cuts cut{};
  double total = 0;
  for (int t = 0; t < threads_; ++t) total += speed_[static_cast<size_t>(t)];
  double before = 0;
  for (int t = 1; t < threads_; ++t) {
    before += speed_[static_cast<size_t>(t - 1)];
    cut[static_cast<size_t>(t)] = std::clamp<int64_t>(std::llround(static_cast<double>(units) * before / total),
                                                      cut[static_cast<size_t>(t - 1)], units);
  }
  cut[static_cast<size_t>(threads_)] = units;
  return cut;
}

void SplitBalance::record(const Cuts& cuts, std::span<const int64_t> elapsed_ns) {
  TANDEM_ASSERT(elapsed_ns.size() >= static_cast<size_t>(threads_));
  std::array<double, kMaxThreads> rate{};
  double sum = 0;
  for (int t = 0; t < threads_; ++t) {
    const auto i = static_cast<size_t>(t);
    const int64_t units = cuts[i + 1] - cuts[i];
    if (units <= 0 || elapsed_ns[i] <= 0) return;
    rate[i] = static_cast<double>(units) / static_cast<double>(elapsed_ns[i]);
    sum += rate[i];
  }
  const double mean = sum / threads_;
  for (int t = 0; t < threads_; ++t) {
    double& s = speed_[static_cast<size_t>(t)];
    s = std::clamp((1.0 - kSpeedUpdateWeight) * s + kSpeedUpdateWeight * rate[static_cast<size_t>(t)] / mean, kMinSpeed,
                   kMaxSpeed);
  }
}

}  // namespace tandem
