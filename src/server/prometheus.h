// /metrics: the engine's counters in the Prometheus text exposition format.
#pragma once

#include <string>

namespace tandem {
struct EngineMetrics;
struct LockstepStatus;
}

namespace tandem::server {

// `model` labels every series (as vLLM's model_name label does).
std::string render_prometheus(const EngineMetrics& m, const std::string& model, bool ready);
// A data-parallel rank's group: tandem_dp_* series labelled by rank (and op).
std::string render_lockstep_metrics(const LockstepStatus& st);

}  // namespace tandem::server
