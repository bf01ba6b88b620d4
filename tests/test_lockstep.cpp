// The data-parallel lockstep group: frame checks, the step consensus, and the
// simulator of N ranks with the seed-000/004 bug families as mutations.
#include <gtest/gtest.h>

#include <cstdio>
#include <set>

#include "parallel/frame.h"
#include "parallel/lockstep_group.h"
#include "parallel/lockstep_sim.h"
#include "parallel/sim_fabric.h"

namespace tandem::parallel {
namespace {

std::vector<Frame> frames(int n) {
  std::vector<Frame> f(static_cast<size_t>(n));
  for (auto& x : f) x.kind = static_cast<int64_t>(OpKind::kExpertDispatch), x.step_id = 7, x.seq = 21;
  return f;
}

TEST(LockstepFrames, AgreeingFramesHaveNoVerdict) {
  const auto f = frames(4);
  const FrameVerdict v = check_frames(f, {});
  EXPECT_FALSE(v.divergence);
  EXPECT_TRUE(v.failed_ranks.empty());
}

TEST(LockstepFrames, TheMinorityRankIsNamedWithTheField) {
  auto f = frames(4);
  f[2].step_id = 8;
  const FrameVerdict v = check_frames(f, {});
  ASSERT_TRUE(v.divergence);
  EXPECT_EQ(v.divergence->rank, 2);
  EXPECT_EQ(v.divergence->field, "step_id");
  EXPECT_EQ(v.divergence->expected, 7);
  EXPECT_EQ(v.divergence->got, 8);
  EXPECT_NE(v.divergence->message().find("rank 2 has step_id=8"), std::string::npos) << v.divergence->message();
}

TEST(LockstepFrames, WithTwoRanksTheOneOffItsPlanIsNamed) {
  for (int off : {0, 1}) {
    auto f = frames(2);
    f[static_cast<size_t>(off)].kind = static_cast<int64_t>(OpKind::kProbe);
    f[static_cast<size_t>(off)].off_plan = 1;
    const FrameVerdict v = check_frames(f, {});
    ASSERT_TRUE(v.divergence);
    EXPECT_EQ(v.divergence->rank, off);
    EXPECT_EQ(v.divergence->field, "kind");
  }
}

TEST(LockstepFrames, AFingerprintIsCheckedAgainstTheAgreedPlanNotTheMajority) {
  auto f = frames(2);
  f[0].fingerprint = 99;  // rank 0 departs; with two ranks a majority could not tell
  f[1].fingerprint = 5;
  FrameChecks checks;
  checks.expected_fingerprint = 5;
  const FrameVerdict v = check_frames(f, checks);
  ASSERT_TRUE(v.divergence);
  EXPECT_EQ(v.divergence->rank, 0);
  EXPECT_EQ(v.divergence->field, "fingerprint");
}

TEST(LockstepFrames, FailuresAreReportedForEveryFailedRank) {
  auto f = frames(3);
  f[1].status = static_cast<int64_t>(FailureCode::kLocalError);
  f[2].status = static_cast<int64_t>(FailureCode::kShuttingDown);
  const FrameVerdict v = check_frames(f, {});
  EXPECT_FALSE(v.divergence);
  EXPECT_EQ(v.failed_ranks, (std::vector<int>{1, 2}));
  EXPECT_EQ(v.failure_code, static_cast<int64_t>(FailureCode::kLocalError));
}

TEST(LockstepPlan, ThePlanDependsOnTheConfigurationOnly) {
  const LockstepConfig config{3, 2};
  const StepPlan busy = plan_step(config, {40, true, true});
  const StepPlan idle = plan_step(config, {0, false, false});
  EXPECT_EQ(busy.ops.size(), 3u * 2 + 2);
  EXPECT_EQ(busy.fingerprint(), idle.fingerprint());
  EXPECT_EQ(idle.draft_width, 2);
  EXPECT_NE(plan_step({2, 2}, {}).fingerprint(), busy.fingerprint());
}

// Every rank of a run with no mutation completes every step with equal counters.
void expect_clean(const LockstepSimConfig& c) {
  const auto results = run_lockstep_sim(c);
  for (size_t r = 0; r < results.size(); ++r) {
    SCOPED_TRACE("seed " + std::to_string(c.seed) + " ranks " + std::to_string(c.n_ranks) + " rank " + std::to_string(r));
    EXPECT_FALSE(results[r].raised) << results[r].message;
    EXPECT_EQ(results[r].steps_done, c.n_steps);
    EXPECT_EQ(results[r].counters.steps, results[0].counters.steps);
    EXPECT_EQ(results[r].counters.ops, results[0].counters.ops);
  }
}

TEST(LockstepSim, EverySeedStepsInLockstepAtEveryGroupSize) {
  for (int n : {1, 2, 3, 4, 8, 16})
    for (uint64_t seed = 1; seed <= 12; ++seed) {
      LockstepSimConfig c;
      c.n_ranks = n;
      c.n_steps = 60;
      c.seed = seed;
      c.group = {static_cast<int>(seed % 3), static_cast<int>(seed % 2) * 2};
      expect_clean(c);
    }
}

TEST(LockstepSim, AnIdleRankRunsAThousandDummyStepsBesideABusyOne) {
  LockstepSimConfig c;
  c.n_steps = 1000;
  c.p_idle = 0;
  c.always_idle_ranks = {1};
  c.group = {2, 1};
  const auto results = run_lockstep_sim(c);
  expect_clean(c);
  EXPECT_EQ(results[1].counters.dummy_steps, 1000);
  EXPECT_EQ(results[0].counters.dummy_steps, 0);
  EXPECT_EQ(results[0].counters.steps, 1000);
  EXPECT_EQ(results[1].counters.by_kind[static_cast<size_t>(OpKind::kExpertDispatch)].count, 2000);
}

// Every rank raised the same error, naming `rank` and `field`, in `step`.
void expect_caught(const std::vector<SimRankResult>& results, LockstepError::Kind kind, int rank,
                   const std::string& field, int64_t step) {
  ASSERT_FALSE(results.empty());
  for (size_t r = 0; r < results.size(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_TRUE(results[r].raised);
    EXPECT_EQ(results[r].kind, kind) << results[r].message;
    EXPECT_EQ(results[r].error_rank, rank) << results[r].message;
    EXPECT_EQ(results[r].field, field) << results[r].message;
    EXPECT_EQ(results[r].message, results[0].message);
    EXPECT_NE(results[r].message.find("step " + std::to_string(step)), std::string::npos) << results[r].message;
  }
}

// The first step in which `pred` holds for the mutant's work.
template <typename Pred>
int64_t first_step(const LockstepSimConfig& c, Pred pred) {
  for (int64_t s = 1; s <= c.n_steps; ++s)
    if (pred(sim_work(c, c.mutant_rank, s))) return s;
  return -1;
}

class LockstepMutation : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (!kLockstepMutationsBuilt) GTEST_SKIP() << "mutations exist in test builds only";
  }
  LockstepSimConfig config(uint64_t seed) const {
    LockstepSimConfig c;
    c.n_ranks = GetParam();
    c.seed = seed;
    c.n_steps = 80;
    c.group = {2, 2};
    c.mutant_rank = static_cast<int>(seed % static_cast<uint64_t>(c.n_ranks));
    return c;
  }
};

TEST_P(LockstepMutation, AnIdleRankSkippingTheExpertCollectivesIsCaughtAtTheConsensus) {
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    LockstepSimConfig c = config(seed);
    c.mutations.skip_experts_when_idle = true;
    const int64_t step = first_step(c, [](const LocalWork& w) { return w.n_tokens == 0; });
    ASSERT_GT(step, 0);
    expect_caught(run_lockstep_sim(c), LockstepError::Kind::kDivergence, c.mutant_rank, "fingerprint", step);
  }
}

