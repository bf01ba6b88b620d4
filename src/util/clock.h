// Monotonic time for measurements and deadlines (never used inside protocol cores).
#pragma once

#include <chrono>
#include <cstdint>

namespace tandem {

inline int64_t monotonic_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline int64_t monotonic_ms() { return monotonic_ns() / 1'000'000; }
inline int64_t monotonic_us() { return monotonic_ns() / 1'000; }

class Stopwatch {
 public:
  Stopwatch() : start_ns_(monotonic_ns()) {}
  double elapsed_s() const { return static_cast<double>(monotonic_ns() - start_ns_) * 1e-9; }
  double elapsed_ms() const { return static_cast<double>(monotonic_ns() - start_ns_) * 1e-6; }

 private:
  int64_t start_ns_;
};

}  // namespace tandem
