#include "parallel/step_plan.h"

namespace tandem::parallel {

uint64_t StepPlan::fingerprint() const {
  uint64_t h = 1469598103934665603ull;
  const auto mix = [&h](int64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= static_cast<uint64_t>(v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  mix(static_cast<int64_t>(ops.size()));
  for (const PlannedOp& op : ops) {
    mix(static_cast<int64_t>(op.kind));
    mix(op.layer);
  }
  mix(draft_width);
  return h;
}

StepPlan plan_step(const LockstepConfig& config, const LocalWork& work, const LockstepMutations& mutations) {
  bool experts = config.n_expert_layers > 0;
  bool draft = config.draft_width > 0;
  if constexpr (kLockstepMutationsBuilt) {
    if (mutations.skip_experts_when_idle && work.n_tokens == 0) experts = false;
    if (mutations.draft_decision_rank_local && !work.wants_draft) draft = false;
    if (mutations.skip_draft_without_output && !work.produces_output) draft = false;
  }
  StepPlan plan;
  for (int g = 0; g < config.n_tensor_gathers; ++g) plan.ops.push_back({OpKind::kTensorGather, g});
  if (experts) {
    for (int l = 0; l < config.n_expert_layers; ++l) {
      plan.ops.push_back({OpKind::kExpertDispatch, l});
      plan.ops.push_back({OpKind::kExpertCombine, l});
    }
  }
  if (draft) {
    plan.draft_width = config.draft_width;
    for (int d = 0; d < config.draft_width; ++d) plan.ops.push_back({OpKind::kDraftExchange, d});
  }
  return plan;
}

}  // namespace tandem::parallel
