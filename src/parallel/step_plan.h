// What collectives a lockstep step issues, decided so that every rank
// decides the same.
//
// The plan of a step depends only on the group's configuration (how many MoE
// layers exchange tokens, how wide the speculative draft is), never on the
// rank's own batch: a rank with no tokens, or a prefill chunk that produces no
// output, issues the same ops with empty inputs. Seeds 000 and 004 are both a
// rank that derived its collectives from its own data. The fingerprint of the
// plan travels in the step header, so a rank whose plan differs is caught at
// the consensus, before any data op.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parallel/frame.h"

namespace tandem::parallel {

struct LockstepConfig {
  int n_expert_layers = 0;  // MoE layers whose experts are sharded (0: no expert parallelism)
  int draft_width = 0;      // speculative tokens drafted per step (0: no drafter)
  int n_tensor_gathers = 0;  // tensor parallelism: all-gathers per step (Model::n_tensor_gathers)
  std::string name = "data-parallel";  // the kind of group, in error messages
};

// A rank's own view of its next step (what it scheduled).
struct LocalWork {
  int64_t n_tokens = 0;         // tokens its batch computes (0: a dummy step)
  bool produces_output = false;  // some sequence samples a token (false: only middle prefill chunks)
  bool wants_draft = false;      // some decoding sequence could use a draft
};

// Test-only switches that reintroduce the bug families of seeds 000 and 004
// (built into test builds only; see kLockstepMutationsBuilt).
struct LockstepMutations {
  bool skip_experts_when_idle = false;    // 1: zero tokens skips the MoE collectives (seed 000)
  bool draft_decision_rank_local = false;  // 2: the drafter runs when this rank wants it (seed 004)
  bool skip_draft_without_output = false;  // 3: a chunk with no output skips the draft ops (seed 004)
  bool side_thread_collective = false;     // 4: a side thread issues an op on the main group
  bool raise_without_vote = false;         // 5: a failing rank raises alone, leaving its peers in an op
  bool any() const {
    return skip_experts_when_idle || draft_decision_rank_local || skip_draft_without_output ||
           side_thread_collective || raise_without_vote;
  }
};

#ifdef TANDEM_LOCKSTEP_MUTATIONS
inline constexpr bool kLockstepMutationsBuilt = true;
#else
inline constexpr bool kLockstepMutationsBuilt = false;
#endif

struct PlannedOp {
  OpKind kind;
  int layer = 0;  // the MoE layer or draft position it belongs to
};

struct StepPlan {
  std::vector<PlannedOp> ops;
  int64_t draft_width = 0;
  // FNV-1a over (kind, layer) of every op and the draft width.
  uint64_t fingerprint() const;
};

// The ops of one step, in order: the tensor-parallel gathers, each expert layer's dispatch and combine,
// then the draft's exchanges. Mutations only take effect in test builds.
StepPlan plan_step(const LockstepConfig& config, const LocalWork& work, const LockstepMutations& mutations = {});

}  // namespace tandem::parallel
