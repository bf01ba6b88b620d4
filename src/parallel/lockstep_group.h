// A data-parallel group that steps in lockstep by consensus (DESIGN.md,
// principle 5).
//
// Every step starts with the step consensus: each rank contributes a
// fixed-shape header (step id, phase, token counts, dummy flag, draft width,
// its load) and the fingerprint of the collectives it plans; the gathered
// headers decide the step for everyone. Then the step's planned ops run in
// order, each starting with a control frame (frame.h). Whatever the frames
// disagree on, or whichever rank reports failure, every rank raises the same
// LockstepError in the same op, so no rank is left inside a collective its
// peers skipped.
//
// Sans-IO: the frames move through a FrameTransport; the group owns the
// sequence numbers, the plan cursor, the checks and the counters. One thread
// owns a group (the one that created it); an op from another thread is
// refused before it touches the channel.
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "parallel/frame.h"
#include "parallel/frame_transport.h"
#include "parallel/step_plan.h"

namespace tandem::parallel {

enum class StepPhase : int64_t { kIdle = 0, kPrefill = 1, kDecode = 2, kMixed = 3 };

// A rank's contribution to the step consensus: what it scheduled. A rank
// with no tokens runs a dummy step of the agreed shape. The group adds the
// draft width and the fingerprint of the step's plan (step_plan.h).
struct StepHeader {
  StepPhase phase = StepPhase::kIdle;
  int64_t n_tokens = 0;
  int64_t n_padded_tokens = 0;
  bool produces_output = false;
  bool wants_draft = false;
  // Load, for balancing new requests across ranks (not checked).
  int64_t n_running = 0;
  int64_t n_waiting = 0;
  int64_t kv_blocks_free = 0;
};

struct RankLoad {
  int64_t n_tokens = 0;
  int64_t n_running = 0;
  int64_t n_waiting = 0;
  int64_t kv_blocks_free = 0;
};

// What the gathered headers decide, identically on every rank.
struct StepDecision {
  int64_t step_id = 0;
  bool any_work = false;            // false: every rank is idle, nothing runs
  int64_t n_padded_tokens = 0;      // the step's shape: the largest rank's padded count
  int64_t draft_width = 0;
  std::vector<RankLoad> ranks;      // per rank, in rank order
};

class LockstepError : public std::runtime_error {
 public:
  enum class Kind { kDivergence, kRankFailed, kTransport, kMisuse };
  LockstepError(Kind kind, int rank, std::string field, const std::string& message)
      : std::runtime_error(message), kind_(kind), rank_(rank), field_(std::move(field)) {}
  Kind kind() const { return kind_; }
  int rank() const { return rank_; }  // the divergent or failed rank (-1: unknown)
  const std::string& field() const { return field_; }

 private:
  Kind kind_;
  int rank_;
  std::string field_;
};

// Per op kind: how many ran, the last sequence number, bytes of frames and
// data, and time spent in them.
struct OpCounters {
  int64_t count = 0;
  int64_t last_seq = -1;
  int64_t bytes = 0;
  int64_t total_ns = 0;
};

// The op a rank is inside right now, for soft-deadline reports and
// /debug/parallel (a snapshot; `kind` 0 when none).
struct InFlightOp {
  int64_t kind = 0;
  int64_t step_id = 0;
  int64_t seq = 0;
  int64_t since_ns = 0;          // monotonic
  uint64_t arrived_mask = 0;     // ranks whose frame has landed (bit r)
  bool data_phase = false;       // past the frames, moving the op's data
};

struct GroupCounters {
  int64_t steps = 0;        // consensus rounds completed
  int64_t dummy_steps = 0;  // of which this rank had no work but others had
  int64_t idle_steps = 0;   // of which no rank had work
  int64_t ops = 0;          // ops completed (consensus included) = next seq
  int64_t busy_consensus_ns = 0;  // time in the consensus of steps some rank had work in
  uint64_t last_fingerprint = 0;
  std::array<OpCounters, 7> by_kind{};  // indexed by OpKind
};

class LockstepGroup {
 public:
  LockstepGroup(FrameTransport& transport, LockstepConfig config, LockstepMutations mutations = {});
  // The same, owning its transport.
  LockstepGroup(std::unique_ptr<FrameTransport> transport, LockstepConfig config, LockstepMutations mutations = {});

  int rank() const { return transport_.rank(); }
  int size() const { return transport_.size(); }

  // Step `step_id`'s consensus: plans the step (plan_step), contributes the
  // header and the plan's fingerprint, and returns the decision; the plan's
  // ops then run by op() in order, and end_step() closes the step. `status`
  // != kNone reports a local failure, which every rank then raises.
  StepDecision begin_step(int64_t step_id, const StepHeader& header, FailureCode status = FailureCode::kNone);
  // The ops begin_step planned for this step.
  const StepPlan& plan() const { return plan_; }
  // The plan's next op: exchanges this rank's frame (payload, data_bytes)
  // and returns every rank's, in rank order.
  std::vector<Frame> op(OpKind kind, std::span<const int64_t> payload = {}, int64_t data_bytes = 0);
  // The plan's next op with a data phase: every rank sends send_bytes[r]
  // bytes to rank r (packed in rank order in `send`); the frames agree the
  // sizes, then the data moves. Returns the bytes received from each rank,
  // packed in rank order into `recv` (resized).
  std::vector<int64_t> op_all_to_all(OpKind kind, const void* send, std::span<const int64_t> send_bytes,
                                     std::vector<char>& recv);
  // A local failure mid-step: the remaining planned ops run with the failure
  // in their frames, so peers are not left in them, then every rank raises.
  [[noreturn]] void fail_step(FailureCode code);
  // Checks every planned op ran.
  void end_step();

  // After any LockstepError the group is broken: every later call raises it again.
  bool broken() const;
  GroupCounters counters() const;
  InFlightOp in_flight() const;
  int64_t next_op_index() const { return static_cast<int64_t>(cursor_); }
  int64_t planned_ops() const { return static_cast<int64_t>(plan_.ops.size()); }

  // Test-only (mutation 4): an op from another thread, past the owner check
  // and the plan.
  std::vector<Frame> mutation_side_op();

 private:
  std::vector<Frame> exchange(Frame mine);
  Frame frame(OpKind kind, int64_t seq) const;
  // Raises the verdict of `all` (divergence first, then failure), if any.
  void check(const std::vector<Frame>& all, bool consensus);
  [[noreturn]] void raise(LockstepError error);
  void check_owner() const;

  std::unique_ptr<FrameTransport> owned_transport_;
  FrameTransport& transport_;
  LockstepConfig config_;
  StepPlan canonical_;  // what the configuration plans for every step
  LockstepMutations mutations_;
  std::thread::id owner_;
  int64_t step_id_ = 0;
  int64_t seq_ = 0;
  bool in_step_ = false;
  StepPlan plan_;
  size_t cursor_ = 0;
  uint64_t fingerprint_ = 0;

  mutable std::mutex mu_;  // guards the snapshot state below
  GroupCounters counters_;
  InFlightOp in_flight_;
  std::optional<LockstepError> broken_;
};

// "{0,2}": the ranks below `size` whose bit in `mask` is set (present) or clear.
std::string ranks_in(uint64_t mask, int size, bool present);

// The payload slots of the step header.
namespace header_slot {
inline constexpr int kPhase = 0, kTokens = 1, kPadded = 2, kDummy = 3, kDraftWidth = 4, kRunning = 5, kWaiting = 6,
                     kBlocksFree = 7, kConfig = 8;
}

}  // namespace tandem::parallel
