// /metrics: the engine's counters in the Prometheus text exposition format.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace tandem {
struct EngineMetrics;
struct LockstepStatus;
}

namespace tandem::server {

// `model` labels every series (as vLLM's model_name label does).
std::string render_prometheus(const EngineMetrics& m, const std::string& model, bool ready);
// A data-parallel rank's group: tandem_dp_* series labelled by rank (and op).
std::string render_lockstep_metrics(const LockstepStatus& st);
// One series with its HELP and TYPE lines: a (labels, value) line per entry.
void append_series(std::string& out, const char* name, const char* type, const char* help,
                   const std::vector<std::pair<std::string, double>>& lines);

}  // namespace tandem::server
