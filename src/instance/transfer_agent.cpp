#include "instance/transfer_agent.h"

#include <algorithm>
#include <cstdio>
#include <condition_variable>
#include <future>

#include "util/clock.h"
#include "util/error.h"

namespace tandem::instance {

using pd::EffectKind;
using pd::MessageKind;
using transport::TransportEvent;

namespace {

// Adjacent block pairs (local b, remote r) and (b+1, r+1) merge into one run,
// so a request's KV moves in as few RMA operations as its allocation allows.
std::vector<transport::RmaRun> coalesce(const std::vector<pd::BlockId>& local, const std::vector<pd::BlockId>& remote,
                                        uint64_t block_bytes) {
  std::vector<transport::RmaRun> runs;
  for (size_t i = 0; i < local.size() && i < remote.size(); ++i) {
    uint64_t l = static_cast<uint64_t>(local[i]) * block_bytes, r = static_cast<uint64_t>(remote[i]) * block_bytes;
    if (!runs.empty() && runs.back().local_offset + runs.back().size_bytes == l &&
        runs.back().remote_offset + runs.back().size_bytes == r) {
      runs.back().size_bytes += block_bytes;
    } else {
      runs.push_back({l, r, block_bytes});
    }
  }
  return runs;
}

}  // namespace

TransferAgent::TransferAgent(EngineCore& engine, std::unique_ptr<transport::Transport> transport,
                             const TransferAgentConfig& config)
    : engine_(engine), transport_(std::move(transport)), config_(config) {
  TANDEM_ASSERT(config.role == pd::Role::kPrefill || config.role == pd::Role::kDecode);
  config_.protocol.block_size_tokens = static_cast<int32_t>(engine.kv_pool().shape().block_size);
  // A hybrid model's state slot moves as this many blocks after the KV ones.
  config_.protocol.state_blocks = engine.kv_pool().state_slot_blocks();
  block_bytes_ = engine.kv_pool().block_bytes();
  listen_port_ = transport_->listen_port();
  auto capacity = static_cast<int32_t>(engine.n_kv_blocks());
  if (config.role == pd::Role::kPrefill)
    prefill_ = std::make_unique<pd::PrefillSide>(config.node, config.epoch, capacity, config_.protocol);
  else
    decode_ = std::make_unique<pd::DecodeSide>(config.node, config.epoch, capacity, config_.protocol);
}

TransferAgent::~TransferAgent() { stop(); }

pd::NodeCore& TransferAgent::core() {
  if (prefill_) return *prefill_;
  return *decode_;
}

void TransferAgent::start() {
  if (running_.exchange(true)) return;
  thread_ = std::thread([this] { loop(); });
}

void TransferAgent::stop() {
  if (!running_.exchange(false)) return;
  transport_->wake();
  if (thread_.joinable()) thread_.join();
}

void TransferAgent::post(Closure c) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    inbox_.push_back(std::move(c));
  }
  transport_->wake();
}

void TransferAgent::connect(const std::string& host, uint16_t port) {
  post([this, host, port] { transport_->connect(host, port); });
}

void TransferAgent::ensure_connected(pd::NodeId node, const std::string& host, uint16_t port) {
  post([this, node, host, port] {
    if (peers_.count(node) != 0) return;
    pd::TimeMs now = monotonic_ms();
    auto it = connecting_since_ms_.find(node);
    if (it != connecting_since_ms_.end() && now - it->second < config_.reconnect_ms) return;
    connecting_since_ms_[node] = now;
    transport_->connect(host, port);
  });
}

void TransferAgent::submit(PdRequest request) {
  post([this, r = std::move(request)]() mutable {
    pd::Message start = start_message(r);
    TransferTimeline& tl = timeline(r.transfer);
    tl.transfer = r.transfer;
    tl.submitted_us = monotonic_us();
    requests_[r.transfer] = std::move(r);
    run([&](pd::Outputs* out) { core().on_message(start, monotonic_ms(), out); });
  });
}

void TransferAgent::cancel(pd::TransferId transfer) {
  post([this, transfer] {
    run([&](pd::Outputs* out) {
      if (prefill_) prefill_->cancel(transfer, pd::EndReason::kClientAbort, monotonic_ms(), out);
      else decode_->cancel(transfer, pd::EndReason::kClientAbort, monotonic_ms(), out);
    });
  });
}

