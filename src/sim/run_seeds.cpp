#include "sim/run_seeds.h"

#include "util/clock.h"

namespace tandem::sim {

SeedRangeResult run_seeds(uint64_t first, int64_t count, const SimOptions& options,
                          bool keep_going) {
  SeedRangeResult out;
  Stopwatch watch;
  for (int64_t i = 0; i < count; ++i) {
    RunResult r = run_scenario(make_scenario(first + static_cast<uint64_t>(i), options), false);
    ++out.seeds_run;
    out.events += r.events;
    out.requests_completed += r.requests_completed;
    out.requests_failed += r.requests_failed;
    for (const auto& [key, n] : r.coverage) out.coverage[key] += n;
    if (!r.violations.empty()) {
      ++out.failing_seeds;
      if (!out.has_failure) {
        out.has_failure = true;
        out.first_failure = std::move(r);
      }
      if (!keep_going) break;
    }
  }
  out.seconds = watch.elapsed_s();
  return out;
}

std::string replay_command(uint64_t seed, const SimOptions& o) {
  std::string cmd = "tandem sim --seed " + std::to_string(seed) + " --prefill " +
                    std::to_string(o.n_prefill) + " --decode " + std::to_string(o.n_decode) +
                    " --requests " + std::to_string(o.n_requests) + " --mode " +
                    std::string(name(o.mode)) + " --faults " + std::string(name(o.faults));
  if (o.mutation != pd::Mutation::kNone) cmd += " --mutation " + std::string(pd::name(o.mutation));
  if (o.long_run) cmd += " --long";
  return cmd + " --trace";
}

std::vector<std::string> required_coverage(const SimOptions& o) {
  bool write = o.mode != ModeChoice::kRead;
  bool read = o.mode != ModeChoice::kWrite;
  std::vector<std::string> need = {
      "state.prefill.Prefilling", "state.prefill.Ended",   "state.decode.Admitting",
      "state.decode.Decoding",    "state.decode.Ended",    "path.sibling_fanout",
      "path.zero_block_transfer", "path.prefix_hit",       "path.quarantine",
      "fault.client_abort",       "fault.slow_admission",  "end.completed",
  };
  if (write) {
    for (const char* s : {"state.prefill.AwaitingAddresses", "state.prefill.Writing",
                          "state.prefill.AwaitingWriteDoneAck", "state.decode.AwaitingWrite",
                          "state.decode.Quarantined", "path.deferred_write",
                          "path.late_addresses_accepted", "path.addresses_before_kv"})
      need.push_back(s);
  }
  if (read) {
    for (const char* s : {"state.prefill.Exposed", "state.prefill.Draining",
                          "state.decode.AwaitingAddresses", "state.decode.Reading"})
      need.push_back(s);
  }
  if (o.faults != FaultLevel::kNone) {
    for (const char* s : {"fault.drop", "fault.duplicate", "fault.long_delay",
                          "fault.partition_drop", "drop.duplicate", "drop.ended", "path.early_message_replayed",
                          "path.retransmit", "path.peer_death", "end.peer_dead",
                          "path.fence_requested", "path.fence_completed"})
      need.push_back(s);
  }
  if (o.long_run) {
    for (const char* s : {"end.deadline", "end.retransmit_limit", "path.silent_peer"}) need.push_back(s);
    // The 30 s deadline ends the 78 s admissions first.
    std::erase(need, std::string("path.late_addresses_accepted"));
  }
  if (o.faults == FaultLevel::kAll) {
    for (const char* s : {"fault.crash", "fault.restart", "fault.rma_failure",
                          "fault.prefill_failure", "drop.stale_epoch", "fault.rma_slow",
                          "fault.drain", "fault.engine_failure", "end.engine_failed",
                          "fault.local_cancel_decode", "fault.local_cancel_prefill"})
      need.push_back(s);
    // A cut-off prefill's write posted after the decode fenced it: it must fail.
    if (write) {
      need.push_back("fault.write_post_failure");
      need.push_back("path.fenced_write");
    }
  }
  return need;
}

std::vector<std::string> missing_coverage(const std::map<std::string, int64_t>& coverage,
                                          const SimOptions& options) {
  std::vector<std::string> missing;
  for (const std::string& key : required_coverage(options)) {
    auto it = coverage.find(key);
    if (it == coverage.end() || it->second == 0) missing.push_back(key);
  }
  return missing;
}

}  // namespace tandem::sim
