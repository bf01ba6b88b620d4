// A futex word as a wake-up hint between processes that share a mapping.
// A waiter reads the word, rechecks the shared state it waits for, and only
// then sleeps on the value it read, for a bounded time: a wake-up that came
// between the check and the sleep changes the word, so the sleep returns at
// once; and a lost or spurious one costs at most the bound.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdint>
#include <ctime>

namespace tandem {

static_assert(std::atomic<uint32_t>::is_always_lock_free);

// Sleeps while *word == seen, at most `ns` nanoseconds.
inline void futex_wait(std::atomic<uint32_t>* word, uint32_t seen, int64_t ns) {
  if (ns <= 0) return;
  timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

inline void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Bumps the word (after the state it announces is published) and wakes every sleeper.
inline void ring_bell(std::atomic<uint32_t>* bell) {
  bell->fetch_add(1, std::memory_order_release);
  futex_wake_all(bell);
}

}  // namespace tandem
