// Runs a range of simulator seeds and aggregates what they found and covered.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "sim/cluster.h"

namespace tandem::sim {

struct SeedRangeResult {
  int64_t seeds_run = 0;
  int64_t failing_seeds = 0;
  int64_t events = 0;
  int64_t requests_completed = 0;
  int64_t requests_failed = 0;
  double seconds = 0;
  bool has_failure = false;
  RunResult first_failure;
  std::map<std::string, int64_t> coverage;
};

// Runs seeds first .. first+count-1; stops at the first failing seed unless keep_going.
SeedRangeResult run_seeds(uint64_t first, int64_t count, const SimOptions& options,
                          bool keep_going);

// The one-line command that replays `seed` with its trace.
std::string replay_command(uint64_t seed, const SimOptions& options);

// Coverage points a range must hit for its verdict to count (depends on the
// mode and fault level asked for).
std::vector<std::string> required_coverage(const SimOptions& options);
std::vector<std::string> missing_coverage(const std::map<std::string, int64_t>& coverage,
                                          const SimOptions& options);

}  // namespace tandem::sim
