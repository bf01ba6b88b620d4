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

}  // namespace tandem::server
