#include "server/parallel_status.h"

#include "engine/engine_core.h"
#include "parallel/frame.h"
#include "util/clock.h"

namespace tandem::server {

namespace {

std::vector<int> ranks_where(uint64_t mask, int size, bool arrived) {
  std::vector<int> out;
  for (int r = 0; r < size; ++r)
    if (((mask >> r) & 1) == static_cast<uint64_t>(arrived)) out.push_back(r);
  return out;
}

}  // namespace

nlohmann::json lockstep_status_json(const LockstepStatus& st) {
  nlohmann::json ops = nlohmann::json::object();
  for (size_t k = 1; k < st.counters.by_kind.size(); ++k) {
    const parallel::OpCounters& c = st.counters.by_kind[k];
    ops[parallel::op_kind_name(static_cast<int64_t>(k))] = {
        {"count", c.count}, {"last_seq", c.last_seq}, {"bytes", c.bytes}, {"time_s", static_cast<double>(c.total_ns) * 1e-9}};
  }
  nlohmann::json body = {{"rank", st.rank},
                         {"size", st.size},
                         {"connected", st.connected},
                         {"step_id", st.step_id},
                         {"steps", st.counters.steps},
                         {"dummy_steps", st.counters.dummy_steps},
                         {"idle_steps", st.counters.idle_steps},
                         {"busy_consensus_s", static_cast<double>(st.counters.busy_consensus_ns) * 1e-9},
                         {"ops", st.counters.ops},
                         {"fingerprint", std::to_string(st.counters.last_fingerprint)},
                         {"group_failures", st.group_failures},
                         {"last_error", st.last_error},
                         {"ops_by_kind", ops}};
  nlohmann::json loads = nlohmann::json::array();
  for (const parallel::RankLoad& l : st.loads)
    loads.push_back({{"tokens", l.n_tokens}, {"running", l.n_running}, {"waiting", l.n_waiting}, {"kv_blocks_free", l.kv_blocks_free}});
  body["rank_loads"] = loads;
  if (st.in_flight.kind != 0) {
    body["in_op"] = {{"kind", parallel::op_kind_name(st.in_flight.kind)},
                     {"step_id", st.in_flight.step_id},
                     {"seq", st.in_flight.seq},
                     {"for_s", static_cast<double>(monotonic_ns() - st.in_flight.since_ns) * 1e-9},
                     {"arrived", ranks_where(st.in_flight.arrived_mask, st.size, true)},
                     {"missing", ranks_where(st.in_flight.arrived_mask, st.size, false)}};
  } else {
    body["in_op"] = nullptr;
  }
  return body;
}

std::string render_lockstep_metrics(const LockstepStatus& st) {
  std::string out;
  const std::string rank = "rank=\"" + std::to_string(st.rank) + "\"";
  const auto series = [&](const char* type, const char* name, const char* help, const std::string& labels, double v) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
    out += std::string(name) + "{" + labels + "} " + std::to_string(v) + "\n";
  };
  series("gauge", "tandem_dp_group_connected", "1 while this rank's data-parallel group is formed", rank, st.connected ? 1 : 0);
  series("gauge", "tandem_dp_step_id", "The last step the group agreed on", rank, static_cast<double>(st.step_id));
  series("counter", "tandem_dp_steps_total", "Consensus rounds this rank completed", rank, static_cast<double>(st.counters.steps));
  series("counter", "tandem_dp_dummy_steps_total", "Steps this rank ran with no work while a peer had some", rank,
         static_cast<double>(st.counters.dummy_steps));
  series("counter", "tandem_dp_group_failures_total", "Times the group failed (divergence, rank failure, lost peer)",
         rank, static_cast<double>(st.group_failures));
  const char* kOps = "tandem_dp_ops_total";
  const char* kBytes = "tandem_dp_op_bytes_total";
  const char* kTime = "tandem_dp_op_seconds_total";
  const char* kSeq = "tandem_dp_op_last_seq";
  out += std::string("# HELP ") + kOps + " Ops of the group by kind\n# TYPE " + kOps + " counter\n";
  out += std::string("# HELP ") + kBytes + " Bytes moved by the group's ops by kind\n# TYPE " + kBytes + " counter\n";
  out += std::string("# HELP ") + kTime + " Time in the group's ops by kind\n# TYPE " + kTime + " counter\n";
  out += std::string("# HELP ") + kSeq + " Sequence number of the last op of each kind\n# TYPE " + kSeq + " gauge\n";
  for (size_t k = 1; k < st.counters.by_kind.size(); ++k) {
    const parallel::OpCounters& c = st.counters.by_kind[k];
    const std::string l = rank + ",op=\"" + parallel::op_kind_name(static_cast<int64_t>(k)) + "\"";
    out += std::string(kOps) + "{" + l + "} " + std::to_string(c.count) + "\n";
    out += std::string(kBytes) + "{" + l + "} " + std::to_string(c.bytes) + "\n";
    out += std::string(kTime) + "{" + l + "} " + std::to_string(static_cast<double>(c.total_ns) * 1e-9) + "\n";
    out += std::string(kSeq) + "{" + l + "} " + std::to_string(c.last_seq) + "\n";
  }
  return out;
}

}  // namespace tandem::server
