#include "server/prometheus.h"

#include <cstdio>

#include "engine/engine_core.h"
#include "engine/metrics.h"
#include "parallel/frame.h"

namespace tandem::server {

namespace {

void line(std::string& out, const char* name, const std::string& labels, double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", value);
  out += name;
  out += "{" + labels + "} " + buf + "\n";
}

void header(std::string& out, const char* name, const char* type, const char* help) {
  out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void histogram(std::string& out, const char* name, const char* help, const Histogram& h, const std::string& labels) {
  header(out, name, "histogram", help);
  const Histogram::Snapshot s = h.snapshot();
  const std::string bucket = std::string(name) + "_bucket";
  for (size_t i = 0; i < s.bounds.size(); ++i) {
    char le[32];
    std::snprintf(le, sizeof le, "%g", s.bounds[i]);
    line(out, bucket.c_str(), labels + ",le=\"" + le + "\"", static_cast<double>(s.cumulative[i]));
  }
  line(out, bucket.c_str(), labels + ",le=\"+Inf\"", static_cast<double>(s.cumulative.back()));
  line(out, (std::string(name) + "_sum").c_str(), labels, s.sum);
  line(out, (std::string(name) + "_count").c_str(), labels, static_cast<double>(s.count));
}

}  // namespace

void append_series(std::string& out, const char* name, const char* type, const char* help,
                   const std::vector<std::pair<std::string, double>>& lines) {
  header(out, name, type, help);
  for (const auto& [labels, value] : lines) line(out, name, labels, value);
}

std::string render_prometheus(const EngineMetrics& m, const std::string& model, const bool ready) {
  std::string out;
  const std::string l = "model_name=\"" + model + "\"";
  auto series = [&](const char* type, const char* name, const char* help, double v) {
    header(out, name, type, help);
    line(out, name, l, v);
  };
  auto gauge = [&](const char* name, const char* help, double v) { series("gauge", name, help, v); };
  auto counter = [&](const char* name, const char* help, double v) { series("counter", name, help, v); };
  gauge("tandem_ready", "1 while the server admits requests, 0 while draining", ready ? 1 : 0);
  gauge("tandem_num_requests_running", "Sequences in the running set", static_cast<double>(m.running.load()));
  gauge("tandem_num_requests_waiting", "Sequences waiting to be scheduled", static_cast<double>(m.waiting.load()));
  gauge("tandem_num_requests_waiting_remote_kv", "P/D decode: requests whose KV is still in transfer",
        static_cast<double>(m.waiting_remote_kv.load()));
  gauge("tandem_kv_blocks_held_for_transfer", "P/D: KV block references held for transfers",
        static_cast<double>(m.transfer_blocks_held.load()));
  const double total = static_cast<double>(m.kv_blocks_total.load());
  gauge("tandem_kv_cache_usage_perc", "Fraction of KV blocks owned by sequences",
        total > 0 ? static_cast<double>(m.kv_blocks_used.load()) / total : 0);
  gauge("tandem_kv_cache_blocks_total", "KV blocks in the pool", total);
  gauge("tandem_kv_cache_blocks_cached", "Evictable blocks kept by the prefix cache",
        static_cast<double>(m.kv_blocks_cached.load()));
  gauge("tandem_state_slots_total", "Recurrent-state slots (models with recurrent layers; one per live sequence)",
        static_cast<double>(m.state_slots_total.load()));
  gauge("tandem_state_slots_used", "Recurrent-state slots held by sequences", static_cast<double>(m.state_slots_used.load()));
  header(out, "tandem_prefix_cache_disabled", "gauge",
         "1 when prefix caching is off although asked for, with the reason");
  line(out, "tandem_prefix_cache_disabled", l + ",reason=\"recurrent_state_not_cached\"",
       m.prefix_caching_off_for_recurrent_state.load() ? 1 : 0);
  const double queries = static_cast<double>(m.prefix_query_tokens.load());
  gauge("tandem_prefix_cache_hit_rate", "Prompt tokens served from the prefix cache / prompt tokens looked up",
        queries > 0 ? static_cast<double>(m.prefix_hit_tokens.load()) / queries : 0);
  counter("tandem_prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache", queries);
  counter("tandem_prefix_cache_hits_total", "Prompt tokens found in the prefix cache",
          static_cast<double>(m.prefix_hit_tokens.load()));
  counter("tandem_prompt_tokens_total", "Prompt tokens admitted", static_cast<double>(m.prompt_tokens.load()));
  counter("tandem_generation_tokens_total", "Tokens generated", static_cast<double>(m.generation_tokens.load()));
  counter("tandem_num_preemptions_total", "Sequences preempted (recomputed later)",
          static_cast<double>(m.preemptions.load()));
  counter("tandem_engine_steps_total", "Engine steps run", static_cast<double>(m.steps.load()));
  counter("tandem_request_success_total", "Requests finished", static_cast<double>(m.requests_finished.load()));
  counter("tandem_request_aborted_total", "Requests aborted", static_cast<double>(m.requests_aborted.load()));
  counter("tandem_nonfinite_logits_total", "Requests failed because the model produced NaN or infinite logits",
          static_cast<double>(m.nonfinite_logits.load()));
  counter("tandem_engine_step_seconds_total", "Time spent in engine steps",
          static_cast<double>(m.step_time_ns_total.load()) * 1e-9);
  counter("tandem_scheduler_seconds_total", "Time spent scheduling",
          static_cast<double>(m.schedule_time_ns_total.load()) * 1e-9);
  // Step time by what the steps carried (StepKind), and what they carried.
  const auto by_kind = [&](const char* name, const char* help, const std::atomic<int64_t> StepKindCounters::*field,
                           double scale) {
    std::vector<std::pair<std::string, double>> lines;
    for (int i = 0; i < kStepKinds; ++i)
      lines.emplace_back(l + ",kind=\"" + kStepKindNames[i] + "\"",
                         static_cast<double>((m.step_kinds[static_cast<size_t>(i)].*field).load()) * scale);
    append_series(out, name, "counter", help, lines);
  };
  by_kind("tandem_engine_steps_by_kind_total", "Engine steps by what they carried: decode rows, prompt chunks or both",
          &StepKindCounters::steps, 1);
  by_kind("tandem_engine_step_seconds_by_kind_total", "Time spent in engine steps, by step kind",
          &StepKindCounters::step_time_ns, 1e-9);
  by_kind("tandem_engine_forward_seconds_by_kind_total", "Time spent in the model's forward, by step kind",
          &StepKindCounters::forward_time_ns, 1e-9);
  by_kind("tandem_engine_prefill_tokens_by_kind_total", "Prompt (or recomputed) positions run, by step kind",
          &StepKindCounters::prefill_tokens, 1);
  by_kind("tandem_engine_decode_rows_by_kind_total", "Decode rows run (one position past the prompt), by step kind",
          &StepKindCounters::decode_rows, 1);
  histogram(out, "tandem_time_to_first_token_seconds", "Time to first token", m.ttft_s, l);
  histogram(out, "tandem_time_per_output_token_seconds", "Mean time per output token after the first", m.tpot_s, l);
  histogram(out, "tandem_e2e_request_latency_seconds", "Request latency", m.e2e_s, l);
  return out;
}

std::string render_lockstep_metrics(const LockstepStatus& st) {
  std::string out;
  const std::string rank = "rank=\"" + std::to_string(st.rank) + "\"";
  auto series = [&](const char* type, const char* name, const char* help, double v) {
    header(out, name, type, help);
    line(out, name, rank, v);
  };
  series("gauge", "tandem_dp_group_connected", "1 while this rank's data-parallel group is formed", st.connected ? 1 : 0);
  series("gauge", "tandem_dp_step_id", "The last step the group agreed on", static_cast<double>(st.step_id));
  series("counter", "tandem_dp_steps_total", "Consensus rounds this rank completed", static_cast<double>(st.counters.steps));
  series("counter", "tandem_dp_dummy_steps_total", "Steps this rank ran with no work while a peer had some",
         static_cast<double>(st.counters.dummy_steps));
  series("counter", "tandem_dp_group_failures_total", "Times the group failed (divergence, rank failure, lost peer)",
         static_cast<double>(st.group_failures));
  struct PerOp {
    const char* name;
    const char* type;
    const char* help;
    double (*value)(const parallel::OpCounters&);
  };
  static constexpr PerOp kPerOp[] = {
      {"tandem_dp_ops_total", "counter", "Ops of the group by kind",
       [](const parallel::OpCounters& c) { return static_cast<double>(c.count); }},
      {"tandem_dp_op_bytes_total", "counter", "Bytes moved by the group's ops by kind",
       [](const parallel::OpCounters& c) { return static_cast<double>(c.bytes); }},
      {"tandem_dp_op_seconds_total", "counter", "Time in the group's ops by kind",
       [](const parallel::OpCounters& c) { return static_cast<double>(c.total_ns) * 1e-9; }},
      {"tandem_dp_op_last_seq", "gauge", "Sequence number of the last op of each kind",
       [](const parallel::OpCounters& c) { return static_cast<double>(c.last_seq); }},
  };
  for (const PerOp& m : kPerOp) {
    header(out, m.name, m.type, m.help);
    for (size_t k = 1; k < st.counters.by_kind.size(); ++k)
      line(out, m.name, rank + ",op=\"" + parallel::op_kind_name(static_cast<int64_t>(k)) + "\"",
           m.value(st.counters.by_kind[k]));
  }
  return out;
}

}  // namespace tandem::server
