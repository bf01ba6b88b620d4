// `tandem serve --role prefill|decode`: what an instance behind a router adds
// to a single one: the UCX transport over its KV pool, the transfer agent,
// the HTTP hook for requests that carry kv_transfer_params, and registration
// and heartbeats with the router.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "engine/engine_core.h"
#include "gguf/gguf.h"
#include "instance/transfer_agent.h"
#include "transport/faulty_transport.h"
#include "server/http_server.h"

namespace tandem::cli {

struct PdInstanceOptions {
  pd::Role role = pd::Role::kDecode;
  pd::TransferMode mode = pd::TransferMode::kWrite;
  std::string router_url;      // http://host:port
  std::string secret;
  pd::NodeId node = 0;         // 0: a random id (the router refuses a clash)
  std::string transfer_host = "127.0.0.1";
  uint16_t transfer_port = 0;  // 0: any free port
  std::string tls = "tcp";     // UCX_TLS for KV transfer
  std::string net_devices;     // UCX_NET_DEVICES
  int heartbeat_ms = 1000;
  int register_timeout_s = 60;
  // A data-parallel rank: its group's id and its rank (registered with the
  // router as ranks of one instance).
  std::string dp_group;
  int dp_rank = 0;
  int dp_size = 1;
  // Test knobs (off in production): injected control-frame faults, held-back admission.
  std::string test_faults;
  int64_t test_admission_delay_ms = 0;
};

// Reads a vLLM-style --kv-transfer-config JSON into `o` (docs/PD_PROTOCOL.md
// maps its keys); throws tandem::Error naming a bad key or value.
void apply_kv_transfer_config(const std::string& json_text, PdInstanceOptions* o);

class PdInstance {
 public:
  // Starts the transport and the agent, installs the HTTP hook.
  PdInstance(EngineCore& engine, const gguf::File& file, server::HttpServer& http, std::string served_model_name,
             PdInstanceOptions options);
  ~PdInstance();
  // Registers with the router (retrying up to register_timeout_s) and starts
  // heartbeating. `api_host`/`api_port`: where the router reaches our HTTP API.
  void join(const std::string& api_host, int api_port);
  void leave();
  // Shutdown: the agent refuses new transfers and the router stops picking us.
  void begin_drain();

 private:
  void heartbeat_loop();
  std::string debug_json();
  bool register_once(std::string* why);

  EngineCore& engine_;
  PdInstanceOptions options_;
  std::string model_name_;
  transport::Fingerprint fingerprint_;  // sent at registration: the router refuses a mismatch
  pd::Epoch epoch_ = 1;
  std::string api_host_;
  int api_port_ = 0;
  uint16_t transfer_port_ = 0;
  std::unique_ptr<instance::TransferAgent> agent_;
  transport::FaultyTransport* faults_ = nullptr;
  std::atomic<bool> running_{false};
  std::atomic<bool> draining_{false};
  std::thread heartbeat_;
};

}  // namespace tandem::cli
