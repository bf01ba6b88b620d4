#include "sim/cluster.h"

#include <algorithm>
#include <functional>
#include <queue>
#include <set>

#include "pd/decode_side.h"
#include "pd/prefill_side.h"
#include "pd/router_core.h"
#include "sim/rng.h"
#include "sim/sim_pool.h"
#include "util/error.h"

namespace tandem::sim {

using namespace pd;

namespace {

constexpr NodeId kRouterNode = 1;

enum class EventKind : uint8_t {
  kArrive,
  kClientAbort,
  kDeliver,
  kWake,
  kPrefillDone,
  kAdmitted,
  kRmaDone,
  kSiblingDone,
  kCrash,
  kRestart,
  kFenced,
  kDrain,
  kLocalCancel,
  kEngineFailed,
};

const char* event_name(EventKind kind) {
  static const char* names[] = {"arrive", "client-abort", "deliver", "wake", "prefill-done",
                                "admitted", "rma-done", "sibling-done", "crash", "restart", "fenced",
                                "drain", "local-cancel", "engine-failed"};
  return names[static_cast<int>(kind)];
}

struct Event {
  TimeMs at = 0;
  uint64_t seq = 0;
  EventKind kind = EventKind::kWake;
  NodeId node = 0;
  Epoch epoch = 0;
  uint64_t a = 0;  // request index, transfer, RMA op, sibling: by kind
  uint64_t b = 0;  // a serial where a stale event must be told apart; the fenced epoch
  Message message;
};

struct LaterFirst {
  bool operator()(const Event& x, const Event& y) const {
    return x.at != y.at ? x.at > y.at : x.seq > y.seq;
  }
};

// Stand-ins for KV content: block i of transfer t, and the recurrent state of t
// after k tokens.
uint64_t block_tag(TransferId t, int32_t i) { return mix64(t, static_cast<uint64_t>(i) + 1); }
uint64_t state_tag(TransferId t, int32_t tokens) { return mix64(t ^ 0x5EED5EEDull, static_cast<uint64_t>(tokens)); }

struct PrefillEngine {
  std::set<TransferId> queue;  // waiting to compute, in transfer-id order
  std::map<TransferId, int32_t> prompt_tokens;
  TransferId computing = 0;
  uint64_t serial = 0;
  std::vector<BlockId> blocks;
  int32_t slot = kNoSlot;
};

struct Admission {
  int32_t n_blocks = 0;
  int32_t prompt_tokens = 0;
  bool ready = false;  // the admission delay passed; now waits for space
};

struct DecodeEngine {
  std::map<TransferId, Admission> admissions;
  std::map<SiblingId, TransferId> running;
};

struct SimNode {
  NodeId id = 0;
  Role role = Role::kRouter;
  Epoch epoch = 1;
  bool up = true;
  std::unique_ptr<RouterCore> router;
  std::unique_ptr<PrefillSide> prefill;
  std::unique_ptr<DecodeSide> decode;
  NodeCore* core = nullptr;
  SimPool blocks{0};
  SimPool slots{0};
  PrefillEngine pe;
  DecodeEngine de;
  TimeMs next_wake_ms = kNever;
  // The real transport's rule: an RMA may use addresses only on the
  // connection they came on, and fencing a peer cuts that connection. Here:
  // how many fences of each peer incarnation completed, and how many had
  // completed when we exposed memory to a peer for a transfer; an RMA whose
  // addresses predate a completed fence of its initiator fails.
  std::map<std::pair<NodeId, Epoch>, int> fences_completed;
  std::map<std::pair<NodeId, TransferId>, int> fences_at_exposure;
};

struct RmaOp {
  bool write = true;
  TransferId transfer = 0;
  NodeId initiator = 0;
  Epoch initiator_epoch = 0;
  NodeId target = 0;
  Epoch target_epoch = 0;
  std::vector<BlockId> initiator_blocks;
  std::vector<BlockId> target_blocks;
  int32_t initiator_slot = kNoSlot;
  int32_t target_slot = kNoSlot;
  bool post_failed = false;
  bool fails = false;
};

struct ClientRequest {
  WorkloadRequest work;
  TransferId transfer = 0;
  int terminal_count = 0;
  RouterState state = RouterState::kQueued;
  EndReason reason = EndReason::kCompleted;
  bool client_aborted = false;
  bool injected_failure = false;  // an engine or RMA failure was injected on it, or a local cancel
  bool slow_admission = false;
  TimeMs kv_arrived_ms = kNever;  // the decode started its siblings
  TimeMs end_ms = kNever;
  NodeId prefill = 0;
  NodeId decode = 0;
};

class Cluster {
 public:
  Cluster(const Scenario& scenario, bool record_trace)
      : s_(scenario), rng_(scenario.seed ^ 0xC1A5737Eull), record_trace_(record_trace) {}

  RunResult run();

 private:
  // Set-up.
  void add_node(NodeId id, Role role);
  void boot(SimNode& node);
  // Event plumbing.
  void push(Event e);
  // An event with no epoch or message: a fault or a client's act.
  void push_at(TimeMs at, EventKind kind, NodeId node = 0, uint64_t a = 0) {
    Event e;
    e.at = at;
    e.kind = kind;
    e.node = node;
    e.a = a;
    push(std::move(e));
  }
  void send(const Message& m);
  void apply(SimNode& node, Outputs& out);
  void apply_effect(SimNode& node, const Effect& e);
  void check_announced(const SimNode& node, const Message& m);
  void pump(SimNode& node);
  bool admit_one(SimNode& node);
  void handle(const Event& e);
  void on_rma_done(uint64_t op_id);
  void on_request_end(const RequestEnd& end);
  // Checks.
  void violation(Invariant invariant, std::string what);
  void check_node(const SimNode& node);
  bool settled() const;
  void final_checks();
  std::string describe_transfer(TransferId t) const;
  bool excused(const ClientRequest& r) const;
  void trace(const Event& e);
  void collect_stats(const SimNode& node);
  pd::ProtocolConfig prefill_protocol() const {
    pd::ProtocolConfig c = s_.protocol;
    c.lease_ms = s_.prefill_lease_ms;
    return c;
  }
  TimeMs max_lease_ms() const { return std::max(s_.protocol.lease_ms, s_.prefill_lease_ms); }
  void count(const std::string& key, int64_t n = 1) {
    if (n != 0) result_.coverage[key] += n;
  }

