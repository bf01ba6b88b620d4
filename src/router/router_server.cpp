#include "router/router_server.h"

#include <httplib.h>

#include <condition_variable>
#include <deque>

#include "router/cluster_api.h"
#include "server/bounded_task_queue.h"
#include "server/http_server.h"
#include "server/api_error.h"
#include "server/openai_protocol.h"
#include "server/upstream_relay.h"
#include "util/clock.h"
#include "util/constant_time.h"
#include "util/error.h"
#include "util/json_depth.h"

namespace tandem::router {

using json = nlohmann::json;
using server::ApiError;

namespace {

// "WHO answered HTTP STATUS", with the message of the OpenAI error in its
// body when there is one (what the client needs to know is in there).
std::string answered(const std::string& who, int status, const std::string& body) {
  std::string what = who + " answered HTTP " + std::to_string(status);
  const json j = json::parse(body, nullptr, false);
  if (j.is_object() && j.contains("error") && j["error"].is_object() && j["error"].contains("message") &&
      j["error"]["message"].is_string())
    what += ": " + j["error"]["message"].get<std::string>();
  return what;
}

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(server::dump_body(body), "application/json");
}
void send_error(httplib::Response& res, const ApiError& e) { send_json(res, e.status, e.to_json()); }

// The client's body for one leg: the same request, with the transfer's
// parameters naming the other instance of the pair.
json leg_body(const json& body, KvTransferParams kp, const InstanceInfo& peer) {
  kp.peer = peer.node;
  kp.peer_epoch = peer.epoch;
  kp.peer_transfer_host = peer.transfer_host;
  kp.peer_transfer_port = peer.transfer_port;
  json leg = body;
  leg["kv_transfer_params"] = to_json(kp);
  return leg;
}

// How one attempt at a request ended.
constexpr int kEndCompleted = 0, kEndFailed = 1, kEndRetried = 2;

ApiError no_instance(const char* role) {
  ApiError e;
  e.status = 503;
  e.type = "server_error";
  e.code = std::string("no_") + role + "_instance";
  e.message = std::string("no healthy ") + role +
              " instance is registered with this router; start one (tandem serve --role " + role +
              " --router URL) or wait for it to come back";
  return e;
}

// The instances by health (healthy, draining, silent: not heard for two
// heartbeats, not yet evicted), and the protocol's health across them from
// their heartbeats: drops by reason, transfers by role and state with the
// oldest age (a stuck transfer shows here, in one place for the cluster).
std::string cluster_health_metrics(const std::vector<InstanceInfo>& instances, int64_t now_ms) {
  constexpr int64_t kSilentMs = 2'000;
  std::map<std::string, int64_t> health = {{"healthy", 0}, {"draining", 0}, {"silent", 0}};
  std::map<std::string, int64_t> drops;
  std::map<std::pair<std::string, std::string>, std::pair<int64_t, int64_t>> states;
  for (const InstanceInfo& i : instances) {
    ++health[now_ms - i.last_heard_ms > kSilentMs ? "silent" : i.draining ? "draining" : "healthy"];
    for (const auto& [reason, n] : i.drops) drops[reason] += n;
    for (const auto& [state, v] : i.transfers_by_state) {
      auto& [count, oldest] = states[{std::string(pd::name(i.role)), state}];
      count += v.first;
      oldest = std::max(oldest, v.second);
    }
  }
  std::string m = "# HELP tandem_router_instances_by_health Registered instances by health\n"
                  "# TYPE tandem_router_instances_by_health gauge\n";
  for (const auto& [h, n] : health)
    m += "tandem_router_instances_by_health{health=\"" + h + "\"} " + std::to_string(n) + "\n";
  m += "# HELP tandem_router_protocol_drops Protocol messages the instances dropped, by reason\n"
       "# TYPE tandem_router_protocol_drops counter\n";
  for (const auto& [reason, n] : drops)
    m += "tandem_router_protocol_drops{reason=\"" + reason + "\"} " + std::to_string(n) + "\n";
  m += "# HELP tandem_router_instance_transfers Transfers on the instances by role and state\n"
       "# TYPE tandem_router_instance_transfers gauge\n";
  for (const auto& [key, v] : states)
    m += "tandem_router_instance_transfers{role=\"" + key.first + "\",state=\"" + key.second + "\"} " +
         std::to_string(v.first) + "\n";
  m += "# HELP tandem_router_instance_transfer_oldest_ms Age in its state of the oldest transfer, by role and state\n"
       "# TYPE tandem_router_instance_transfer_oldest_ms gauge\n";
  for (const auto& [key, v] : states)
    m += "tandem_router_instance_transfer_oldest_ms{role=\"" + key.first + "\",state=\"" + key.second + "\"} " +
         std::to_string(v.second) + "\n";
  return m;
}

}  // namespace

