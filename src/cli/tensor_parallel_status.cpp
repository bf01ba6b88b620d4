// The tensor-parallel executor's state on /debug/parallel and /metrics.
// Sampled twice, a frozen worker (heartbeat age growing, process stopped)
// is told from one parked in a collective (heartbeat fresh, the same op and
// sequence, a rank missing) and from a healthy group (steps and gathers
// moving): seed 003's discriminator.
#include <nlohmann/json.hpp>

#include "cli/tensor_parallel.h"
#include "parallel/frame.h"
#include "server/prometheus.h"

namespace tandem::cli {

namespace {

nlohmann::json status_json(const TensorParallelSnapshot& s) {
  nlohmann::json workers = nlohmann::json::array();
  for (const TensorWorkerSnapshot& w : s.workers) {
    nlohmann::json j = {{"rank", w.rank},
                        {"pid", w.pid},
                        {"host", w.host.empty() ? "local" : w.host},
                        {"process_state", std::string(1, w.process_state)},
                        {"phase", w.phase},
                        {"step_id", w.step_id},
                        {"steps_done", w.steps_done},
                        {"heartbeat_age_ms", w.heartbeat_age_ms},
                        {"ops", w.ops},
                        {"tensor_gathers", w.gathers},
                        {"tensor_gather_bytes", w.gather_bytes},
                        {"tensor_gather_ns", w.gather_ns},
                        {"consensus_ns", w.consensus_ns}};
    if (w.op_kind != 0 && w.phase == static_cast<int32_t>(WorkerPhase::kInStep))
      j["in_op"] = {{"kind", parallel::op_kind_name(w.op_kind)}, {"seq", w.op_seq}, {"age_ms", w.op_age_ms},
                    {"arrived_mask", w.op_arrived}, {"data_phase", w.op_data_phase}};
    workers.push_back(j);
  }
  return {{"size", s.size},
          {"ready", s.ready},
          {"generation", s.generation},
          {"step_id", s.step_id},
          {"steps", s.steps},
          {"failures", s.failures},
          {"restarts", s.restarts},
          {"soft_deadline_reports", s.soft_deadline_reports},
          {"core_waiting_ms", s.waiting_since_ms},
          {"last_error", s.last_error},
          {"join_address", s.join_address},
          {"ring", {{"published", s.ring.published}, {"read", s.ring.read}, {"bytes", s.ring.bytes},
                    {"writer_pid", s.ring.writer_pid}, {"reader_pids", s.ring.reader_pids},
                    {"soft_deadline_reports", s.ring.soft_deadline_reports}}},
          {"workers", workers}};
}

std::string metrics_text(const TensorParallelSnapshot& s) {
  std::string out;
  using Lines = std::vector<std::pair<std::string, double>>;
  server::append_series(out, "tandem_tp_ready", "gauge", "1 while the tensor-parallel workers can run steps", {{"", s.ready ? 1.0 : 0.0}});
  server::append_series(out, "tandem_tp_steps_total", "counter", "Steps the workers completed", {{"", static_cast<double>(s.steps)}});
  server::append_series(out, "tandem_tp_failures_total", "counter", "Steps lost to a worker failure or a deadline",
                        {{"", static_cast<double>(s.failures)}});
  server::append_series(out, "tandem_tp_restarts_total", "counter", "Times the workers were replaced",
                        {{"", static_cast<double>(s.restarts)}});
  server::append_series(out, "tandem_tp_ring_messages_total", "counter", "Messages the engine core published on the step ring",
                        {{"", static_cast<double>(s.ring.published)}});
  Lines read, steps, gathers, bytes, secs, heartbeat;
  for (size_t r = 0; r < s.ring.read.size(); ++r) read.push_back({"reader=\"" + std::to_string(r) + "\"", static_cast<double>(s.ring.read[r])});
  for (const TensorWorkerSnapshot& w : s.workers) {
    const std::string l = "rank=\"" + std::to_string(w.rank) + "\"";
    steps.push_back({l, static_cast<double>(w.steps_done)});
    gathers.push_back({l, static_cast<double>(w.gathers)});
    bytes.push_back({l, static_cast<double>(w.gather_bytes)});
    secs.push_back({l, static_cast<double>(w.gather_ns) * 1e-9});
    heartbeat.push_back({l, static_cast<double>(w.heartbeat_age_ms) * 1e-3});
  }
  server::append_series(out, "tandem_tp_ring_read_total", "counter", "Step messages each worker has read", read);
  server::append_series(out, "tandem_tp_worker_steps_total", "counter", "Steps each worker completed", steps);
  server::append_series(out, "tandem_tp_worker_gathers_total", "counter", "Tensor gathers each worker completed", gathers);
  server::append_series(out, "tandem_tp_worker_gather_bytes_total", "counter", "Bytes each worker's gathers moved", bytes);
  server::append_series(out, "tandem_tp_worker_gather_seconds_total", "counter", "Time each worker spent in gathers", secs);
  server::append_series(out, "tandem_tp_worker_heartbeat_age_seconds", "gauge",
                        "Age of each worker's heartbeat (grows while a worker is frozen)", heartbeat);
  return out;
}

}  // namespace

server::TpHook tensor_parallel_hook(const TensorParallelExecutor& tp) {
  server::TpHook h;
  h.status_json = [&tp] { return status_json(tp.snapshot()).dump(); };
  h.metrics = [&tp] { return metrics_text(tp.snapshot()); };
  return h;
}

}  // namespace tandem::cli
