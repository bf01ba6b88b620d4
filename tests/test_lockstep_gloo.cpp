// The lockstep group over the real channel: gloo over TCP on loopback, one
// thread per rank, each with its own gloo context (as separate processes
// would have), meeting through a FileStore.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "parallel/lockstep_group.h"
#include "parallel/lockstep_sim.h"
#include "transport/gloo_transport.h"

namespace tandem {
namespace {

using parallel::LockstepError;
using parallel::LockstepSimConfig;
using parallel::SimRankResult;

std::filesystem::path fresh_dir(const std::string& name) {
  static int counter = 0;
  auto dir = std::filesystem::temp_directory_path() /
             ("tandem-gloo-" + name + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// Every rank of `c` over gloo; the sim's rank loop on each.
std::vector<SimRankResult> run_over_gloo(const LockstepSimConfig& c, int timeout_ms = 10'000, bool shm_frames = false) {
  const auto dir = fresh_dir("sim");
  std::vector<SimRankResult> results(static_cast<size_t>(c.n_ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < c.n_ranks; ++r) {
    threads.emplace_back([&, r] {
      GlooGroupOptions o;
      o.rank = r;
      o.size = c.n_ranks;
      o.rendezvous_dir = dir.string();
      o.timeout_ms = timeout_ms;
      o.shared_memory_frames = shm_frames;
      GlooTransport transport(o);
      parallel::LockstepGroup group(transport, c.group, r == c.mutant_rank ? c.mutations : parallel::LockstepMutations{});
      results[static_cast<size_t>(r)] = run_sim_rank(group, c);
    });
  }
  for (auto& t : threads) t.join();
  std::filesystem::remove_all(dir);
  return results;
}

class LockstepChannel : public ::testing::TestWithParam<bool> {};  // frames over TCP, or shared memory

TEST_P(LockstepChannel, RanksStepInLockstep) {
  for (int n : {2, 3}) {
    LockstepSimConfig c;
    c.n_ranks = n;
    c.n_steps = 200;
    c.seed = 7;
    c.group = {2, 1};
    c.mutant_rank = -1;
    const auto results = run_over_gloo(c, 10'000, GetParam());
    for (const auto& r : results) {
      EXPECT_FALSE(r.raised) << r.message;
      EXPECT_EQ(r.steps_done, 200);
      EXPECT_EQ(r.counters.ops, results[0].counters.ops);
    }
  }
}

// Each bug family over the real channel: every rank raises the same error in
// the step the mutation strikes, naming the mutant and the field.
TEST_P(LockstepChannel, EveryMutationIsCaughtNamingTheRankAndField) {
  if (!parallel::kLockstepMutationsBuilt) GTEST_SKIP() << "mutations exist in test builds only";
  struct Case {
    const char* field;
    void (*set)(parallel::LockstepMutations&);
  };
  const Case cases[] = {
      {"fingerprint", [](parallel::LockstepMutations& m) { m.skip_experts_when_idle = true; }},
      {"draft_width", [](parallel::LockstepMutations& m) { m.draft_decision_rank_local = true; }},
      {"draft_width", [](parallel::LockstepMutations& m) { m.skip_draft_without_output = true; }},
      {"kind", [](parallel::LockstepMutations& m) { m.side_thread_collective = true; }},
      {"kind", [](parallel::LockstepMutations& m) { m.raise_without_vote = true; }},
  };
  for (const Case& k : cases) {
    LockstepSimConfig c;
    c.n_ranks = 2;
    c.n_steps = 60;
    c.seed = 3;
    c.group = {2, 2};
    c.mutant_rank = 1;
    c.event_step = 9;
    c.event_op = 2;
    k.set(c.mutations);
    const auto results = run_over_gloo(c, 10'000, GetParam());
    for (const auto& r : results) {
      SCOPED_TRACE(k.field);
      EXPECT_TRUE(r.raised);
      EXPECT_EQ(r.kind, LockstepError::Kind::kDivergence) << r.message;
      EXPECT_EQ(r.error_rank, 1) << r.message;
      EXPECT_EQ(r.field, k.field) << r.message;
      EXPECT_EQ(r.message, results[0].message);
    }
  }
}

TEST_P(LockstepChannel, AnHonestFailureIsVotedAndRaisedOnEveryRank) {
  LockstepSimConfig c;
  c.n_ranks = 3;
  c.n_steps = 40;
  c.group = {1, 0};
  c.mutant_rank = -1;
  c.fail_rank = 2;
  c.event_step = 6;
  const auto results = run_over_gloo(c, 10'000, GetParam());
  for (const auto& r : results) {
    EXPECT_EQ(r.kind, LockstepError::Kind::kRankFailed) << r.message;
    EXPECT_EQ(r.error_rank, 2);
    EXPECT_EQ(r.message, results[0].message);
  }
}

INSTANTIATE_TEST_SUITE_P(Gloo, LockstepChannel, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "SharedMemoryFrames" : "TcpFrames"; });

TEST(LockstepGloo, AMissingPeerIsATimeoutNamingIt) {
  // Rank 1 joins, then stops taking part: rank 0's consensus times out and
  // names rank 1 as the one that did not arrive.
  const auto dir = fresh_dir("missing");
  std::string error;
  std::thread peer([&] {
    GlooGroupOptions o;
    o.rank = 1;
    o.size = 2;
    o.rendezvous_dir = dir.string();
    o.timeout_ms = 1500;
    GlooTransport transport(o);
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // holds its connections, sends nothing
  });
  {
    GlooGroupOptions o;
    o.rank = 0;
    o.size = 2;
    o.rendezvous_dir = dir.string();
    o.timeout_ms = 1500;
    GlooTransport transport(o);
    parallel::LockstepGroup group(transport, {0, 0});
    try {
      (void)group.begin_step(1, {});
    } catch (const LockstepError& e) {
      EXPECT_EQ(e.kind(), LockstepError::Kind::kTransport);
      error = e.what();
    }
  }
  peer.join();
  EXPECT_NE(error.find("missing {1}"), std::string::npos) << error;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tandem