RouterServer::RouterServer(RouterConfig config)
    : config_(std::move(config)), registry_(config_.eviction_ms), http_(std::make_unique<httplib::Server>()) {
  if (config_.secret.empty())
    throw Error("the router needs a cluster secret: --cluster-secret or TANDEM_CLUSTER_SECRET");
  TANDEM_ASSERT(config_.epoch > 0 && config_.epoch < (1u << 21), "router epoch must fit the transfer id's epoch bits");
  queue_stats_ = std::make_unique<server::QueueStats>();
  http_->new_task_queue = [this] {
    return new server::BoundedTaskQueue(config_.http_threads, config_.max_queued_connections, queue_stats_.get());
  };
  server::use_exclusive_listener(*http_, &listen_fd_);
  install_routes();
}

RouterServer::~RouterServer() { stop(); }

pd::TransferId RouterServer::mint() {
  uint64_t n = next_transfer_.fetch_add(1);
  // The counter must never reach the epoch bits: ids would repeat.
  TANDEM_ASSERT(n < (uint64_t{1} << pd::kTransferEpochShift), "transfer id counter wrapped");
  return (uint64_t{config_.epoch} << pd::kTransferEpochShift) | n;
}

int RouterServer::bind() { return server::bind_listener(*http_, config_.host, config_.port, &listen_fd_); }

void RouterServer::serve() {
  running_ = true;
  evictor_ = std::thread([this] {
    while (running_) {
      const std::vector<pd::NodeId> evicted = registry_.evict_silent(monotonic_ms());
      if (!evicted.empty()) lose_instances(evicted);
      for (int i = 0; i < 10 && running_; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  http_->listen_after_bind();
}

void RouterServer::stop() {
  if (running_.exchange(false) && evictor_.joinable()) evictor_.join();
  http_->stop();
}

void RouterServer::begin_drain() { draining_ = true; }

void RouterServer::cut_off(const std::string& why) {
  std::vector<std::function<void(const std::string&)>> cuts;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cut_off_why_ = why;
    for (const auto& [transfer, t] : transfers_)
      if (t.cut) cuts.push_back(t.cut);
  }
  // (Outside the lock: each aborts its legs over HTTP.)
  for (const auto& cut : cuts) cut(why);
}

void RouterServer::lose_instances(const std::vector<pd::NodeId>& nodes) {
  std::vector<std::pair<std::function<void(const std::string&)>, std::string>> stops;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [transfer, t] : transfers_) {
      for (pd::NodeId node : nodes) {
        // A prefill lost after it answered is not waited on: the decode has
        // the KV, or reads it under its own deadline and fails the leg.
        if (node != t.decode && (node != t.prefill || t.phase != "prefill")) continue;
        t.lost = node;
        const std::string why = std::string(node == t.prefill ? "the prefill" : "the decode") + " instance (node " +
                                std::to_string(node) + ") went silent: no heartbeat for " +
                                std::to_string(registry_.eviction_ms()) + " ms (--eviction-ms), so the router dropped it";
        // A lost prefill: its call only (should it have answered already,
        // the request goes on to its decode, as above; the prefill's failure
        // path drops the decode leg otherwise). A lost decode: both, since
        // the attempt is over wherever it is.
        if (t.stop_prefill_call) stops.emplace_back(t.stop_prefill_call, why);
        if (node == t.decode && t.stop_decode_call) stops.emplace_back(t.stop_decode_call, why);
        break;
      }
    }
  }
  for (const auto& [stop, why] : stops) stop(why);
}

std::string RouterServer::cut_off_reason() {
  std::lock_guard<std::mutex> lock(mu_);
  return cut_off_why_;
}

std::optional<pd::NodeId> RouterServer::lost_node(pd::TransferId transfer) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = transfers_.find(transfer);
  return it == transfers_.end() ? std::nullopt : it->second.lost;
}

