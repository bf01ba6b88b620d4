#include "cli/pd_instance.h"

#include <httplib.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

#include "instance/fingerprint.h"
#include "router/cluster_api.h"
#include "transport/faulty_transport.h"
#include "transport/ucx_transport.h"
#include "util/clock.h"
#include "util/error.h"

namespace tandem::cli {

using json = nlohmann::json;

void apply_kv_transfer_config(const std::string& text, PdInstanceOptions* o) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw Error("--kv-transfer-config is not a JSON object");
  auto str = [&](const json& obj, const char* key) -> std::string {
    if (!obj[key].is_string()) throw Error(std::string("--kv-transfer-config: '") + key + "' must be a string");
    return obj[key].get<std::string>();
  };
  for (auto& [key, value] : j.items()) {
    if (key == "kv_connector") {
      std::string c = str(j, "kv_connector");
      if (c != "TandemConnector" && c != "UcxConnector")
        throw Error("--kv-transfer-config: kv_connector '" + c + "' is not available; tandem's is TandemConnector (UCX)");
    } else if (key == "kv_role") {
      std::string r = str(j, "kv_role");
      if (r == "kv_producer") o->role = pd::Role::kPrefill;
      else if (r == "kv_consumer") o->role = pd::Role::kDecode;
      else throw Error("--kv-transfer-config: kv_role must be kv_producer (prefill) or kv_consumer (decode), not '" + r + "'");
    } else if (key == "kv_ip") {
      o->transfer_host = str(j, "kv_ip");
    } else if (key == "kv_port") {
      if (!value.is_number_unsigned() || value.get<uint64_t>() > 65535)
        throw Error("--kv-transfer-config: kv_port must be a port number");
      o->transfer_port = static_cast<uint16_t>(value.get<uint64_t>());
    } else if (key == "kv_buffer_size" || key == "kv_rank" || key == "kv_parallel_size" || key == "engine_id") {
      // vLLM keys with no meaning here: the KV pool is the transfer buffer
      // (--kv-cache-mb), and ranks come with data parallelism.
    } else if (key == "kv_connector_extra_config") {
      if (!value.is_object()) throw Error("--kv-transfer-config: kv_connector_extra_config must be an object");
      for (auto& [k, v] : value.items()) {
        if (k == "mode") {
          std::string m = str(value, "mode");
          if (m == "write") o->mode = pd::TransferMode::kWrite;
          else if (m == "read") o->mode = pd::TransferMode::kRead;
          else throw Error("--kv-transfer-config: mode must be write or read");
        } else if (k == "tls") {
          o->tls = str(value, "tls");
        } else if (k == "net_devices") {
          o->net_devices = str(value, "net_devices");
        } else if (k == "router") {
          o->router_url = str(value, "router");
        } else {
          throw Error("--kv-transfer-config: unknown kv_connector_extra_config key '" + k + "'");
        }
      }
    } else {
      throw Error("--kv-transfer-config: unknown key '" + key + "'");
    }
  }
}

