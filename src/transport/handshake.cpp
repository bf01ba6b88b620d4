#include "transport/handshake.h"

#include "kernels/dtype.h"
#include "transport/bytes.h"
#include "util/constant_time.h"

namespace tandem::transport {
namespace {

constexpr uint32_t kHandshakeMagic = 0x53484454;  // "TDHS"
enum class FrameKind : uint8_t { kHello = 1, kChallenge, kProof, kWelcome, kRefuse };
constexpr size_t kMaxKeyBytes = 16 * 1024;
constexpr size_t kMaxWhyBytes = 1024;

void put_header(ByteWriter& w, FrameKind kind) {
  w.put(kHandshakeMagic);
  w.put(kTransferProtocolVersion);
  w.put(kind);
}

void put_identity(ByteWriter& w, const PeerIdentity& id) {
  w.put(id.node);
  w.put(id.epoch);
  w.put(id.role);
  const Fingerprint& f = id.fingerprint;
  w.put(f.model_hash);
  w.put(f.kv_dtype);
  w.put(f.block_size);
  w.put(f.kv_layout);
  w.put(f.n_layers);
  w.put(f.n_kv_heads);
  w.put(f.head_dim);
  w.put(f.protocol_version);
  w.put(f.mode);
}

bool get_identity(ByteReader& r, PeerIdentity* id) {
  id->node = r.get<uint32_t>();
  id->epoch = r.get<uint32_t>();
  uint8_t role = r.get<uint8_t>();
  Fingerprint& f = id->fingerprint;
  f.model_hash = r.get<uint64_t>();
  f.kv_dtype = r.get<uint8_t>();
  f.block_size = r.get<int32_t>();
  f.kv_layout = r.get<int32_t>();
  f.n_layers = r.get<int32_t>();
  f.n_kv_heads = r.get<int32_t>();
  f.head_dim = r.get<int32_t>();
  f.protocol_version = r.get<uint16_t>();
  uint8_t mode = r.get<uint8_t>();
  if (role > 2 || mode > 1 || id->node == 0 || id->epoch == 0) return false;
  id->role = static_cast<pd::Role>(role);
  f.mode = static_cast<pd::TransferMode>(mode);
  return r.ok();
}

void put_keys(ByteWriter& w, const RegionKeys& k) {
  w.put_bytes(k.endpoint_address);
  w.put_bytes(k.rkey);
  w.put(k.base_address);
  w.put(k.size_bytes);
  w.put(k.n_blocks);
  w.put(k.block_bytes);
  w.put(k.n_slots);
  w.put(k.pid);
  w.put(k.host_id);
}

bool get_keys(ByteReader& r, RegionKeys* k) {
  k->endpoint_address = r.get_bytes(kMaxKeyBytes);
  k->rkey = r.get_bytes(kMaxKeyBytes);
  k->base_address = r.get<uint64_t>();
  k->size_bytes = r.get<uint64_t>();
  k->n_blocks = r.get<int32_t>();
  k->block_bytes = r.get<uint64_t>();
  k->n_slots = r.get<int32_t>();
  k->pid = r.get<uint32_t>();
  k->host_id = r.get<uint64_t>();
  if (!r.ok() || k->n_blocks < 0 || k->n_slots < 0) return false;
  // The blocks the peer names must lie inside the region it registered.
  unsigned __int128 blocks_bytes = static_cast<unsigned __int128>(k->block_bytes) * static_cast<uint64_t>(k->n_blocks);
  return blocks_bytes <= k->size_bytes && k->base_address + k->size_bytes >= k->base_address;
}

void put_nonce(ByteWriter& w, const Nonce& n) {
  for (uint8_t b : n) w.put(b);
}
Nonce get_nonce(ByteReader& r) {
  Nonce n{};
  for (uint8_t& b : n) b = r.get<uint8_t>();
  return n;
}

std::string describe_dtype(uint8_t dtype) {
  return dtype < kernels::kDTypeCount
             ? kernels::dtype_name(static_cast<kernels::DType>(dtype))
             : "dtype " + std::to_string(dtype);
}

}  // namespace

std::string_view name(HandshakeFailure failure) {
  switch (failure) {
    case HandshakeFailure::kNone: return "none";
    case HandshakeFailure::kBadFrame: return "bad_frame";
    case HandshakeFailure::kBadProof: return "bad_proof";
    case HandshakeFailure::kFingerprint: return "fingerprint";
    case HandshakeFailure::kRefusedByPeer: return "refused_by_peer";
  }
  return "?";
}

std::optional<std::string> fingerprint_difference(const Fingerprint& s, const Fingerprint& c,
                                                  std::string_view s_name, std::string_view c_name) {
  auto differs = [&](const char* field, const std::string& a, const std::string& b) {
    return std::string(field) + " differs: " + std::string(s_name) + " has " + a + ", " + std::string(c_name) +
           " has " + b;
  };
  auto num = [](auto v) { return std::to_string(v); };
  if (s.protocol_version != c.protocol_version)
    return differs("protocol_version", num(s.protocol_version), num(c.protocol_version));
  if (s.model_hash != c.model_hash)
    return differs("model (tensor table hash)", num(s.model_hash), num(c.model_hash));
  if (s.kv_dtype != c.kv_dtype) return differs("kv_dtype", describe_dtype(s.kv_dtype), describe_dtype(c.kv_dtype));
  if (s.block_size != c.block_size) return differs("block_size", num(s.block_size), num(c.block_size));
  if (s.kv_layout != c.kv_layout) return differs("kv_layout", num(s.kv_layout), num(c.kv_layout));
  if (s.n_layers != c.n_layers) return differs("n_layers", num(s.n_layers), num(c.n_layers));
  if (s.n_kv_heads != c.n_kv_heads) return differs("n_kv_heads", num(s.n_kv_heads), num(c.n_kv_heads));
  if (s.head_dim != c.head_dim) return differs("head_dim", num(s.head_dim), num(c.head_dim));
  if (s.mode != c.mode)
    return differs("transfer mode", std::string(pd::name(s.mode)), std::string(pd::name(c.mode)));
  return std::nullopt;
}

Handshake::Handshake(Side side, std::string secret, PeerIdentity self, RegionKeys keys, Nonce nonce)
    : side_(side), secret_(std::move(secret)), self_(self), keys_(std::move(keys)), nonce_(nonce) {}

Digest Handshake::mac(std::string_view label, const Nonce& first, const Nonce& second) const {
  return hmac_sha256(secret_, {std::span(reinterpret_cast<const uint8_t*>(label.data()), label.size()),
                               std::span<const uint8_t>(first), std::span<const uint8_t>(second)});
}

std::vector<uint8_t> Handshake::refuse(HandshakeFailure failure, std::string why) {
  state_ = State::kRefused;
  failure_ = failure;
  why_ = std::move(why);
  ByteWriter w;
  put_header(w, FrameKind::kRefuse);
  w.put_bytes(why_.substr(0, kMaxWhyBytes));
  return std::move(w.bytes());
}

std::vector<uint8_t> Handshake::start() {
  if (side_ != Side::kClient) return {};
  ByteWriter w;
  put_header(w, FrameKind::kHello);
  put_identity(w, self_);
  put_nonce(w, nonce_);
  return std::move(w.bytes());
}

std::vector<uint8_t> Handshake::on_frame(std::span<const uint8_t> frame) {
  if (state_ != State::kInProgress) return {};
  if (frame.size() > kMaxHandshakeFrameBytes) return refuse(HandshakeFailure::kBadFrame, "oversized hand-shake frame");
  ByteReader r(frame);
  uint32_t magic = r.get<uint32_t>();
  uint16_t version = r.get<uint16_t>();
  auto kind = static_cast<FrameKind>(r.get<uint8_t>());
  if (!r.ok() || magic != kHandshakeMagic) return refuse(HandshakeFailure::kBadFrame, "not a tandem hand-shake frame");
  if (version != kTransferProtocolVersion)
    return refuse(HandshakeFailure::kFingerprint,
                  "protocol_version differs: peer speaks " + std::to_string(version) + ", this instance " +
                      std::to_string(kTransferProtocolVersion));
  if (kind == FrameKind::kRefuse) {
    std::vector<uint8_t> why = r.get_bytes(kMaxWhyBytes);
    state_ = State::kRefused;
    failure_ = HandshakeFailure::kRefusedByPeer;
    why_ = "refused by the peer: " + std::string(why.begin(), why.end());
    return {};
  }
  ++frames_seen_;
  // The expected frame for each step: the server sees Hello then Proof, the
  // client Challenge then Welcome. Anything else is out of order.
  FrameKind expected = side_ == Side::kServer ? (frames_seen_ == 1 ? FrameKind::kHello : FrameKind::kProof)
                                              : (frames_seen_ == 1 ? FrameKind::kChallenge : FrameKind::kWelcome);
  if (kind != expected || frames_seen_ > 2) return refuse(HandshakeFailure::kBadFrame, "hand-shake frame out of order");

  switch (kind) {
    case FrameKind::kHello: {
      if (!get_identity(r, &peer_)) return refuse(HandshakeFailure::kBadFrame, "malformed Hello");
      peer_nonce_ = get_nonce(r);
      if (!r.ok() || !r.at_end()) return refuse(HandshakeFailure::kBadFrame, "malformed Hello");
      if (auto diff = fingerprint_difference(self_.fingerprint, peer_.fingerprint))
        return refuse(HandshakeFailure::kFingerprint, *diff);
      ByteWriter w;
      put_header(w, FrameKind::kChallenge);
      put_identity(w, self_);
      put_nonce(w, nonce_);
      Digest proof = mac("tandem-handshake-server", peer_nonce_, nonce_);
      w.put_bytes(proof);
      return std::move(w.bytes());
    }
    case FrameKind::kChallenge: {
      if (!get_identity(r, &peer_)) return refuse(HandshakeFailure::kBadFrame, "malformed Challenge");
      peer_nonce_ = get_nonce(r);
      std::vector<uint8_t> proof = r.get_bytes(64);
      if (!r.ok() || !r.at_end()) return refuse(HandshakeFailure::kBadFrame, "malformed Challenge");
      Digest expected_proof = mac("tandem-handshake-server", nonce_, peer_nonce_);
      if (!constant_time_equal(proof, expected_proof))
        return refuse(HandshakeFailure::kBadProof,
                      "authentication failed: the server does not hold this cluster secret");
      if (auto diff = fingerprint_difference(peer_.fingerprint, self_.fingerprint))
        return refuse(HandshakeFailure::kFingerprint, *diff);
      ByteWriter w;
      put_header(w, FrameKind::kProof);
      w.put_bytes(mac("tandem-handshake-client", peer_nonce_, nonce_));
      put_keys(w, keys_);
      return std::move(w.bytes());
    }
    case FrameKind::kProof: {
      std::vector<uint8_t> proof = r.get_bytes(64);
      if (!r.ok()) return refuse(HandshakeFailure::kBadFrame, "malformed Proof");
      // The MAC first: a peer that cannot prove the secret learns nothing more.
      if (!constant_time_equal(proof, mac("tandem-handshake-client", nonce_, peer_nonce_)))
        return refuse(HandshakeFailure::kBadProof,
                      "authentication failed: the client does not hold this cluster secret");
      if (!get_keys(r, &peer_keys_) || !r.at_end()) return refuse(HandshakeFailure::kBadFrame, "malformed Proof");
      state_ = State::kDone;
      ByteWriter w;
      put_header(w, FrameKind::kWelcome);
      put_keys(w, keys_);
      return std::move(w.bytes());
    }
    case FrameKind::kWelcome: {
      if (!get_keys(r, &peer_keys_) || !r.at_end()) return refuse(HandshakeFailure::kBadFrame, "malformed Welcome");
      state_ = State::kDone;
      return {};
    }
    case FrameKind::kRefuse:
      break;
  }
  return refuse(HandshakeFailure::kBadFrame, "unknown hand-shake frame");
}

}  // namespace tandem::transport
