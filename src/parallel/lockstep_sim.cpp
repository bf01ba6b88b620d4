#include "parallel/lockstep_sim.h"

#include <algorithm>
#include <thread>

#include "parallel/sim_fabric.h"
#include "sim/rng.h"

namespace tandem::parallel {

LocalWork sim_work(const LockstepSimConfig& config, int rank, int64_t step) {
  sim::Rng rng(sim::mix64(sim::mix64(config.seed, static_cast<uint64_t>(rank) + 1), static_cast<uint64_t>(step)));
  LocalWork w;
  const bool idle = std::find(config.always_idle_ranks.begin(), config.always_idle_ranks.end(), rank) !=
                        config.always_idle_ranks.end() ||
                    rng.chance(config.p_idle);
  if (idle) return w;
  w.n_tokens = rng.uniform(1, 64);
  w.produces_output = !rng.chance(config.p_no_output);
  w.wants_draft = w.produces_output && !rng.chance(config.p_no_draft);
  return w;
}

SimRankResult run_sim_rank(LockstepGroup& group, const LockstepSimConfig& config) {
  SimRankResult result;
  const int me = group.rank();
  const bool mutant = me == config.mutant_rank;
  bool event_done = config.event_step <= 0;
  for (int64_t step = 1; step <= config.n_steps; ++step) {
    const LocalWork w = sim_work(config, me, step);
    StepHeader header;
    header.phase = w.n_tokens == 0 ? StepPhase::kIdle : (w.produces_output ? StepPhase::kDecode : StepPhase::kPrefill);
    header.n_tokens = w.n_tokens;
    header.n_padded_tokens = (w.n_tokens + 7) / 8 * 8;
    header.produces_output = w.produces_output;
    header.wants_draft = w.wants_draft;
    header.n_running = w.n_tokens > 0 ? 1 : 0;
    try {
      const StepDecision d = group.begin_step(step, header);
      const bool event_here = !event_done && step >= config.event_step && !group.plan().ops.empty();
      bool left_step = false;
      for (size_t i = 0; i < group.plan().ops.size(); ++i) {
        if (event_here && static_cast<int>(i) == std::min<int>(config.event_op, static_cast<int>(group.plan().ops.size()) - 1)) {
          event_done = true;
          if (me == config.fail_rank) group.fail_step(FailureCode::kLocalError);
          if (mutant && config.mutations.side_thread_collective) {
            std::exception_ptr side_error;
            std::thread side([&] {
              try {
                (void)group.mutation_side_op();
              } catch (...) {
                side_error = std::current_exception();
              }
            });
            side.join();
            if (side_error) std::rethrow_exception(side_error);
          }
          if (mutant && config.mutations.raise_without_vote) {
            left_step = true;  // raises alone: its peers stay in this op
            break;
          }
        }
        const PlannedOp op = group.plan().ops[i];
        int64_t counts[kMaxRanks] = {};
        for (int r = 0; r < group.size(); ++r) counts[r] = d.ranks[static_cast<size_t>(me)].n_tokens;
        (void)group.op(op.kind, std::span<const int64_t>(counts, static_cast<size_t>(group.size())),
                       d.ranks[static_cast<size_t>(me)].n_tokens * 64);
      }
      if (left_step) continue;
      group.end_step();
      result.steps_done = step;
    } catch (const LockstepError& e) {
      result.raised = true;
      result.kind = e.kind();
      result.error_rank = e.rank();
      result.field = e.field();
      result.message = e.what();
      result.error_step = step;
      break;
    }
  }
  result.counters = group.counters();
  return result;
}

std::vector<SimRankResult> run_lockstep_sim(const LockstepSimConfig& config) {
  SimFabric fabric(config.n_ranks);
  std::vector<SimRankResult> results(static_cast<size_t>(config.n_ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < config.n_ranks; ++r) {
    threads.emplace_back([&, r] {
      LockstepMutations m = r == config.mutant_rank ? config.mutations : LockstepMutations{};
      LockstepGroup group(fabric.rank(r), config.group, m);
      results[static_cast<size_t>(r)] = run_sim_rank(group, config);
      fabric.leave(r);
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

}  // namespace tandem::parallel