PdInstance::PdInstance(EngineCore& engine, const gguf::File& file, server::HttpServer& http,
                       std::string served_model_name, PdInstanceOptions options)
    : engine_(engine), options_(std::move(options)), model_name_(std::move(served_model_name)) {
  if (options_.secret.empty())
    throw Error("a prefill or decode instance needs the cluster secret: --cluster-secret or TANDEM_CLUSTER_SECRET");
  if (!router::parse_http_url(options_.router_url))
    throw Error("--router must be http://HOST:PORT (got '" + options_.router_url + "')");
  std::random_device rd;
  if (options_.node == 0) options_.node = 2 + (static_cast<uint32_t>(rd()) % 0x7ffffff0u);
  // Grows with every restart (tenths of seconds since 2026): old-epoch
  // messages are then recognised as stale.
  epoch_ = static_cast<pd::Epoch>((std::chrono::duration_cast<std::chrono::milliseconds>(
                                       std::chrono::system_clock::now().time_since_epoch())
                                       .count() -
                                   1'767'225'600'000LL) /
                                  100);
  KvPool& pool = engine.kv_pool();
  transport::UcxTransportConfig tc;
  tc.secret = options_.secret;
  tc.self.node = options_.node;
  tc.self.epoch = epoch_;
  tc.self.role = options_.role;
  tc.self.fingerprint = instance::make_fingerprint(file, pool.shape(), options_.mode);
  fingerprint_ = tc.self.fingerprint;
  tc.region = pool.data();
  tc.region_bytes = pool.transfer_bytes();
  tc.n_blocks = static_cast<int32_t>(pool.n_transfer_blocks());
  tc.block_bytes = pool.block_bytes();
  tc.listen_host = options_.transfer_host;
  tc.listen_port = options_.transfer_port;
  tc.tls = options_.tls;
  tc.net_devices = options_.net_devices;
  auto ucx = std::make_unique<transport::UcxTransport>(tc);
  if (!ucx->fences_by_close())
    std::fprintf(stderr,
                 "tandem: UCX_TLS=%s includes shared memory: a peer on this host is fenced only when its process "
                 "exits (blocks it could reach stay quarantined until then)\n",
                 options_.tls.c_str());
  transfer_port_ = ucx->listen_port();
  std::unique_ptr<transport::Transport> t = std::move(ucx);
  if (!options_.test_faults.empty()) {
    auto faulty = std::make_unique<transport::FaultyTransport>(std::move(t), transport::parse_fault_spec(options_.test_faults));
    faults_ = faulty.get();
    t = std::move(faulty);
    std::fprintf(stderr, "tandem: TEST KNOB: control frames suffer injected faults (%s)\n", options_.test_faults.c_str());
  }
  instance::TransferAgentConfig ac;
  ac.role = options_.role;
  ac.node = options_.node;
  ac.epoch = epoch_;
  ac.test_admission_delay_ms = options_.test_admission_delay_ms;
  agent_ = std::make_unique<instance::TransferAgent>(engine, std::move(t), ac);
  agent_->start();

  server::PdHook hook;
  hook.prefill = options_.role == pd::Role::kPrefill;
  hook.submit = [this](const std::string& params_json, std::vector<int32_t> prompt, const SamplingParams& params,
                       OutputSink sink, uint64_t* transfer) -> std::optional<std::string> {
    std::string why;
    auto kp = router::kv_transfer_params_from_json(json::parse(params_json, nullptr, false), &why);
    if (!kp) return why;
    if (kp->mode != options_.mode)
      return "transfer mode " + std::string(pd::name(kp->mode)) + " but this instance runs " +
             std::string(pd::name(options_.mode));
    // Decodes connect to prefills (one side connects, so a pair has one endpoint).
    if (options_.role == pd::Role::kDecode) agent_->ensure_connected(kp->peer, kp->peer_transfer_host, kp->peer_transfer_port);
    instance::PdRequest r;
    r.transfer = kp->transfer;
    r.mode = kp->mode;
    r.peer = kp->peer;
    r.peer_epoch = kp->peer_epoch;
    r.router_epoch = kp->router_epoch;
    r.budget_ms = kp->budget_ms;
    r.prompt = std::move(prompt);
    r.params = params;
    r.sink = std::move(sink);
    *transfer = kp->transfer;
    agent_->submit(std::move(r));
    return std::nullopt;
  };
  hook.cancel = [this](uint64_t transfer) { agent_->cancel(transfer); };
  hook.router_abort = [this](uint64_t transfer) { agent_->abort_from_router(transfer); };
  hook.verify = [this](const std::string& body, const std::string& signature) {
    return router::verify(options_.secret, body, signature);
  };
  hook.debug_transfers = [this] { return debug_json(); };
  http.set_pd_hook(std::move(hook));
}

namespace {

// What /debug/transfers and the heartbeat both tell of the protocol.
json fencing_json(const std::vector<std::pair<pd::NodeId, pd::Epoch>>& fencing) {
  json list = json::array();
  for (const auto& [node, epoch] : fencing) list.push_back({{"node", node}, {"epoch", epoch}});
  return list;
}

json drops_json(const pd::NodeStats& stats) {
  json drops = json::object();
  for (int i = 0; i < pd::kDropReasonCount; ++i)
    drops[std::string(pd::name(static_cast<pd::DropReason>(i)))] = stats.drops[static_cast<size_t>(i)];
  return drops;
}

json states_json(const instance::TransferAgent::Snapshot& s, pd::Role role) {
  json by_state = json::object();
  for (size_t i = 0; i < s.transfers_by_state.size(); ++i) {
    std::string name = role == pd::Role::kPrefill ? std::string(pd::name(static_cast<pd::PrefillState>(i)))
                                                  : std::string(pd::name(static_cast<pd::DecodeState>(i)));
    by_state[name] = {{"count", s.transfers_by_state[i]}, {"oldest_ms", s.ages_by_state[i].oldest_ms}};
  }
  return by_state;
}

}  // namespace