void TransferAgent::begin_drain() {
  post([this] { core().begin_drain(); });
}

void TransferAgent::abort_from_router(pd::TransferId transfer) {
  post([this, transfer] {
    // The router's Abort, as the core knows it: it names the peer, so a
    // transfer this side never started still releases the peer.
    auto it = requests_.find(transfer);
    pd::Message abort;
    abort.kind = MessageKind::kAbort;
    abort.from = config_.router_node;
    abort.from_epoch = it != requests_.end() ? it->second.router_epoch : 1;
    abort.to = config_.node;
    abort.to_epoch = config_.epoch;
    abort.transfer = transfer;
    if (it != requests_.end()) {
      abort.peer = it->second.peer;
      abort.peer_epoch = it->second.peer_epoch;
    }
    run([&](pd::Outputs* out) { core().on_message(abort, monotonic_ms(), out); });
  });
}

pd::Message TransferAgent::start_message(const PdRequest& r) const {
  pd::Message m;
  m.kind = config_.role == pd::Role::kPrefill ? MessageKind::kStartPrefill : MessageKind::kStartDecode;
  m.from = config_.router_node;
  m.from_epoch = r.router_epoch;
  m.to = config_.node;
  m.to_epoch = config_.epoch;
  m.transfer = r.transfer;
  m.mode = r.mode;
  m.peer = r.peer;
  m.peer_epoch = r.peer_epoch;
  m.prompt_tokens = static_cast<int32_t>(r.prompt.size());
  m.n_siblings = std::max(1, r.params.best_of);
  m.max_tokens = r.params.max_tokens;
  m.budget_ms = r.budget_ms;
  return m;
}

void TransferAgent::run(const std::function<void(pd::Outputs*)>& call) {
  pd::Outputs out;
  call(&out);
  execute(out);
}

void TransferAgent::execute(pd::Outputs& out) {
  // The drivers' contract: effects before messages.
  for (const pd::Effect& e : out.effects) apply(e);
  for (const pd::Message& m : out.messages) send(m);
  // The earliest of every call's wish: calls nest (an effect's engine refusal
  // runs the core again), and an inner call's earlier timer must not be lost.
  next_wake_ms_ = std::min(next_wake_ms_, out.wake_at_ms);
  out.clear();
}

void TransferAgent::send(const pd::Message& m) {
  if (m.to == config_.router_node) {
    // The router hears a request's fate through the client stream; what the
    // core would tell it is acted on here. A decode that fails a transfer
    // whose request still waits for its KV fails the request.
    if (m.kind == MessageKind::kOutcome && m.reason != pd::EndReason::kCompleted && decode_) {
      std::string why = "the KV transfer from the prefill instance failed (" + std::string(pd::name(m.reason)) + ")";
      auto r = requests_.find(m.transfer);
      if (engine_started_.count(m.transfer) != 0) {
        engine_.fail_request(engine_id(m.transfer), std::move(why));
      } else if (r != requests_.end() && r->second.sink) {
        // The engine never had it: the client hears it from here, once.
        RequestOutput fail;
        fail.finished = true;
        fail.error = std::move(why);
        auto sink = std::move(r->second.sink);
        r->second.sink = nullptr;
        sink(std::move(fail));
      }
    }
    return;
  }
  if (!transport_->send(m.to, transport::encode_message(m))) ++counters_.unsent_messages;
}

void TransferAgent::start_engine_request(const pd::Effect& e) {
  auto it = requests_.find(e.transfer);
  TANDEM_ASSERT(it != requests_.end(), "an engine effect for a request the agent never submitted");
  PdRequest& r = it->second;
  EngineRequest er;
  er.id = engine_id(e.transfer);
  er.prompt = r.prompt;
  er.kv_role = e.kind == EffectKind::kComputePrefill ? KvRole::kPrefillOnly : KvRole::kRemoteKv;
  if (e.kind == EffectKind::kComputePrefill) {
    er.params.max_tokens = 1;  // nothing is sampled; the engine's checks see one token
  } else {
    er.params = r.params;
  }
  pd::TransferId transfer = e.transfer;
  er.sink = [this, transfer](RequestOutput&& out) { on_engine_output(transfer, std::move(out)); };
  engine_started_.insert(transfer);
  if (auto refused = engine_.add_request(std::move(er))) {
    engine_started_.erase(transfer);
    if (prefill_) {
      run([&](pd::Outputs* out) { prefill_->on_prefill_failed(transfer, monotonic_ms(), out); });
    } else {
      RequestOutput fail;
      fail.finished = true;
      fail.error = *refused;
      if (r.sink) r.sink(std::move(fail));
      run([&](pd::Outputs* out) { decode_->on_allocation_failed(transfer, monotonic_ms(), out); });
    }
  }
}

