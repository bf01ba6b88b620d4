// What one simulated run looks like: the cluster, the workload and the faults.
// make_scenario() draws one from a seed within the ranges of SimOptions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pd/router_core.h"
#include "pd/types.h"

namespace tandem::sim {

using pd::TimeMs;

enum class ModeChoice : uint8_t { kWrite, kRead, kMixed };
enum class FaultLevel : uint8_t { kNone, kNetwork, kAll };

// What the user asks of a seed range (tandem sim's flags).
struct SimOptions {
  int n_prefill = 2;
  int n_decode = 2;
  int n_requests = 200;
  ModeChoice mode = ModeChoice::kMixed;
  FaultLevel faults = FaultLevel::kAll;
  pd::Mutation mutation = pd::Mutation::kNone;
  // Long virtual time: the deadline and the retransmit limit scaled down
  // (30 s and 30 sends against 900 s and 900) and faults that outlast them:
  // links that pass heartbeats but lose every other message for up to 90 s,
  // admissions slower than the deadline. Those ends become legitimate.
  bool long_run = false;
};

struct NetworkFaults {
  double drop_probability = 0;
  double duplicate_probability = 0;
  TimeMs delay_min_ms = 1;
  TimeMs delay_max_ms = 5;
  double long_delay_probability = 0;  // a message overtaken by later ones
  TimeMs long_delay_max_ms = 0;       // kept under the lease: a slow link is not a dead peer
};

struct Partition {
  pd::NodeId a = 0;
  pd::NodeId b = 0;
  TimeMs start_ms = 0;
  TimeMs end_ms = 0;
  // Only a -> b is cut: b stops hearing a, a still hears b (a failing link
  // direction, a full queue): b declares a dead while a goes on working.
  bool one_way = false;
  // Heartbeats pass, every other message is lost: the peer stays alive to
  // its leases while nothing it is sent is acknowledged (a stuck queue).
  bool data_only = false;
  // b == 0: a is cut off from every node (its control network is down; RMA
  // on a separate fabric still runs).
  bool between(pd::NodeId from, pd::NodeId to) const {
    if (b == 0) return from == a || to == a;
    return (from == a && to == b) || (!one_way && from == b && to == a);
  }
  bool involves(pd::NodeId x, pd::NodeId y) const {
    if (b == 0) return x == a || y == a;
    return (a == x && b == y) || (a == y && b == x);
  }
};

struct Crash {
  pd::NodeId node = 0;
  TimeMs at_ms = 0;
  TimeMs restart_after_ms = 0;
};

// An instance shutting down: it refuses new transfers from at_ms (and says
// so in its heartbeats), finishes its live ones, and exits exit_after_ms
// later (a Crash in the scenario's list, with its restart).
struct Drain {
  pd::NodeId node = 0;
  TimeMs at_ms = 0;
};

struct WorkloadRequest {
  TimeMs arrival_ms = 0;
  pd::RequestSpec spec;
  TimeMs abort_at_ms = pd::kNever;  // client abort, if any
  // The instance ends the transfer on its own at this time: its client left
  // the decode, or a local error on the prefill (the core's cancel input).
  TimeMs local_cancel_at_ms = pd::kNever;
};

struct Scenario {
  uint64_t seed = 0;
  SimOptions options;
  pd::ProtocolConfig protocol;
  // Leases are each observer's own setting: prefills may wait longer for a
  // silent decode than decodes wait for a silent prefill (then, cut off, the
  // prefill goes on working after the decode has given up on it).
  TimeMs prefill_lease_ms = 3000;
  int32_t prefill_pool_blocks = 256;
  int32_t decode_pool_blocks = 512;
  bool recurrent = false;  // hybrid model: a state slot moves with the KV
  // Engines.
  TimeMs prefill_base_ms = 2;
  double prefill_ms_per_token = 0.02;
  // A prompt that takes long to prefill (a long prompt on a busy instance):
  // the decode's addresses wait for it, and a cut between the two can strike
  // in between (the write is then posted after the decode gave up on it).
  double slow_prefill_probability = 0;
  TimeMs slow_prefill_ms = 0;
  TimeMs decode_ms_per_token = 10;
  TimeMs admission_max_ms = 20;
  double slow_admission_probability = 0;
  TimeMs slow_admission_ms = 78'000;  // field report 000: addresses 78 s after the KV
  double prefix_hit_probability = 0.3;
  TimeMs rma_base_ms = 1;
  double rma_ms_per_block = 0.05;
  double rma_slow_probability = 0;
  TimeMs rma_slow_ms = 0;
  double rma_failure_probability = 0;
  // How long the driver takes to fence a peer (an endpoint's close, a
  // process's exit being seen): RMA of the peer lands until then.
  TimeMs fence_min_ms = 1;
  TimeMs fence_max_ms = 200;
  double write_post_failure_probability = 0;
  double prefill_failure_probability = 0;
  // The decode's engine fails a request after its siblings started (a
  // forward error): the core's on_engine_failed input.
  double engine_failure_probability = 0;
  // Faults.
  NetworkFaults network;
  std::vector<Partition> partitions;
  std::vector<Crash> crashes;
  std::vector<Drain> drains;
  TimeMs faults_end_ms = 0;  // no fault starts or lasts past this
  TimeMs grace_ms = 120'000; // liveness: by faults_end + lease + grace all is settled
  std::vector<WorkloadRequest> workload;
};

Scenario make_scenario(uint64_t seed, const SimOptions& options);

std::string_view name(ModeChoice mode);
std::string_view name(FaultLevel level);
bool parse_mode(std::string_view text, ModeChoice* out);
bool parse_faults(std::string_view text, FaultLevel* out);

}  // namespace tandem::sim
