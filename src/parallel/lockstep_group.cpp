#include "parallel/lockstep_group.h"

#include <algorithm>

#include "util/clock.h"
#include "util/error.h"

namespace tandem::parallel {

std::string ranks_in(uint64_t mask, int size, bool present) {
  std::string out = "{";
  for (int r = 0; r < size; ++r) {
    if (((mask >> r) & 1) != static_cast<uint64_t>(present)) continue;
    if (out.size() > 1) out += ",";
    out += std::to_string(r);
  }
  return out + "}";
}

LockstepGroup::LockstepGroup(FrameTransport& transport, LockstepConfig config, LockstepMutations mutations)
    : transport_(transport),
      config_(config),
      canonical_(plan_step(config, LocalWork{})),
      mutations_(mutations),
      owner_(std::this_thread::get_id()) {
  TANDEM_ASSERT(transport.size() >= 1 && transport.size() <= kMaxRanks, "a lockstep group holds 1..kMaxRanks ranks");
}

LockstepGroup::LockstepGroup(std::unique_ptr<FrameTransport> transport, LockstepConfig config,
                             LockstepMutations mutations)
    : LockstepGroup(*transport, config, mutations) {
  owned_transport_ = std::move(transport);
}

void LockstepGroup::check_owner() const {
  if (std::this_thread::get_id() != owner_)
    throw LockstepError(LockstepError::Kind::kMisuse, rank(), "thread",
                        "a collective was issued on the lockstep group from a thread that does not own it "
                        "(a side thread must use a group of its own)");
}

bool LockstepGroup::broken() const {
  std::lock_guard<std::mutex> lock(mu_);
  return broken_.has_value();
}

GroupCounters LockstepGroup::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

InFlightOp LockstepGroup::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_flight_;
}

void LockstepGroup::raise(LockstepError error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_) broken_ = error;
    in_flight_ = {};
  }
  in_step_ = false;
  throw error;
}

std::vector<Frame> LockstepGroup::exchange(Frame mine) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_) throw *broken_;
    in_flight_ = {mine.kind, mine.step_id, mine.seq, monotonic_ns(), uint64_t{1} << rank()};
  }
  std::vector<Frame> all(static_cast<size_t>(size()));
  const int64_t start_ns = monotonic_ns();
  try {
    transport_.exchange(mine, all, [this](int r) {
      std::lock_guard<std::mutex> lock(mu_);
      in_flight_.arrived_mask |= uint64_t{1} << r;
    });
  } catch (const TransportError& e) {
    const uint64_t mask = in_flight().arrived_mask;
    raise(LockstepError(LockstepError::Kind::kTransport, -1, "transport",
                        config_.name + " group failed in step " + std::to_string(mine.step_id) + ", op #" +
                            std::to_string(mine.seq) + " (" + op_kind_name(mine.kind) + "): " + e.what() +
                            "; arrived " + ranks_in(mask, size(), true) + ", missing " + ranks_in(mask, size(), false)));
  }
  ++seq_;
  std::lock_guard<std::mutex> lock(mu_);
  OpCounters& c = counters_.by_kind[static_cast<size_t>(std::clamp<int64_t>(mine.kind, 0, 6))];
  ++c.count;
  c.last_seq = mine.seq;
  c.bytes += static_cast<int64_t>(sizeof(Frame)) * size() + mine.data_bytes;
  c.total_ns += monotonic_ns() - start_ns;
  ++counters_.ops;
  in_flight_ = {};
  return all;
}

Frame LockstepGroup::frame(OpKind kind, int64_t seq) const {
  Frame f;
  f.kind = static_cast<int64_t>(kind);
  f.step_id = step_id_;
  f.seq = seq;
  f.fingerprint = static_cast<int64_t>(fingerprint_);
  return f;
}

