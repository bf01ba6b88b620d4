// The thread pool's regions and splits, and the FunctionRef they take.
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <vector>

#include "util/function_ref.h"
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

}  // namespace
}  // namespace tandem