void RouterServer::abort_leg(const InstanceInfo& instance, pd::TransferId transfer) {
  std::string body = json{{"transfer_id", transfer}}.dump();
  httplib::Client cli(instance.api_host, instance.api_port);
  cli.set_tcp_nodelay(true);
  cli.set_connection_timeout(0, config_.upstream_connect_timeout_ms * 1000);
  cli.set_read_timeout(2, 0);
  httplib::Headers h = {{kSignatureHeader, sign(config_.secret, body)}};
  cli.Post("/internal/pd/abort", h, body, "application/json");
}

void RouterServer::install_routes() {
  httplib::Server& s = *http_;
  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (server::BoundedTaskQueue::rejecting()) {
      send_error(res, server::connections_exhausted(config_.http_threads, config_.max_queued_connections));
      res.set_header("Connection", "close");
      return httplib::Server::HandlerResponse::Handled;
    }
    if (config_.api_key.empty() || req.path.rfind("/v1/", 0) != 0) return httplib::Server::HandlerResponse::Unhandled;
    if (!constant_time_equal(req.get_header_value("Authorization"), "Bearer " + config_.api_key)) {
      send_error(res, server::unauthorized());
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });

  // ---- instances ----
  auto signed_body = [this](const httplib::Request& req, httplib::Response& res) -> std::optional<json> {
    if (!verify(config_.secret, req.body, req.get_header_value(kSignatureHeader))) {
      ++counters_.bad_signatures;
      send_json(res, 403, {{"error", "bad or missing cluster signature: the instance's cluster secret differs"}});
      return std::nullopt;
    }
    json j = json::parse(req.body, nullptr, false);
    if (j.is_discarded()) {
      send_json(res, 400, {{"error", "the body is not JSON"}});
      return std::nullopt;
    }
    return j;
  };
  s.Post("/internal/register", [this, signed_body](const httplib::Request& req, httplib::Response& res) {
    auto j = signed_body(req, res);
    if (!j) return;
    std::string why;
    auto info = instance_from_json(*j, &why);
    if (info) {
      if (auto refused = registry_.add(*info, monotonic_ms())) why = *refused, info.reset();
    }
    if (!info) {
      ++counters_.registrations_refused;
      std::fprintf(stderr, "tandem router: refused a registration: %s\n", why.c_str());
      return send_json(res, 409, {{"error", why}});
    }
    ++counters_.registrations;
    send_json(res, 200, {{"router_epoch", config_.epoch}});
  });
  s.Post("/internal/heartbeat", [this, signed_body](const httplib::Request& req, httplib::Response& res) {
    auto j = signed_body(req, res);
    if (!j) return;
    bool known = false;
    if (j->is_object()) {
      InstanceLoad load;
      load.free_blocks = j->value("free_blocks", int64_t{0});
      if (auto q = j->find("quarantined_blocks"); q != j->end() && q->is_number_integer())
        load.quarantined_blocks = q->get<int64_t>();
      load.waiting = j->value("waiting", int64_t{0});
      load.draining = j->value("draining", false);
      load.ready = j->value("ready", true);
      if (auto g = j->find("dp_group_failures"); g != j->end() && g->is_number_unsigned())
        load.dp_group_failures = g->get<int64_t>();
      auto fencing = j->find("fencing");
      if (fencing != j->end() && fencing->is_array() && fencing->size() <= 4096) {
        load.fencing.emplace();
        for (const json& f : *fencing)
          if (f.is_object() && f.value("node", json()).is_number_unsigned() && f.value("epoch", json()).is_number_unsigned())
            load.fencing->emplace_back(f["node"].get<pd::NodeId>(), f["epoch"].get<pd::Epoch>());
      }
      // Bounded: an instance has a few drop reasons and states.
      constexpr size_t kMaxNames = 32;
      auto drops = j->find("drops");
      if (drops != j->end() && drops->is_object() && drops->size() <= kMaxNames) {
        load.drops.emplace();
        for (const auto& [reason, n] : drops->items())
          if (n.is_number_integer() && reason.size() <= 64) (*load.drops)[reason] = n.get<int64_t>();
      }
      auto states = j->find("transfers_by_state");
      if (states != j->end() && states->is_object() && states->size() <= kMaxNames) {
        load.transfers_by_state.emplace();
        for (const auto& [state, v] : states->items())
          if (v.is_object() && state.size() <= 64 && v.value("count", json()).is_number_integer() &&
              v.value("oldest_ms", json()).is_number_integer())
            (*load.transfers_by_state)[state] = {v["count"].get<int64_t>(), v["oldest_ms"].get<int64_t>()};
      }
      known = registry_.heartbeat(j->value("node", 0u), j->value("epoch", 0u), load, monotonic_ms());
    }
    if (!known) return send_json(res, 404, {{"error", "unknown node or epoch: register again"}});
    // The list only when it changed since the instance last saw it: a
    // heartbeat costs O(1), not O(instances).
    uint64_t version = registry_.version();
    json answer = {{"registry_version", version}};
    if (j->value("registry_version", uint64_t{0}) != version) {
      json list = json::array();
      for (const InstanceInfo& i : registry_.list()) list.push_back(to_json(i));
      answer["instances"] = std::move(list);
    }
    send_json(res, 200, answer);
  });

  // ---- clients ----
  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (draining_) return send_json(res, 503, json{{"status", "shutting down"}});
    int p = registry_.count(pd::Role::kPrefill), d = registry_.count(pd::Role::kDecode);
    json body = {{"prefill", p},
                 {"decode", d},
                 {"prefill_ranks", registry_.count_ranks(pd::Role::kPrefill)},
                 {"decode_ranks", registry_.count_ranks(pd::Role::kDecode)}};
    if (p > 0 && d > 0) {
      body["status"] = "ok";
      return send_json(res, 200, body);
    }
    body["status"] = std::string("no healthy ") + (p == 0 ? "prefill" : "decode") + " instance";
    send_json(res, 503, body);
  });
  s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    std::vector<server::ModelCard> cards;
    for (const InstanceInfo& i : registry_.list()) {
      auto known = std::find_if(cards.begin(), cards.end(), [&](auto& c) { return c.id == i.model_name; });
      if (known != cards.end()) {
        // What every instance can serve: the shortest context among them.
        known->max_model_len = std::min(known->max_model_len, i.max_model_len);
        continue;
      }
      server::ModelCard c;
      c.id = i.model_name;
      c.created = static_cast<int64_t>(std::time(nullptr));
      c.max_model_len = i.max_model_len;
      cards.push_back(c);
    }
    send_json(res, 200, server::models_response(cards));
  });
  s.Get("/debug/instances", [this](const httplib::Request&, httplib::Response& res) {
    json list = json::array();
    int64_t now = monotonic_ms();
    for (const InstanceInfo& i : registry_.list()) {
      json j = to_json(i);
      j["silent_ms"] = now - i.last_heard_ms;
      list.push_back(j);
    }
    send_json(res, 200, {{"instances", list}, {"evictions", registry_.evictions()}});
  });
  s.Get("/debug/transfers", [this](const httplib::Request&, httplib::Response& res) {
    json list = json::array();
    int64_t now = monotonic_ms();
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, t] : transfers_)
      list.push_back({{"transfer", pd::transfer_name(id)}, {"prefill", t.prefill}, {"decode", t.decode},
                      {"phase", t.phase}, {"age_ms", now - t.started_ms}});
    send_json(res, 200, {{"transfers", list}});
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    std::string m;
    auto gauge = [&](const char* name, const char* help, double v, const std::string& labels = {}) {
      m += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " gauge\n" + name + labels + " " +
           std::to_string(v) + "\n";
    };
    gauge("tandem_router_requests_in_flight", "Client requests being served", static_cast<double>(in_flight_.load()));
    gauge("tandem_router_requests_total", "Client requests received", static_cast<double>(counters_.requests.load()));
    gauge("tandem_router_requests_completed", "Requests relayed to their end", static_cast<double>(counters_.completed.load()));
    gauge("tandem_router_requests_failed", "Requests that failed", static_cast<double>(counters_.failed.load()));
    gauge("tandem_router_retries", "Attempts retried on another instance before the first byte",
          static_cast<double>(counters_.retries.load()));
    gauge("tandem_router_client_aborts", "Clients that went away", static_cast<double>(counters_.client_aborts.load()));
    gauge("tandem_router_rejected_overload", "Requests refused beyond max_in_flight",
          static_cast<double>(counters_.rejected_overload.load()));
    gauge("tandem_router_rejected_no_instance", "Requests refused for want of an instance",
          static_cast<double>(counters_.rejected_no_instance.load()));
    gauge("tandem_router_requests_waiting_for_credits", "Requests waiting at the router for KV credits now",
          static_cast<double>(registry_.waiting_for_credits()));
    gauge("tandem_router_credit_waits", "Requests that had to wait for KV credits",
          static_cast<double>(counters_.credit_waits.load()));
    gauge("tandem_router_rejected_no_credits", "Requests refused after waiting credit_wait_ms for KV credits",
          static_cast<double>(counters_.rejected_no_credits.load()));
    gauge("tandem_router_bad_signatures", "Instance calls with a wrong cluster signature",
          static_cast<double>(counters_.bad_signatures.load()));
    gauge("tandem_router_instances", "Registered instances", registry_.count(pd::Role::kPrefill), "{role=\"prefill\"}");
    m += "tandem_router_instances{role=\"decode\"} " + std::to_string(registry_.count(pd::Role::kDecode)) + "\n";
    m += cluster_health_metrics(registry_.list(), monotonic_ms());
    gauge("tandem_router_evictions", "Instances dropped for silence", static_cast<double>(registry_.evictions()));
    m += server::render_queue_metrics(*queue_stats_);
    // Requests by phase, with the age of the oldest in each (a stuck one shows).
    std::map<std::string, std::pair<int64_t, int64_t>> phases = {{"prefill", {0, 0}}, {"decode", {0, 0}}};
    {
      std::lock_guard<std::mutex> lock(mu_);
      int64_t now = monotonic_ms();
      for (const auto& [id, t] : transfers_) {
        auto& [count, oldest] = phases[t.phase];
        ++count;
        oldest = std::max(oldest, now - t.started_ms);
      }
    }
    m += "# HELP tandem_router_transfers Requests in flight by phase\n# TYPE tandem_router_transfers gauge\n";
    for (const auto& [phase, v] : phases) m += "tandem_router_transfers{phase=\"" + phase + "\"} " + std::to_string(v.first) + "\n";
    m += "# HELP tandem_router_transfer_oldest_ms Age of the oldest request in each phase\n"
         "# TYPE tandem_router_transfer_oldest_ms gauge\n";
    for (const auto& [phase, v] : phases)
      m += "tandem_router_transfer_oldest_ms{phase=\"" + phase + "\"} " + std::to_string(v.second) + "\n";
    res.set_content(m, "text/plain; version=0.0.4");
  });

  s.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    generate(req, res, "/v1/completions");
  });
  s.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    generate(req, res, "/v1/chat/completions");
  });
}

