// The control frame every op of a lockstep group starts with.
//
// Each op (the step consensus, an expert dispatch, a draft exchange...) begins
// with every rank contributing one fixed-size frame to an all-gather. The
// frame says which op the rank believes it is in (kind, step, sequence number
// on the group, the fingerprint of the step's planned collectives) and
// whether it has failed. Because every op has the same frame size and the
// frames travel in one ordered channel, ranks that disagree about where they
// are still exchange frames instead of waiting for each other: the
// disagreement is found by comparing frames, within the op it happens in,
// and every rank computes the same verdict from the same frames.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace tandem::parallel {

// The most ranks one group holds (the width of a frame's per-rank payload).
inline constexpr int kMaxRanks = 32;

enum class OpKind : int64_t {
  kStepConsensus = 1,   // the step header (step_consensus.h)
  kExpertDispatch = 2,  // an MoE layer's tokens to the ranks holding their experts
  kExpertCombine = 3,   // and their outputs back
  kDraftExchange = 4,   // one speculative draft token's collective
  kProbe = 5,           // tests and benchmarks
  kTensorGather = 6,    // tensor parallelism: one all-gather of a split matmul's columns
};
const char* op_kind_name(int64_t kind);

// Why a rank reports failure in its frame (0 = none).
enum class FailureCode : int64_t { kNone = 0, kLocalError = 1, kShuttingDown = 2 };
const char* failure_code_name(int64_t code);

struct Frame {
  static constexpr int64_t kMagic = 0x74616e64656d4c53;  // "tandemLS"
  int64_t magic = kMagic;
  int64_t kind = 0;
  int64_t step_id = 0;
  int64_t seq = 0;          // ops this rank issued on the group before this one
  int64_t status = 0;       // FailureCode
  int64_t fingerprint = 0;  // of the step's planned collectives (the bits of a uint64)
  int64_t data_bytes = 0;   // what the op's data phase moves from this rank
  int64_t off_plan = 0;     // 1: this rank knows it is not where its plan says (see check_frames)
  int64_t payload[kMaxRanks] = {};  // op-specific
};
static_assert(sizeof(Frame) == 40 * sizeof(int64_t));

// Two ranks disagree about a field that must be equal on all of them.
struct Divergence {
  int rank = -1;       // the rank that differs from the reference value
  std::string field;   // e.g. "step_id", "fingerprint", "draft_width"
  int64_t expected = 0;  // the value most ranks hold (ties: the lowest rank's)
  int64_t got = 0;
  int64_t kind = 0;      // the op, as the reference ranks see it
  int64_t step_id = 0;
  int64_t seq = 0;
  std::string message(const std::string& group = "data-parallel") const;  // `group` names the kind of group
};

// What a set of frames says: a divergence (a bug somewhere), ranks that
// reported failure, or neither.
struct FrameVerdict {
  std::optional<Divergence> divergence;
  std::vector<int> failed_ranks;
  int64_t failure_code = 0;  // the first failed rank's
};

// The reference value of field `get`: the one most ranks hold among those
// not flagged off_plan (all ranks if every one is), ties broken towards the
// lowest rank.
template <typename Get>
int64_t majority_value(std::span<const Frame> frames, Get get);

// A payload slot every rank must agree on (e.g. the group's configuration).
struct AgreedPayload {
  const char* name;
  int index;
};
// A payload slot whose value the group's agreed configuration fixes.
struct ExpectedPayload {
  const char* name;
  int index;
  int64_t value;
};
struct FrameChecks {
  std::span<const AgreedPayload> agreed;
  std::span<const ExpectedPayload> expected;
  int64_t expected_fingerprint = 0;  // what the agreed configuration plans
};

// Finds the first rank (lowest) whose frame differs in a field every rank
// must agree on, in the order magic, kind, step_id, seq, the agreed payload
// slots, the expected payload slots, fingerprint; then any failure. The
// reference for agreed fields is the value most ranks hold among those not
// flagged off_plan (ties: the lowest such rank's), so with two ranks the one
// that knows it left its plan is the one named.
FrameVerdict check_frames(std::span<const Frame> frames, const FrameChecks& checks);

template <typename Get>
int64_t majority_value(std::span<const Frame> frames, Get get) {
  bool any_on_plan = false;
  for (const Frame& f : frames) any_on_plan = any_on_plan || f.off_plan == 0;
  int64_t best = get(frames[0]);
  size_t best_count = 0;
  for (size_t i = 0; i < frames.size(); ++i) {
    if (any_on_plan && frames[i].off_plan != 0) continue;
    const int64_t v = get(frames[i]);
    size_t count = 0;
    for (const Frame& f : frames) count += (get(f) == v && (!any_on_plan || f.off_plan == 0)) ? 1 : 0;
    if (count > best_count) best = v, best_count = count;
  }
  return best;
}

}  // namespace tandem::parallel