void TransferAgent::apply(const pd::Effect& e) {
  switch (e.kind) {
    case EffectKind::kComputePrefill:
      return start_engine_request(e);
    case EffectKind::kAllocate:
      if (config_.test_admission_delay_ms > 0) {
        delayed_.emplace_back(monotonic_ms() + config_.test_admission_delay_ms, [this, e] {
          // A transfer that ended meanwhile was already reported (send()).
          const pd::DecodeTransfer* t = decode_->find(e.transfer);
          if (t != nullptr && !t->ending) start_engine_request(e);
        });
        return;
      }
      return start_engine_request(e);
    case EffectKind::kCancel:
      engine_.abort_request(engine_id(e.transfer));
      return;
    case EffectKind::kExpose:
      // The pool is registered once; what a peer may reach is enforced by
      // the protocol's quarantine and, when it ends, by fencing the peer.
      ++counters_.exposes;
      return;
    case EffectKind::kEndExposure:
      ++counters_.exposures_ended;
      return;
    case EffectKind::kFencePeer:
      ++counters_.fences_requested;
      std::fprintf(stderr,
                   "tandem serve: fencing node %u epoch %u: it is dead or silent to us while our memory is "
                   "exposed to it; that memory stays quarantined until the fence completes\n",
                   e.peer, e.peer_epoch);
      transport_->fence(e.peer, e.peer_epoch);
      return;
    case EffectKind::kPostWrite:
    case EffectKind::kPostRead: {
      bool write = e.kind == EffectKind::kPostWrite;
      pd::TransferId transfer = e.transfer;
      ++counters_.rma_posts;
      timeline(transfer).rma_posted_us = monotonic_us();
      std::vector<transport::RmaRun> runs;
      if (pd::kMutationsBuilt && config_.mutation_skip_state_transfer) {
        // Test-only: the state slot's blocks (ids past the KV blocks) stay behind.
        std::vector<pd::BlockId> local, remote;
        for (size_t i = 0; i < e.local_blocks.size() && i < e.remote_blocks.size(); ++i)
          if (e.local_blocks[i] < static_cast<pd::BlockId>(engine_.n_kv_blocks())) {
            local.push_back(e.local_blocks[i]);
            remote.push_back(e.remote_blocks[i]);
          }
        runs = coalesce(local, remote, block_bytes_);
      } else {
        runs = coalesce(e.local_blocks, e.remote_blocks, block_bytes_);
      }
      if (runs.empty()) {
        // A zero-block transfer (N = 1, or a full prefix hit) completes at once.
        post([this, transfer, write] {
          run([&](pd::Outputs* out) {
            if (write) prefill_->on_write_done(transfer, pd::RmaResult::kOk, monotonic_ms(), out);
            else decode_->on_read_done(transfer, pd::RmaResult::kOk, monotonic_ms(), out);
          });
        });
        return;
      }
      auto conn = address_connection_.find(transfer);
      transport_->post(e.peer, write ? transport::RmaOp::kPut : transport::RmaOp::kGet, std::move(runs), transfer,
                       monotonic_ms() + config_.rma_timeout_ms,
                       conn == address_connection_.end() ? 0 : conn->second.connection);
      return;
    }
    case EffectKind::kFree:
      counters_.blocks_freed += static_cast<int64_t>(e.local_blocks.size());
      // Blocks handed over at StartSiblings belong to the engine already.
      if (handed_over_.erase(e.transfer) == 0) engine_.release_transfer_blocks(e.local_blocks);
      return;
    case EffectKind::kStartSiblings:
      timeline(e.transfer).kv_ready_us = monotonic_us();
      siblings_[e.transfer] = e.siblings;
      engine_.remote_kv_arrived(engine_id(e.transfer));
      // The KV is complete and no peer can reach these blocks any more
      // (WriteDone came after the flush, or our own read is over): the
      // sequences own them from here. Holding the transfer's reference
      // until the request ends would pin blocks that preemption must be able
      // to reclaim (every other request's prompt), and could starve the pool.
      engine_.release_transfer_blocks(e.local_blocks);
      handed_over_.insert(e.transfer);
      return;
    case EffectKind::kStopSiblings: {
      siblings_.erase(e.transfer);
      const pd::DecodeTransfer* t = decode_ ? decode_->find(e.transfer) : nullptr;
      pd::EndReason why = t != nullptr ? t->end_reason : pd::EndReason::kRouterAbort;
      if (why == pd::EndReason::kClientAbort || why == pd::EndReason::kRouterAbort)
        engine_.abort_request(engine_id(e.transfer));
      else
        engine_.fail_request(engine_id(e.transfer), "the request's transfer ended: " + std::string(pd::name(why)));
      return;
    }
  }
}

