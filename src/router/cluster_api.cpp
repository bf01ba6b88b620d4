#include "router/cluster_api.h"

#include "transport/sha256.h"
#include "util/constant_time.h"

namespace tandem::router {

using json = nlohmann::json;

namespace {

template <typename T>
bool read(const json& j, const char* key, T* out, std::string* why) {
  auto it = j.find(key);
  if (it == j.end()) {
    *why = std::string("missing field '") + key + "'";
    return false;
  }
  try {
    *out = it->get<T>();
  } catch (const std::exception&) {
    *why = std::string("field '") + key + "' has the wrong type";
    return false;
  }
  return true;
}

bool parse_role(const std::string& s, pd::Role* role) {
  if (s == "prefill") *role = pd::Role::kPrefill;
  else if (s == "decode") *role = pd::Role::kDecode;
  else return false;
  return true;
}
bool parse_mode(const std::string& s, pd::TransferMode* mode) {
  if (s == "write") *mode = pd::TransferMode::kWrite;
  else if (s == "read") *mode = pd::TransferMode::kRead;
  else return false;
  return true;
}
json fingerprint_json(const transport::Fingerprint& f) {
  return {{"model_hash", f.model_hash}, {"kv_dtype", f.kv_dtype},     {"block_size", f.block_size},
          {"kv_layout", f.kv_layout},   {"n_layers", f.n_layers},     {"n_kv_heads", f.n_kv_heads},
          {"head_dim", f.head_dim},     {"protocol_version", f.protocol_version}};
}

bool read_fingerprint(const json& j, transport::Fingerprint* f, std::string* why) {
  if (!j.is_object()) {
    *why = "field 'fingerprint' must be an object";
    return false;
  }
  return read(j, "model_hash", &f->model_hash, why) && read(j, "kv_dtype", &f->kv_dtype, why) &&
         read(j, "block_size", &f->block_size, why) && read(j, "kv_layout", &f->kv_layout, why) &&
         read(j, "n_layers", &f->n_layers, why) && read(j, "n_kv_heads", &f->n_kv_heads, why) &&
         read(j, "head_dim", &f->head_dim, why) && read(j, "protocol_version", &f->protocol_version, why);
}
}  // namespace

std::string sign(const std::string& secret, const std::string& body) {
  auto d = transport::hmac_sha256(secret, {std::span(reinterpret_cast<const uint8_t*>(body.data()), body.size())});
  return transport::to_hex(d);
}

bool verify(const std::string& secret, const std::string& body, const std::string& signature) {
  return constant_time_equal(sign(secret, body), signature);
}

json to_json(const InstanceInfo& i) {
  json fencing = json::array();
  for (const auto& [node, epoch] : i.fencing) fencing.push_back({{"node", node}, {"epoch", epoch}});
  return {{"node", i.node},
          {"epoch", i.epoch},
          {"role", std::string(pd::name(i.role))},
          {"mode", std::string(pd::name(i.mode))},
          {"api_host", i.api_host},
          {"api_port", i.api_port},
          {"transfer_host", i.transfer_host},
          {"transfer_port", i.transfer_port},
          {"fingerprint", fingerprint_json(i.fingerprint)},
          {"model_name", i.model_name},
          {"max_model_len", i.max_model_len},
          {"capacity_blocks", i.capacity_blocks},
          {"free_blocks", i.free_blocks},
          {"quarantined_blocks", i.quarantined_blocks},
          {"reserved_blocks", i.reserved_blocks},
          {"waiting", i.waiting},
          {"draining", i.draining},
          {"ready", i.ready},
          {"data_parallel",
           {{"group", i.dp_group}, {"rank", i.dp_rank}, {"size", i.dp_size}, {"group_failures", i.dp_group_failures}}},
          {"fencing", fencing},
          {"in_flight", i.in_flight},
          {"requests", i.requests}};
}

std::optional<InstanceInfo> instance_from_json(const json& j, std::string* why) {
  if (!j.is_object()) {
    *why = "the body is not a JSON object";
    return std::nullopt;
  }
  InstanceInfo i;
  std::string role, mode;
  if (!read(j, "node", &i.node, why) || !read(j, "epoch", &i.epoch, why) || !read(j, "role", &role, why) ||
      !read(j, "mode", &mode, why) || !read(j, "api_host", &i.api_host, why) || !read(j, "api_port", &i.api_port, why) ||
      !read(j, "transfer_host", &i.transfer_host, why) || !read(j, "transfer_port", &i.transfer_port, why) ||
      !read(j, "model_name", &i.model_name, why) || !read(j, "max_model_len", &i.max_model_len, why) ||
      !read(j, "capacity_blocks", &i.capacity_blocks, why))
    return std::nullopt;
  auto fp = j.find("fingerprint");
  if (fp == j.end()) {
    *why = "missing field 'fingerprint'";
    return std::nullopt;
  }
  if (!read_fingerprint(*fp, &i.fingerprint, why)) return std::nullopt;
  if (!parse_role(role, &i.role)) {
    *why = "role must be prefill or decode";
    return std::nullopt;
  }
  if (!parse_mode(mode, &i.mode)) {
    *why = "mode must be write or read";
    return std::nullopt;
  }
  i.fingerprint.mode = i.mode;
  if (auto dp = j.find("data_parallel"); dp != j.end() && dp->is_object()) {
    i.dp_group = dp->value("group", std::string());
    i.dp_rank = dp->value("rank", 0);
    i.dp_size = dp->value("size", 1);
    if (i.dp_size < 1 || i.dp_rank < 0 || i.dp_rank >= i.dp_size) {
      *why = "data_parallel: rank must be in [0, size)";
      return std::nullopt;
    }
  }
  if (i.epoch == 0 || i.capacity_blocks <= 0 || i.api_port == 0 || i.transfer_port == 0 || i.max_model_len <= 0 ||
      i.fingerprint.block_size <= 0) {
    *why = "epoch, capacity_blocks, max_model_len, the block size and ports must be positive";
    return std::nullopt;
  }
  return i;
}

json to_json(const KvTransferParams& p) {
  return {{"transfer_id", p.transfer},
          {"mode", std::string(pd::name(p.mode))},
          {"peer_node", p.peer},
          {"peer_epoch", p.peer_epoch},
          {"peer_transfer_host", p.peer_transfer_host},
          {"peer_transfer_port", p.peer_transfer_port},
          {"router_epoch", p.router_epoch},
          {"budget_ms", p.budget_ms}};
}

std::optional<KvTransferParams> kv_transfer_params_from_json(const json& j, std::string* why) {
  if (!j.is_object()) {
    *why = "kv_transfer_params must be an object";
    return std::nullopt;
  }
  KvTransferParams p;
  std::string mode;
  if (!read(j, "transfer_id", &p.transfer, why) || !read(j, "mode", &mode, why) ||
      !read(j, "peer_node", &p.peer, why) || !read(j, "peer_epoch", &p.peer_epoch, why) ||
      !read(j, "peer_transfer_host", &p.peer_transfer_host, why) ||
      !read(j, "peer_transfer_port", &p.peer_transfer_port, why) || !read(j, "router_epoch", &p.router_epoch, why) ||
      !read(j, "budget_ms", &p.budget_ms, why))
    return std::nullopt;
  if (!parse_mode(mode, &p.mode)) {
    *why = "kv_transfer_params.mode must be write or read";
    return std::nullopt;
  }
  if (p.transfer == 0 || p.transfer >= (uint64_t{1} << 62) || p.peer <= 1 || p.peer_epoch == 0 || p.budget_ms <= 0) {
    *why = "kv_transfer_params out of range";
    return std::nullopt;
  }
  return p;
}

std::optional<HostPort> parse_http_url(const std::string& url) {
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) != 0) return std::nullopt;
  std::string rest = url.substr(scheme.size());
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  size_t colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0) return std::nullopt;
  HostPort hp;
  hp.host = rest.substr(0, colon);
  try {
    int port = std::stoi(rest.substr(colon + 1));
    if (port <= 0 || port > 65535) return std::nullopt;
    hp.port = static_cast<uint16_t>(port);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  return hp;
}

}  // namespace tandem::router
