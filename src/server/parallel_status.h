// A data-parallel rank's lockstep state as JSON (/debug/parallel; the same
// as Prometheus series: render_lockstep_metrics in prometheus.h): step id, the group's counters by op with
// their last sequence numbers, bytes and time, and the op it is inside now,
// with which ranks have and have not arrived. Sampled twice, a frozen group
// (no counter moves) is told from one with a rank parked (seed 003's
// discriminator).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace tandem {
struct LockstepStatus;
}

namespace tandem::server {

nlohmann::json lockstep_status_json(const LockstepStatus& st);

}  // namespace tandem::server
