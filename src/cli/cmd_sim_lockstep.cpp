// `tandem sim-lockstep`: the data-parallel lockstep simulator of N ranks
// (parallel/lockstep_sim.h) over seeds, with one bug family switched on if
// asked, so a divergence a test found replays from its seed.
#include <cstdio>

#include "cli/commands.h"
#include "parallel/lockstep_sim.h"
#include "util/error.h"

namespace tandem::cli {
namespace {

struct SimLockstepArgs {
  parallel::LockstepSimConfig config;
  int seeds = 20;
  std::string mutation;  // empty: none
  std::string fail;      // "rank" to make config.fail_rank fail honestly
};

// Returns whether the seed's outcome is the expected one: no error without
// a mutation or failure, else the same error on every rank.
bool run_seed(const SimLockstepArgs& a, uint64_t seed) {
  parallel::LockstepSimConfig c = a.config;
  c.seed = seed;
  const auto results = parallel::run_lockstep_sim(c);
  bool all_same = true, any = false;
  for (const auto& r : results) {
    any = any || r.raised;
    all_same = all_same && r.raised == results[0].raised && r.message == results[0].message;
  }
  const bool expect_error = c.mutations.any() || c.fail_rank >= 0;
  std::printf("seed %llu: %s\n", static_cast<unsigned long long>(seed),
              !any ? ("every rank completed " + std::to_string(results[0].steps_done) + " steps").c_str()
                   : (all_same ? ("every rank raised: " + results[0].message).c_str() : "ranks raised different errors"));
  if (any && !all_same)
    for (size_t r = 0; r < results.size(); ++r) std::printf("  rank %zu: %s\n", r, results[r].message.c_str());
  return (any == expect_error) && all_same;
}

}  // namespace

void add_sim_lockstep(CLI::App& app) {
  auto a = std::make_shared<SimLockstepArgs>();
  CLI::App* cmd = app.add_subcommand("sim-lockstep", "Simulate a data-parallel lockstep group of N ranks over seeds");
  cmd->add_option("--ranks", a->config.n_ranks, "Ranks")->check(CLI::Range(1, parallel::kMaxRanks));
  cmd->add_option("--steps", a->config.n_steps, "Steps per seed")->check(CLI::Range(1, 10'000'000));
  cmd->add_option("--seeds", a->seeds, "Seeds to run")->check(CLI::Range(1, 1'000'000));
  cmd->add_option("--first-seed", a->config.seed, "First seed");
  cmd->add_option("--expert-layers", a->config.group.n_expert_layers, "MoE layers exchanging per step");
  cmd->add_option("--draft-width", a->config.group.draft_width, "Speculative draft tokens per step");
  cmd->add_option("--mutation", a->mutation, "A bug family on --mutant-rank (test builds)")
      ->check(CLI::IsMember({"skip-experts-when-idle", "draft-decision-rank-local", "skip-draft-without-output",
                             "side-thread-collective", "raise-without-vote"}));
  cmd->add_option("--mutant-rank", a->config.mutant_rank, "The rank the mutation applies to");
  cmd->add_option("--fail-rank", a->config.fail_rank, "A rank that fails (and votes) at --event-step");
  cmd->add_option("--event-step", a->config.event_step, "The step mutations 4-5 and --fail-rank strike at");
  cmd->callback([a] {
    parallel::LockstepMutations& m = a->config.mutations;
    m.skip_experts_when_idle = a->mutation == "skip-experts-when-idle";
    m.draft_decision_rank_local = a->mutation == "draft-decision-rank-local";
    m.skip_draft_without_output = a->mutation == "skip-draft-without-output";
    m.side_thread_collective = a->mutation == "side-thread-collective";
    m.raise_without_vote = a->mutation == "raise-without-vote";
    if (m.any() && !parallel::kLockstepMutationsBuilt)
      throw Error("--mutation needs a test build (RelWithDebInfo or Debug): a Release build has no mutations");
    if ((m.side_thread_collective || m.raise_without_vote || a->config.fail_rank >= 0) && a->config.event_step <= 0)
      a->config.event_step = 10;
    int bad = 0;
    for (int i = 0; i < a->seeds; ++i) bad += run_seed(*a, a->config.seed + static_cast<uint64_t>(i)) ? 0 : 1;
    std::printf("%d of %d seeds as expected\n", a->seeds - bad, a->seeds);
    if (bad > 0) throw Error(std::to_string(bad) + " seeds did not end as expected");
  });
}

}  // namespace tandem::cli
