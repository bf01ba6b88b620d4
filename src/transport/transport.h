// The KV transfer agent's view of the network: control messages to peers,
// RMA on a peer's registered pool, fencing a peer, and one poll() that
// reports what happened. One thread owns a Transport and calls every method
// (the protocol core runs on that thread too); only wake() may be called from
// any thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "pd/types.h"
#include "transport/handshake.h"

namespace tandem::transport {

// One contiguous run of bytes: blocks first..first+n of the local pool to (or
// from) the same-sized run of the peer's pool. Offsets are from each pool's base.
struct RmaRun {
  uint64_t local_offset = 0;
  uint64_t remote_offset = 0;
  uint64_t size_bytes = 0;
};
enum class RmaOp : uint8_t { kPut, kGet };

struct TransportEvent {
  enum class Kind : uint8_t {
    kConnected,  // a hand-shake completed; `peer`, `identity`, `keys`
    kRefused,    // a hand-shake failed; `detail` says why (both sides get one)
    kMessage,    // a control frame from an authenticated peer; `frame`
    kRmaDone,    // an operation completed (`ok`), tagged `tag`. A put is
                 // complete at the target (flushed) before kRmaDone reports ok
    kPeerFailed, // the peer's endpoint failed (error callback, or a forced close)
    kPeerFenced, // no RMA of the peer's can reach our memory any more
  };
  Kind kind = Kind::kMessage;
  pd::NodeId peer = 0;
  pd::Epoch peer_epoch = 0;
  // Which connection to the peer (kConnected, kMessage, kPeerFailed): every
  // hand-shake makes a new one, numbered from 1. Addresses a peer sent are
  // good only on the connection they came on (see post()).
  uint64_t connection = 0;
  uint64_t tag = 0;
  bool ok = false;
  std::string detail;
  std::vector<uint8_t> frame;
  PeerIdentity identity;
  RegionKeys keys;
};

class Transport {
 public:
  virtual ~Transport() = default;
  // Starts a hand-shake with the instance whose transfer listener is at host:port.
  virtual void connect(const std::string& host, uint16_t port) = 0;
  // Sends a control frame; best effort (the protocol retransmits). False when
  // the peer is not connected.
  virtual bool send(pd::NodeId peer, std::span<const uint8_t> frame) = 0;
  // Posts RMA runs on the peer's pool, on `connection` (the one the peer's
  // addresses came on): if that connection is gone, the operation fails at
  // once, since a fence may have cut it and the memory since been reused.
  // kRmaDone(tag) follows exactly once. An operation still running at
  // deadline_ms (monotonic_ms() time) is cancelled by force-closing its
  // endpoint, and reported failed once the close is over: nothing of it can
  // land after its report.
  virtual void post(pd::NodeId peer, RmaOp op, std::vector<RmaRun> runs, uint64_t tag,
                    pd::TimeMs deadline_ms, uint64_t connection) = 0;
  // Cuts the peer incarnation off. kPeerFenced(peer, epoch) follows once the
  // transport can guarantee that no RMA of it reaches our memory any more.
  virtual void fence(pd::NodeId peer, pd::Epoch epoch) = 0;
  // Waits at most timeout_ms for activity and appends what happened.
  virtual void poll(int timeout_ms, std::vector<TransportEvent>* events) = 0;
  // Interrupts a poll() in progress; callable from any thread.
  virtual void wake() = 0;
  // Where peers connect for the hand-shake.
  virtual uint16_t listen_port() const = 0;
};

}  // namespace tandem::transport
