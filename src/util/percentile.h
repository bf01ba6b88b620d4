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

}  // namespace tandem
