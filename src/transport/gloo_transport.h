// The lockstep group's frame channel over gloo (Debian libgloo-dev) on TCP.
//
// Ranks meet through a gloo FileStore in a directory they share (one host,
// or network namespaces of one host), under a prefix per generation of the
// group so a rebuilt group never reads a dead one's keys. Each exchange sends
// this rank's frame to every peer on one fixed slot, so frames between two
// ranks arrive in the order sent, and receives one frame from each peer,
// reporting each arrival as it lands. Every wait is bounded by the group's
// timeout; gloo closes the group's connections when one passes, so a
// TransportError means the group must be rebuilt.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "parallel/frame_transport.h"

namespace gloo {
class Context;
namespace transport {
class UnboundBuffer;
}
}  // namespace gloo

namespace tandem {

class ShmFrames;

struct GlooGroupOptions {
  int rank = 0;
  int size = 1;
  std::string rendezvous_dir;      // shared by every rank; must exist
  std::string generation = "g0";   // a fresh one per (re)build of the group
  std::string bind_host = "127.0.0.1";  // this rank's address for its peers
  int timeout_ms = 30'000;         // rendezvous and every exchange
  // When set and raised, a rendezvous under way gives up within about a
  // second (so stopping never waits for a peer that is not coming).
  const std::atomic<bool>* interrupted = nullptr;
  // Every rank on this host: control frames through shared memory
  // (shm_frames.h), data through gloo.
  bool shared_memory_frames = false;
};

class GlooTransport : public parallel::FrameTransport {
 public:
  // Connects the full mesh; throws parallel::TransportError when the peers
  // do not all arrive within the timeout.
  explicit GlooTransport(const GlooGroupOptions& options);
  ~GlooTransport() override;
  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  void exchange(const parallel::Frame& mine, std::span<parallel::Frame> all,
                const std::function<void(int)>& arrived) override;
  void all_to_all(const void* send, std::span<const int64_t> send_bytes, void* recv,
                  std::span<const int64_t> recv_bytes, int64_t largest_send_bytes) override;

 private:
  GlooGroupOptions options_;
  std::shared_ptr<gloo::Context> context_;
  parallel::Frame send_frame_;
  std::unique_ptr<parallel::Frame[]> recv_frames_;
  std::unique_ptr<gloo::transport::UnboundBuffer> send_buf_;
  std::unique_ptr<gloo::transport::UnboundBuffer> recv_buf_;
  std::unique_ptr<ShmFrames> shm_;  // when options.shared_memory_frames
};

}  // namespace tandem
