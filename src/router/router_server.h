// `tandem router`: the client-facing OpenAI API of a P/D cluster.
//
// For each completion or chat request it mints a transfer id, picks a
// prefill and a decode instance from the registry, hands the request to the
// prefill (which accepts at once and computes) and then to the decode (each
// with its "kv_transfer_params"), and relays the decode's response to the
// client as it streams. A client that goes away ends both legs; an instance
// that refuses or fails ends the other leg. Nothing waits unbounded: upstream
// calls have timeouts, requests beyond max_in_flight get 503 at once.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "router/registry.h"
#include "router/request_shape.h"
#include "server/api_error.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}

namespace tandem::server {
struct QueueStats;
}

namespace tandem::router {

struct RouterConfig {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string secret;   // the cluster secret (instances sign with it)
  std::string api_key;  // clients' bearer token; empty: none
  pd::Epoch epoch = 1;  // carried in transfer ids: a restarted router never repeats one
  int64_t eviction_ms = 5000;
  int64_t request_timeout_ms = 900'000;
  int64_t max_in_flight = 1024;
  int http_threads = 256;
  int max_queued_connections = 256;
  int upstream_connect_timeout_ms = 3000;
  // How long a request may wait at the router for KV credits (every instance
  // that could hold it has them reserved) before it is answered 503.
  int64_t credit_wait_ms = 30'000;
  // SIGTERM: how long requests in flight may go on before they are cut off.
  int shutdown_timeout_s = 30;
};

struct RouterCounters {
  std::atomic<int64_t> requests{0};
  std::atomic<int64_t> completed{0};
  std::atomic<int64_t> failed{0};
  std::atomic<int64_t> retries{0};  // attempts given up on another instance before any byte was sent
  std::atomic<int64_t> client_aborts{0};
  std::atomic<int64_t> rejected_overload{0};
  std::atomic<int64_t> rejected_no_instance{0};
  std::atomic<int64_t> credit_waits{0};          // requests that waited for KV credits
  std::atomic<int64_t> rejected_no_credits{0};   // ... and got none within credit_wait_ms
  std::atomic<int64_t> bad_signatures{0};
  std::atomic<int64_t> registrations{0};
  std::atomic<int64_t> registrations_refused{0};
};

class RouterServer {
 public:
  explicit RouterServer(RouterConfig config);
  ~RouterServer();
  RouterServer(const RouterServer&) = delete;
  RouterServer& operator=(const RouterServer&) = delete;

  int bind();
  void serve();
  // Stops admitting: new requests and /health get 503; those in flight go on.
  void begin_drain();
  int64_t in_flight() const { return in_flight_.load(); }
  // Ends every request in flight with `why` as the error its client sees,
  // and both of its legs (a drain past its timeout).
  void cut_off(const std::string& why);
  void stop();
  Registry& registry() { return registry_; }
  const RouterCounters& counters() const { return counters_; }

 private:
  struct InFlight {
    pd::TransferId transfer = 0;
    pd::NodeId prefill = 0;
    pd::NodeId decode = 0;
    int64_t started_ms = 0;
    std::string phase;
    // Stop the prefill leg's call, the decode leg's, each ending with `why`
    // as its error.
    std::function<void(const std::string& why)> stop_prefill_call, stop_decode_call;
    // Stops them and aborts both legs (cut_off).
    std::function<void(const std::string& why)> cut;
    // The instance of its pair that was evicted for silence while it ran,
    // if one was: its attempt failed there, not at the other.
    std::optional<pd::NodeId> lost;
  };
  // Ends the calls of every request in flight on these instances, which
  // were just evicted for silence: a request still before its first byte
  // is tried on another pair, a stream ends with the error (a client is
  // never left waiting out its request timeout on a wedged instance).
  void lose_instances(const std::vector<pd::NodeId>& nodes);
  // cut_off()'s reason, empty until it was called.
  std::string cut_off_reason();
  // The node of `transfer`'s pair that was evicted while it ran, if one was.
  std::optional<pd::NodeId> lost_node(pd::TransferId transfer);
  void install_routes();
  // A prefill and a decode with the request's credits reserved on both (or
  // neither), waiting for credits until deadline_ms; nullopt with the
  // client's answer in *refusal (no such instance, or no credits in time).
  struct Pair {
    InstanceInfo prefill, decode;
    int64_t prefill_credits = 0, decode_credits = 0;
  };
  std::optional<Pair> pick_pair(const RequestShape& shape, const std::vector<pd::NodeId>& avoid_prefill,
                                const std::vector<pd::NodeId>& avoid_decode, int64_t deadline_ms,
                                server::ApiError* refusal);
  // One client completion or chat request: pick, hand over, relay (retrying
  // on other instances while nothing has reached the client).
  void generate(const httplib::Request& req, httplib::Response& res, const std::string& path);
  pd::TransferId mint();
  void abort_leg(const InstanceInfo& instance, pd::TransferId transfer);

  RouterConfig config_;
  Registry registry_;
  RouterCounters counters_;
  std::unique_ptr<server::QueueStats> queue_stats_;
  std::unique_ptr<httplib::Server> http_;
  int listen_fd_ = -1;
  std::atomic<uint64_t> next_transfer_{1};
  std::atomic<int64_t> in_flight_{0};
  std::mutex mu_;
  std::map<pd::TransferId, InFlight> transfers_;
  std::atomic<bool> running_{false};
  std::atomic<bool> draining_{false};
  std::string cut_off_why_;  // under mu_: cut_off()'s reason, empty until then
  std::thread evictor_;
};

}  // namespace tandem::router
