// The deterministic cluster simulator: one router, P prefill and D decode
// instances running the real protocol cores (src/pd) in one thread on a
// virtual clock, with simulated engines, block pools, RMA and a faulty network.
// Invariants are checked after every event; a violation ends the run with a
// readable reason, and the event trace (hashed, optionally recorded) replays
// exactly from the seed.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "sim/scenario.h"

namespace tandem::sim {

struct RunResult {
  uint64_t seed = 0;
  std::vector<std::string> violations;  // empty = the run passed
  uint64_t trace_hash = 0;
  int64_t events = 0;
  TimeMs end_ms = 0;
  int64_t requests_completed = 0;
  int64_t requests_failed = 0;
  std::map<std::string, int64_t> coverage;  // fault sites and protocol paths exercised
  std::vector<std::string> trace;           // when recorded
};

// Runs one scenario to its end (everything settled, a violation, or the
// liveness check time).
RunResult run_scenario(const Scenario& scenario, bool record_trace);

}  // namespace tandem::sim
