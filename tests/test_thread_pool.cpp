// The thread pool's regions and splits, and the FunctionRef they take.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>
#include <vector>

#include "util/function_ref.h"
#include "util/idle_fetch.h"
#include "util/split_balance.h"
#include "util/thread_pool.h"

namespace tandem {
namespace {

TEST(FunctionRef, CallsTheReferencedCallableWithItsStateAndReturnsItsResult) {
  int calls = 0;
  auto add = [&calls](int a, int b) {
    ++calls;
    return a + b;
  };
  FunctionRef<int(int, int)> ref = add;
  EXPECT_TRUE(static_cast<bool>(ref));
  EXPECT_EQ(ref(2, 3), 5);
  EXPECT_EQ(ref(-4, 1), -3);
  EXPECT_EQ(calls, 2);  // the lambda itself ran, not a copy of it
  std::function<int(int, int)> f = [](int a, int b) { return a * b; };
  ref = f;
  EXPECT_EQ(ref(6, 7), 42);
  EXPECT_FALSE(static_cast<bool>(FunctionRef<void()>{}));
}

TEST(IdleFetch, StepsThroughItsRangesInOrderUpToItsLimit) {
  std::vector<uint8_t> a(2500), b(1024);
  IdleFetch f;
  EXPECT_EQ(f.take_step().bytes, 0) << "nothing queued";
  IdleFetch::Ranges r;
  r.range[0] = {a.data(), 2500};
  r.range[1] = {b.data(), 1024};
  r.n = 2;
  f.queue(r, 1 << 20);
  const std::vector<std::pair<const uint8_t*, int64_t>> want = {
      {a.data(), 1024}, {a.data() + 1024, 1024}, {a.data() + 2048, 452}, {b.data(), 1024}};
  for (const auto& [data, bytes] : want) {
    const IdleFetch::Range s = f.take_step();
    EXPECT_EQ(s.data, data);
    EXPECT_EQ(s.bytes, bytes);
  }
  EXPECT_EQ(f.take_step().bytes, 0);
  EXPECT_FALSE(f.step());
  // At most the limit, and a new queue replaces what is left.
  f.queue(r, 1500);
  EXPECT_EQ(f.take_step().bytes, 1024);
  EXPECT_EQ(f.take_step().bytes, 476);
  EXPECT_EQ(f.take_step().bytes, 0);
  f.queue(r, 1500);
  EXPECT_TRUE(f.step());
  f.queue(IdleFetch::Ranges{}, 1500);
  EXPECT_FALSE(f.step());
}

// What a thread has queued is fetched while it waits in the pool: a worker
// between regions, the caller while the workers finish.
TEST(ThreadPool, AWaitingThreadFetchesWhatItHasQueued) {
  ThreadPool pool(2);
  std::vector<uint8_t> data(4096);
  IdleFetch::Ranges r;
  r.range[0] = {data.data(), 4096};
  r.n = 1;
  // The worker queues, and waits for the next region.
  pool.run([&](int t, int) {
    if (t == 1) IdleFetch::this_thread().queue(r, 1 << 20);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  int64_t worker_left_bytes = -1;
  pool.run([&](int t, int) {
    if (t == 1) worker_left_bytes = IdleFetch::this_thread().take_step().bytes;
  });
  EXPECT_EQ(worker_left_bytes, 0);
  // The caller queues, and waits for a worker that takes longer.
  pool.run([&](int t, int) {
    if (t == 0) IdleFetch::this_thread().queue(r, 1 << 20);
    else std::this_thread::sleep_for(std::chrono::milliseconds(20));
  });
  EXPECT_EQ(IdleFetch::this_thread().take_step().bytes, 0);
}

TEST(ThreadPool, RunCallsEveryThreadIndexOnceWithTheThreadCount) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    for (int round = 0; round < 100; ++round) {
      std::vector<std::atomic<int>> seen(static_cast<size_t>(threads));
      std::atomic<int> wrong_count{0};
      pool.run([&](int t, int nt) {
        if (nt != threads) wrong_count.fetch_add(1);
        seen[static_cast<size_t>(t)].fetch_add(1);
      });
      EXPECT_EQ(wrong_count.load(), 0);
      for (int t = 0; t < threads; ++t) ASSERT_EQ(seen[static_cast<size_t>(t)].load(), 1) << threads << " threads, index " << t;
    }
  }
}

TEST(ThreadPool, ParallelForRunsEveryIndexOnceOnGrainBoundaries) {
  for (int threads : {1, 2, 3, 4}) {
    ThreadPool pool(threads);
    for (int64_t n : {1, 15, 16, 17, 1000, 4099}) {
      for (int64_t grain : {1, 16, 64}) {
        SCOPED_TRACE(testing::Message() << threads << " threads, n " << n << ", grain " << grain);
        std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
        std::atomic<int> bad_bounds{0};
        pool.parallel_for(n, grain, [&](int64_t b, int64_t e) {
          if (b % grain != 0 || (e % grain != 0 && e != n) || b >= e) bad_bounds.fetch_add(1);
          for (int64_t i = b; i < e; ++i) seen[static_cast<size_t>(i)].fetch_add(1);
        });
        EXPECT_EQ(bad_bounds.load(), 0);
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(seen[static_cast<size_t>(i)].load(), 1) << "index " << i;
      }
    }
  }
}

TEST(ThreadPool, BalancedForRunsEveryThreadOnceOverEveryIndexOnceOnGrainBoundaries) {
  // 9 threads: more than SplitBalance::kMaxThreads, an even split.
  for (int threads : {1, 2, 3, 4, 9}) {
    ThreadPool pool(threads);
    for (int64_t n : {1, 15, 16, 17, 1000, 4099}) {
      for (int64_t grain : {1, 16, 64}) {
        SCOPED_TRACE(testing::Message() << threads << " threads, n " << n << ", grain " << grain);
        // Several calls, so that later ones run on measured speeds.
        for (int call = 0; call < 5; ++call) {
          std::vector<std::pair<int64_t, int64_t>> predicted(static_cast<size_t>(threads));
          for (int t = 0; t < threads; ++t) predicted[static_cast<size_t>(t)] = pool.balanced_range(n, grain, t);
          std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
          std::vector<std::atomic<int>> calls(static_cast<size_t>(threads));
          std::atomic<int> bad_bounds{0}, unpredicted{0};
          pool.parallel_for_balanced(n, grain, [&](int t, int64_t b, int64_t e) {
            calls[static_cast<size_t>(t)].fetch_add(1);
            if (b > e || (b < e && (b % grain != 0 || (e % grain != 0 && e != n)))) bad_bounds.fetch_add(1);
            if (predicted[static_cast<size_t>(t)] != std::pair<int64_t, int64_t>{b, e}) unpredicted.fetch_add(1);
            for (int64_t i = b; i < e; ++i) seen[static_cast<size_t>(i)].fetch_add(1);
          });
          EXPECT_EQ(bad_bounds.load(), 0);
          EXPECT_EQ(unpredicted.load(), 0) << "balanced_range differs from the call's ranges";
          // One grain runs on the caller alone; otherwise every thread is called once.
          const bool inline_call = threads == 1 || (n + grain - 1) / grain == 1;
          for (int t = 0; t < threads; ++t)
            ASSERT_EQ(calls[static_cast<size_t>(t)].load(), inline_call && t > 0 ? 0 : 1) << "thread " << t;
          for (int64_t i = 0; i < n; ++i) ASSERT_EQ(seen[static_cast<size_t>(i)].load(), 1) << "index " << i;
        }
      }
    }
  }
}

TEST(SplitBalance, CutsEvenlyUntilTimesAreRecorded) {
  EXPECT_EQ(SplitBalance(1).cuts(7)[1], 7);
  const SplitBalance::Cuts two = SplitBalance(2).cuts(100);
  EXPECT_EQ(two[0], 0);
  EXPECT_EQ(two[1], 50);
  EXPECT_EQ(two[2], 100);
  const SplitBalance::Cuts three = SplitBalance(3).cuts(100);
  EXPECT_EQ(three[1], 33);
  EXPECT_EQ(three[2], 67);
  EXPECT_EQ(three[3], 100);
}

TEST(SplitBalance, ASlowerThreadIsGivenFewerUnitsInProportionToItsSpeed) {
  SplitBalance split(2);
  // Thread 1 takes twice as long per unit as thread 0, whatever its share.
  for (int call = 0; call < 60; ++call) {
    const SplitBalance::Cuts cut = split.cuts(90);
    const std::array<int64_t, 2> elapsed_ns = {1000 * cut[1], 2000 * (cut[2] - cut[1])};
    split.record(cut, elapsed_ns);
  }
  EXPECT_NEAR(split.speed(0) / split.speed(1), 2.0, 0.05);
  const SplitBalance::Cuts cut = split.cuts(90);
  EXPECT_EQ(cut[1], 60);  // two thirds to the thread twice as fast
  EXPECT_EQ(cut[2], 90);
}

TEST(SplitBalance, ACallWithAnIdleThreadSaysNothingAndSpeedsStayBounded) {
  SplitBalance split(2);
  SplitBalance::Cuts no_units{0, 10, 10};  // thread 1 had no units
  split.record(no_units, std::array<int64_t, 2>{100, 0});
  EXPECT_EQ(split.speed(0), 1.0);
  EXPECT_EQ(split.speed(1), 1.0);
  split.record(SplitBalance::Cuts{0, 5, 10}, std::array<int64_t, 2>{100, 0});  // no time measured
  EXPECT_EQ(split.speed(1), 1.0);
  // A thread descheduled for long: its speed falls to the floor, and it keeps units.
  for (int call = 0; call < 200; ++call) {
    const SplitBalance::Cuts cut = split.cuts(64);
    split.record(cut, std::array<int64_t, 2>{100 * cut[1], 1'000'000 * (cut[2] - cut[1])});
  }
  EXPECT_GE(split.speed(1), SplitBalance::kMinSpeed);
  EXPECT_LE(split.speed(0), SplitBalance::kMaxSpeed);
  EXPECT_LT(split.cuts(64)[1], 64) << "the slow thread keeps some units";
}

}  // namespace
}  // namespace tandem
