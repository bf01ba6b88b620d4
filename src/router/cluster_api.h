// The instance <-> router API (JSON over HTTP), both sides of it.
//
//   POST /internal/register   instance -> router: who it is; answers 200 or 409 with why
//   POST /internal/heartbeat  instance -> router: load; answers the live instances
//                             (so decodes connect to every prefill before traffic)
//   POST /internal/pd/abort   router -> instance: end a transfer (client gone, other leg failed)
//
// Bodies are signed with the cluster secret (header X-Tandem-Signature:
// HMAC-SHA256 of the body, hex): the secret itself never crosses, and an
// instance without it cannot join. Requests to an instance's OpenAI API carry
// the router's "kv_transfer_params" (see docs/PD_PROTOCOL.md, "Processes").
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "router/registry.h"

namespace tandem::router {

constexpr const char* kSignatureHeader = "X-Tandem-Signature";

std::string sign(const std::string& secret, const std::string& body);
bool verify(const std::string& secret, const std::string& body, const std::string& signature);

nlohmann::json to_json(const InstanceInfo& info);
// Validates a registration body; nullopt (and *why) when a field is missing or out of range.
std::optional<InstanceInfo> instance_from_json(const nlohmann::json& j, std::string* why);

// What the router tells an instance about one request's transfer.
struct KvTransferParams {
  pd::TransferId transfer = 0;
  pd::TransferMode mode = pd::TransferMode::kWrite;
  pd::NodeId peer = 0;
  pd::Epoch peer_epoch = 0;
  std::string peer_transfer_host;
  uint16_t peer_transfer_port = 0;
  pd::Epoch router_epoch = 1;
  int64_t budget_ms = 900'000;
};
nlohmann::json to_json(const KvTransferParams& p);
std::optional<KvTransferParams> kv_transfer_params_from_json(const nlohmann::json& j, std::string* why);

// Where a URL "http://host:port" points; nullopt for anything else.
struct HostPort {
  std::string host;
  uint16_t port = 0;
};
std::optional<HostPort> parse_http_url(const std::string& url);

}  // namespace tandem::router
