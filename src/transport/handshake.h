// The hand-shake two instances run once per peer incarnation, before any
// memory key or address crosses (sans-IO: frames in, frames out; the driver
// owns the socket, the nonces and the deadline).
//
//   client -> server  Hello      identity, fingerprint, client nonce
//   server -> client  Challenge  identity, fingerprint, server nonce,
//                                MAC(secret, "server" | client nonce | server nonce)
//   client -> server  Proof      MAC(secret, "client" | server nonce | client nonce), client keys
//   server -> client  Welcome    server keys
//   either            Refuse     why (a differing fingerprint field, a failed proof)
//
// Each side proves it holds the cluster secret by a MAC over the other's fresh
// nonce, so the secret never crosses the wire and a recorded exchange cannot be
// replayed; the two MACs are domain-separated, so one cannot be reflected as
// the other. A side sends its keys only after it has verified the peer's MAC.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "pd/types.h"
#include "transport/sha256.h"

namespace tandem::transport {

// Bumped with every change to the protocol's messages (transport/wire.h's
// kWireVersion): peers of two versions refuse each other at the hand-shake,
// naming the field, instead of dropping every frame.
constexpr uint16_t kTransferProtocolVersion = 2;
using Nonce = std::array<uint8_t, 32>;

// What two instances must agree on before KV bytes may move between them.
struct Fingerprint {
  uint64_t model_hash = 0;  // a hash of the model's tensor table (names, types, shapes)
  uint8_t kv_dtype = 0;     // kernels::DType
  int32_t block_size = 0;
  int32_t kv_layout = 0;    // version of kernels/kv_layout.h's placement
  int32_t n_layers = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  uint16_t protocol_version = kTransferProtocolVersion;
  pd::TransferMode mode = pd::TransferMode::kWrite;
};

// The first field in which two fingerprints differ, as a sentence naming it and
// both values ("kv_dtype differs: server has f16, client has bf16"); nullopt if equal.
std::optional<std::string> fingerprint_difference(const Fingerprint& server, const Fingerprint& client,
                                                  std::string_view server_name = "server",
                                                  std::string_view client_name = "client");

// Who a peer is and how to reach its registered memory.
struct PeerIdentity {
  pd::NodeId node = 0;
  pd::Epoch epoch = 0;
  pd::Role role = pd::Role::kRouter;
  Fingerprint fingerprint;
};
struct RegionKeys {
  std::vector<uint8_t> endpoint_address;  // how the transport's endpoint is reached (opaque here)
  std::vector<uint8_t> rkey;            // packed memory key of the registered pool
  uint64_t base_address = 0;
  uint64_t size_bytes = 0;
  int32_t n_blocks = 0;
  uint64_t block_bytes = 0;
  int32_t n_slots = 0;
  // The process behind the keys: on one host a peer is fenced by its exit.
  uint32_t pid = 0;
  uint64_t host_id = 0;  // same value: same boot, PID and IPC namespaces
};

enum class HandshakeFailure : uint8_t {
  kNone,
  kBadFrame,      // malformed, out of order, or oversized
  kBadProof,      // the peer's MAC does not match our secret
  kFingerprint,   // model, layout or mode differ
  kRefusedByPeer,
};
std::string_view name(HandshakeFailure failure);

constexpr size_t kMaxHandshakeFrameBytes = 64 * 1024;

class Handshake {
 public:
  enum class Side : uint8_t { kClient, kServer };
  enum class State : uint8_t { kInProgress, kDone, kRefused };

  Handshake(Side side, std::string secret, PeerIdentity self, RegionKeys keys, Nonce nonce);

  // Client: the Hello to send first. Server: empty.
  std::vector<uint8_t> start();
  // One frame from the peer; returns the frame to send back (may be empty).
  std::vector<uint8_t> on_frame(std::span<const uint8_t> frame);

  State state() const { return state_; }
  Side side() const { return side_; }
  HandshakeFailure failure() const { return failure_; }
  const std::string& why() const { return why_; }
  // Valid once state() == kDone.
  const PeerIdentity& peer() const { return peer_; }
  const RegionKeys& peer_keys() const { return peer_keys_; }

 private:
  std::vector<uint8_t> refuse(HandshakeFailure failure, std::string why);
  Digest mac(std::string_view label, const Nonce& first, const Nonce& second) const;

  Side side_;
  std::string secret_;
  PeerIdentity self_;
  RegionKeys keys_;
  Nonce nonce_;
  Nonce peer_nonce_{};
  State state_ = State::kInProgress;
  int frames_seen_ = 0;
  HandshakeFailure failure_ = HandshakeFailure::kNone;
  std::string why_;
  PeerIdentity peer_;
  RegionKeys peer_keys_;
};

}  // namespace tandem::transport