// Credits of one attempt, returned as it goes: the prefill's once the decode's
// first output shows its KV has moved, the rest when the attempt ends, each
// amount corrected to the request's exact size once the prefill tells it.
// One lock orders the three, so no amount is returned twice or corrected
// after it was returned.
class AttemptCredits {
 public:
  AttemptCredits(Registry& registry, InstanceInfo prefill, InstanceInfo decode, int64_t prefill_blocks,
                 int64_t decode_blocks)
      : registry_(registry), prefill_(std::move(prefill)), decode_(std::move(decode)),
        prefill_blocks_(prefill_blocks), decode_blocks_(decode_blocks) {}
  void correct(int64_t prefill_blocks, int64_t decode_blocks) {
    std::lock_guard<std::mutex> lock(mu_);
    if (prefill_blocks_ != 0) registry_.adjust(prefill_, prefill_blocks - std::exchange(prefill_blocks_, prefill_blocks));
    if (decode_blocks_ != 0) registry_.adjust(decode_, decode_blocks - std::exchange(decode_blocks_, decode_blocks));
  }
  void kv_moved() {
    std::lock_guard<std::mutex> lock(mu_);
    registry_.adjust(prefill_, -std::exchange(prefill_blocks_, 0));
  }
  void done() {
    std::lock_guard<std::mutex> lock(mu_);
    registry_.done(prefill_, std::exchange(prefill_blocks_, 0));
    registry_.done(decode_, std::exchange(decode_blocks_, 0));
  }

