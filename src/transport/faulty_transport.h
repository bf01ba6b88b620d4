// A test knob on the real transport: drops, duplicates and delays control
// frames (never RMA) by a seeded generator, so a soak of real processes sees
// the faults the simulator injects. Off unless configured (`tandem serve
// --test-faults`); a production instance never wraps its transport.
#pragma once

#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "transport/transport.h"

namespace tandem::transport {

struct FaultSpec {
  uint64_t seed = 1;
  double drop = 0;       // probability a frame is lost
  double duplicate = 0;  // probability it is sent twice
  double delay = 0;      // probability it is held back
  int max_delay_ms = 0;  // for how long at most (uniform)
  bool any() const { return drop > 0 || duplicate > 0 || delay > 0; }
};

// "seed=7,drop=0.05,dup=0.05,delay=0.1,max_delay_ms=200"; throws tandem::Error naming a bad key.
FaultSpec parse_fault_spec(const std::string& text);

struct FaultCounters {
  int64_t dropped = 0;
  int64_t duplicated = 0;
  int64_t delayed = 0;
  int64_t lost_with_connection = 0;  // held past the end of their connection
};

class FaultyTransport final : public Transport {
 public:
  FaultyTransport(std::unique_ptr<Transport> inner, const FaultSpec& spec);

  void connect(const std::string& host, uint16_t port) override { inner_->connect(host, port); }
  bool send(pd::NodeId peer, std::span<const uint8_t> frame) override;
  void post(pd::NodeId peer, RmaOp op, std::vector<RmaRun> runs, uint64_t tag, pd::TimeMs deadline_ms,
            uint64_t connection) override {
    inner_->post(peer, op, std::move(runs), tag, deadline_ms, connection);
  }
  void fence(pd::NodeId peer, pd::Epoch epoch) override { inner_->fence(peer, epoch); }
  void poll(int timeout_ms, std::vector<TransportEvent>* events) override;
  void wake() override { inner_->wake(); }
  uint16_t listen_port() const override { return inner_->listen_port(); }
  const FaultCounters& counters() const { return counters_; }

 private:
  // A held frame belongs to the connection it was sent on: it is lost with
  // it (a real frame never moves to a newer connection).
  struct Held {
    pd::TimeMs due_ms;
    pd::NodeId peer;
    uint64_t connection;
    std::vector<uint8_t> frame;
  };
  std::map<pd::NodeId, uint64_t> connection_;  // the current one, from kConnected
  std::unique_ptr<Transport> inner_;
  FaultSpec spec_;
  std::mt19937_64 rng_;
  std::vector<Held> held_;
  FaultCounters counters_;
};

}  // namespace tandem::transport
