// The OpenAI-compatible HTTP front end of one instance (role "both").
//
// Endpoints: POST /v1/completions, POST /v1/chat/completions (streaming with
// server-sent events or not), GET /v1/models, POST /tokenize, POST
// /detokenize, GET /health, GET /metrics. Each request is parsed and
// validated here, submitted to the engine core, and its outputs relayed from
// a per-request channel. Every wait here has a deadline; a client that goes
// away has its request aborted, freeing its KV blocks in the engine's next
// step.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/request.h"
#include "engine/sampling_params.h"

#include "server/chat_template.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace tandem {
class EngineCore;
class Model;
class Tokenizer;
}  // namespace tandem

namespace tandem::server {

struct QueueStats;

// What every tandem HTTP listener needs from httplib (the instance's and the
// router's): SO_REUSEADDR only (httplib's default adds SO_REUSEPORT, with which
// another socket of this user, a UCX interface among them, can be handed the
// same port by the kernel and take a share of the connections), the listening
// fd recorded in *listen_fd, then a backlog raised past httplib's 5 at bind.
void use_exclusive_listener(httplib::Server& server, int* listen_fd);
// Binds host:port (0: any free port); returns the port or throws tandem::Error.
int bind_listener(httplib::Server& server, const std::string& host, int port, const int* listen_fd);

struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 8000;                 // 0: any free port (see bind())
  std::string api_key;             // empty: no authentication
  std::string served_model_name;   // the id clients send as "model"
  std::string chat_template;       // --chat-template: a Jinja file (or inline text); empty: the model's
  int http_threads = 128;          // concurrent connections served
  int max_queued_connections = 128;  // beyond http_threads, waiting; beyond both: 503 at once
  int64_t max_body_bytes = 16 << 20;
  int output_timeout_s = 300;      // longest wait for the engine's next output of a request
  int health_timeout_ms = 2000;    // the engine loop must tick within this for /health to say 200
  int keepalive_ms = 1000;         // non-streaming: a space is sent this often to notice a gone client
};

// P/D (a prefill or decode instance behind a router): completion and chat
// requests that carry "kv_transfer_params" go through this hook instead of
// straight to the engine. The prefill answers at once once the request is
// accepted; the decode streams the outputs as a single instance would.
struct PdHook {
  bool prefill = false;
  // Submits the request; an error message when kv_transfer_params is malformed.
  std::function<std::optional<std::string>(const std::string& kv_transfer_params_json, std::vector<int32_t> prompt,
                                           const SamplingParams& params, OutputSink sink, uint64_t* transfer)>
      submit;
  std::function<void(uint64_t transfer)> cancel;        // the client went away
  std::function<void(uint64_t transfer)> router_abort;  // POST /internal/pd/abort
  // Checks the router's signature on /internal/pd/abort.
  std::function<bool(const std::string& body, const std::string& signature)> verify;
  // GET /debug/transfers: the transfer agent's state as JSON text.
  std::function<std::string()> debug_transfers;
};

// Data parallelism, on the front rank (rank 0): each completion or chat
// request goes to the rank the hook picks; another rank's is relayed there.
// The pick counts the request at its rank until `hold` is released, so
// that requests arriving together spread before any of them is parsed:
// the server holds it until its response is over (an early error drops it).
struct DpPlacement {
  int rank = 0;
  std::shared_ptr<void> hold;
  std::string address;  // another rank's HTTP listener (host:port), as read when it was picked
};
struct DpHook {
  std::function<DpPlacement()> pick;  // the rank for the next request
  int self = 0;                       // this server's own rank
  std::function<void(DpPlacement placement, const httplib::Request& req, httplib::Response& res)> forward;
  std::function<std::string()> ranks_json;  // the ranks' addresses and requests in flight, for /debug/parallel
};

// Tensor parallelism: the executor's state for /debug/parallel (JSON text)
// and /metrics (Prometheus text).
struct TpHook {
  std::function<std::string()> status_json;
  std::function<std::string()> metrics;
};

class HttpServer {
 public:
  HttpServer(EngineCore& engine, const Model& model, const Tokenizer& tokenizer, ServerConfig config);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds the listening socket; returns the port. Throws tandem::Error when
  // the address cannot be bound.
  int bind();
  // Serves until stop(); call after bind().
  void serve();
  // Stops admitting: new requests and /health get 503; in-flight ones go on.
  void begin_drain();
  bool draining() const { return draining_.load(); }
  int64_t in_flight() const { return in_flight_.load(); }
  // Ends every request in flight with `why` as the error its client sees
  // (a drain past its timeout): the engine fails them, and a response whose
  // engine gives nothing within a keep-alive tick (a wedged step) ends
  // without it.
  void cut_off(const std::string& why);
  void stop();

  const ChatTemplate& chat_template() const { return template_; }
  // Before serve().
  void set_pd_hook(PdHook hook);
  void set_dp_hook(DpHook hook);
  // Before serve().
  void set_tp_hook(TpHook hook) { tp_hook_ = std::move(hook); }

 private:
  void install_routes();

  EngineCore& engine_;
  const Model& model_;
  const Tokenizer& tokenizer_;
  ServerConfig config_;
  ChatTemplate template_;
  PdHook pd_hook_;
  DpHook dp_hook_;
  TpHook tp_hook_;
  std::unique_ptr<QueueStats> queue_stats_;
  std::unique_ptr<httplib::Server> http_;
  std::atomic<bool> draining_{false};
  std::mutex cut_off_mu_;
  std::string cut_off_why_;  // cut_off()'s reason, empty until then
  std::atomic<int64_t> in_flight_{0};
  std::atomic<uint64_t> next_request_id_{1};
  int listen_fd_ = -1;
  std::atomic<bool> serving_{false};
  std::atomic<bool> stop_requested_{false};
};

}  // namespace tandem::server