TEST_P(LockstepMutation, ARankLocalDraftDecisionIsCaughtAtTheConsensus) {
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    LockstepSimConfig c = config(seed);
    c.mutations.draft_decision_rank_local = true;
    const int64_t step = first_step(c, [](const LocalWork& w) { return !w.wants_draft; });
    ASSERT_GT(step, 0);
    expect_caught(run_lockstep_sim(c), LockstepError::Kind::kDivergence, c.mutant_rank, "draft_width", step);
  }
}

TEST_P(LockstepMutation, AChunkWithoutOutputSkippingTheDraftIsCaughtAtTheConsensus) {
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    LockstepSimConfig c = config(seed);
    c.mutations.skip_draft_without_output = true;
    const int64_t step = first_step(c, [](const LocalWork& w) { return !w.produces_output; });
    ASSERT_GT(step, 0);
    expect_caught(run_lockstep_sim(c), LockstepError::Kind::kDivergence, c.mutant_rank, "draft_width", step);
  }
}

// The step at or after `from` whose plan has ops (some rank has work).
int64_t first_busy_step(const LockstepSimConfig& c, int64_t from) {
  for (int64_t s = from; s <= c.n_steps; ++s)
    for (int r = 0; r < c.n_ranks; ++r)
      if (sim_work(c, r, s).n_tokens > 0) return s;
  return -1;
}