PdInstance::~PdInstance() { leave(); }

std::string PdInstance::debug_json() {
  auto s = agent_->snapshot();
  if (!s) return json{{"error", "the transfer agent did not answer within 1 s"}}.dump();
  json ends = json::object();
  for (int i = 0; i < pd::kEndReasonCount; ++i)
    ends[std::string(pd::name(static_cast<pd::EndReason>(i)))] = s->stats.ends[static_cast<size_t>(i)];
  json wire = json::object();
  for (int i = 1; i < transport::kWireErrorCount; ++i)
    wire[std::string(transport::name(static_cast<transport::WireError>(i)))] = s->counters.wire_errors[static_cast<size_t>(i)];
  json peers = json::array();
  for (pd::NodeId p : s->connected_peers) peers.push_back(p);
  json j = {{"role", std::string(pd::name(options_.role))},
            {"node", options_.node},
            {"epoch", epoch_},
            {"transfers_by_state", states_json(*s, options_.role)},
            {"live_transfers", s->live_transfers},
            {"blocks_held", s->blocks_held},
            {"quarantined_blocks", s->quarantined_blocks},
            {"drops", drops_json(s->stats)},
            {"ends", ends},
            {"wire_errors", wire},
            {"spoofed_frames", s->counters.spoofed_frames},
            {"unsent_messages", s->counters.unsent_messages},
            {"retransmits", s->stats.retransmits},
            {"peer_deaths", s->stats.peer_deaths},
            {"rma_posts", s->counters.rma_posts},
            {"rma_failures", s->counters.rma_failures},
            {"fences_requested", s->counters.fences_requested},
            {"fences_completed", s->counters.fences_completed},
            {"connected_peers", peers},
            {"fences_pending", fencing_json(s->fences_pending)},
            {"requests_tracked", s->requests_tracked}};
  json recent = json::array();
  for (const instance::TransferTimeline& t : s->recent)
    recent.push_back({{"transfer", pd::transfer_name(t.transfer)}, {"transfer_id", t.transfer},
                      {"submitted_us", t.submitted_us}, {"engine_kv_us", t.engine_kv_us},
                      {"rma_posted_us", t.rma_posted_us}, {"rma_done_us", t.rma_done_us},
                      {"kv_ready_us", t.kv_ready_us}, {"first_output_us", t.first_output_us},
                      {"ended_us", t.ended_us}});
  j["recent"] = std::move(recent);  // CLOCK_MONOTONIC microseconds: comparable across this host's processes
  if (faults_ != nullptr)
    j["injected_faults"] = {{"dropped", faults_->counters().dropped},
                            {"duplicated", faults_->counters().duplicated},
                            {"delayed", faults_->counters().delayed},
                            {"lost_with_connection", faults_->counters().lost_with_connection}};
  return j.dump();
}

bool PdInstance::register_once(std::string* why) {
  router::InstanceInfo info;
  info.node = options_.node;
  info.epoch = epoch_;
  info.role = options_.role;
  info.mode = options_.mode;
  info.api_host = api_host_;
  info.api_port = static_cast<uint16_t>(api_port_);
  info.transfer_host = options_.transfer_host;
  info.transfer_port = transfer_port_;
  info.fingerprint = fingerprint_;
  info.model_name = model_name_;
  info.max_model_len = engine_.max_model_len();
  info.capacity_blocks = engine_.n_kv_blocks();
  info.dp_group = options_.dp_group;
  info.dp_rank = options_.dp_rank;
  info.dp_size = options_.dp_size;
  std::string body = router::to_json(info).dump();
  auto url = router::parse_http_url(options_.router_url);
  httplib::Client cli(url->host, url->port);
  cli.set_tcp_nodelay(true);
  cli.set_connection_timeout(2, 0);
  cli.set_read_timeout(5, 0);
  auto r = cli.Post("/internal/register", {{router::kSignatureHeader, router::sign(options_.secret, body)}}, body,
                    "application/json");
  if (!r) {
    *why = "the router at " + options_.router_url + " could not be reached";
    return false;
  }
  if (r->status != 200) {
    json j = json::parse(r->body, nullptr, false);
    *why = "the router refused the registration: " +
           (j.is_object() && j.contains("error") ? j["error"].dump() : "HTTP " + std::to_string(r->status));
    // A refusal (another model, a clash) is final; only an unreachable router is retried.
    if (r->status == 409 || r->status == 403) throw Error(*why);
    return false;
  }
  return true;
}

