// The Transport over UCX (ucp, 1.13): one context and worker per instance,
// the KV pool registered once, one endpoint per authenticated peer with peer
// error handling, control frames as eager active messages, RMA put/get per
// contiguous run followed by an endpoint flush (a put is reported complete
// only after the flush, so WriteDone never overtakes its data: UCX orders no
// active message against RMA). The hand-shake runs on a plain TCP listener
// first; no endpoint exists to, and no key is sent to, an unauthenticated peer.
//
// Fencing (docs/PD_PROTOCOL.md, "Fencing"): with UCX restricted to TCP, a
// forced close of the peer's endpoint is a fence (incoming puts are applied by
// our own progress, over the sockets that close). With shared-memory
// transports (sm/cma) a live peer can write into our pool whatever we close,
// so the peer counts as fenced only when its process is gone (a pidfd); a peer
// in another PID namespace or on another host cannot be fenced that way and is
// refused for shared-memory RMA at the hand-shake.
#pragma once

#include <memory>
#include <string>

#include "transport/transport.h"

namespace tandem::transport {

struct UcxTransportConfig {
  std::string secret;  // the cluster secret (must not be empty)
  PeerIdentity self;
  // The registered pool: n_blocks blocks of block_bytes from `region`.
  void* region = nullptr;
  uint64_t region_bytes = 0;
  int32_t n_blocks = 0;
  uint64_t block_bytes = 0;
  int32_t n_slots = 0;
  std::string listen_host = "127.0.0.1";
  uint16_t listen_port = 0;  // 0: pick a free one
  // UCX transports (UCX_TLS): "tcp" fences by closing; anything with sm/cma
  // (e.g. "tcp,sm,self") fences by the peer's exit, on one host only.
  std::string tls = "tcp";
  std::string net_devices;   // UCX_NET_DEVICES; empty: UCX's default
  int keepalive_interval_ms = 1000;  // UCP keepalive (dead peers on shared memory)
  int handshake_timeout_ms = 5000;
  int max_bootstrap_connections = 64;
};

struct TransportCounters {
  int64_t handshakes_ok = 0;
  int64_t handshakes_refused = 0;  // by us or by the peer
  int64_t connections_rejected = 0;  // UCX connection requests from no authenticated peer
  int64_t frames_sent = 0;
  int64_t frames_received = 0;
  int64_t frames_dropped_unknown_peer = 0;
  int64_t rma_posted = 0;
  int64_t rma_failed = 0;
  int64_t rma_deadline_exceeded = 0;
  int64_t bytes_moved = 0;
  int64_t peer_failures = 0;
};

class UcxTransport final : public Transport {
 public:
  // Throws tandem::Error when UCX cannot be initialised or the listener bound.
  explicit UcxTransport(const UcxTransportConfig& config);
  ~UcxTransport() override;

  void connect(const std::string& host, uint16_t port) override;
  bool send(pd::NodeId peer, std::span<const uint8_t> frame) override;
  void post(pd::NodeId peer, RmaOp op, std::vector<RmaRun> runs, uint64_t tag,
            pd::TimeMs deadline_ms, uint64_t connection) override;
  void fence(pd::NodeId peer, pd::Epoch epoch) override;
  void poll(int timeout_ms, std::vector<TransportEvent>* events) override;
  void wake() override;
  uint16_t listen_port() const override;

  // Whether closing an endpoint stops the peer's RMA with this configuration.
  bool fences_by_close() const;
  const TransportCounters& counters() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::transport