 private:
  std::mutex mu_;
  Registry& registry_;
  const InstanceInfo prefill_, decode_;
  int64_t prefill_blocks_, decode_blocks_;
};

std::optional<RouterServer::Pair> RouterServer::pick_pair(const RequestShape& shape, const std::vector<pd::NodeId>& avoid_prefill,
                                                          const std::vector<pd::NodeId>& avoid_decode, int64_t deadline_ms,
                                                          ApiError* refusal) {
  bool counted = false;
  for (;;) {
    auto limits = registry_.limits();
    PairPick picked;
    Pair pair;
    if (limits) {
      pair.prefill_credits = prefill_credits(shape, limits->block_size, limits->max_model_len);
      pair.decode_credits = decode_credits(shape, limits->block_size, limits->max_model_len);
      picked = registry_.pick_pair(pair.prefill_credits, pair.decode_credits, avoid_prefill, avoid_decode);
      if (picked.ok()) {
        pair.prefill = *picked.prefill;
        pair.decode = *picked.decode;
        return pair;
      }
    } else {
      picked.missing = registry_.count(pd::Role::kPrefill) == 0 ? pd::Role::kPrefill : pd::Role::kDecode;
    }
    const char* role = picked.missing == pd::Role::kPrefill ? "prefill" : "decode";
    if (!picked.must_wait) {
      ++counters_.rejected_no_instance;
      *refusal = no_instance(role);
      if (picked.skipped_cut)
        refusal->message = "no prefill and decode instance can reach each other: each pair is cut off (one of the "
                           "two is fencing the other after a failure; /debug/instances lists who fences whom)";
      return std::nullopt;
    }
    // Every instance that could hold the request has its credits taken:
    // wait (bounded, and counted in /metrics) for some to be returned, and
    // pick once more even when the wait ends at the deadline.
    if (!counted) ++counters_.credit_waits;
    counted = true;
    if (monotonic_ms() >= deadline_ms) {
      ++counters_.rejected_no_credits;
      *refusal = server::engine_unavailable(
          std::string("every ") + role + " instance's KV cache is reserved by requests in flight (waited " +
          std::to_string(config_.credit_wait_ms) + " ms for room); retry after a short wait, or add " + role +
          " instances");
      return std::nullopt;
    }
    registry_.wait_for_credits(picked.credits_version, deadline_ms);
  }
}