void LockstepGroup::check(const std::vector<Frame>& all, bool consensus) {
  const AgreedPayload agreed[] = {{"config", header_slot::kConfig}};
  const ExpectedPayload expected[] = {{"draft_width", header_slot::kDraftWidth, canonical_.draft_width}};
  FrameChecks checks;
  checks.expected_fingerprint = static_cast<int64_t>(canonical_.fingerprint());
  if (consensus) checks.agreed = agreed, checks.expected = expected;
  const FrameVerdict verdict = check_frames(all, checks);
  if (verdict.divergence)
    raise(LockstepError(LockstepError::Kind::kDivergence, verdict.divergence->rank, verdict.divergence->field,
                        verdict.divergence->message(config_.name)));
  if (verdict.failed_ranks.empty()) return;
  const Frame& ref = all[static_cast<size_t>(rank())];
  const int failed = verdict.failed_ranks[0];
  raise(LockstepError(LockstepError::Kind::kRankFailed, failed, "status",
                      config_.name + " rank " + std::to_string(failed) + " failed (" +
                          failure_code_name(verdict.failure_code) + ") in step " + std::to_string(ref.step_id) +
                          " at op #" + std::to_string(ref.seq) + " (" + op_kind_name(ref.kind) +
                          "); every rank abandons the step"));
}

StepDecision LockstepGroup::begin_step(int64_t step_id, const StepHeader& header, FailureCode status) {
  check_owner();
  // Only the raise-without-vote mutant leaves a step with ops left; it then
  // knows it is off its plan, which names it when frames disagree.
  const bool abandoned = in_step_ && cursor_ < plan_.ops.size();
  TANDEM_ASSERT(!abandoned || mutations_.raise_without_vote, "begin_step inside a step: end_step or fail_step first");
  step_id_ = step_id;
  plan_ = plan_step(config_, {header.n_tokens, header.produces_output, header.wants_draft}, mutations_);
  cursor_ = 0;
  fingerprint_ = plan_.fingerprint();
  in_step_ = true;

  Frame mine = frame(OpKind::kStepConsensus, seq_);
  mine.status = static_cast<int64_t>(status);
  mine.off_plan = abandoned ? 1 : 0;
  mine.payload[header_slot::kPhase] = static_cast<int64_t>(header.phase);
  mine.payload[header_slot::kTokens] = header.n_tokens;
  mine.payload[header_slot::kPadded] = header.n_padded_tokens;
  mine.payload[header_slot::kDummy] = header.n_tokens == 0 ? 1 : 0;
  mine.payload[header_slot::kDraftWidth] = plan_.draft_width;
  mine.payload[header_slot::kRunning] = header.n_running;
  mine.payload[header_slot::kWaiting] = header.n_waiting;
  mine.payload[header_slot::kBlocksFree] = header.kv_blocks_free;
  mine.payload[header_slot::kConfig] = static_cast<int64_t>(canonical_.fingerprint());
  const int64_t start_ns = monotonic_ns();
  const std::vector<Frame> all = exchange(mine);
  const int64_t consensus_ns = monotonic_ns() - start_ns;
  check(all, /*consensus=*/true);

  StepDecision d;
  d.step_id = step_id;
  d.draft_width = canonical_.draft_width;
  for (const Frame& f : all) {
    d.ranks.push_back({f.payload[header_slot::kTokens], f.payload[header_slot::kRunning],
                       f.payload[header_slot::kWaiting], f.payload[header_slot::kBlocksFree]});
    d.any_work = d.any_work || f.payload[header_slot::kTokens] > 0;
    d.n_padded_tokens = std::max(d.n_padded_tokens, f.payload[header_slot::kPadded]);
  }
  // When no rank has work the group agrees to run nothing this step.
  if (!d.any_work) plan_.ops.clear();
  std::lock_guard<std::mutex> lock(mu_);
  ++counters_.steps;
  if (!d.any_work) ++counters_.idle_steps;
  else if (header.n_tokens == 0) ++counters_.dummy_steps;
  if (d.any_work) counters_.busy_consensus_ns += consensus_ns;
  counters_.last_fingerprint = fingerprint_;
  return d;
}

std::vector<Frame> LockstepGroup::op(OpKind kind, std::span<const int64_t> payload, int64_t data_bytes) {
  check_owner();
  TANDEM_ASSERT(in_step_ && cursor_ < plan_.ops.size() && plan_.ops[cursor_].kind == kind,
                "an op the step did not plan (its fingerprint would not describe it)");
  TANDEM_ASSERT(payload.size() <= static_cast<size_t>(kMaxRanks), "an op's payload fits a frame");
  Frame mine = frame(kind, seq_);
  mine.data_bytes = data_bytes;
  std::copy(payload.begin(), payload.end(), mine.payload);
  std::vector<Frame> all = exchange(mine);
  check(all, /*consensus=*/false);
  ++cursor_;
  return all;
}

