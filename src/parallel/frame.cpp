#include "parallel/frame.h"

#include <string>

namespace tandem::parallel {

const char* op_kind_name(int64_t kind) {
  switch (static_cast<OpKind>(kind)) {
    case OpKind::kStepConsensus: return "step_consensus";
    case OpKind::kExpertDispatch: return "expert_dispatch";
    case OpKind::kExpertCombine: return "expert_combine";
    case OpKind::kDraftExchange: return "draft_exchange";
    case OpKind::kProbe: return "probe";
    case OpKind::kTensorGather: return "tensor_gather";
  }
  return "unknown";
}

const char* failure_code_name(int64_t code) {
  switch (static_cast<FailureCode>(code)) {
    case FailureCode::kNone: return "none";
    case FailureCode::kLocalError: return "local_error";
    case FailureCode::kShuttingDown: return "shutting_down";
  }
  return "unknown";
}

std::string Divergence::message(const std::string& group) const {
  return group + " divergence in step " + std::to_string(step_id) + ", op #" + std::to_string(seq) + " (" +
         op_kind_name(kind) + "): rank " + std::to_string(rank) + " has " + field + "=" + std::to_string(got) +
         " where the other ranks have " + std::to_string(expected);
}

FrameVerdict check_frames(std::span<const Frame> frames, const FrameChecks& checks) {
  FrameVerdict verdict;
  if (frames.empty()) return verdict;
  const auto kind = [](const Frame& f) { return f.kind; };
  const auto step = [](const Frame& f) { return f.step_id; };
  const auto seq = [](const Frame& f) { return f.seq; };
  const int64_t ref_kind = majority_value(frames, kind);
  const int64_t ref_step = majority_value(frames, step);
  const int64_t ref_seq = majority_value(frames, seq);
  // Returns whether some rank differs in `get` (and records the first).
  const auto differs = [&](const char* name, auto get) {
    const int64_t ref = majority_value(frames, get);
    for (size_t r = 0; r < frames.size(); ++r) {
      if (get(frames[r]) == ref) continue;
      verdict.divergence = Divergence{static_cast<int>(r), name, ref, get(frames[r]), ref_kind, ref_step, ref_seq};
      return true;
    }
    return false;
  };
  if (differs("magic", [](const Frame& f) { return f.magic; }) || differs("kind", kind) || differs("step_id", step) ||
      differs("seq", seq))
    return verdict;
  for (const AgreedPayload& p : checks.agreed)
    if (differs(p.name, [&p](const Frame& f) { return f.payload[p.index]; })) return verdict;
  // Fields the agreed configuration fixes name exactly the rank that
  // departs from it, however many ranks there are.
  const auto departs = [&](const char* name, int64_t expected, auto get) {
    for (size_t r = 0; r < frames.size(); ++r) {
      if (get(frames[r]) == expected) continue;
      verdict.divergence = Divergence{static_cast<int>(r), name, expected, get(frames[r]), ref_kind, ref_step, ref_seq};
      return true;
    }
    return false;
  };
  for (const ExpectedPayload& p : checks.expected)
    if (departs(p.name, p.value, [&p](const Frame& f) { return f.payload[p.index]; })) return verdict;
  if (departs("fingerprint", checks.expected_fingerprint, [](const Frame& f) { return f.fingerprint; })) return verdict;
  for (size_t r = 0; r < frames.size(); ++r) {
    if (frames[r].status == 0) continue;
    if (verdict.failed_ranks.empty()) verdict.failure_code = frames[r].status;
    verdict.failed_ranks.push_back(static_cast<int>(r));
  }
  return verdict;
}

}  // namespace tandem::parallel
