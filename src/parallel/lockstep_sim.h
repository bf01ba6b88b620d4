// The deterministic simulator of a lockstep group of N ranks.
//
// Each rank runs the same step loop the engine runs (consensus, the planned
// ops, end of step) on its own thread, over a SimFabric or, for the
// real-group checks, over gloo. Each rank's work per step comes from the
// seed, so a run replays exactly: which rank is idle, which chunk produces
// no output, which step a mutation or a failure strikes in.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parallel/lockstep_group.h"

namespace tandem::parallel {

struct LockstepSimConfig {
  int n_ranks = 2;
  int n_steps = 100;
  uint64_t seed = 1;
  LockstepConfig group{/*n_expert_layers=*/2, /*draft_width=*/0};
  double p_idle = 0.3;       // a rank has no tokens this step
  double p_no_output = 0.2;  // a busy rank's batch is only middle prefill chunks
  double p_no_draft = 0.3;   // no decoding sequence wants a draft
  std::vector<int> always_idle_ranks;
  // The mutations, applied to `mutant_rank` only (test builds).
  LockstepMutations mutations;
  int mutant_rank = 1;
  // Mutations 4 and 5, and an honest failure of `fail_rank`: the first step
  // at or after `event_step` with a planned op, before its op `event_op`.
  int event_step = 0;  // 0: none
  int event_op = 0;
  int fail_rank = -1;
};

struct SimRankResult {
  int64_t steps_done = 0;  // steps this rank completed
  GroupCounters counters;
  bool raised = false;
  LockstepError::Kind kind = LockstepError::Kind::kDivergence;
  int error_rank = -1;
  std::string field;
  std::string message;
  int64_t error_step = 0;  // the step the rank was in when it raised
};

// The work of `rank` in `step` (1-based), from the seed alone.
LocalWork sim_work(const LockstepSimConfig& config, int rank, int64_t step);

// One rank's loop over `group` (whose transport is that rank's): stops at the
// first LockstepError, as an engine does before it rebuilds its group.
SimRankResult run_sim_rank(LockstepGroup& group, const LockstepSimConfig& config);

// Every rank on its own thread over a SimFabric.
std::vector<SimRankResult> run_lockstep_sim(const LockstepSimConfig& config);

}  // namespace tandem::parallel
