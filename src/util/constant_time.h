// Comparison of secrets (API keys, cluster secrets, MACs) in time that
// depends only on the lengths, so a wrong guess does not learn how long a
// prefix it got right.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace tandem {

inline bool constant_time_equal(std::span<const uint8_t> a, std::span<const uint8_t> b) {
  if (a.size() != b.size()) return false;
  volatile uint8_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff = diff | (a[i] ^ b[i]);
  return diff == 0;
}

inline bool constant_time_equal(std::string_view a, std::string_view b) {
  return constant_time_equal(std::span(reinterpret_cast<const uint8_t*>(a.data()), a.size()),
                             std::span(reinterpret_cast<const uint8_t*>(b.data()), b.size()));
}

}  // namespace tandem