// On the engine thread: the client's outputs go straight to its sink; what
// the protocol must hear is posted to the agent.
void TransferAgent::on_engine_output(pd::TransferId transfer, RequestOutput&& out) {
  switch (out.kv_event) {
    case KvEvent::kPrefillComputed:
      post([this, transfer, blocks = std::move(out.kv_blocks)]() mutable {
        timeline(transfer).engine_kv_us = monotonic_us();
        run([&](pd::Outputs* o) { prefill_->on_prefill_computed(transfer, std::move(blocks), pd::kNoSlot, monotonic_ms(), o); });
      });
      return;
    case KvEvent::kAllocated:
      post([this, transfer, blocks = std::move(out.kv_blocks), cached = out.kv_cached_blocks]() mutable {
        timeline(transfer).engine_kv_us = monotonic_us();
        run([&](pd::Outputs* o) {
          decode_->on_blocks_allocated(transfer, std::move(blocks), pd::kNoSlot, cached, monotonic_ms(), o);
        });
      });
      return;
    case KvEvent::kNone:
      break;
  }
  bool finished = out.finished;
  bool failed = !out.error.empty();
  bool has_tokens = std::any_of(out.sequences.begin(), out.sequences.end(),
                                [](const SequenceDelta& d) { return !d.tokens.empty(); });
  int64_t output_us = monotonic_us();
  std::vector<int32_t> finished_indexes;
  for (const SequenceDelta& d : out.sequences)
    if (d.finish != FinishReason::kNone) finished_indexes.push_back(d.index);
  post([this, transfer, finished, failed, has_tokens, output_us, finished_indexes, out = std::move(out)]() mutable {
    if (prefill_) return;  // a prefill request's only output is its KV
    if (has_tokens) {
      auto tl = timelines_.find(transfer);
      if (tl != timelines_.end() && tl->second.first_output_us == 0) tl->second.first_output_us = output_us;
    }
    auto r = requests_.find(transfer);
    if (r != requests_.end() && r->second.sink) r->second.sink(std::move(out));
    auto s = siblings_.find(transfer);
    if (s == siblings_.end()) return;
    if (failed) {
      // The engine failed it after its siblings started (or the agent failed
      // it; then the transfer is ending already and this is a no-op).
      siblings_.erase(s);
      return run([&](pd::Outputs* o) { decode_->on_engine_failed(transfer, monotonic_ms(), o); });
    }
    std::vector<pd::SiblingId> done;
    for (int32_t i : finished_indexes)
      if (i >= 0 && static_cast<size_t>(i) < s->second.size()) done.push_back(s->second[static_cast<size_t>(i)]);
    // A request that ends before its siblings fork (an abort, an error) ends them all.
    if (finished) done = s->second;
    if (finished) siblings_.erase(s);
    run([&](pd::Outputs* o) {
      for (pd::SiblingId id : done) decode_->on_sibling_finished(id, monotonic_ms(), o);
    });
  });
}

