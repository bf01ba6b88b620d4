// The transfer agent of a prefill or decode instance: one thread that owns
// the instance's protocol core (pd::PrefillSide or pd::DecodeSide) and its
// transport, and bridges both to the engine.
//
// Everything the core decides runs here, in the drivers' contract order
// (docs/PD_PROTOCOL.md): a call's effects first (engine work, RMA posts,
// frees), then its messages. Other threads (HTTP handlers, the engine's output
// sinks) never touch the core: they post closures to the agent's inbox and
// wake its poll. The thread never sleeps longer than the core's next timer, a
// transport deadline, or max_sleep_ms.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine_core.h"
#include "engine/request.h"
#include "pd/decode_side.h"
#include "pd/prefill_side.h"
#include "transport/transport.h"
#include "transport/wire.h"

namespace tandem::instance {

struct TransferAgentConfig {
  pd::Role role = pd::Role::kDecode;  // kPrefill or kDecode
  pd::NodeId node = 0;
  pd::Epoch epoch = 1;
  pd::NodeId router_node = 1;  // Starts come from it (over HTTP); its acks and outcomes stay local
  pd::ProtocolConfig protocol;
  int64_t rma_timeout_ms = 60'000;  // one put or get; then its endpoint is force-closed
  int max_sleep_ms = 50;
  int64_t reconnect_ms = 2000;
  // Test knob: the decode admits each request this much later (seed 000's
  // slow admission, scaled down). 0 in production.
  int64_t test_admission_delay_ms = 0;
  // Test-only (built with TANDEM_PD_MUTATIONS): the RMA skips the blocks of
  // a hybrid model's state slot, so the decode runs from a state that never
  // arrived.
  bool mutation_skip_state_transfer = false;
};

// One client request's part on this instance, as the router hands it over.
struct PdRequest {
  pd::TransferId transfer = 0;
  pd::TransferMode mode = pd::TransferMode::kWrite;
  pd::NodeId peer = 0;
  pd::Epoch peer_epoch = 0;
  pd::Epoch router_epoch = 1;
  pd::TimeMs budget_ms = 900'000;
  std::vector<int32_t> prompt;
  SamplingParams params;  // decode: the sampling of every sibling
  OutputSink sink;        // decode: the client's outputs; prefill: unused
};

// When each step of one transfer happened on this instance, in
// monotonic_us() time (CLOCK_MONOTONIC: comparable across the processes of
// one host), 0 for steps it never reached. Where a request's time goes.
struct TransferTimeline {
  pd::TransferId transfer = 0;
  int64_t submitted_us = 0;    // the router's leg arrived
  int64_t engine_kv_us = 0;    // prefill: KV computed; decode: blocks allocated
  int64_t rma_posted_us = 0;   // prefill WRITE: put posted; decode READ: get posted
  int64_t rma_done_us = 0;     // ... and flushed / completed
  int64_t kv_ready_us = 0;     // decode: siblings started (KV complete)
  int64_t first_output_us = 0; // decode: the first token left the engine
  int64_t ended_us = 0;        // the transfer's record went (tombstone swept)
};

// Counters the agent keeps beyond the core's (debug endpoint, metrics, tests).
struct AgentCounters {
  std::array<int64_t, transport::kWireErrorCount> wire_errors{};
  int64_t spoofed_frames = 0;     // a frame whose sender is not the endpoint's peer
  int64_t unsent_messages = 0;    // peer not connected (yet): the core retransmits
  int64_t rma_posts = 0;
  int64_t rma_failures = 0;
  int64_t exposes = 0;
  int64_t exposures_ended = 0;
  int64_t fences_requested = 0;
  int64_t fences_completed = 0;
  int64_t blocks_freed = 0;
};

class TransferAgent {
 public:
  TransferAgent(EngineCore& engine, std::unique_ptr<transport::Transport> transport,
                const TransferAgentConfig& config);
  ~TransferAgent();
  TransferAgent(const TransferAgent&) = delete;
  TransferAgent& operator=(const TransferAgent&) = delete;

  void start();
  void stop();

