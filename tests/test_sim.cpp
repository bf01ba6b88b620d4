// The deterministic cluster simulator over the real protocol cores: seed sweeps
// must find no violation and exercise every fault site and protocol path; the
// same seed must replay the same trace; and each mutation that reintroduces a
// bug family of the field reports must be caught within a stated number of seeds.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <ostream>
#include <string>

#include "sim/run_seeds.h"

namespace tandem::sim {
namespace {

// ASan+UBSan makes the simulator about five times slower; the sanitizer build
// runs half of each small-cluster sweep (the Release build runs all of it).
#if defined(__SANITIZE_ADDRESS__)
constexpr int64_t kSweepScale = 2;
#else
constexpr int64_t kSweepScale = 1;
#endif

SimOptions small_cluster(ModeChoice mode, int n_prefill = 2, int n_decode = 2) {
  SimOptions o;
  o.n_prefill = n_prefill;
  o.n_decode = n_decode;
  o.n_requests = 20;
  o.mode = mode;
  o.faults = FaultLevel::kAll;
  return o;
}

void expect_clean_sweep(uint64_t first_seed, int64_t seeds, const SimOptions& options,
                        int64_t scale = kSweepScale) {
  seeds /= scale;
  SeedRangeResult r = run_seeds(first_seed, seeds, options, false);
  ASSERT_FALSE(r.has_failure) << "seed " << r.first_failure.seed << ": "
                              << r.first_failure.violations.front() << "\nreplay: "
                              << replay_command(r.first_failure.seed, options);
  EXPECT_EQ(r.seeds_run, seeds);
  EXPECT_GT(r.requests_completed, 0);
  std::vector<std::string> missing = missing_coverage(r.coverage, options);
  std::string list;
  for (const std::string& m : missing) list += " " + m;
  EXPECT_TRUE(missing.empty()) << "never exercised:" << list;
}

// 10,000 seeds in all (Release): 6,000 mixed-mode 2P2D, 2,000 WRITE, 2,000 READ.
TEST(Sim, MixedModeSweepHasNoViolations) { expect_clean_sweep(1, 6000, small_cluster(ModeChoice::kMixed)); }
TEST(Sim, WriteModeSweepHasNoViolations) { expect_clean_sweep(100001, 2000, small_cluster(ModeChoice::kWrite)); }
TEST(Sim, ReadModeSweepHasNoViolations) { expect_clean_sweep(200001, 2000, small_cluster(ModeChoice::kRead)); }

TEST(Sim, OtherTopologiesHaveNoViolations) {
  // Whole in every build: its first 250 seeds happen to hold no fenced write.
  expect_clean_sweep(300001, 500, small_cluster(ModeChoice::kMixed, 1, 3), 1);
  expect_clean_sweep(400001, 500, small_cluster(ModeChoice::kMixed, 3, 1));
  expect_clean_sweep(500001, 500, small_cluster(ModeChoice::kMixed, 1, 1));
}

// Long virtual time (audit: simulated runs ended near 140 s against 900 s
// limits): the deadline and the retransmit limit scaled down, with faults that
// outlast them. Both ends, and the silent-peer fence, are required coverage;
// every other invariant holds. These runs found a Release that exhausted its
// retransmits counting as heard: the peer held its blocks for ever.
TEST(Sim, LongVirtualTimeRunsReachTheDeadlineAndTheRetransmitLimit) {
  SimOptions o = small_cluster(ModeChoice::kMixed);
  o.long_run = true;
  expect_clean_sweep(600001, 600, o);
}

// The reference scenario: 2P2D, 200 requests per seed.
TEST(Sim, LargeScenarioHasNoViolations) {
  SimOptions o;
  expect_clean_sweep(1, 100, o, 1);
}

TEST(Sim, FaultFreeRunsCompleteEveryRequestTheClientKept) {
  SimOptions o = small_cluster(ModeChoice::kMixed);
  o.faults = FaultLevel::kNone;
  SeedRangeResult r = run_seeds(1, 200, o, false);
  ASSERT_FALSE(r.has_failure) << r.first_failure.violations.front();
  // Without faults the only failures are the client's own aborts.
  EXPECT_EQ(r.requests_failed, r.coverage["request.client_abort"]);
  EXPECT_GT(r.coverage["path.late_addresses_accepted"], 0);
}

TEST(Sim, SameSeedSameTrace) {
  SimOptions o = small_cluster(ModeChoice::kMixed);
  for (uint64_t seed = 1; seed <= 30; ++seed) {
    Scenario s = make_scenario(seed, o);
    RunResult a = run_scenario(s, false);
    RunResult b = run_scenario(s, true);  // recording the trace must not perturb it
    EXPECT_EQ(a.trace_hash, b.trace_hash) << "seed " << seed;
    EXPECT_EQ(a.events, b.events) << "seed " << seed;
    EXPECT_FALSE(b.trace.empty());
    EXPECT_NE(a.trace_hash, run_scenario(make_scenario(seed + 1000, o), false).trace_hash);
  }
}

// Each mutation is caught within `bound` seeds of the mixed-mode 2P2D sweep,
// by the invariant that names its bug (seeds are deterministic, so the first
// catching seed is a fixed number).
struct MutationCase {
  pd::Mutation mutation;
  int64_t bound;
  Invariant caught_by;
};

void PrintTo(const MutationCase& c, std::ostream* os) { *os << pd::name(c.mutation); }

class SimMutation : public testing::TestWithParam<MutationCase> {};

TEST_P(SimMutation, IsCaughtWithinBound) {
  if (!pd::kMutationsBuilt) GTEST_SKIP() << "a Release build has no mutations; the sanitizer build runs this";
  SimOptions o = small_cluster(ModeChoice::kMixed);
  o.mutation = GetParam().mutation;
  SeedRangeResult r = run_seeds(1, GetParam().bound, o, false);
  ASSERT_TRUE(r.has_failure) << pd::name(o.mutation) << " survived " << r.seeds_run << " seeds";
  ASSERT_FALSE(r.first_failure.broken.empty());
  EXPECT_EQ(name(r.first_failure.broken.front()), name(GetParam().caught_by)) << r.first_failure.violations.front();
  std::printf("mutation %s caught by seed %llu: %s\n", std::string(pd::name(o.mutation)).c_str(),
              static_cast<unsigned long long>(r.first_failure.seed),
              r.first_failure.violations.front().c_str());
}

INSTANTIATE_TEST_SUITE_P(
    AllMutations, SimMutation,
    testing::Values(MutationCase{pd::Mutation::kFixedDeferExpiry, 50, Invariant::kUnexplainedFailure},
                    MutationCase{pd::Mutation::kOneToOneSiblingMap, 5, Invariant::kSiblingMap},
                    // The leaked prefill blocks fill its pool: the first
                    // symptom is a request that never gets space (then the leak).
                    MutationCase{pd::Mutation::kReleaseWithLocalId, 5, Invariant::kLeak},
                    MutationCase{pd::Mutation::kFreeQuarantineOnTimeout, 1000, Invariant::kPoolOwnership},
                    MutationCase{pd::Mutation::kSilentWritePostFailure, 100, Invariant::kHang},
                    MutationCase{pd::Mutation::kEndKeepsSiblings, 200, Invariant::kEndedStillRunning},
                    MutationCase{pd::Mutation::kFreeWithoutFence, 50, Invariant::kRmaIntoPrivate}),
    [](const testing::TestParamInfo<MutationCase>& info) {
      std::string n(pd::name(info.param.mutation));
      for (char& c : n)
        if (c == '-') c = '_';
      return n;
    });

std::string run(const std::string& cmd, int* status) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  *status = ::pclose(p);
  return out;
}

TEST(SimCli, ReportsViolationsAndReplayCommand) {
  const std::string bin = TANDEM_BINARY;
  int status = 0;
  std::string out = run(bin + " sim --seeds 20 --requests 10 --prefill 2 --decode 2", &status);
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("violations: 0"), std::string::npos) << out;
  EXPECT_NE(out.find("seeds/s:"), std::string::npos) << out;