void TransferAgent::on_event(TransportEvent& e) {
  pd::TimeMs now = monotonic_ms();
  switch (e.kind) {
    case TransportEvent::Kind::kConnected: {
      Peer& p = peers_[e.peer];
      p.epoch = e.peer_epoch;
      p.limits.peer_n_blocks = e.keys.n_blocks;
      p.limits.peer_n_slots = e.keys.n_slots;
      std::vector<pd::NodeId> targets;
      for (const auto& [node, peer] : peers_) targets.push_back(node);
      core().set_heartbeat_targets(std::move(targets));
      return;
    }
    case TransportEvent::Kind::kMessage: {
      auto p = peers_.find(e.peer);
      if (p == peers_.end()) return;
      pd::Message m;
      transport::WireError err = transport::decode_message(e.frame, p->second.limits, &m);
      if (err != transport::WireError::kNone) {
        ++counters_.wire_errors[static_cast<size_t>(err)];
        return;
      }
      if (m.from != e.peer || m.from_epoch != e.peer_epoch || m.to != config_.node) {
        ++counters_.spoofed_frames;
        return;
      }
      // Bind the transfer's RMA to the connection its addresses come on: the
      // copy the core is about to accept (it may post the RMA at once), or,
      // for a transfer not started here yet, the copy it keeps until its
      // Start (the first such copy: the one the core replays).
      if (m.kind == MessageKind::kRemoteBlocks || m.kind == MessageKind::kKvAddresses) {
        const pd::TransferBase* t = prefill_ ? static_cast<const pd::TransferBase*>(prefill_->find(m.transfer))
                                             : static_cast<const pd::TransferBase*>(decode_->find(m.transfer));
        if (t != nullptr && !t->addresses_known) address_connection_[m.transfer] = {e.connection, now};
        if (t == nullptr) {
          // The core replays the oldest copy it still keeps (each for one
          // retransmit interval): bind that one's connection.
          auto [b, fresh] = address_connection_.try_emplace(m.transfer, AddressBinding{e.connection, now});
          if (!fresh && now - b->second.bound_ms >= core().config().retransmit_interval_ms)
            b->second = {e.connection, now};
        }
      }
      return run([&](pd::Outputs* out) { core().on_message(m, now, out); });
    }
    case TransportEvent::Kind::kRmaDone: {
      if (!e.ok) {
        ++counters_.rma_failures;
        std::fprintf(stderr, "tandem serve: transfer %s: RMA with node %u failed: %s\n",
                     pd::transfer_name(e.tag).c_str(), e.peer, e.detail.c_str());
      }
      if (auto tl = timelines_.find(e.tag); tl != timelines_.end()) tl->second.rma_done_us = monotonic_us();
      pd::RmaResult result = e.ok ? pd::RmaResult::kOk : pd::RmaResult::kFailed;
      return run([&](pd::Outputs* out) {
        if (prefill_) prefill_->on_write_done(e.tag, result, now, out);
        else decode_->on_read_done(e.tag, result, now, out);
      });
    }
    case TransportEvent::Kind::kPeerFailed: {
      // The endpoint is gone: a later ensure_connected makes a new one.
      peers_.erase(e.peer);
      connecting_since_ms_.erase(e.peer);
      std::vector<pd::NodeId> targets;
      for (const auto& [node, peer] : peers_) targets.push_back(node);
      core().set_heartbeat_targets(std::move(targets));
      return;
    }
    case TransportEvent::Kind::kPeerFenced:
      ++counters_.fences_completed;
      std::fprintf(stderr, "tandem serve: node %u epoch %u fenced (%s): the memory exposed to it is freed\n", e.peer,
                   e.peer_epoch, e.detail.c_str());
      return run([&](pd::Outputs* out) { core().on_peer_fenced(e.peer, e.peer_epoch, now, out); });
    case TransportEvent::Kind::kRefused:
      // Liveness is the core's: a failed peer stops heartbeating and its lease
      // expires within lease_ms.
      return;
  }
}