TEST_P(LockstepMutation, ASideThreadCollectiveOnTheMainGroupIsCaughtInItsOp) {
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    LockstepSimConfig c = config(seed);
    c.mutations.side_thread_collective = true;
    c.event_step = 10 + static_cast<int>(seed);
    c.event_op = static_cast<int>(seed % 3);
    expect_caught(run_lockstep_sim(c), LockstepError::Kind::kDivergence, c.mutant_rank, "kind",
                  first_busy_step(c, c.event_step));
  }
}

TEST_P(LockstepMutation, ARankRaisingWithoutTheVoteIsCaughtInTheOpItLeft) {
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    LockstepSimConfig c = config(seed);
    c.mutations.raise_without_vote = true;
    c.event_step = 10 + static_cast<int>(seed);
    c.event_op = static_cast<int>(seed % 4);
    expect_caught(run_lockstep_sim(c), LockstepError::Kind::kDivergence, c.mutant_rank, "kind",
                  first_busy_step(c, c.event_step));
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, LockstepMutation, ::testing::Values(2, 3, 16));

TEST(LockstepSim, AFailingRankVotesAndEveryRankRaisesTheSameError) {
  for (int n : {2, 4}) {
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      LockstepSimConfig c;
      c.n_ranks = n;
      c.seed = seed;
      c.group = {2, 1};
      c.mutant_rank = -1;
      c.fail_rank = static_cast<int>(seed % static_cast<uint64_t>(n));
      c.event_step = 5;
      c.event_op = static_cast<int>(seed % 5);
      expect_caught(run_lockstep_sim(c), LockstepError::Kind::kRankFailed, c.fail_rank, "status",
                    first_busy_step(c, 5));
    }
  }
}

TEST(LockstepGroup, AnOpFromAThreadThatDoesNotOwnTheGroupIsRefused) {
  SimFabric fabric(1);
  LockstepGroup group(fabric.rank(0), {1, 0});
  StepHeader h;
  h.n_tokens = 4;
  (void)group.begin_step(1, h);
  std::string error;
  std::thread([&] {
    try {
      (void)group.op(OpKind::kExpertDispatch);
    } catch (const LockstepError& e) {
      error = e.what();
      EXPECT_EQ(e.kind(), LockstepError::Kind::kMisuse);
    }
  }).join();
  EXPECT_NE(error.find("does not own"), std::string::npos) << error;
  (void)group.op(OpKind::kExpertDispatch);  // the owner's op still runs
  (void)group.op(OpKind::kExpertCombine);
  group.end_step();
  EXPECT_EQ(group.counters().ops, 3);
}

TEST(LockstepGroup, ARankThatLeftTheGroupFailsItsPeersWaitNamingTheMissingRank) {
  SimFabric fabric(3);
  fabric.leave(2);
  LockstepGroup group(fabric.rank(0), {0, 0});
  std::thread peer([&] {
    LockstepGroup g1(fabric.rank(1), {0, 0});
    EXPECT_THROW((void)g1.begin_step(1, {}), LockstepError);
  });
  try {
    (void)group.begin_step(1, {});
    ADD_FAILURE() << "no error";
  } catch (const LockstepError& e) {
    EXPECT_EQ(e.kind(), LockstepError::Kind::kTransport);
    EXPECT_NE(std::string(e.what()).find("rank(s) 2 left the group"), std::string::npos) << e.what();
  }
  peer.join();
  EXPECT_TRUE(group.broken());
  EXPECT_THROW((void)group.begin_step(2, {}), LockstepError);
}

}  // namespace
}  // namespace tandem::parallel

namespace tandem::parallel {
namespace {

std::string run_command(const std::string& cmd, int* rc) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  while (p != nullptr && std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
  *rc = p != nullptr ? ::pclose(p) : -1;
  return out;
}

TEST(LockstepSimCli, ReplaysSeedsAndAMutationFromTheCommandLine) {
  int rc = -1;
  const std::string clean = run_command(std::string(TANDEM_BINARY) + " sim-lockstep --ranks 3 --seeds 2 --steps 50", &rc);
  EXPECT_EQ(rc, 0) << clean;
  EXPECT_NE(clean.find("2 of 2 seeds as expected"), std::string::npos) << clean;
  const std::string mutant = run_command(std::string(TANDEM_BINARY) +
                                             " sim-lockstep --ranks 3 --seeds 1 --first-seed 5 --mutation "
                                             "skip-experts-when-idle --mutant-rank 2",
                                         &rc);
  if (!kLockstepMutationsBuilt) {
    EXPECT_NE(mutant.find("needs a test build"), std::string::npos) << mutant;
    return;
  }
  EXPECT_EQ(rc, 0) << mutant;
  EXPECT_NE(mutant.find("every rank raised: data-parallel divergence"), std::string::npos) << mutant;
  EXPECT_NE(mutant.find("rank 2 has fingerprint="), std::string::npos) << mutant;
}

}  // namespace
}  // namespace tandem::parallel
