// /metrics: the engine's counters in the Prometheus text exposition format.
#pragma once

#include <string>

namespace tandem {
struct EngineMetrics;
}

namespace tandem::server {

// `model` labels every series (as vLLM's model_name label does).
std::string render_prometheus(const EngineMetrics& m, const std::string& model, bool ready);

}  // namespace tandem::server