void RouterServer::generate(const httplib::Request& req, httplib::Response& res, const std::string& path) {
  ++counters_.requests;
  if (draining_) return send_error(res, server::engine_unavailable("the router is shutting down"));
  if (const std::string_view problem = json_shape_problem(req.body); !problem.empty())
    return send_error(res, server::bad_json(problem));
  json body = json::parse(req.body, nullptr, false);
  if (body.is_discarded() || !body.is_object()) return send_error(res, server::bad_json("the body is not a JSON object"));
  if (in_flight_.load() >= config_.max_in_flight) {
    ++counters_.rejected_overload;
    ApiError e = server::engine_unavailable("the router has " + std::to_string(config_.max_in_flight) +
                                            " requests in flight; retry after a short wait");
    return send_error(res, e);
  }
  const RequestShape shape = estimate_shape(body, path == "/v1/chat/completions");
  const int64_t credit_deadline_ms = monotonic_ms() + config_.credit_wait_ms;
  // A request is retried on other instances only while nothing has been
  // sent to the client: a leg that cannot be reached or answers 5xx before
  // the decode's response began.
  constexpr int kMaxAttempts = 3;
  // The prefill answers once it has computed the prompt (never a stream).
  constexpr int kPrefillReadTimeoutS = 30;
  std::vector<pd::NodeId> avoid_prefill, avoid_decode;
  std::string last_error;
  int attempts = 0;
  for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
    // Cut off (a shutdown) between attempts: no other pair is tried.
    if (const std::string why = cut_off_reason(); !why.empty()) {
      ++counters_.failed;
      return send_error(res, server::engine_unavailable(why));
    }
    ApiError refusal;
    auto pair = pick_pair(shape, avoid_prefill, avoid_decode, credit_deadline_ms, &refusal);
    if (!pair) {
      if (attempt > 0) break;
      return send_error(res, refusal);
    }
    ++attempts;
    const InstanceInfo& prefill = pair->prefill;
    const InstanceInfo& decode = pair->decode;
    const std::string prefill_who = "the prefill instance (node " + std::to_string(prefill.node) + ")";
    const std::string decode_who = "the decode instance (node " + std::to_string(decode.node) + ")";
    const pd::TransferId transfer = mint();
    ++in_flight_;
    auto credits =
        std::make_shared<AttemptCredits>(registry_, prefill, decode, pair->prefill_credits, pair->decode_credits);
    // Every attempt ends through `finish`, exactly once.
    auto finish = [this, transfer, credits](int outcome) {
      credits->done();
      --in_flight_;
      ++(outcome == kEndCompleted ? counters_.completed : outcome == kEndRetried ? counters_.retries : counters_.failed);
      std::lock_guard<std::mutex> lock(mu_);
      transfers_.erase(transfer);
    };

    KvTransferParams kp;
    kp.transfer = transfer;
    kp.mode = prefill.mode;
    kp.router_epoch = config_.epoch;
    kp.budget_ms = config_.request_timeout_ms;
    // The decode leg, read on its own thread so the client's connection can
    // stream what arrives. WRITE sends it at once, beside the prefill's (the
    // decode allocates and sends its block addresses while the prefill
    // computes); READ after the prefill accepted (the decode reads what the
    // prefill computed, so there is nothing for it to do earlier).
    auto up = std::make_shared<server::Upstream>();
    // The prefill leg's call, stopped like the decode's: neither a cut-off
    // nor an eviction waits out its read timeout on a prefill that has
    // stopped answering.
    auto prefill_leg = std::make_shared<server::Upstream>();
    {
      std::lock_guard<std::mutex> lock(mu_);
      InFlight& t = transfers_[transfer];
      t.transfer = transfer;
      t.prefill = prefill.node;
      t.decode = decode.node;
      t.started_ms = monotonic_ms();
      t.phase = "prefill";
      auto stopper = [](std::weak_ptr<server::Upstream> call) {
        return [call = std::move(call)](const std::string& why) {
          if (auto u = call.lock()) u->stop(why);
        };
      };
      t.stop_prefill_call = stopper(prefill_leg);
      t.stop_decode_call = stopper(up);
      t.cut = [this, stop_prefill = t.stop_prefill_call, stop_decode = t.stop_decode_call, prefill_at = prefill,
               decode_at = decode, transfer](const std::string& why) {
        stop_decode(why);
        stop_prefill(why);
        abort_leg(prefill_at, transfer);
        abort_leg(decode_at, transfer);
      };
    }
    // An instance of the pair evicted between the pick and the entry above
    // was not seen by lose_instances: it is lost now (one evicted later
    // finds the entry).
    for (pd::NodeId node : {prefill.node, decode.node})
      if (!registry_.contains(node)) lose_instances({node});
    const bool parallel = prefill.mode == pd::TransferMode::kWrite;
    bool decode_leg_started = false;
    auto start_decode_leg = [&] {
      decode_leg_started = true;
      server::UpstreamCall call;
      call.host = decode.api_host;
      call.port = decode.api_port;
      call.path = path;
      call.body = leg_body(body, kp, prefill).dump();
      call.who = decode_who;
      call.connect_timeout_ms = config_.upstream_connect_timeout_ms;
      call.read_timeout_s = config_.request_timeout_ms / 1000;
      // The first choice out of the decode: the KV it needed has moved, so
      // the prefill's blocks are on their way back to its pool.
      up->start(std::move(call), [credits, saw_output = false](const std::string& chunk) mutable {
        if (saw_output || chunk.find("\"choices\"") == std::string::npos) return;
        saw_output = true;
        credits->kv_moved();
      });
    };
    // An attempt given up before its first byte: the decode leg ends too.
    auto drop_decode_leg = [&] {
      if (!decode_leg_started) return;
      up->stop();
      abort_leg(decode, transfer);
    };
    if (parallel) start_decode_leg();

    // The prefill leg: it validates and tokenizes as the decode will, accepts
    // and computes; its answer (never a stream) comes at once, with the
    // request's exact size for the credits.
    json prefill_body = leg_body(body, kp, decode);
    prefill_body["stream"] = false;
    prefill_body.erase("stream_options");
    {
      server::UpstreamCall call;
      call.host = prefill.api_host;
      call.port = prefill.api_port;
      call.path = path;
      call.body = prefill_body.dump();
      call.who = prefill_who;
      call.connect_timeout_ms = config_.upstream_connect_timeout_ms;
      call.read_timeout_s = kPrefillReadTimeoutS;
      prefill_leg->start(std::move(call));
      // (The reader's own read timeout ends a silent call first; this bound
      // is the one the router holds itself to.)
      const int status = prefill_leg->wait_status(config_.upstream_connect_timeout_ms + kPrefillReadTimeoutS * 1000 + 1000);
      const std::string answer = status > 0 ? prefill_leg->wait_body(kPrefillReadTimeoutS * 1000) : std::string();
      if (status >= 400 && status < 500) {
        // The request itself is wrong: the instance's OpenAI error goes back as is.
        drop_decode_leg();
        finish(kEndFailed);
        res.status = status;
        res.set_content(answer, "application/json");
        return;
      }
      if (status != 200 || !prefill_leg->error().empty()) {
        prefill_leg->stop();
        if (const std::string why = cut_off_reason(); !why.empty()) {  // (the cut has aborted both legs)
          finish(kEndFailed);
          return send_error(res, server::engine_unavailable(why));
        }
        // (A call that failed, or was stopped, has its error; one that
        // answered with an error status, the instance's message.)
        const std::string error = prefill_leg->error();
        last_error = !error.empty() ? error : status > 0 ? answered(prefill_who, status, answer) : prefill_who + " did not answer";
        // (No abort goes to an instance evicted for silence: it would wait
        // out its timeout, and the instance drops the request itself when
        // it finds the router's connection gone.)
        const std::optional<pd::NodeId> lost = lost_node(transfer);
        if (status > 0 || (lost && *lost != prefill.node)) abort_leg(prefill, transfer);
        if (lost == decode.node) {
          up->stop();
          avoid_decode.push_back(decode.node);
        } else {
          drop_decode_leg();
          avoid_prefill.push_back(prefill.node);
        }
        finish(kEndRetried);
        continue;
      }
      json accepted = json::parse(answer, nullptr, false);
      if (accepted.is_object() && accepted.contains("prompt_tokens")) {
        RequestShape exact;
        exact.prompt_tokens = accepted.value("prompt_tokens", shape.prompt_tokens);
        exact.n_sequences = accepted.value("best_of", shape.n_sequences);
        exact.max_tokens = accepted.value("max_tokens", shape.max_tokens);
        const int64_t len = std::max<int64_t>(exact.prompt_tokens + exact.max_tokens, 1);
        const int64_t bs = prefill.fingerprint.block_size;
        credits->correct(prefill_credits(exact, bs, len), decode_credits(exact, bs, len));
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      transfers_[transfer].phase = "decode";
    }
    if (!parallel) start_decode_leg();
    const int status = up->wait_status(config_.request_timeout_ms);
    if (status != 200) {
      // Wait for the whole (error) body, bounded, then answer with it or retry.
      const std::string text = up->wait_body(5000);
      abort_leg(prefill, transfer);
      if (status >= 400 && status < 500) {
        finish(kEndFailed);
        res.status = status;
        res.set_content(text, "application/json");
        return;
      }
      last_error = status > 0 ? answered(decode_who, status, text) : up->error();
      finish(kEndRetried);
      avoid_decode.push_back(decode.node);
      continue;
    }
    server::Upstream::relay(res, up, body.value("stream", false),
                            [this, finish, prefill_info = prefill, transfer, leg = std::weak_ptr<server::Upstream>(up)](bool success) {
                              if (!success) {
                                // The client left: both legs end (the relay stopped the decode's).
                                ++counters_.client_aborts;
                                abort_leg(prefill_info, transfer);
                              }
                              // A response that ended with the leg's error (a decode lost
                              // mid-stream, a cut-off) reached the client whole, but failed.
                              const auto u = leg.lock();
                              finish(success && (!u || u->error().empty()) ? kEndCompleted : kEndFailed);
                            });
    return;
  }
  ++counters_.failed;
  // (Fewer than kMaxAttempts when no other pair was left to try.)
  send_error(res, server::upstream_error(last_error + " (tried " + std::to_string(attempts) +
                                         (attempts == 1 ? " time)" : " times)")));
}

}  // namespace tandem::router