void PdInstance::join(const std::string& api_host, int api_port) {
  api_host_ = api_host;
  api_port_ = api_port;
  std::string why;
  for (int64_t until = monotonic_ms() + options_.register_timeout_s * 1000LL;;) {
    if (register_once(&why)) break;
    if (monotonic_ms() >= until)
      throw Error(why + " (gave up after " + std::to_string(options_.register_timeout_s) + " s)");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  std::fprintf(stderr, "tandem: %s node %u (epoch %u) registered with %s; KV transfer on %s:%u (UCX_TLS=%s, %s)\n",
               std::string(pd::name(options_.role)).c_str(), options_.node, epoch_, options_.router_url.c_str(),
               options_.transfer_host.c_str(), transfer_port_, options_.tls.c_str(),
               std::string(pd::name(options_.mode)).c_str());
  running_ = true;
  heartbeat_ = std::thread([this] { heartbeat_loop(); });
}

void PdInstance::heartbeat_loop() {
  auto url = router::parse_http_url(options_.router_url);
  httplib::Client cli(url->host, url->port);
  cli.set_tcp_nodelay(true);
  cli.set_connection_timeout(1, 0);
  cli.set_read_timeout(2, 0);
  cli.set_keep_alive(true);
  uint64_t registry_version = 0;
  while (running_) {
    const EngineMetrics& m = engine_.metrics();
    const bool ready = engine_.ready();
    json body = {{"node", options_.node},
                 {"epoch", epoch_},
                 {"free_blocks", engine_.n_kv_blocks() - m.kv_blocks_used.load()},
                 {"waiting", m.waiting.load() + m.waiting_remote_kv.load()},
                 {"draining", draining_.load()},
                 {"ready", ready},
                 {"registry_version", registry_version}};
    // A group failure the beats' sampling of readiness may have missed (the
    // group re-formed between two): the router's listing shows it.
    if (options_.dp_size > 1) body["dp_group_failures"] = engine_.lockstep_status().group_failures;
    // The protocol's side, from one snapshot of the agent (omitted if it
    // does not answer in time; the router then keeps the last it had): the
    // blocks quarantined (credits), whom it fences (pairing), drops by reason
    // and transfers by state with the oldest in each (/metrics).
    if (auto s = agent_->snapshot(200)) {
      body["quarantined_blocks"] = s->quarantined_blocks;
      body["fencing"] = fencing_json(s->fences_pending);
      body["drops"] = drops_json(s->stats);
      body["transfers_by_state"] = states_json(*s, options_.role);
    }
    std::string text = body.dump();
    auto r = cli.Post("/internal/heartbeat", {{router::kSignatureHeader, router::sign(options_.secret, text)}}, text,
                      "application/json");
    if (r && r->status == 404) {
      std::string why;
      registry_version = 0;
      try {
        register_once(&why);  // the router restarted, or evicted us
      } catch (const Error& e) {
        std::fprintf(stderr, "tandem: %s\n", e.what());
      }
    } else if (r && r->status == 200) {
      // Decodes connect to every prefill before traffic needs it (the list
      // comes only when it changed).
      json j = json::parse(r->body, nullptr, false);
      if (j.is_object()) registry_version = j.value("registry_version", uint64_t{0});
      if (options_.role == pd::Role::kDecode && j.is_object() && j.contains("instances") && j["instances"].is_array())
        for (const json& i : j["instances"])
          if (i.value("role", "") == "prefill")
            agent_->ensure_connected(i.value("node", 0u), i.value("transfer_host", ""),
                                     static_cast<uint16_t>(i.value("transfer_port", 0)));
    }
    // A change of readiness (a data-parallel group formed or failed) is
    // told at once, not at the next beat.
    for (int i = 0; i < options_.heartbeat_ms / 50 && running_ && engine_.ready() == ready; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void PdInstance::begin_drain() {
  draining_ = true;
  agent_->begin_drain();
}

void PdInstance::leave() {
  if (running_.exchange(false) && heartbeat_.joinable()) heartbeat_.join();
  if (agent_) agent_->stop();
}

}  // namespace tandem::cli
