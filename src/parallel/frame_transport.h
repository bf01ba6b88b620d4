// The one channel a lockstep group's control frames travel in.
//
// Implemented by gloo over TCP in production (transport/gloo_transport.h) and
// by an in-process fabric of N ranks in tests (parallel/sim_fabric.h). Frames
// from one rank to another arrive in the order sent, all on one channel, so
// ranks that disagree about which op they are in still exchange frames.
#pragma once

#include <functional>
#include <span>
#include <stdexcept>
#include <string>

#include "parallel/frame.h"

namespace tandem::parallel {

// The channel itself failed: a peer is gone, or the hard deadline passed.
// The group is unusable afterwards and must be rebuilt.
class TransportError : public std::runtime_error {
 public:
  explicit TransportError(const std::string& message) : std::runtime_error(message) {}
};

class FrameTransport {
 public:
  virtual ~FrameTransport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Sends `mine` to every peer and fills all[r] with rank r's frame
  // (all[rank()] = mine). `arrived(r)` is called as each peer's frame lands,
  // on the calling thread. Throws TransportError.
  virtual void exchange(const Frame& mine, std::span<Frame> all, const std::function<void(int)>& arrived) = 0;
  // The data phase of an op, after its frames agreed on the sizes: sends
  // send_bytes[r] bytes (packed in rank order in `send`) to each rank r and
  // receives recv_bytes[r] from each into `recv` (packed likewise).
  // `largest_send_bytes` is the most any rank sends in this phase (every
  // rank knows it from the frames), so every rank picks the same path.
  // Throws TransportError.
  virtual void all_to_all(const void* send, std::span<const int64_t> send_bytes, void* recv,
                          std::span<const int64_t> recv_bytes, int64_t largest_send_bytes) = 0;
};

}  // namespace tandem::parallel
