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

// Which invariant a violation breaks (mutation tests assert the one that
// catches each bug, not only that something failed).
enum class Invariant : uint8_t {
  kAnnounced,           // a message announced what its step had not done (drivers' contract)
  kPoolOwnership,       // a block freed twice, by a non-owner, or while exposed to a peer
  kSiblingMap,          // transfer <-> sibling maps disagree
  kFork,                // the decode forked the wrong number of siblings
  kKvIntegrity,         // decoding from KV or state that is not the transfer's own
  kCompletedEarly,      // a transfer completed with siblings still running
  kTerminalOnce,        // a request reached a second terminal state
  kUnexplainedFailure,  // a request failed with no injected fault to explain it
  kBlockAccounting,     // protocol + engine holdings differ from the pool's allocation
  kHang,                // a request never reached a terminal state
  kLeak,                // an instance did not return to baseline (blocks, exposures)
  kRmaAfterEnd,         // RMA touched memory of a transfer that had ended
  kEndedStillRunning,   // a sibling went on decoding after its transfer ended
  kRmaIntoPrivate,      // an unfenced peer's RMA reached memory no longer exposed to it
};
constexpr int kInvariantCount = 14;
std::string_view name(Invariant invariant);

struct RunResult {
  uint64_t seed = 0;
  std::vector<std::string> violations;  // empty = the run passed
  std::vector<Invariant> broken;        // one per violation, same order
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