  out = run(bin + " sim --list-mutations", &status);
  EXPECT_EQ(status, 0);
  for (const char* m : {"fixed-defer-expiry", "one-to-one-sibling-map", "release-with-local-id",
                        "free-quarantine-on-timeout", "silent-write-post-failure"})
    EXPECT_NE(out.find(m), std::string::npos) << m;

  out = run(bin + " sim --seeds 5 --requests 20 --mutation one-to-one-sibling-map", &status);
  EXPECT_NE(status, 0) << out;
  if (!pd::kMutationsBuilt) {
    // A Release build refuses, saying which build has them.
    EXPECT_NE(out.find("no mutations compiled in"), std::string::npos) << out;
    return;
  }
  EXPECT_NE(out.find("violations: 1"), std::string::npos) << out;
  size_t replay = out.find("replay: tandem sim --seed ");
  ASSERT_NE(replay, std::string::npos) << out;
  // The replay command reproduces the failure, with a readable trace.
  std::string cmd = out.substr(replay + 8, out.find('\n', replay) - replay - 8);
  std::string again = run(bin + cmd.substr(6), &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(again.find("VIOLATION"), std::string::npos) << again.substr(0, 2000);
  EXPECT_NE(again.find("deliver"), std::string::npos);

  out = run(bin + " sim --mutation no-such-bug", &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("list-mutations"), std::string::npos) << out;
}

}  // namespace
}  // namespace tandem::sim