std::vector<int64_t> LockstepGroup::op_all_to_all(OpKind kind, const void* send, std::span<const int64_t> send_bytes,
                                                  std::vector<char>& recv) {
  TANDEM_ASSERT(static_cast<int>(send_bytes.size()) == size(), "one send size per rank");
  int64_t total_send = 0;
  for (int64_t b : send_bytes) total_send += b;
  const std::vector<Frame> all = op(kind, send_bytes, total_send);
  const int64_t start_ns = monotonic_ns();  // the frames' time is op()'s
  std::vector<int64_t> recv_bytes(static_cast<size_t>(size()));
  int64_t total_recv = 0;
  for (int r = 0; r < size(); ++r) {
    recv_bytes[static_cast<size_t>(r)] = all[static_cast<size_t>(r)].payload[rank()];
    // A peer's size is input from the wire: checked before it sizes a buffer.
    if (recv_bytes[static_cast<size_t>(r)] < 0 || recv_bytes[static_cast<size_t>(r)] > (int64_t{1} << 34))
      raise(LockstepError(LockstepError::Kind::kDivergence, r, "data_bytes",
                          config_.name + " rank " + std::to_string(r) + " announced " +
                              std::to_string(recv_bytes[static_cast<size_t>(r)]) + " bytes for op " +
                              op_kind_name(static_cast<int64_t>(kind))));
    total_recv += recv_bytes[static_cast<size_t>(r)];
  }
  recv.resize(static_cast<size_t>(total_recv));
  int64_t largest = 0;
  for (const Frame& f : all) largest = std::max(largest, f.data_bytes);
  {
    // Inside the op's data phase (which peers' data arrived is not known here).
    std::lock_guard<std::mutex> lock(mu_);
    in_flight_ = InFlightOp{static_cast<int64_t>(kind), step_id_, seq_ - 1, start_ns, uint64_t{1} << rank(), true};
  }
  struct ClearInFlight {
    LockstepGroup* g;
    ~ClearInFlight() {
      std::lock_guard<std::mutex> lock(g->mu_);
      g->in_flight_ = {};
    }
  } clear{this};
  try {
    transport_.all_to_all(send, send_bytes, recv.data(), recv_bytes, largest);
  } catch (const TransportError& e) {
    raise(LockstepError(LockstepError::Kind::kTransport, -1, "transport",
                        config_.name + " group failed in step " + std::to_string(step_id_) + " moving the data of op " +
                            op_kind_name(static_cast<int64_t>(kind)) + ": " + e.what()));
  }
  std::lock_guard<std::mutex> lock(mu_);
  OpCounters& c = counters_.by_kind[static_cast<size_t>(kind)];
  c.bytes += total_recv;
  c.total_ns += monotonic_ns() - start_ns;
  return recv_bytes;
}

void LockstepGroup::fail_step(FailureCode code) {
  check_owner();
  TANDEM_ASSERT(code != FailureCode::kNone, "fail_step needs a failure");
  if (in_step_ && cursor_ < plan_.ops.size()) {
    // The next op the peers wait in carries the failure; its verdict raises
    // on every rank alike, this one included.
    Frame mine = frame(plan_.ops[cursor_].kind, seq_);
    mine.status = static_cast<int64_t>(code);
    check(exchange(mine), /*consensus=*/false);
  } else {
    // No op left in this step: the peers' next stop is the next consensus.
    const int64_t next = in_step_ ? step_id_ + 1 : step_id_;
    in_step_ = false;
    (void)begin_step(next, StepHeader{}, code);
  }
  TANDEM_ASSERT(false, "an exchange carrying a failure raises");
  __builtin_unreachable();
}

void LockstepGroup::end_step() {
  check_owner();
  TANDEM_ASSERT(in_step_ && cursor_ == plan_.ops.size(), "a step ends after every op it planned");
  in_step_ = false;
}

std::vector<Frame> LockstepGroup::mutation_side_op() {
  TANDEM_ASSERT(kLockstepMutationsBuilt && mutations_.side_thread_collective, "mutation 4 only");
  Frame mine = frame(OpKind::kProbe, seq_);
  mine.off_plan = 1;
  std::vector<Frame> all = exchange(mine);
  check(all, /*consensus=*/false);
  return all;
}

}  // namespace tandem::parallel