  // Thread-safe. Connects to a peer instance's transfer listener.
  void connect(const std::string& host, uint16_t port);
  // Thread-safe. Connects unless `node` is connected or a try is under way
  // (a failed try is repeated after reconnect_ms).
  void ensure_connected(pd::NodeId node, const std::string& host, uint16_t port);
  // Thread-safe. Hands a request to the protocol (a Start from the router).
  void submit(PdRequest request);
  // Thread-safe. The client went away: the transfer ends (idempotent).
  void cancel(pd::TransferId transfer);
  // Thread-safe. The router's Abort (the other leg failed, or the client left
  // the router): it names the peer, so even a transfer this side has not
  // started yet releases the peer.
  void abort_from_router(pd::TransferId transfer);
  // Thread-safe. Refuse new transfers from now on (shutdown); live ones go on.
  void begin_drain();
  uint16_t listen_port() const { return listen_port_; }

  // A snapshot taken on the agent thread (bounded wait; nullopt if it does not answer).
  struct Snapshot {
    std::array<int64_t, 7> transfers_by_state{};
    std::array<pd::StateAge, 7> ages_by_state{};
    pd::NodeStats stats;
    AgentCounters counters;
    int64_t blocks_held = 0;
    int64_t quarantined_blocks = 0;  // held by transfers that ended (the router's credits count them)
    std::vector<pd::NodeId> connected_peers;
    // Peer incarnations being fenced (memory exposed to them stays quarantined).
    std::vector<std::pair<pd::NodeId, pd::Epoch>> fences_pending;
    int64_t live_transfers = 0;  // not yet ended
    int64_t requests_tracked = 0;
    std::vector<TransferTimeline> recent;  // the last kRecentTimelines finished ones, oldest first
  };
  std::optional<Snapshot> snapshot(int timeout_ms = 1000);

 private:
  using Closure = std::function<void()>;
  void post(Closure c);
  void loop();
  void run(const std::function<void(pd::Outputs*)>& call);
  void execute(pd::Outputs& out);
  void apply(const pd::Effect& e);
  void send(const pd::Message& m);
  void on_event(transport::TransportEvent& e);
  void on_engine_output(pd::TransferId transfer, RequestOutput&& out);
  void start_engine_request(const pd::Effect& e);
  void sweep_requests();
  pd::NodeCore& core();
  uint64_t engine_id(pd::TransferId t) const { return t + (uint64_t{1} << 62); }
  pd::Message start_message(const PdRequest& r) const;

  EngineCore& engine_;
  std::unique_ptr<transport::Transport> transport_;
  TransferAgentConfig config_;
  uint16_t listen_port_ = 0;
  uint64_t block_bytes_ = 0;
  std::unique_ptr<pd::PrefillSide> prefill_;
  std::unique_ptr<pd::DecodeSide> decode_;

  // Agent thread only.
  std::map<pd::TransferId, PdRequest> requests_;  // until the core's transfer has a tombstone
  std::map<pd::TransferId, std::vector<pd::SiblingId>> siblings_;
  std::set<pd::TransferId> engine_started_;  // the engine has (or had) the request
  std::set<pd::TransferId> handed_over_;     // decode: blocks given to the engine at StartSiblings
  std::map<pd::TransferId, TransferTimeline> timelines_;  // live
  std::deque<TransferTimeline> recent_;                   // finished, bounded
  static constexpr size_t kRecentTimelines = 64;
  TransferTimeline& timeline(pd::TransferId t) { return timelines_[t]; }
  struct Peer {
    pd::Epoch epoch = 0;
    transport::WireLimits limits;
  };
  std::map<pd::NodeId, Peer> peers_;
  // The connection each transfer's peer addresses came on: its RMA may use
  // only that one (a fence cuts it, and the memory may be reused after).
  struct AddressBinding {
    uint64_t connection = 0;
    pd::TimeMs bound_ms = 0;
  };
  std::map<pd::TransferId, AddressBinding> address_connection_;
  std::map<pd::NodeId, pd::TimeMs> connecting_since_ms_;
  std::vector<std::pair<pd::TimeMs, Closure>> delayed_;  // test_admission_delay_ms
  pd::TimeMs next_wake_ms_ = 0;
  pd::TimeMs next_sweep_ms_ = 0;
  AgentCounters counters_;

  std::mutex mu_;
  std::deque<Closure> inbox_;
  std::atomic<bool> running_{false};
  std::thread thread_;
};

}  // namespace tandem::instance