void TransferAgent::loop() {
  run([&](pd::Outputs* out) { core().start(monotonic_ms(), out); });
  std::vector<TransportEvent> events;
  while (running_.load(std::memory_order_acquire)) {
    std::deque<Closure> work;
    {
      std::lock_guard<std::mutex> lock(mu_);
      work.swap(inbox_);
    }
    for (Closure& c : work) c();
    pd::TimeMs now = monotonic_ms();
    for (size_t i = 0; i < delayed_.size();) {
      if (delayed_[i].first > now) {
        ++i;
        continue;
      }
      Closure c = std::move(delayed_[i].second);
      delayed_.erase(delayed_.begin() + static_cast<ptrdiff_t>(i));
      c();
    }
    if (now >= next_wake_ms_) {
      next_wake_ms_ = pd::kNever;  // on_timer reports the next one
      run([&](pd::Outputs* out) { core().on_timer(now, out); });
    }
    if (now >= next_sweep_ms_) {
      sweep_requests();
      next_sweep_ms_ = now + 1000;
    }
    pd::TimeMs wake = next_wake_ms_;
    for (const auto& d : delayed_) wake = std::min(wake, d.first);
    int timeout = static_cast<int>(std::clamp<pd::TimeMs>(wake - monotonic_ms(), 0, config_.max_sleep_ms));
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!inbox_.empty()) timeout = 0;
    }
    events.clear();
    transport_->poll(timeout, &events);
    for (TransportEvent& e : events) on_event(e);
  }
}

// A request's record goes once its transfer has ended on this side (its
// tombstone alone answers late messages).
void TransferAgent::sweep_requests() {
  auto ended = [&](pd::TransferId id) {
    if (siblings_.count(id) != 0) return false;
    if (prefill_) {
      const pd::PrefillTransfer* t = prefill_->find(id);
      return t == nullptr || t->state == pd::PrefillState::kEnded;
    }
    const pd::DecodeTransfer* t = decode_->find(id);
    return t == nullptr || t->state == pd::DecodeState::kEnded;
  };
  std::erase_if(requests_, [&](const auto& kv) { return ended(kv.first); });
  for (auto it = timelines_.begin(); it != timelines_.end();) {
    if (!ended(it->first)) {
      ++it;
      continue;
    }
    it->second.ended_us = monotonic_us();
    recent_.push_back(it->second);
    if (recent_.size() > kRecentTimelines) recent_.pop_front();
    it = timelines_.erase(it);
  }
  std::erase_if(engine_started_, [&](pd::TransferId id) { return requests_.count(id) == 0; });
  // A binding for a transfer not started here lives as long as the core
  // keeps the message it came with (one retransmit interval).
  const pd::TimeMs now = monotonic_ms();
  std::erase_if(address_connection_, [&](const auto& kv) {
    const bool unknown = prefill_ ? prefill_->find(kv.first) == nullptr : decode_->find(kv.first) == nullptr;
    return requests_.count(kv.first) == 0 &&
           (!unknown || now - kv.second.bound_ms > core().config().retransmit_interval_ms);
  });
}

std::optional<TransferAgent::Snapshot> TransferAgent::snapshot(int timeout_ms) {
  auto promise = std::make_shared<std::promise<Snapshot>>();
  std::future<Snapshot> future = promise->get_future();
  post([this, promise] {
    Snapshot s;
    pd::TimeMs now = monotonic_ms();
    if (prefill_) {
      s.transfers_by_state = prefill_->count_by_state();
      s.ages_by_state = prefill_->ages_by_state(now);
      s.blocks_held = prefill_->blocks_held();
      s.live_transfers = static_cast<int64_t>(prefill_->transfers().size()) -
                         s.transfers_by_state[static_cast<size_t>(pd::PrefillState::kEnded)];
    } else {
      s.transfers_by_state = decode_->count_by_state();
      s.ages_by_state = decode_->ages_by_state(now);
      s.blocks_held = decode_->blocks_held();
      s.live_transfers = static_cast<int64_t>(decode_->transfers().size()) -
                         s.transfers_by_state[static_cast<size_t>(pd::DecodeState::kEnded)];
    }
    s.quarantined_blocks = core().quarantined_blocks();
    s.stats = core().stats();
    s.counters = counters_;
    s.requests_tracked = static_cast<int64_t>(requests_.size());
    s.recent.assign(recent_.begin(), recent_.end());
    for (const auto& [node, p] : peers_) s.connected_peers.push_back(node);
    s.fences_pending.assign(core().fences_pending().begin(), core().fences_pending().end());
    promise->set_value(std::move(s));
  });
  if (future.wait_for(std::chrono::milliseconds(timeout_ms)) != std::future_status::ready) return std::nullopt;
  return future.get();
}

}  // namespace tandem::instance
