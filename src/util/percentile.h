// The p-quantile (0..1) of a sample, nearest rank; 0 for an empty one.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace tandem {

inline double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

// Repeated measurements of a rate: the largest, the median, the smallest (0s
// for none).
struct RateSpread {
  double best = 0, median = 0, worst = 0;
};
inline RateSpread rate_spread(std::vector<double> v) {
  if (v.empty()) return {};
  std::sort(v.begin(), v.end());
  return {v.back(), v[v.size() / 2], v.front()};
}

}  // namespace tandem
