#include "server/shutdown_drain.h"

#include <chrono>
#include <cstdio>
#include <thread>

namespace tandem::server {

namespace {
// Polls in_flight() every 20 ms until it is 0 or `deadline`.
void wait_drained(FunctionRef<int64_t()> in_flight, std::chrono::steady_clock::time_point deadline) {
  while (in_flight() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
}
}  // namespace

void drain_then_cut_off(const char* log_prefix, const char* what, int timeout_s, FunctionRef<int64_t()> in_flight,
                        FunctionRef<void(const std::string&)> cut_off) {
  wait_drained(in_flight, std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s));
  const int64_t left = in_flight();
  if (left == 0) return;
  std::fprintf(stderr, "%s: %lld requests still in flight at the shutdown timeout; they are cut off\n", log_prefix,
               static_cast<long long>(left));
  // Each ends with an error its client sees; the caller's stop then has no
  // response under way to wait for (httplib's stop waits for them).
  cut_off("the " + std::string(what) + " shut down before this request finished (--shutdown-timeout " +
          std::to_string(timeout_s) + " s)");
  wait_drained(in_flight, std::chrono::steady_clock::now() + std::chrono::seconds(5));
}

}  // namespace tandem::server
