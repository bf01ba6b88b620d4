// The link between the engine core and a tensor-parallel worker on another
// host: one TCP connection carrying what the rings and the status page carry
// on one host (tensor_wire.h). The core sends the job and then each step;
// the worker sends its replies and, every heartbeat, its status.
//
// Framing: a fixed header (magic, kind, step id, payload length) and the
// payload. Everything read is input from the wire: a bad magic or a payload
// over the reader's bound ends the link with an error, never an assert.
// Every send and every receive is bounded (poll in slices); a closed or
// reset connection is an error naming the peer, and keepalive probes end a
// link whose peer's host vanished silently within about 25 s.
//
// Not authenticated, like the gloo group the workers form: bind it to an
// address only the cluster's hosts reach (the default is loopback).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace tandem::cli {

// Kinds beyond the rings' StepKind and ReplyKind values (1..3).
enum class LinkKind : uint32_t { kHello = 16, kJob = 17, kStatus = 18 };

struct LinkMessage {
  uint32_t kind = 0;
  int64_t step_id = 0;
  std::vector<uint8_t> payload;
};

class TensorLink {
 public:
  // Connects within timeout_ms; throws tandem::Error naming the address.
  static std::unique_ptr<TensorLink> connect(const std::string& host, int port, int64_t timeout_ms);
  TensorLink(int fd, std::string peer);
  ~TensorLink();
  TensorLink(const TensorLink&) = delete;
  TensorLink& operator=(const TensorLink&) = delete;

  // Whole message or an Error (timeout, closed, reset); safe from several threads.
  void send(uint32_t kind, int64_t step_id, std::span<const uint8_t> payload, int64_t timeout_ms);
  // The next message: true when one arrived within timeout_ms, false on the
  // timeout (nothing of a message consumed: a partial one is finished first,
  // within a further timeout_ms). Throws Error when the peer closed, the
  // connection broke, or a header is malformed or announces more than
  // max_payload_bytes. One reading thread at a time.
  bool receive(LinkMessage& out, int64_t timeout_ms, uint64_t max_payload_bytes);
  // Ends the connection: a receive or send under way on another thread fails.
  void close_now();
  const std::string& peer() const { return peer_; }

 private:
  void read_exact(uint8_t* p, size_t n, int64_t timeout_ms);
  int fd_;
  std::string peer_;
  std::mutex send_mu_;
};

// The core's listening socket for workers on other hosts.
class LinkListener {
 public:
  // Binds host:port (0: any free port); throws Error.
  LinkListener(const std::string& host, int port);
  ~LinkListener();
  LinkListener(const LinkListener&) = delete;
  LinkListener& operator=(const LinkListener&) = delete;
  // A connection within timeout_ms, or null.
  std::unique_ptr<TensorLink> accept(int64_t timeout_ms);
  int port() const { return port_; }
  const std::string& host() const { return host_; }

 private:
  int fd_ = -1;
  int port_ = 0;
  std::string host_;
};

}  // namespace tandem::cli
