// Fencing over the real transport, driven by the real protocol cores: a
// prefill that is alive but cut off from the decode (every control frame
// between them dropped) posts its write after the decode has declared it dead.
// The write must fail, or land in blocks the decode still holds in
// quarantine; never in blocks the decode has freed and reused.
//  - UCX over TCP: the decode's fence (a forced close) completes, it frees and
//    reuses the blocks; the prefill reconnects, and its write, bound to the
//    connection the addresses came on, fails. The reused bytes are intact.
//  - UCX with shared memory: a live peer cannot be fenced, so the fence never
//    completes and the blocks stay quarantined (held, never reused) however
//    long it lasts, whatever the late write does.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "pd/decode_side.h"
#include "pd/prefill_side.h"
#include "pd_fixtures.h"
#include "transport/ucx_transport.h"
#include "transport/wire.h"
#include "util/clock.h"

namespace tandem::transport {
namespace {

using pd::Effect;
using pd::EffectKind;
using pd::Message;
using pd::MessageKind;

constexpr pd::NodeId kRouter = tandem::testing::kRouterNode, kPrefill = tandem::testing::kPrefillNode,
                     kDecode = tandem::testing::kDecodeNode;
constexpr pd::TransferId kTransfer = (pd::TransferId{1} << pd::kTransferEpochShift) | 7;
constexpr int kBlocks = 32;
constexpr uint64_t kBlockBytes = 4096;
constexpr int kPrompt = 65;  // 64 tokens move: 4 blocks of 16

// One instance: a pool, a real transport and a real protocol core, and the
// driver's duties (effects before messages, events into the core).
struct Instance {
  std::vector<uint8_t> pool;
  std::unique_ptr<UcxTransport> transport;
  std::unique_ptr<pd::PrefillSide> prefill;
  std::unique_ptr<pd::DecodeSide> decode;
  bool cut_off = false;  // control frames to the peer are dropped
  std::map<pd::TransferId, uint64_t> address_connection;
  std::vector<Effect> effects;
  std::vector<TransportEvent> events;
  pd::NodeCore& core() { return prefill ? static_cast<pd::NodeCore&>(*prefill) : *decode; }
};

Instance make(pd::NodeId node, const std::string& tls, pd::TimeMs lease_ms, uint8_t fill) {
  Instance in;
  in.pool.assign(kBlocks * kBlockBytes, fill);
  UcxTransportConfig c;
  c.secret = "fencing";
  c.self.node = node;
  c.self.epoch = 1;
  c.self.role = node == kPrefill ? pd::Role::kPrefill : pd::Role::kDecode;
  c.self.fingerprint.model_hash = 42;
  c.region = in.pool.data();
  c.region_bytes = in.pool.size();
  c.n_blocks = kBlocks;
  c.block_bytes = kBlockBytes;
  c.tls = tls;
  c.handshake_timeout_ms = 3000;
  in.transport = std::make_unique<UcxTransport>(c);
  pd::ProtocolConfig p;
  p.heartbeat_interval_ms = 100;
  p.lease_ms = lease_ms;
  p.retransmit_interval_ms = 200;
  if (node == kPrefill) {
    in.prefill = std::make_unique<pd::PrefillSide>(node, 1, kBlocks, p);
  } else {
    in.decode = std::make_unique<pd::DecodeSide>(node, 1, kBlocks, p);
  }
  in.core().set_heartbeat_targets({node == kPrefill ? kDecode : kPrefill});
  return in;
}

void perform(Instance& in, pd::Outputs& out) {
  for (const Effect& e : out.effects) {
    in.effects.push_back(e);
    if (e.kind == EffectKind::kFencePeer) in.transport->fence(e.peer, e.peer_epoch);
    if (e.kind == EffectKind::kPostWrite) {
      std::vector<RmaRun> runs;
      for (size_t i = 0; i < e.local_blocks.size(); ++i)
        runs.push_back({uint64_t(e.local_blocks[i]) * kBlockBytes, uint64_t(e.remote_blocks[i]) * kBlockBytes,
                        kBlockBytes});
      auto conn = in.address_connection.find(e.transfer);
      in.transport->post(e.peer, RmaOp::kPut, runs, e.transfer, monotonic_ms() + 3000,
                         conn == in.address_connection.end() ? 0 : conn->second);
    }
  }
  for (const Message& m : out.messages) {
    if (m.to == kRouter || in.cut_off) continue;  // no router here; the cut drops the rest
    in.transport->send(m.to, encode_message(m));
  }
  out.clear();
}

void call(Instance& in, const std::function<void(pd::Outputs*)>& f) {
  pd::Outputs out;
  f(&out);
  perform(in, out);
}

void step(Instance& in) {
  in.transport->poll(1, &in.events);
  for (TransportEvent& e : in.events) {
    pd::TimeMs now = monotonic_ms();
    if (e.kind == TransportEvent::Kind::kMessage) {
      WireLimits limits;
      limits.peer_n_blocks = kBlocks;
      Message m;
      if (decode_message(e.frame, limits, &m) != WireError::kNone) continue;
      // As the transfer agent does: bind the RMA to the connection the
      // addresses come on, before the core may post it.
      if (m.kind == MessageKind::kRemoteBlocks && in.prefill && in.prefill->find(m.transfer) != nullptr &&
          !in.prefill->find(m.transfer)->addresses_known)
        in.address_connection[m.transfer] = e.connection;
      call(in, [&](pd::Outputs* o) { in.core().on_message(m, now, o); });
    } else if (e.kind == TransportEvent::Kind::kRmaDone && in.prefill) {
      pd::RmaResult r = e.ok ? pd::RmaResult::kOk : pd::RmaResult::kFailed;
      call(in, [&](pd::Outputs* o) { in.prefill->on_write_done(e.tag, r, now, o); });
    } else if (e.kind == TransportEvent::Kind::kPeerFenced) {
      call(in, [&](pd::Outputs* o) { in.core().on_peer_fenced(e.peer, e.peer_epoch, now, o); });
    }
  }
  in.events.clear();
  call(in, [&](pd::Outputs* o) { in.core().on_timer(monotonic_ms(), o); });
}

bool run_until(Instance& a, Instance& b, const std::function<bool()>& done, int timeout_ms) {
  for (pd::TimeMs until = monotonic_ms() + timeout_ms; monotonic_ms() < until;) {
    step(a);
    step(b);
    if (done()) return true;
  }
  return done();
}

Message start(MessageKind kind) {
  return tandem::testing::start_message(kind, kTransfer, pd::TransferMode::kWrite, kPrompt, 1, 600'000);
}

bool has_effect(const Instance& in, EffectKind kind) {
  return std::any_of(in.effects.begin(), in.effects.end(), [&](const Effect& e) { return e.kind == kind; });
}

// Up to the cut: both connected, the Starts in, the decode's blocks allocated
// and their addresses at the prefill, whose compute is still "running".
std::vector<pd::BlockId> set_up(Instance& prefill, Instance& decode) {
  prefill.transport->connect("127.0.0.1", decode.transport->listen_port());
  auto connected = [](const Instance& in) {
    return std::any_of(in.events.begin(), in.events.end(),
                       [](const TransportEvent& e) { return e.kind == TransportEvent::Kind::kConnected; });
  };
  for (pd::TimeMs until = monotonic_ms() + 5000; monotonic_ms() < until && !(connected(prefill) && connected(decode));) {
    prefill.transport->poll(1, &prefill.events);
    decode.transport->poll(1, &decode.events);
  }
  EXPECT_TRUE(connected(prefill) && connected(decode));
  prefill.events.clear();
  decode.events.clear();
  pd::TimeMs now = monotonic_ms();
  call(prefill, [&](pd::Outputs* o) { prefill.core().start(now, o); });
  call(decode, [&](pd::Outputs* o) { decode.core().start(now, o); });
  call(decode, [&](pd::Outputs* o) { decode.core().on_message(start(MessageKind::kStartDecode), now, o); });
  call(prefill, [&](pd::Outputs* o) { prefill.core().on_message(start(MessageKind::kStartPrefill), now, o); });
  std::vector<pd::BlockId> blocks = {20, 21, 22, 23, 24};  // 4 moved + 1 for the outputs
  call(decode, [&](pd::Outputs* o) { decode.decode->on_blocks_allocated(kTransfer, blocks, pd::kNoSlot, 0, now, o); });
  EXPECT_TRUE(run_until(prefill, decode, [&] { return prefill.prefill->find(kTransfer)->addresses_known; }, 3000));
  return blocks;
}

void post_late_write(Instance& prefill) {
  // The prefill's KV is ready only now; it still believes in the decode.
  ASSERT_FALSE(prefill.prefill->find(kTransfer)->ending);
  for (int b = 0; b < 4; ++b) std::fill_n(prefill.pool.begin() + b * kBlockBytes, kBlockBytes, uint8_t{0x11});
  call(prefill, [&](pd::Outputs* o) {
    prefill.prefill->on_prefill_computed(kTransfer, {0, 1, 2, 3}, pd::kNoSlot, monotonic_ms(), o);
  });
  ASSERT_TRUE(has_effect(prefill, EffectKind::kPostWrite));
}

TEST(PdFencing, OverTcpALateWriteOfAFencedPrefillFailsAndReusedBlocksStayIntact) {
  // The prefill waits 30 s for a silent decode; the decode gives up after 0.5 s.
  Instance prefill = make(kPrefill, "tcp", 30'000, 0x00);
  Instance decode = make(kDecode, "tcp", 500, 0x00);
  std::vector<pd::BlockId> blocks = set_up(prefill, decode);
  prefill.cut_off = decode.cut_off = true;
  // The decode declares the prefill dead, fences it, and only then frees.
  ASSERT_TRUE(run_until(prefill, decode, [&] { return decode.decode->blocks_held() == 0; }, 5000));
  ASSERT_TRUE(has_effect(decode, EffectKind::kFencePeer));
  EXPECT_EQ(decode.decode->find(kTransfer)->end_reason, pd::EndReason::kPeerDead);
  EXPECT_TRUE(decode.core().fences_pending().empty());
  // The blocks are reused at once: another request's KV is in them.
  for (pd::BlockId b : blocks) std::fill_n(decode.pool.begin() + b * kBlockBytes, kBlockBytes, uint8_t{0xEE});
  // The cut heals enough for the prefill to reconnect (a new connection),
  // but the addresses it holds came on the old one.
  run_until(prefill, decode, [] { return false; }, 200);
  prefill.transport->connect("127.0.0.1", decode.transport->listen_port());
  bool reconnected = false;
  for (pd::TimeMs until = monotonic_ms() + 5000; monotonic_ms() < until && !reconnected;) {
    prefill.transport->poll(1, &prefill.events);
    decode.transport->poll(1, &decode.events);
    for (const TransportEvent& e : prefill.events) reconnected |= e.kind == TransportEvent::Kind::kConnected;
    prefill.events.erase(std::remove_if(prefill.events.begin(), prefill.events.end(),
                                        [](const TransportEvent& e) { return e.kind == TransportEvent::Kind::kConnected; }),
                         prefill.events.end());
  }
  ASSERT_TRUE(reconnected);
  post_late_write(prefill);
  ASSERT_TRUE(run_until(prefill, decode, [&] { return prefill.prefill->find(kTransfer)->ending; }, 5000));
  EXPECT_EQ(prefill.prefill->find(kTransfer)->end_reason, pd::EndReason::kRmaFailed);
  run_until(prefill, decode, [] { return false; }, 200);
  for (pd::BlockId b : blocks)
    EXPECT_TRUE(std::all_of(decode.pool.begin() + b * kBlockBytes, decode.pool.begin() + (b + 1) * kBlockBytes,
                            [](uint8_t x) { return x == 0xEE; }))
        << "block " << b << " was written after it was reused";
}

TEST(PdFencing, WithSharedMemoryALivePrefillIsNeverFencedSoTheBlocksStayQuarantined) {
  Instance prefill = make(kPrefill, "tcp,sm,self", 30'000, 0x00);
  Instance decode = make(kDecode, "tcp,sm,self", 500, 0x00);
  ASSERT_FALSE(decode.transport->fences_by_close());
  set_up(prefill, decode);
  prefill.cut_off = decode.cut_off = true;
  ASSERT_TRUE(run_until(prefill, decode, [&] { return has_effect(decode, EffectKind::kFencePeer); }, 5000));
  // The prefill lives (this very process): no fence completes, nothing is freed.
  run_until(prefill, decode, [] { return false; }, 1500);
  EXPECT_EQ(decode.decode->find(kTransfer)->state, pd::DecodeState::kQuarantined);
  EXPECT_EQ(decode.decode->blocks_held(), 5);
  EXPECT_FALSE(has_effect(decode, EffectKind::kFree));
  EXPECT_EQ(decode.core().fences_pending().size(), 1u);
  // Its late write may land (shared memory reaches our pages): in blocks still
  // held by the quarantined transfer, never in freed ones.
  post_late_write(prefill);
  run_until(prefill, decode, [&] { return prefill.prefill->find(kTransfer)->rma_in_flight == false; }, 5000);
  run_until(prefill, decode, [] { return false; }, 300);
  EXPECT_EQ(decode.decode->blocks_held(), 5);
  EXPECT_FALSE(has_effect(decode, EffectKind::kFree));
}

}  // namespace
}  // namespace tandem::transport