  const Scenario& s_;
  Rng rng_;
  bool record_trace_;
  RunResult result_;
  TimeMs now_ = 0;
  uint64_t seq_ = 0;
  std::priority_queue<Event, std::vector<Event>, LaterFirst> events_;
  std::map<NodeId, SimNode> nodes_;
  std::vector<ClientRequest> requests_;
  std::map<TransferId, size_t> request_of_;
  std::map<uint64_t, RmaOp> ops_;
  uint64_t next_op_ = 1;
  // Heartbeats the network lost long enough for a lease to expire on a live
  // peer (a run of random drops): a cut as real as a partition, and as good
  // an explanation of a failure. When each directed pair last heard one.
  std::map<std::pair<NodeId, NodeId>, TimeMs> last_heartbeat_ms_;
  std::vector<Partition> silences_;
  int64_t terminal_ = 0;
  int64_t slow_admissions_ = 0;
  uint64_t hash_ = 1469598103934665603ull;
  Outputs scratch_;
};

void Cluster::add_node(NodeId id, Role role) {
  SimNode& node = nodes_[id];
  node.id = id;
  node.role = role;
}

void Cluster::boot(SimNode& node) {
  node.up = true;
  node.next_wake_ms = kNever;
  node.pe = PrefillEngine{};
  node.de = DecodeEngine{};
  node.router.reset();
  node.prefill.reset();
  node.decode.reset();
  std::vector<NodeId> targets;
  for (const auto& [id, other] : nodes_) {
    if (id == node.id) continue;
    bool wanted = node.role == Role::kRouter || other.role == Role::kRouter ||
                  other.role != node.role;
    if (wanted) targets.push_back(id);
  }
  int32_t capacity = 0;
  switch (node.role) {
    case Role::kRouter:
      node.router = std::make_unique<RouterCore>(node.id, node.epoch, s_.protocol);
      node.core = node.router.get();
      break;
    case Role::kPrefill:
      capacity = s_.prefill_pool_blocks;
      node.prefill = std::make_unique<PrefillSide>(node.id, node.epoch, capacity, prefill_protocol());
      node.core = node.prefill.get();
      break;
    case Role::kDecode:
      capacity = s_.decode_pool_blocks;
      node.decode = std::make_unique<DecodeSide>(node.id, node.epoch, capacity, s_.protocol);
      node.core = node.decode.get();
      break;
  }
  // The router's block credits also bound the state slots in use, so a slot
  // pool as large as the block pool never runs out first.
  node.blocks = SimPool(capacity);
  node.slots = SimPool(s_.recurrent ? capacity : 0);
  node.core->set_heartbeat_targets(targets);
}

void Cluster::push(Event e) {
  e.seq = seq_++;
  events_.push(std::move(e));
}

void Cluster::send(const Message& m) {
  const NetworkFaults& net = s_.network;
  for (const Partition& p : s_.partitions) {
    if (p.between(m.from, m.to) && now_ >= p.start_ms && now_ < p.end_ms &&
        !(p.data_only && m.kind == MessageKind::kHeartbeat)) {
      count("fault.partition_drop");
      if (record_trace_) result_.trace.push_back("    lost (partition): " + describe(m));
      return;
    }
  }
  if (rng_.chance(net.drop_probability)) {
    count("fault.drop");
    if (record_trace_) result_.trace.push_back("    lost: " + describe(m));
    return;
  }
  int copies = rng_.chance(net.duplicate_probability) ? 2 : 1;
  if (copies == 2) count("fault.duplicate");
  for (int i = 0; i < copies; ++i) {
    TimeMs delay = rng_.uniform(net.delay_min_ms, net.delay_max_ms);
    if (rng_.chance(net.long_delay_probability)) {
      delay += rng_.uniform(0, net.long_delay_max_ms);
      count("fault.long_delay");
    }
    Event e;
    e.at = now_ + delay;
    e.kind = EventKind::kDeliver;
    e.node = m.to;
    e.message = m;
    push(std::move(e));
  }
}

// The drivers' contract (docs/PD_PROTOCOL.md): a step's effects are
// performed before its messages are sent, so a message never announces what
// has not happened yet (addresses of memory not yet exposed, a write not yet
// complete).
void Cluster::apply(SimNode& node, Outputs& out) {
  for (const Effect& e : out.effects) apply_effect(node, e);
  for (const Message& m : out.messages) {
    check_announced(node, m);
    send(m);
  }
  for (const RequestEnd& end : out.request_ends) on_request_end(end);
  if (out.wake_at_ms < node.next_wake_ms) {
    node.next_wake_ms = std::max(out.wake_at_ms, now_);
    Event e;
    e.at = node.next_wake_ms;
    e.kind = EventKind::kWake;
    e.node = node.id;
    e.epoch = node.epoch;
    push(std::move(e));
  }
  out.clear();
}

void Cluster::check_announced(const SimNode& node, const Message& m) {
  std::string t = pd::transfer_name(m.transfer);
  if (m.kind == MessageKind::kRemoteBlocks || m.kind == MessageKind::kKvAddresses) {
    for (BlockId b : m.blocks)
      if (!node.blocks.valid(b) || !node.blocks.exposed_to(b, m.to, m.transfer))
        violation(Invariant::kAnnounced, t + ": n" + std::to_string(node.id) + " sent " + std::string(pd::name(m.kind)) + " naming block " +
                  std::to_string(b) + " before exposing it to n" + std::to_string(m.to));
  } else if (m.kind == MessageKind::kWriteDone) {
    for (const auto& [id, op] : ops_)
      if (op.write && op.initiator == node.id && op.transfer == m.transfer)
        violation(Invariant::kAnnounced, t + ": n" + std::to_string(node.id) + " sent WriteDone while its write is still in flight");
  }
}

void Cluster::apply_effect(SimNode& node, const Effect& e) {
  if (record_trace_) result_.trace.push_back("    n" + std::to_string(node.id) + " effect " + describe(e));
  switch (e.kind) {
    case EffectKind::kComputePrefill:
      node.pe.queue.insert(e.transfer);
      node.pe.prompt_tokens[e.transfer] = e.prompt_tokens;
      break;
    case EffectKind::kAllocate: {
      node.de.admissions[e.transfer] = {e.n_blocks, e.prompt_tokens, false};
      TimeMs delay = rng_.uniform(0, s_.admission_max_ms);
      auto it = request_of_.find(e.transfer);
      if (rng_.chance(s_.slow_admission_probability)) {
        delay = s_.slow_admission_ms;
        ++slow_admissions_;
        count("fault.slow_admission");
        if (it != request_of_.end()) requests_[it->second].slow_admission = true;
      }
      Event ev;
      ev.at = now_ + delay;
      ev.kind = EventKind::kAdmitted;
      ev.node = node.id;
      ev.epoch = node.epoch;
      ev.a = e.transfer;
      push(std::move(ev));
      break;
    }
    case EffectKind::kCancel:
      if (node.role == Role::kPrefill) {
        node.pe.queue.erase(e.transfer);
        if (node.pe.computing == e.transfer) {
          std::string problem = node.blocks.free(node.pe.blocks, e.transfer);
          if (node.pe.slot != kNoSlot) problem += node.slots.free({node.pe.slot}, e.transfer);
          if (!problem.empty()) violation(Invariant::kPoolOwnership, problem);
          node.pe.computing = 0;
          node.pe.blocks.clear();
          node.pe.slot = kNoSlot;
        }
        node.pe.prompt_tokens.erase(e.transfer);
      } else {
        node.de.admissions.erase(e.transfer);
      }
      break;
    case EffectKind::kExpose:
      node.blocks.expose(e.local_blocks, e.peer, e.transfer);
      if (e.local_slot != kNoSlot) node.slots.expose({e.local_slot}, e.peer, e.transfer);
      node.fences_at_exposure[{e.peer, e.transfer}] = node.fences_completed[{e.peer, e.peer_epoch}];
      break;
    case EffectKind::kEndExposure:
      // Bookkeeping: the core says the peer can no longer reach these blocks
      // (released or fenced). If it still can, its RMA lands in private memory
      // and on_rma_done reports the violation.
      node.blocks.revoke(e.transfer);
      node.slots.revoke(e.transfer);
      break;
    case EffectKind::kFencePeer: {
      count("path.fence_requested");
      Event ev;
      ev.at = now_ + rng_.uniform(s_.fence_min_ms, s_.fence_max_ms);
      ev.kind = EventKind::kFenced;
      ev.node = node.id;
      ev.epoch = node.epoch;
      ev.a = e.peer;
      ev.b = e.peer_epoch;
      push(std::move(ev));
      break;
    }
    case EffectKind::kPostWrite:
    case EffectKind::kPostRead: {
      RmaOp op;
      op.write = e.kind == EffectKind::kPostWrite;
      op.transfer = e.transfer;
      op.initiator = node.id;
      op.initiator_epoch = node.epoch;
      op.target = e.peer;
      op.target_epoch = e.peer_epoch;
      op.initiator_blocks = e.local_blocks;
      op.target_blocks = e.remote_blocks;
      op.initiator_slot = e.local_slot;
      op.target_slot = e.remote_slot;
      TimeMs duration = s_.rma_base_ms + static_cast<TimeMs>(s_.rma_ms_per_block *
                                                            static_cast<double>(e.local_blocks.size()));
      if (rng_.chance(s_.rma_slow_probability)) {
        duration += s_.rma_slow_ms;
        count("fault.rma_slow");
      }
      if (op.write && rng_.chance(s_.write_post_failure_probability)) {
        op.post_failed = true;
        duration = 0;
        count("fault.write_post_failure");
      } else if (rng_.chance(s_.rma_failure_probability)) {
        op.fails = true;
        count("fault.rma_failure");
      }
      if (op.post_failed || op.fails) {
        auto it = request_of_.find(e.transfer);
        if (it != request_of_.end()) requests_[it->second].injected_failure = true;
      }
      uint64_t id = next_op_++;
      ops_[id] = std::move(op);
      Event ev;
      ev.at = now_ + duration;
      ev.kind = EventKind::kRmaDone;
      ev.node = node.id;
      ev.a = id;
      push(std::move(ev));
      break;
    }
    case EffectKind::kFree: {
      std::string problem = node.blocks.free(e.local_blocks, e.transfer);
      if (e.local_slot != kNoSlot) {
        std::string slot_problem = node.slots.free({e.local_slot}, e.transfer);
        if (!slot_problem.empty()) problem = "state slot: " + slot_problem;
      }
      if (!problem.empty()) violation(Invariant::kPoolOwnership, "n" + std::to_string(node.id) + ": " + problem);
      break;
    }
    case EffectKind::kStartSiblings: {
      auto it = request_of_.find(e.transfer);
      TANDEM_ASSERT(it != request_of_.end());
      ClientRequest& r = requests_[it->second];
      r.kv_arrived_ms = now_;
      if (static_cast<int32_t>(e.siblings.size()) != r.work.spec.n_siblings)
        violation(Invariant::kFork, pd::transfer_name(e.transfer) + " forked " + std::to_string(e.siblings.size()) +
                  " of its " + std::to_string(r.work.spec.n_siblings) + " siblings");
      if (e.siblings.size() > 1) count("path.sibling_fanout");
      // The KV of the first N-1 tokens, and the state after them, must be this
      // transfer's; then the decode computes token N itself, advancing the state once.
      int32_t moved = moved_blocks(e.prompt_tokens, s_.protocol.block_size_tokens);
      for (int32_t i = 0; i < moved; ++i) {
        if (node.blocks.tag(e.local_blocks[i]) != block_tag(e.transfer, i)) {
          violation(Invariant::kKvIntegrity, pd::transfer_name(e.transfer) + " decodes from block " + std::to_string(i) +
                    " that does not hold its KV");
          break;
        }
      }
      if (e.local_slot != kNoSlot) {
        uint64_t tag = node.slots.tag(e.local_slot);
        if (tag == state_tag(e.transfer, e.prompt_tokens))
          violation(Invariant::kKvIntegrity, pd::transfer_name(e.transfer) + ": recurrent state advanced twice");
        else if (tag != state_tag(e.transfer, e.prompt_tokens - 1))
          violation(Invariant::kKvIntegrity, pd::transfer_name(e.transfer) + ": recurrent state is not the state after N-1 tokens");
        node.slots.set_tag(e.local_slot, state_tag(e.transfer, e.prompt_tokens));
      }
      if (rng_.chance(s_.engine_failure_probability)) {
        Event fail;
        fail.at = now_ + s_.decode_ms_per_token * rng_.uniform(1, r.work.spec.max_tokens);
        fail.kind = EventKind::kEngineFailed;
        fail.node = node.id;
        fail.epoch = node.epoch;
        fail.a = e.transfer;
        push(std::move(fail));
      }
      for (SiblingId sibling : e.siblings) {
        node.de.running[sibling] = e.transfer;
        Event ev;
        ev.at = now_ + s_.decode_ms_per_token * rng_.uniform(1, r.work.spec.max_tokens);
        ev.kind = EventKind::kSiblingDone;
        ev.node = node.id;
        ev.epoch = node.epoch;
        ev.a = sibling;
        push(std::move(ev));
      }
      break;
    }
    case EffectKind::kStopSiblings: {
      // Stopping siblings is for failures and aborts: a transfer that
      // "completed" with siblings still running completed too early.
      const DecodeTransfer* d = node.decode->find(e.transfer);
      if (d != nullptr && d->end_reason == EndReason::kCompleted)
        violation(Invariant::kCompletedEarly, pd::transfer_name(e.transfer) + " completed with " +
                  std::to_string(e.siblings.size()) + " siblings still running");
      for (SiblingId sibling : e.siblings) node.de.running.erase(sibling);
      break;
    }
  }
}

// Starts engine work that waits for pool space; calls into the core for
// admissions, so it runs after the outputs of the current event were applied.
void Cluster::pump(SimNode& node) {
  if (!node.up) return;
  if (node.role == Role::kPrefill) {
    PrefillEngine& pe = node.pe;
    if (pe.computing != 0 || pe.queue.empty()) return;
    TransferId t = *pe.queue.begin();
    int32_t prompt = pe.prompt_tokens.at(t);
    int32_t need = moved_blocks(prompt, s_.protocol.block_size_tokens);
    if (need > node.blocks.free_count() || (s_.recurrent && node.slots.free_count() == 0)) return;
    pe.queue.erase(pe.queue.begin());
    pe.blocks = *node.blocks.allocate(need, t);
    pe.slot = s_.recurrent ? (*node.slots.allocate(1, t))[0] : kNoSlot;
    pe.computing = t;
    Event ev;
    ev.at = now_ + s_.prefill_base_ms + static_cast<TimeMs>(s_.prefill_ms_per_token * prompt);
    if (rng_.chance(s_.slow_prefill_probability)) {
      ev.at += s_.slow_prefill_ms;
      count("fault.slow_prefill");
    }
    ev.kind = EventKind::kPrefillDone;
    ev.node = node.id;
    ev.epoch = node.epoch;
    ev.a = t;
    ev.b = ++pe.serial;
    push(std::move(ev));
  } else if (node.role == Role::kDecode) {
    while (admit_one(node)) {
    }
  }
}

bool Cluster::admit_one(SimNode& node) {
  // Admission in transfer-id order, head of line first: no request is starved.
  for (auto it = node.de.admissions.begin(); it != node.de.admissions.end(); ++it) {
    if (!it->second.ready) continue;
    Admission a = it->second;
    TransferId t = it->first;
    if (a.n_blocks > node.blocks.free_count() || (s_.recurrent && node.slots.free_count() == 0))
      return false;
    node.de.admissions.erase(it);
    std::vector<BlockId> blocks = *node.blocks.allocate(a.n_blocks, t);
    int32_t slot = s_.recurrent ? (*node.slots.allocate(1, t))[0] : kNoSlot;
    // A prefix-cache hit: the leading full blocks already hold this prompt's KV.
    int32_t full = (a.prompt_tokens - 1) / s_.protocol.block_size_tokens;
    int32_t cached = rng_.chance(s_.prefix_hit_probability) ? static_cast<int32_t>(rng_.uniform(0, full)) : 0;
    if (s_.recurrent) cached = 0;  // a recurrent state cannot be cut at a block boundary
    for (int32_t i = 0; i < cached; ++i) node.blocks.set_tag(blocks[i], block_tag(t, i));
    if (cached > 0) count("path.prefix_hit");
    node.decode->on_blocks_allocated(t, std::move(blocks), slot, cached, now_, &scratch_);
    apply(node, scratch_);
    return true;
  }
  return false;
}

void Cluster::on_request_end(const RequestEnd& end) {
  auto it = request_of_.find(end.transfer);
  TANDEM_ASSERT(it != request_of_.end());
  ClientRequest& r = requests_[it->second];
  ++r.terminal_count;
  if (r.terminal_count > 1) {
    violation(Invariant::kTerminalOnce, pd::transfer_name(end.transfer) + " reached a second terminal state");
    return;
  }
  ++terminal_;
  if (record_trace_)
    result_.trace.push_back("    request " + pd::transfer_name(end.transfer) + " " +
                            std::string(name(end.state)) + " (" + std::string(name(end.reason)) + ")");
  r.state = end.state;
  r.reason = end.reason;
  r.end_ms = now_;
  if (const RouterRequest* rr = nodes_.at(kRouterNode).router->find(end.transfer)) {
    r.prefill = rr->prefill;
    r.decode = rr->decode;
  }
  if (end.state == RouterState::kCompleted) {
    ++result_.requests_completed;
  } else {
    ++result_.requests_failed;
    if (!excused(r))
      violation(Invariant::kUnexplainedFailure, pd::transfer_name(end.transfer) + " failed (" + std::string(name(end.reason)) +
                ") with no fault to explain it" + (r.slow_admission ? " (slow admission)" : ""));
  }
}

// A failure is legitimate only when something happened to the request: the
// client left, an engine or RMA failure was injected on it, or one of its
// nodes crashed or was cut off while that could still hurt it. Once the
// decode holds the KV only the decode matters (its crash, or its being cut off
// from the router). Deadlines, exhausted retransmits and capacity refusals are
// never legitimate here: the simulated deadline is far beyond any real service
// time, and the generated workload always fits the pools.
bool Cluster::excused(const ClientRequest& r) const {
  switch (r.reason) {
    case EndReason::kDeadline:
    case EndReason::kRetransmitLimit:
      // Legitimate only where faults outlast them on purpose (long runs):
      // an admission slower than the deadline, or a cut that overlapped it.
      // A deadline also comes to a request that waited at the router for
      // credits held by transfers stuck behind any such cut.
      if (!s_.options.long_run) return false;
      if (r.reason == EndReason::kDeadline) {
        if (r.slow_admission) return true;
        for (const Partition& p : s_.partitions)
          if (r.work.arrival_ms <= p.end_ms && r.end_ms >= p.start_ms) return true;
      }
      break;
    case EndReason::kCapacity:
    case EndReason::kOverloaded:
      return false;
    case EndReason::kClientAbort:
      return r.client_aborted;
    default:
      break;
  }
  if (r.injected_failure) return true;
  // A Start that reached an instance already draining, before its heartbeat
  // told the router.
  if (r.reason == EndReason::kDraining)
    for (const Drain& d : s_.drains)
      if ((d.node == r.prefill || d.node == r.decode) && r.end_ms >= d.at_ms) return true;
  const TimeMs settle_ms = max_lease_ms() + 2 * s_.protocol.retransmit_interval_ms;
  // Faults that hurt the request up to time `until` (its end, or the KV's
  // arrival for faults that only the prefill side could cause).
  const TimeMs kv_ms = std::min(r.kv_arrived_ms, r.end_ms);
  auto overlaps = [&](TimeMs from, TimeMs to, TimeMs until) {
    return r.work.arrival_ms <= to && until >= from;
  };
  for (const Crash& c : s_.crashes) {
    TimeMs to = c.at_ms + c.restart_after_ms + settle_ms;
    if (c.node == r.decode && overlaps(c.at_ms, to, r.end_ms)) return true;
    if (c.node == r.prefill && overlaps(c.at_ms, to, kv_ms)) return true;
  }
  std::vector<Partition> cuts = s_.partitions;
  cuts.insert(cuts.end(), silences_.begin(), silences_.end());
  for (const auto& [pair, last] : last_heartbeat_ms_)
    if (now_ - last >= s_.protocol.lease_ms) cuts.push_back({pair.first, pair.second, last, now_});
  for (const Partition& p : cuts) {
    TimeMs to = p.end_ms + settle_ms;
    auto is = [&](NodeId a, NodeId b) { return p.involves(a, b); };
    if (is(kRouterNode, r.decode) && overlaps(p.start_ms, to, r.end_ms)) return true;
    if ((is(kRouterNode, r.prefill) || is(r.prefill, r.decode)) && overlaps(p.start_ms, to, kv_ms))
      return true;
  }
  return false;
}

void Cluster::violation(Invariant invariant, std::string what) {
  result_.violations.push_back("at " + std::to_string(now_) + " ms: [" + std::string(name(invariant)) + "] " +
                               std::move(what));
  result_.broken.push_back(invariant);
}


void Cluster::check_node(const SimNode& node) {
  if (!node.up || node.role == Role::kRouter) return;
  int64_t held = 0, slots = 0;
  if (node.role == Role::kPrefill) {
    held = node.prefill->blocks_held() + static_cast<int64_t>(node.pe.blocks.size());
    slots = node.prefill->slots_held() + (node.pe.slot != kNoSlot ? 1 : 0);
  } else {
    held = node.decode->blocks_held();
    slots = node.decode->slots_held();
    std::string maps = node.decode->check_sibling_maps();
    if (!maps.empty()) violation(Invariant::kSiblingMap, "n" + std::to_string(node.id) + ": " + maps);
  }
  // Conservation: every allocated block is held by exactly one live or
  // quarantined transfer (or the engine computing it); free + held == total.
  if (held != node.blocks.allocated_count() || slots != node.slots.allocated_count())
    violation(Invariant::kBlockAccounting, "n" + std::to_string(node.id) + " block accounting: pool has " +
              std::to_string(node.blocks.allocated_count()) + " blocks and " +
              std::to_string(node.slots.allocated_count()) + " slots allocated, the protocol holds " +
              std::to_string(held) + " and " + std::to_string(slots));
}

bool Cluster::settled() const {
  if (terminal_ < static_cast<int64_t>(requests_.size()) || now_ < s_.faults_end_ms || !ops_.empty())
    return false;
  for (const auto& [id, node] : nodes_) {
    if (!node.up) return false;
    if (node.blocks.allocated_count() != 0 || node.slots.allocated_count() != 0) return false;
    if (node.role == Role::kPrefill &&
        node.prefill->count_by_state()[static_cast<int>(PrefillState::kEnded)] !=
            static_cast<int64_t>(node.prefill->transfers().size()))
      return false;
    if (node.role == Role::kDecode &&
        node.decode->count_by_state()[static_cast<int>(DecodeState::kEnded)] !=
            static_cast<int64_t>(node.decode->transfers().size()))
      return false;
  }
  return true;
}

std::string Cluster::describe_transfer(TransferId t) const {
  std::string s;
  for (const auto& [id, node] : nodes_) {
    if (!node.up) continue;
    if (node.role == Role::kRouter) {
      if (const RouterRequest* r = node.router->find(t)) s += " router:" + std::string(name(r->state));
    } else if (node.role == Role::kPrefill) {
      if (const PrefillTransfer* p = node.prefill->find(t))
        s += " n" + std::to_string(id) + ":" + std::string(name(p->state));
    } else if (const DecodeTransfer* d = node.decode->find(t)) {
      s += " n" + std::to_string(id) + ":" + std::string(name(d->state));
    }
  }
  return s;
}

void Cluster::final_checks() {
  for (const ClientRequest& r : requests_) {
    if (r.terminal_count == 0)
      violation(Invariant::kHang, pd::transfer_name(r.transfer) + " never reached a terminal state (" +
                describe_transfer(r.transfer) + " )" + (r.slow_admission ? " (slow admission)" : ""));
  }
  for (const auto& [id, node] : nodes_) {
    if (!node.up || node.role == Role::kRouter) continue;
    std::string held;
    auto note = [&](TransferId t, std::string_view state, size_t blocks) {
      if (blocks > 0 || state != "Ended") held += " " + pd::transfer_name(t) + ":" + std::string(state) +
                                                 "/" + std::to_string(blocks);
    };
    if (node.role == Role::kPrefill) {
      for (const auto& [t, x] : node.prefill->transfers()) note(t, name(x.state), x.blocks.size());
    } else {
      for (const auto& [t, x] : node.decode->transfers()) note(t, name(x.state), x.blocks.size());
    }
    if (node.blocks.allocated_count() != 0 || node.slots.allocated_count() != 0 || !held.empty())
      violation(Invariant::kLeak, "n" + std::to_string(id) + " did not return to baseline: " +
                std::to_string(node.blocks.allocated_count()) + " blocks and " +
                std::to_string(node.slots.allocated_count()) + " slots allocated;" + held);
    if (node.blocks.exposed_count() != 0)
      violation(Invariant::kLeak, "n" + std::to_string(id) + " still exposes " +
                std::to_string(node.blocks.exposed_count()) + " blocks");
  }
}

void Cluster::trace(const Event& e) {
  auto feed = [&](uint64_t v) { hash_ = (hash_ ^ v) * 1099511628211ull; };
  feed(static_cast<uint64_t>(e.at));
  feed(static_cast<uint64_t>(e.kind));
  feed(e.node);
  feed(e.a);
  if (e.kind == EventKind::kDeliver) {
    feed(static_cast<uint64_t>(e.message.kind));
    feed(e.message.from);
    feed(e.message.transfer);
  }
  if (!record_trace_) return;
  std::string line = std::to_string(e.at) + " ms " + event_name(e.kind) + " n" + std::to_string(e.node);
  if (e.kind == EventKind::kDeliver) {
    line += " " + describe(e.message);
  } else if (e.kind != EventKind::kWake && e.kind != EventKind::kCrash && e.kind != EventKind::kRestart) {
    line += " " + std::to_string(e.a);
  }
  result_.trace.push_back(std::move(line));
}

void Cluster::collect_stats(const SimNode& node) {
  const NodeStats& st = node.core->stats();
  for (int i = 0; i < kDropReasonCount; ++i)
    count("drop." + std::string(name(static_cast<DropReason>(i))), st.drops[i]);
  for (int i = 0; i < kEndReasonCount; ++i)
    count(std::string(node.role == Role::kRouter ? "request." : "end.") +
              std::string(name(static_cast<EndReason>(i))),
          st.ends[i]);
  if (node.role == Role::kPrefill) {
    for (int i = 0; i < kPrefillStateCount; ++i)
      count("state.prefill." + std::string(name(static_cast<PrefillState>(i))), st.state_entries[i]);
  } else if (node.role == Role::kDecode) {
    for (int i = 0; i < kDecodeStateCount; ++i)
      count("state.decode." + std::string(name(static_cast<DecodeState>(i))), st.state_entries[i]);
  }
  count("path.deferred_write", st.deferred_writes);
  count("path.late_addresses_accepted", st.late_addresses_accepted);
  count("path.addresses_before_kv", st.addresses_before_kv);
  count("path.zero_block_transfer", st.zero_block_transfers);
  count("path.quarantine", st.quarantines);
  count("path.end_before_start", st.early_end_tombstones);
  count("path.early_message_replayed", st.early_messages_replayed);
  count("path.silent_peer", st.silent_peers);
  count("path.retransmit", st.retransmits);
  count("path.peer_death", st.peer_deaths);
}

void Cluster::handle(const Event& e) {
  SimNode* node = e.node != 0 ? &nodes_.at(e.node) : nullptr;
  auto stale = [&]() { return !node->up || e.epoch != node->epoch; };
  switch (e.kind) {
    case EventKind::kArrive: {
      ClientRequest& r = requests_[e.a];
      SimNode& router = nodes_.at(kRouterNode);
      // The router mints the id inside submit(); map it before its outputs run.
      TransferId t = router.router->submit(r.work.spec, now_, &scratch_);
      r.transfer = t;
      request_of_[t] = e.a;
      apply(router, scratch_);
      break;
    }
    case EventKind::kClientAbort: {
      ClientRequest& r = requests_[e.a];
      if (r.transfer == 0 || r.terminal_count > 0) break;
      if (!r.client_aborted) count("fault.client_abort");
      r.client_aborted = true;
      SimNode& router = nodes_.at(kRouterNode);
      router.router->cancel(r.transfer, now_, &scratch_);
      apply(router, scratch_);
      break;
    }
    case EventKind::kDeliver:
      if (!node->up) {
        count("fault.delivered_to_dead");
        break;
      }
      if (e.message.kind == MessageKind::kHeartbeat) {
        auto [it, fresh] = last_heartbeat_ms_.try_emplace({e.message.from, e.node}, now_);
        if (!fresh && now_ - it->second >= s_.protocol.lease_ms) {
          silences_.push_back({e.message.from, e.node, it->second, now_});
          count("fault.heartbeat_silence");
        }
        it->second = now_;
      }
      node->core->on_message(e.message, now_, &scratch_);
      apply(*node, scratch_);
      break;
    case EventKind::kWake:
      if (stale() || e.at != node->next_wake_ms) break;
      node->next_wake_ms = kNever;
      node->core->on_timer(now_, &scratch_);
      apply(*node, scratch_);
      break;
    case EventKind::kPrefillDone: {
      if (stale() || node->pe.computing != e.a || node->pe.serial != e.b) break;
      TransferId t = e.a;
      PrefillEngine& pe = node->pe;
      std::vector<BlockId> blocks = std::move(pe.blocks);
      int32_t slot = pe.slot;
      int32_t prompt = pe.prompt_tokens.at(t);
      pe.computing = 0;
      pe.blocks.clear();
      pe.slot = kNoSlot;
      pe.prompt_tokens.erase(t);
      if (rng_.chance(s_.prefill_failure_probability)) {
        count("fault.prefill_failure");
        requests_[request_of_.at(t)].injected_failure = true;
        std::string problem = node->blocks.free(blocks, t);
        if (slot != kNoSlot) problem += node->slots.free({slot}, t);
        if (!problem.empty()) violation(Invariant::kPoolOwnership, problem);
        node->prefill->on_prefill_failed(t, now_, &scratch_);
      } else {
        for (size_t i = 0; i < blocks.size(); ++i)
          node->blocks.set_tag(blocks[i], block_tag(t, static_cast<int32_t>(i)));
        if (slot != kNoSlot) node->slots.set_tag(slot, state_tag(t, prompt - 1));
        node->prefill->on_prefill_computed(t, std::move(blocks), slot, now_, &scratch_);
      }
      apply(*node, scratch_);
      break;
    }
    case EventKind::kAdmitted: {
      if (stale()) break;
      auto it = node->de.admissions.find(e.a);
      if (it != node->de.admissions.end()) it->second.ready = true;
      break;
    }
    case EventKind::kRmaDone:
      on_rma_done(e.a);
      break;
    case EventKind::kSiblingDone: {
      if (stale()) break;
      auto it = node->de.running.find(e.a);
      if (it == node->de.running.end()) break;
      // An ended request must stop consuming resources: no sibling of an
      // ended transfer decodes on.
      const DecodeTransfer* d = node->decode->find(it->second);
      if (d == nullptr || d->ending)
        violation(Invariant::kEndedStillRunning,
                  pd::transfer_name(it->second) + ": a sibling decoded on after its transfer ended (" +
                      std::string(d != nullptr ? pd::name(d->end_reason) : "forgotten") + ")");
      node->de.running.erase(it);
      node->decode->on_sibling_finished(e.a, now_, &scratch_);
      apply(*node, scratch_);
      break;
    }
    case EventKind::kCrash:
      // Two crashes of one node may overlap (a drained instance's exit and
      // a crash): the second finds it down; its restart finds it up again.
      if (!node->up) break;
      count("fault.crash");
      collect_stats(*node);
      node->up = false;
      node->core = nullptr;
      node->router.reset();
      node->prefill.reset();
      node->decode.reset();
      break;
    case EventKind::kFenced: {
      if (stale()) break;
      NodeId peer = static_cast<NodeId>(e.a);
      Epoch peer_epoch = static_cast<Epoch>(e.b);
      ++node->fences_completed[{peer, peer_epoch}];
      count("path.fence_completed");
      node->core->on_peer_fenced(peer, peer_epoch, now_, &scratch_);
      apply(*node, scratch_);
      break;
    }
    case EventKind::kDrain:
      if (!node->up) break;
      count("fault.drain");
      node->core->begin_drain();
      break;
    case EventKind::kEngineFailed: {
      if (stale()) break;
      const DecodeTransfer* d = node->decode->find(e.a);
      if (d == nullptr || d->ending) break;  // it ended first
      count("fault.engine_failure");
      requests_[request_of_.at(e.a)].injected_failure = true;
      node->decode->on_engine_failed(e.a, now_, &scratch_);
      apply(*node, scratch_);
      break;
    }
    case EventKind::kLocalCancel: {
      ClientRequest& r = requests_[e.a];
      if (r.transfer == 0 || r.terminal_count > 0) break;
      const RouterRequest* rr = nodes_.at(kRouterNode).router->find(r.transfer);
      if (rr == nullptr || rr->state != RouterState::kDispatched) break;
      // Either side may give up on its own: the decode when its client
      // left, the prefill on a local error.
      const bool at_decode = (e.a % 3) != 0;
      SimNode& n = nodes_.at(at_decode ? rr->decode : rr->prefill);
      if (!n.up || n.epoch != (at_decode ? rr->decode_epoch : rr->prefill_epoch)) break;
      const TransferBase* t = at_decode ? static_cast<const TransferBase*>(n.decode->find(r.transfer))
                                        : static_cast<const TransferBase*>(n.prefill->find(r.transfer));
      if (t == nullptr || t->ending) break;
      count(at_decode ? "fault.local_cancel_decode" : "fault.local_cancel_prefill");
      r.injected_failure = true;
      if (at_decode) {
        // The decode sees its HTTP client (the router's leg) go first; the
        // router, whose client it was, aborts a moment later.
        r.client_aborted = true;
        n.decode->cancel(r.transfer, EndReason::kClientAbort, now_, &scratch_);
        push_at(now_ + rng_.uniform(0, 50), EventKind::kClientAbort, 0, e.a);
      } else {
        n.prefill->cancel(r.transfer, EndReason::kPrefillFailed, now_, &scratch_);
      }
      apply(n, scratch_);
      break;
    }
    case EventKind::kRestart: {
      if (node->up) break;
      count("fault.restart");
      ++node->epoch;
      boot(*node);
      node->core->start(now_, &scratch_);
      apply(*node, scratch_);
      break;
    }
  }
}

void Cluster::on_rma_done(uint64_t op_id) {
  RmaOp op = std::move(ops_.at(op_id));
  ops_.erase(op_id);
  SimNode& initiator = nodes_.at(op.initiator);
  SimNode& target = nodes_.at(op.target);
  // A crashed initiator's operation dies with it (nothing lands, nobody hears).
  if (!initiator.up || initiator.epoch != op.initiator_epoch) return;
  RmaResult result = RmaResult::kOk;
  std::string t = pd::transfer_name(op.transfer);
  if (op.post_failed) {
    result = RmaResult::kPostFailed;
  } else if (op.fails || !target.up || target.epoch != op.target_epoch) {
    result = RmaResult::kFailed;
  } else if (auto at = target.fences_at_exposure.find({op.initiator, op.transfer});
             at != target.fences_at_exposure.end() &&
             target.fences_completed[{op.initiator, op.initiator_epoch}] > at->second) {
    // The target fenced the initiator after telling it where to go: the
    // connection the addresses came on is cut, the operation fails.
    result = RmaResult::kFailed;
    count(op.write ? "path.fenced_write" : "path.fenced_read");
  } else {
    // An unfenced peer's RMA lands, whatever the target's core believes: it
    // must find the memory still exposed to it for this transfer (held, in
    // quarantine if the transfer ended), never freed or reused.
    bool reachable = true;
    for (BlockId b : op.target_blocks) reachable = reachable && target.blocks.exposed_to(b, op.initiator, op.transfer);
    if (op.target_slot != kNoSlot)
      reachable = reachable && target.slots.exposed_to(op.target_slot, op.initiator, op.transfer);
    if (!reachable) {
      violation(Invariant::kRmaIntoPrivate, t + ": an " + std::string(op.write ? "RMA write" : "RMA read") + " of n" +
                std::to_string(op.initiator) + " reached memory of n" + std::to_string(op.target) +
                " no longer exposed to it, and n" + std::to_string(op.target) + " never fenced it");
      result = RmaResult::kFailed;
    } else {
      SimNode& src = op.write ? initiator : target;
      SimNode& dst = op.write ? target : initiator;
      const std::vector<BlockId>& src_blocks = op.write ? op.initiator_blocks : op.target_blocks;
      const std::vector<BlockId>& dst_blocks = op.write ? op.target_blocks : op.initiator_blocks;
      int32_t src_slot = op.write ? op.initiator_slot : op.target_slot;
      int32_t dst_slot = op.write ? op.target_slot : op.initiator_slot;
      for (size_t i = 0; i < src_blocks.size(); ++i) {
        if (!src.blocks.owned_by(src_blocks[i], op.transfer))
          violation(Invariant::kRmaAfterEnd, t + ": block " + std::to_string(src_blocks[i]) + " of n" + std::to_string(src.id) +
                    " read after its transfer ended (owner t" +
                    std::to_string(src.blocks.owner(src_blocks[i])) + ")");
        if (!dst.blocks.owned_by(dst_blocks[i], op.transfer))
          violation(Invariant::kRmaAfterEnd, t + ": block " + std::to_string(dst_blocks[i]) + " of n" + std::to_string(dst.id) +
                    " written after its transfer ended (owner t" +
                    std::to_string(dst.blocks.owner(dst_blocks[i])) + ")");
        dst.blocks.set_tag(dst_blocks[i], src.blocks.tag(src_blocks[i]));
      }
      if (src_slot != kNoSlot && dst_slot != kNoSlot) {
        if (!src.slots.owned_by(src_slot, op.transfer) || !dst.slots.owned_by(dst_slot, op.transfer))
          violation(Invariant::kRmaAfterEnd, t + ": state slot moved after its transfer ended");
        dst.slots.set_tag(dst_slot, src.slots.tag(src_slot));
      }
    }
  }
  if (op.write) {
    initiator.prefill->on_write_done(op.transfer, result, now_, &scratch_);
  } else {
    initiator.decode->on_read_done(op.transfer, result, now_, &scratch_);
  }
  apply(initiator, scratch_);
  check_node(target);
}

RunResult Cluster::run() {
  result_.seed = s_.seed;
  add_node(kRouterNode, Role::kRouter);
  NodeId next = kRouterNode + 1;
  for (int i = 0; i < s_.options.n_prefill; ++i) add_node(next++, Role::kPrefill);
  for (int i = 0; i < s_.options.n_decode; ++i) add_node(next++, Role::kDecode);
  // Boot once every node exists: heartbeat targets name them all.
  for (auto& [id, node] : nodes_) boot(node);
  for (auto& [id, node] : nodes_) {
    node.core->start(0, &scratch_);
    apply(node, scratch_);
  }
  for (size_t i = 0; i < s_.workload.size(); ++i) {
    ClientRequest r;
    r.work = s_.workload[i];
    requests_.push_back(r);
    push_at(r.work.arrival_ms, EventKind::kArrive, 0, i);
    if (r.work.abort_at_ms != kNever) push_at(r.work.abort_at_ms, EventKind::kClientAbort, 0, i);
    if (r.work.local_cancel_at_ms != kNever) push_at(r.work.local_cancel_at_ms, EventKind::kLocalCancel, 0, i);
  }
  for (const Drain& d : s_.drains) push_at(d.at_ms, EventKind::kDrain, d.node);
  for (const Crash& c : s_.crashes) {
    push_at(c.at_ms, EventKind::kCrash, c.node);
    push_at(c.at_ms + c.restart_after_ms, EventKind::kRestart, c.node);
  }
  if (record_trace_) {
    for (const Partition& p : s_.partitions)
      result_.trace.push_back("fault: partition n" + std::to_string(p.a) +
                              (p.b == 0 ? std::string(" <-> all") : (p.one_way ? " -> n" : " <-> n") + std::to_string(p.b)) +
                              " from " + std::to_string(p.start_ms) + " to " + std::to_string(p.end_ms) + " ms");
    for (const Crash& c : s_.crashes)
      result_.trace.push_back("fault: crash n" + std::to_string(c.node) + " at " + std::to_string(c.at_ms) +
                              " ms, restart after " + std::to_string(c.restart_after_ms) + " ms");
    for (const Drain& d : s_.drains)
      result_.trace.push_back("fault: drain n" + std::to_string(d.node) + " from " + std::to_string(d.at_ms) + " ms");
  }
  // Liveness: once faults stop, everything settles within a lease and a grace
  // period; each injected slow admission may hold credits that later requests
  // queue behind, so it extends the bound by its own length.
  auto check_ms = [&] {
    return s_.faults_end_ms + max_lease_ms() + s_.grace_ms +
           slow_admissions_ * s_.slow_admission_ms;
  };
  while (!events_.empty() && result_.violations.empty()) {
    Event e = events_.top();
    events_.pop();
    if (e.at > check_ms()) break;
    now_ = e.at;
    ++result_.events;
    trace(e);
    handle(e);
    if (e.node != 0) {
      SimNode& node = nodes_.at(e.node);
      pump(node);
      check_node(node);
    }
    if (terminal_ == static_cast<int64_t>(requests_.size()) && settled()) break;
  }
  result_.end_ms = now_;
  if (result_.violations.empty()) final_checks();
  for (auto& [id, node] : nodes_)
    if (node.up) collect_stats(node);
  result_.trace_hash = hash_;
  return std::move(result_);
}

}  // namespace

RunResult run_scenario(const Scenario& scenario, bool record_trace) {
  Cluster cluster(scenario, record_trace);
  return cluster.run();
}

std::string_view name(Invariant v) {
  static constexpr std::array<std::string_view, kInvariantCount> names = {
      "announced", "pool_ownership", "sibling_map", "fork", "kv_integrity", "completed_early", "terminal_once",
      "unexplained_failure", "block_accounting", "hang", "leak", "rma_after_end", "ended_still_running",
      "rma_into_private"};
  return names[static_cast<size_t>(v)];
}

}  // namespace tandem::sim
