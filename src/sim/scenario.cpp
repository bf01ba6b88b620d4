#include "sim/scenario.h"

#include <algorithm>

#include "sim/rng.h"

namespace tandem::sim {

std::string_view name(ModeChoice mode) {
  switch (mode) {
    case ModeChoice::kWrite: return "write";
    case ModeChoice::kRead: return "read";
    case ModeChoice::kMixed: return "mixed";
  }
  return "?";
}

std::string_view name(FaultLevel level) {
  switch (level) {
    case FaultLevel::kNone: return "none";
    case FaultLevel::kNetwork: return "network";
    case FaultLevel::kAll: return "all";
  }
  return "?";
}

bool parse_mode(std::string_view text, ModeChoice* out) {
  for (ModeChoice m : {ModeChoice::kWrite, ModeChoice::kRead, ModeChoice::kMixed})
    if (name(m) == text) return *out = m, true;
  return false;
}

bool parse_faults(std::string_view text, FaultLevel* out) {
  for (FaultLevel f : {FaultLevel::kNone, FaultLevel::kNetwork, FaultLevel::kAll})
    if (name(f) == text) return *out = f, true;
  return false;
}

Scenario make_scenario(uint64_t seed, const SimOptions& options) {
  Rng rng(seed);
  Scenario s;
  s.seed = seed;
  s.options = options;
  s.protocol.mutation = options.mutation;
  const int32_t block = s.protocol.block_size_tokens;
  s.recurrent = rng.chance(0.5);
  s.prefill_pool_blocks = static_cast<int32_t>(rng.uniform(96, 512));
  s.decode_pool_blocks = static_cast<int32_t>(rng.uniform(160, 1024));
  s.prefill_ms_per_token = 0.005 * static_cast<double>(rng.uniform(1, 20));
  s.decode_ms_per_token = rng.uniform(2, 25);
  s.prefix_hit_probability = 0.1 * static_cast<double>(rng.uniform(0, 5));

  // Workload: mixed prompt lengths (including 1 token and block-boundary
  // lengths), n > 1 for some, aborts at random points, slow admissions.
  const TimeMs arrival_window_ms = 2'000 + 100 * options.n_requests;
  const int32_t max_prompt = std::min<int32_t>(2048, s.prefill_pool_blocks * block / 2);
  for (int i = 0; i < options.n_requests; ++i) {
    WorkloadRequest w;
    w.arrival_ms = rng.uniform(0, arrival_window_ms);
    int64_t shape = rng.uniform(0, 9);
    if (shape == 0) {
      w.spec.prompt_tokens = 1;
    } else if (shape == 1) {
      w.spec.prompt_tokens = block * static_cast<int32_t>(rng.uniform(1, 8)) + 1;
    } else {
      w.spec.prompt_tokens = static_cast<int32_t>(rng.uniform(2, max_prompt));
    }
    w.spec.n_siblings = rng.chance(0.3) ? static_cast<int32_t>(rng.uniform(2, 4)) : 1;
    w.spec.max_tokens = static_cast<int32_t>(rng.uniform(1, 64));
    switch (options.mode) {
      case ModeChoice::kWrite: w.spec.mode = pd::TransferMode::kWrite; break;
      case ModeChoice::kRead: w.spec.mode = pd::TransferMode::kRead; break;
      case ModeChoice::kMixed:
        w.spec.mode = rng.chance(0.5) ? pd::TransferMode::kWrite : pd::TransferMode::kRead;
        break;
    }
    if (rng.chance(0.1)) w.abort_at_ms = w.arrival_ms + rng.uniform(0, 4'000);
    s.workload.push_back(w);
  }
  std::sort(s.workload.begin(), s.workload.end(),
            [](const WorkloadRequest& a, const WorkloadRequest& b) { return a.arrival_ms < b.arrival_ms; });
  s.slow_admission_probability = rng.chance(0.5) ? 0.05 : 0.0;
  s.faults_end_ms = arrival_window_ms + 12'000;

  if (options.faults == FaultLevel::kNone) return s;
  // Network faults. Delays stay under the lease so a slow link is never a dead peer.
  s.network.drop_probability = 0.01 * static_cast<double>(rng.uniform(0, 5));
  s.network.duplicate_probability = 0.01 * static_cast<double>(rng.uniform(0, 5));
  s.network.delay_max_ms = rng.uniform(2, 50);
  s.network.long_delay_probability = 0.01 * static_cast<double>(rng.uniform(0, 5));
  s.network.long_delay_max_ms = s.protocol.lease_ms / 2;
  // Node ids: router 1, prefills 2.., decodes after them.
  const int n_nodes = 1 + options.n_prefill + options.n_decode;
  int n_partitions = static_cast<int>(rng.uniform(0, 2));
  for (int i = 0; i < n_partitions; ++i) {
    Partition p;
    if (rng.chance(0.5)) {
      // Between a prefill and a decode: the cut the fencing design is about.
      p.a = static_cast<pd::NodeId>(rng.uniform(2, 1 + options.n_prefill));
      p.b = static_cast<pd::NodeId>(rng.uniform(2 + options.n_prefill, n_nodes));
    } else {
      p.a = static_cast<pd::NodeId>(rng.uniform(1, n_nodes));
      do p.b = static_cast<pd::NodeId>(rng.uniform(1, n_nodes)); while (p.b == p.a);
    }
    p.start_ms = rng.uniform(0, arrival_window_ms);
    p.end_ms = p.start_ms + rng.uniform(500, 8'000);
    p.one_way = rng.chance(0.5);
    s.partitions.push_back(p);
  }
  if (rng.chance(0.5)) {
    // An instance (a prefill, more often) cut off from everyone, while its
    // RMA fabric still works.
    Partition p;
    p.a = static_cast<pd::NodeId>(rng.chance(0.7) ? rng.uniform(2, 1 + options.n_prefill)
                                                   : rng.uniform(2 + options.n_prefill, n_nodes));
    p.b = 0;
    p.start_ms = rng.uniform(0, arrival_window_ms);
    p.end_ms = p.start_ms + rng.uniform(2'000, 10'000);
    s.partitions.push_back(p);
  }
  if (options.faults == FaultLevel::kNetwork) return s;
  if (rng.chance(0.4)) {
    Crash c;
    c.node = static_cast<pd::NodeId>(rng.uniform(2, n_nodes));
    c.at_ms = rng.uniform(0, arrival_window_ms);
    c.restart_after_ms = rng.uniform(500, 10'000);
    s.crashes.push_back(c);
  }
  if (rng.chance(0.3)) {
    Drain d;
    d.node = static_cast<pd::NodeId>(rng.uniform(2, n_nodes));
    d.at_ms = rng.uniform(0, arrival_window_ms);
    s.drains.push_back(d);
    Crash exit;  // the drained process exits, and is started again
    exit.node = d.node;
    exit.at_ms = d.at_ms + rng.uniform(2'000, 15'000);
    exit.restart_after_ms = rng.uniform(500, 5'000);
    s.crashes.push_back(exit);
    s.faults_end_ms = std::max(s.faults_end_ms, exit.at_ms + exit.restart_after_ms);
  }
  s.engine_failure_probability = 0.01 * static_cast<double>(rng.uniform(0, 3));
  for (WorkloadRequest& w : s.workload)
    if (rng.chance(0.03)) w.local_cancel_at_ms = w.arrival_ms + rng.uniform(0, 4'000);
  s.rma_failure_probability = 0.01 * static_cast<double>(rng.uniform(0, 3));
  s.write_post_failure_probability = 0.01 * static_cast<double>(rng.uniform(0, 3));
  s.prefill_failure_probability = 0.005 * static_cast<double>(rng.uniform(0, 2));
  if (rng.chance(0.5)) s.prefill_lease_ms = s.protocol.lease_ms * rng.uniform(2, 4);
  s.rma_slow_probability = 0.02;
  s.slow_prefill_probability = rng.chance(0.3) ? 0.2 : 0.02;
  s.slow_prefill_ms = rng.uniform(1'000, 6'000);
  s.rma_slow_ms = rng.uniform(100, 4'000);
  if (options.long_run) {
    s.protocol.request_timeout_ms = 30'000;
    s.protocol.max_retransmits = 30;
    s.slow_admission_probability = 0.1;  // 78 s: past the deadline
    Partition p;
    p.a = static_cast<pd::NodeId>(rng.uniform(2, 1 + options.n_prefill));
    p.b = static_cast<pd::NodeId>(rng.uniform(2 + options.n_prefill, n_nodes));
    p.start_ms = rng.uniform(0, arrival_window_ms);
    p.end_ms = p.start_ms + rng.uniform(35'000, 90'000);
    p.data_only = true;
    s.partitions.push_back(p);
    s.faults_end_ms = std::max(s.faults_end_ms, p.end_ms);
  }
  return s;
}

}  // namespace tandem::sim
