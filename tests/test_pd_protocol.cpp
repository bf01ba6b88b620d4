// The P/D transfer protocol cores driven by hand, message by message: each test
// replays one failure family of the field reports (shared/seeds 000 and 002)
// against the real protocol, and against its mutation where one exists.
#include <gtest/gtest.h>

#include <algorithm>

#include "pd/decode_side.h"
#include "pd/prefill_side.h"
#include "pd/router_core.h"
#include "pd_fixtures.h"

namespace tandem::pd {
namespace {

constexpr NodeId kRouter = tandem::testing::kRouterNode, kPrefill = tandem::testing::kPrefillNode,
                 kDecode = tandem::testing::kDecodeNode;
constexpr TransferId kTransfer = 7;

int count_messages(const Outputs& out, MessageKind kind) {
  return static_cast<int>(std::count_if(out.messages.begin(), out.messages.end(),
                                        [&](const Message& m) { return m.kind == kind; }));
}
const Message* find_message(const Outputs& out, MessageKind kind) {
  for (const Message& m : out.messages)
    if (m.kind == kind) return &m;
  return nullptr;
}
const Effect* find_effect(const Outputs& out, EffectKind kind) {
  for (const Effect& e : out.effects)
    if (e.kind == kind) return &e;
  return nullptr;
}

Message start(MessageKind kind, TransferMode mode, int32_t prompt_tokens, int32_t n) {
  return tandem::testing::start_message(kind, kTransfer, mode, prompt_tokens, n, 900'000);
}

// A message from one side to the other, as the network would deliver it.
Message peer_message(MessageKind kind, NodeId from, NodeId to) {
  Message m;
  m.kind = kind;
  m.from = from;
  m.from_epoch = 1;
  m.to = to;
  m.to_epoch = 1;
  m.transfer = kTransfer;
  return m;
}

Message heartbeat(NodeId from, NodeId to, Role role) {
  Message m;
  m.kind = MessageKind::kHeartbeat;
  m.from = from;
  m.from_epoch = 1;
  m.to = to;
  m.role = role;
  return m;
}

std::vector<BlockId> iota_blocks(int n, BlockId first) {
  std::vector<BlockId> b(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) b[i] = first + i;
  return b;
}

// Report 000, bug 1: the decode's block addresses arrive 78 s after the KV is
// ready. The deferred write has no timer of its own: it fires on arrival.
TEST(PdProtocol, DeferredWriteAcceptsAddresses78SecondsLate) {
  ProtocolConfig config;
  PrefillSide prefill(kPrefill, 1, 64, config);
  Outputs out;
  prefill.on_message(start(MessageKind::kStartPrefill, TransferMode::kWrite, 40, 1), 0, &out);
  ASSERT_NE(find_effect(out, EffectKind::kComputePrefill), nullptr);
  out.clear();
  prefill.on_prefill_computed(kTransfer, iota_blocks(3, 0), kNoSlot, 100, &out);
  EXPECT_EQ(prefill.find(kTransfer)->state, PrefillState::kAwaitingAddresses);
  // 78 s pass: heartbeats from the (slow but live) decode keep its lease.
  for (TimeMs t = 500; t <= 78'100; t += 500) {
    prefill.on_message(heartbeat(kDecode, kPrefill, Role::kDecode), t, &out);
    prefill.on_timer(t, &out);
  }
  EXPECT_EQ(prefill.find(kTransfer)->state, PrefillState::kAwaitingAddresses);
  // Inspectable: one transfer waiting for addresses, for 78 s.
  auto ages = prefill.ages_by_state(78'100);
  EXPECT_EQ(ages[static_cast<int>(PrefillState::kAwaitingAddresses)].count, 1);
  EXPECT_EQ(ages[static_cast<int>(PrefillState::kAwaitingAddresses)].oldest_ms, 78'000);
  out.clear();
  Message remote = peer_message(MessageKind::kRemoteBlocks, kDecode, kPrefill);
  remote.blocks = iota_blocks(3, 10);
  prefill.on_message(remote, 78'100, &out);
  const Effect* write = find_effect(out, EffectKind::kPostWrite);
  ASSERT_NE(write, nullptr);
  EXPECT_EQ(write->remote_blocks, iota_blocks(3, 10));
  EXPECT_EQ(prefill.stats().late_addresses_accepted, 1);
}

TEST(PdProtocol, MutationFixedDeferExpiryDropsTheLateAddresses) {
  if (!kMutationsBuilt) GTEST_SKIP() << "a Release build has no mutations; the sanitizer build runs this";
  ProtocolConfig config;
  config.mutation = Mutation::kFixedDeferExpiry;
  PrefillSide prefill(kPrefill, 1, 64, config);
  Outputs out;
  prefill.on_message(start(MessageKind::kStartPrefill, TransferMode::kWrite, 40, 1), 0, &out);
  prefill.on_prefill_computed(kTransfer, iota_blocks(3, 0), kNoSlot, 100, &out);
  for (TimeMs t = 500; t <= 78'100; t += 500) {
    prefill.on_message(heartbeat(kDecode, kPrefill, Role::kDecode), t, &out);
    prefill.on_timer(t, &out);
  }
  EXPECT_EQ(prefill.find(kTransfer)->state, PrefillState::kEnded);
  EXPECT_EQ(prefill.find(kTransfer)->end_reason, EndReason::kDeferExpired);
  out.clear();
  Message remote = peer_message(MessageKind::kRemoteBlocks, kDecode, kPrefill);
  remote.blocks = iota_blocks(3, 10);
  prefill.on_message(remote, 78'100, &out);
  EXPECT_EQ(find_effect(out, EffectKind::kPostWrite), nullptr);
  EXPECT_EQ(prefill.stats().drops[static_cast<int>(DropReason::kEnded)], 1);
}

// Report 002, fix 1: n siblings share one transfer id; one write completion
// starts all of them, and the transfer completes once, when the last finishes.
void run_siblings(Mutation mutation, int* started, std::string* map_problem, int* outcomes) {
  ProtocolConfig config;
  config.mutation = mutation;
  DecodeSide decode(kDecode, 1, 256, config);
  Outputs out;
  decode.on_message(start(MessageKind::kStartDecode, TransferMode::kWrite, 40, 4), 0, &out);
  *map_problem = decode.check_sibling_maps();
  decode.on_blocks_allocated(kTransfer, iota_blocks(7, 0), kNoSlot, 0, 10, &out);
  out.clear();
  decode.on_message(peer_message(MessageKind::kWriteDone, kPrefill, kDecode), 20, &out);
  const Effect* start_siblings = find_effect(out, EffectKind::kStartSiblings);
  ASSERT_NE(start_siblings, nullptr);
  *started = static_cast<int>(start_siblings->siblings.size());
  std::vector<SiblingId> siblings = start_siblings->siblings;
  out.clear();
  for (SiblingId s : siblings) decode.on_sibling_finished(s, 30, &out);
  *outcomes = count_messages(out, MessageKind::kOutcome);
}

TEST(PdProtocol, SiblingsAreChildrenOfOneTransfer) {
  int started = 0, outcomes = 0;
  std::string problem;
  run_siblings(Mutation::kNone, &started, &problem, &outcomes);
  EXPECT_EQ(started, 4);
  EXPECT_EQ(problem, "");
  EXPECT_EQ(outcomes, 1);
}

TEST(PdProtocol, MutationOneToOneMapLosesSiblings) {
  if (!kMutationsBuilt) GTEST_SKIP() << "a Release build has no mutations; the sanitizer build runs this";
  int started = 0, outcomes = 0;
  std::string problem;
  run_siblings(Mutation::kOneToOneSiblingMap, &started, &problem, &outcomes);
  EXPECT_EQ(started, 1);
  EXPECT_NE(problem, "");
}

// Report 002, fix 2: after its read the decode releases the prefill's blocks
// with the shared transfer id, and the prefill frees them.
void run_read_release(Mutation mutation, TransferId* release_id, bool* prefill_freed) {
  ProtocolConfig config;
  config.mutation = mutation;
  PrefillSide prefill(kPrefill, 1, 64, config);
  DecodeSide decode(kDecode, 1, 256, config);
  Outputs p, d;
  prefill.on_message(start(MessageKind::kStartPrefill, TransferMode::kRead, 40, 2), 0, &p);
  decode.on_message(start(MessageKind::kStartDecode, TransferMode::kRead, 40, 2), 0, &d);
  decode.on_blocks_allocated(kTransfer, iota_blocks(7, 0), kNoSlot, 0, 5, &d);
  p.clear();
  prefill.on_prefill_computed(kTransfer, iota_blocks(3, 20), kNoSlot, 10, &p);
  const Message* addresses = find_message(p, MessageKind::kKvAddresses);
  ASSERT_NE(addresses, nullptr);
  ASSERT_NE(find_effect(p, EffectKind::kExpose), nullptr);
  d.clear();
  decode.on_message(*addresses, 12, &d);
  ASSERT_NE(find_effect(d, EffectKind::kPostRead), nullptr);
  d.clear();
  decode.on_read_done(kTransfer, RmaResult::kOk, 20, &d);
  const Message* release = find_message(d, MessageKind::kRelease);
  ASSERT_NE(release, nullptr);
  *release_id = release->transfer;
  p.clear();
  prefill.on_message(*release, 25, &p);
  *prefill_freed = find_effect(p, EffectKind::kFree) != nullptr &&
                   prefill.find(kTransfer)->state == PrefillState::kEnded;
}

TEST(PdProtocol, ReadReleaseCarriesTheSharedTransferId) {
  TransferId id = 0;
  bool freed = false;
  run_read_release(Mutation::kNone, &id, &freed);
  EXPECT_EQ(id, kTransfer);
  EXPECT_TRUE(freed);
}

TEST(PdProtocol, MutationReleaseWithLocalIdLeaksThePrefillBlocks) {
  if (!kMutationsBuilt) GTEST_SKIP() << "a Release build has no mutations; the sanitizer build runs this";
  TransferId id = 0;
  bool freed = true;
  run_read_release(Mutation::kReleaseWithLocalId, &id, &freed);
  EXPECT_NE(id, kTransfer);
  EXPECT_FALSE(freed);
}

// A WRITE decode admitted with 7 blocks, exposed to the prefill.
void admit_write(DecodeSide& decode, Outputs* out) {
  decode.on_message(start(MessageKind::kStartDecode, TransferMode::kWrite, 40, 1), 0, out);
  decode.on_blocks_allocated(kTransfer, iota_blocks(7, 0), kNoSlot, 0, 10, out);
}

// The router's Abort (it names the prefill).
void router_abort(DecodeSide& decode, TimeMs at_ms, Outputs* out) {
  Message abort = peer_message(MessageKind::kAbort, kRouter, kDecode);
  abort.peer = kPrefill;
  abort.peer_epoch = 1;
  decode.on_message(abort, at_ms, out);
}

// A decode that ends while its blocks are exposed to a live prefill keeps them
// until the prefill releases (here after 30 s), or is declared dead; then it
// revokes access before freeing.
TEST(PdProtocol, QuarantineHoldsBlocksWhileThePeerLives) {
  ProtocolConfig config;
  DecodeSide decode(kDecode, 1, 256, config);
  Outputs out;
  admit_write(decode, &out);
  out.clear();
  router_abort(decode, 100, &out);
  EXPECT_EQ(decode.find(kTransfer)->state, DecodeState::kQuarantined);
  EXPECT_EQ(find_effect(out, EffectKind::kFree), nullptr);
  EXPECT_EQ(count_messages(out, MessageKind::kRelease), 1);  // "stop writing"
  for (TimeMs t = 500; t <= 30'000; t += 500) {
    decode.on_message(heartbeat(kPrefill, kDecode, Role::kPrefill), t, &out);
    decode.on_timer(t, &out);
    ASSERT_EQ(find_effect(out, EffectKind::kFree), nullptr) << "freed at " << t << " ms";
    out.clear();
  }
  decode.on_message(peer_message(MessageKind::kRelease, kPrefill, kDecode), 30'100, &out);
  ASSERT_EQ(out.effects.size(), 2u);
  EXPECT_EQ(out.effects[0].kind, EffectKind::kEndExposure);
  EXPECT_EQ(out.effects[1].kind, EffectKind::kFree);
  EXPECT_EQ(decode.blocks_held(), 0);
}

TEST(PdProtocol, QuarantineEndsWhenThePeerIsDeclaredDeadAndFenced) {
  ProtocolConfig config;
  DecodeSide decode(kDecode, 1, 256, config);
  Outputs out;
  admit_write(decode, &out);
  router_abort(decode, 100, &out);
  out.clear();
  // The prefill is never heard from: its lease (started by the Start) expires.
  // A dead peer may still be writing (a partition, a NIC queue): the blocks
  // stay until the driver has fenced it.
  decode.on_timer(config.lease_ms + 1, &out);
  const Effect* fence = find_effect(out, EffectKind::kFencePeer);
  ASSERT_NE(fence, nullptr);
  EXPECT_EQ(fence->peer, kPrefill);
  EXPECT_EQ(fence->peer_epoch, 1u);
  EXPECT_EQ(find_effect(out, EffectKind::kFree), nullptr);
  EXPECT_EQ(decode.find(kTransfer)->state, DecodeState::kQuarantined);
  EXPECT_EQ(decode.fences_pending().size(), 1u);
  out.clear();
  // Time alone frees nothing, and the fence is asked for once.
  for (TimeMs t = config.lease_ms + 500; t <= 60'000; t += 500) decode.on_timer(t, &out);
  EXPECT_EQ(find_effect(out, EffectKind::kFree), nullptr);
  EXPECT_EQ(find_effect(out, EffectKind::kFencePeer), nullptr);
  out.clear();
  decode.on_peer_fenced(kPrefill, 1, 60'100, &out);
  ASSERT_NE(find_effect(out, EffectKind::kEndExposure), nullptr);
  ASSERT_NE(find_effect(out, EffectKind::kFree), nullptr);
  EXPECT_LT(find_effect(out, EffectKind::kEndExposure) - out.effects.data(),
            find_effect(out, EffectKind::kFree) - out.effects.data());
  EXPECT_EQ(decode.blocks_held(), 0);
  EXPECT_TRUE(decode.fences_pending().empty());
}

// A peer that restarted (a newer epoch of the same node) is gone with its
// process: that retires the old incarnation at once, no fence needed.
TEST(PdProtocol, APeerRestartedInANewEpochNeedsNoFence) {
  ProtocolConfig config;
  DecodeSide decode(kDecode, 1, 256, config);
  Outputs out;
  admit_write(decode, &out);
  out.clear();
  Message hb = heartbeat(kPrefill, kDecode, Role::kPrefill);
  hb.from_epoch = 2;
  decode.on_message(hb, 500, &out);
  EXPECT_EQ(find_effect(out, EffectKind::kFencePeer), nullptr);
  EXPECT_NE(find_effect(out, EffectKind::kFree), nullptr);
  EXPECT_EQ(decode.find(kTransfer)->end_reason, EndReason::kPeerDead);
  EXPECT_EQ(decode.blocks_held(), 0);
}

// While a fence is under way the incarnation stays dead: a transfer naming it
// fails at once, its heartbeats do not revive it. Once fenced it may come
// back (on a new connection, which its old addresses cannot use).
TEST(PdProtocol, AnIncarnationBeingFencedTakesNoNewTransfer) {
  ProtocolConfig config;
  DecodeSide decode(kDecode, 1, 256, config);
  Outputs out;
  admit_write(decode, &out);
  decode.on_timer(config.lease_ms + 1, &out);
  ASSERT_NE(find_effect(out, EffectKind::kFencePeer), nullptr);
  out.clear();
  decode.on_message(heartbeat(kPrefill, kDecode, Role::kPrefill), config.lease_ms + 10, &out);
  EXPECT_EQ(decode.stats().drops[static_cast<int>(DropReason::kStaleEpoch)], 1);
  Message second = start(MessageKind::kStartDecode, TransferMode::kWrite, 40, 1);
  second.transfer = kTransfer + 1;
  decode.on_message(second, config.lease_ms + 20, &out);
  EXPECT_EQ(decode.find(kTransfer + 1)->end_reason, EndReason::kPeerDead);
  EXPECT_EQ(find_effect(out, EffectKind::kAllocate), nullptr);
  decode.on_peer_fenced(kPrefill, 1, config.lease_ms + 30, &out);
  out.clear();
  decode.on_message(heartbeat(kPrefill, kDecode, Role::kPrefill), config.lease_ms + 40, &out);
  Message third = start(MessageKind::kStartDecode, TransferMode::kWrite, 40, 1);
  third.transfer = kTransfer + 2;
  decode.on_message(third, config.lease_ms + 50, &out);
  EXPECT_NE(find_effect(out, EffectKind::kAllocate), nullptr);
  EXPECT_FALSE(decode.find(kTransfer + 2)->ending);
}

TEST(PdProtocol, MutationFreeQuarantineOnTimeoutFreesWithoutRevoking) {
  if (!kMutationsBuilt) GTEST_SKIP() << "a Release build has no mutations; the sanitizer build runs this";
  ProtocolConfig config;
  config.mutation = Mutation::kFreeQuarantineOnTimeout;
  DecodeSide decode(kDecode, 1, 256, config);
  Outputs out;
  admit_write(decode, &out);
  router_abort(decode, 100, &out);
  out.clear();
  decode.on_message(heartbeat(kPrefill, kDecode, Role::kPrefill), 2'000, &out);
  decode.on_timer(2'200, &out);
  EXPECT_NE(find_effect(out, EffectKind::kFree), nullptr);
  EXPECT_EQ(find_effect(out, EffectKind::kEndExposure), nullptr);
}

// A write that cannot be posted ends the transfer on both sides at once: the
// decode hears Release, the router hears Outcome with the reason.
TEST(PdProtocol, WritePostFailureIsReported) {
  for (Mutation mutation : {Mutation::kNone, Mutation::kSilentWritePostFailure}) {
    if (mutation != Mutation::kNone && !kMutationsBuilt) continue;  // test builds only
    ProtocolConfig config;
    config.mutation = mutation;
    PrefillSide prefill(kPrefill, 1, 64, config);
    Outputs out;
    prefill.on_message(start(MessageKind::kStartPrefill, TransferMode::kWrite, 40, 1), 0, &out);
    prefill.on_prefill_computed(kTransfer, iota_blocks(3, 0), kNoSlot, 10, &out);
    Message remote = peer_message(MessageKind::kRemoteBlocks, kDecode, kPrefill);
    remote.blocks = iota_blocks(3, 10);
    prefill.on_message(remote, 20, &out);
    out.clear();
    prefill.on_write_done(kTransfer, RmaResult::kPostFailed, 21, &out);
    const Message* outcome = find_message(out, MessageKind::kOutcome);
    if (mutation == Mutation::kNone) {
      ASSERT_NE(outcome, nullptr);
      EXPECT_EQ(outcome->reason, EndReason::kWritePostFailed);
      EXPECT_EQ(count_messages(out, MessageKind::kRelease), 1);
    } else {
      EXPECT_EQ(outcome, nullptr);
      EXPECT_EQ(count_messages(out, MessageKind::kRelease), 0);
    }
    EXPECT_NE(find_effect(out, EffectKind::kFree), nullptr);
  }
}

// A peer that stops heartbeating is declared dead within one lease, and its
// transfers fail at once, reported to the router with the reason.
TEST(PdProtocol, DeadPeerFailsTransfersWithinTheLease) {
  ProtocolConfig config;
  PrefillSide prefill(kPrefill, 1, 64, config);
  Outputs out;
  prefill.on_message(start(MessageKind::kStartPrefill, TransferMode::kWrite, 40, 1), 0, &out);
  prefill.on_prefill_computed(kTransfer, iota_blocks(3, 0), kNoSlot, 10, &out);
  const TimeMs last_heard_ms = 1'000;
  prefill.on_message(heartbeat(kDecode, kPrefill, Role::kDecode), last_heard_ms, &out);
  out.clear();
  prefill.on_timer(last_heard_ms + config.lease_ms - 1, &out);
  EXPECT_EQ(prefill.find(kTransfer)->state, PrefillState::kAwaitingAddresses);
  prefill.on_timer(last_heard_ms + config.lease_ms, &out);
  EXPECT_EQ(prefill.find(kTransfer)->state, PrefillState::kEnded);
  EXPECT_EQ(prefill.find(kTransfer)->end_reason, EndReason::kPeerDead);
  const Message* outcome = find_message(out, MessageKind::kOutcome);
  ASSERT_NE(outcome, nullptr);
  EXPECT_EQ(outcome->reason, EndReason::kPeerDead);
  EXPECT_NE(find_effect(out, EffectKind::kFree), nullptr);
  EXPECT_EQ(prefill.blocks_held(), 0);
}

// Once the decode holds the KV, its prefill is no longer needed: the prefill's
// death does not end the request, and the router does not fail it on the
// prefill's word that it lost the decode.
TEST(PdProtocol, PrefillDeathAfterTheKvArrivedDoesNotFailTheRequest) {
  ProtocolConfig config;
  DecodeSide decode(kDecode, 1, 256, config);
  Outputs out;
  decode.on_message(start(MessageKind::kStartDecode, TransferMode::kWrite, 40, 2), 0, &out);
  decode.on_blocks_allocated(kTransfer, iota_blocks(7, 0), kNoSlot, 0, 10, &out);
  decode.on_message(peer_message(MessageKind::kWriteDone, kPrefill, kDecode), 20, &out);
  ASSERT_EQ(decode.find(kTransfer)->state, DecodeState::kDecoding);
  out.clear();
  decode.on_timer(config.lease_ms + 100, &out);  // the prefill was never heard again
  EXPECT_EQ(decode.find(kTransfer)->state, DecodeState::kDecoding);
  EXPECT_EQ(find_effect(out, EffectKind::kStopSiblings), nullptr);

  RouterCore router(kRouter, 1, config);
  for (auto [node, role] : {std::pair{kPrefill, Role::kPrefill}, {kDecode, Role::kDecode}}) {
    Message hb = heartbeat(node, kRouter, role);
    hb.capacity_blocks = 100;
    router.on_message(hb, 0, &out);
  }
  TransferId id = router.submit(RequestSpec{}, 1, &out);
  out.clear();
  Message lost = peer_message(MessageKind::kOutcome, kPrefill, kRouter);
  lost.transfer = id;
  lost.reason = EndReason::kPeerDead;
  router.on_message(lost, 2, &out);
  EXPECT_TRUE(out.request_ends.empty());
  EXPECT_EQ(router.find(id)->state, RouterState::kDispatched);
}

// Transfer ids carry the router's epoch: a restarted router never reuses one.
TEST(PdProtocol, TransferIdsNeverRepeatAcrossRouterRestarts) {
  ProtocolConfig config;
  Outputs out;
  RouterCore first(kRouter, 1, config), restarted(kRouter, 2, config);
  TransferId a = first.submit(RequestSpec{}, 0, &out);
  TransferId b = restarted.submit(RequestSpec{}, 0, &out);
  EXPECT_NE(a, b);
  EXPECT_EQ(transfer_name(a), "t1.1");
  EXPECT_EQ(transfer_name(b), "t2.1");
}

// One prompt token moves nothing; the transfer still completes.
TEST(PdProtocol, ZeroBlockTransferCompletes) {
  ProtocolConfig config;
  PrefillSide prefill(kPrefill, 1, 64, config);
  DecodeSide decode(kDecode, 1, 256, config);
  Outputs p, d;
  prefill.on_message(start(MessageKind::kStartPrefill, TransferMode::kWrite, 1, 1), 0, &p);
  prefill.on_prefill_computed(kTransfer, {}, kNoSlot, 1, &p);
  decode.on_message(start(MessageKind::kStartDecode, TransferMode::kWrite, 1, 1), 0, &d);
  decode.on_blocks_allocated(kTransfer, iota_blocks(2, 0), kNoSlot, 0, 2, &d);
  const Message* remote = find_message(d, MessageKind::kRemoteBlocks);
  ASSERT_NE(remote, nullptr);
  EXPECT_TRUE(remote->blocks.empty());
  p.clear();
  prefill.on_message(*remote, 3, &p);
  const Effect* write = find_effect(p, EffectKind::kPostWrite);
  ASSERT_NE(write, nullptr);
  EXPECT_TRUE(write->local_blocks.empty());
  p.clear();
  prefill.on_write_done(kTransfer, RmaResult::kOk, 4, &p);
  d.clear();
  decode.on_message(*find_message(p, MessageKind::kWriteDone), 5, &d);
  EXPECT_NE(find_effect(d, EffectKind::kStartSiblings), nullptr);
}

// Late, duplicate and stale messages are dropped idempotently, by counted reason.
TEST(PdProtocol, DropsAreCountedByReason) {
  ProtocolConfig config;
  PrefillSide prefill(kPrefill, 2, 64, config);  // restarted: epoch 2
  Outputs out;
  Message old = start(MessageKind::kStartPrefill, TransferMode::kWrite, 40, 1);
  prefill.on_message(old, 0, &out);  // addressed to epoch 1
  EXPECT_EQ(prefill.stats().drops[static_cast<int>(DropReason::kStaleEpoch)], 1);
  EXPECT_EQ(prefill.find(kTransfer), nullptr);
  Message fresh = old;
  fresh.to_epoch = 2;
  prefill.on_message(fresh, 1, &out);
  prefill.on_message(fresh, 2, &out);
  EXPECT_EQ(prefill.stats().drops[static_cast<int>(DropReason::kDuplicate)], 1);
  Message unknown = peer_message(MessageKind::kRemoteBlocks, kDecode, kPrefill);
  unknown.to_epoch = 2;
  unknown.transfer = 999;
  ProtocolConfig no_room = config;
  no_room.max_early_messages = 0;  // nothing is kept for a Start that may come
  PrefillSide full(kPrefill, 2, 64, no_room);
  full.on_message(unknown, 3, &out);
  EXPECT_EQ(full.stats().drops[static_cast<int>(DropReason::kUnknown)], 1);
  Message abort = peer_message(MessageKind::kAbort, kRouter, kPrefill);
  abort.to_epoch = 2;
  abort.peer = kDecode;
  abort.peer_epoch = 1;
  prefill.on_message(abort, 4, &out);
  EXPECT_EQ(prefill.find(kTransfer)->state, PrefillState::kEnded);
  out.clear();
  Message late = peer_message(MessageKind::kRemoteBlocks, kDecode, kPrefill);
  late.to_epoch = 2;
  prefill.on_message(late, 5, &out);
  EXPECT_EQ(prefill.stats().drops[static_cast<int>(DropReason::kEnded)], 1);
  // The late sender is told the transfer ended, so it can end too.
  EXPECT_EQ(count_messages(out, MessageKind::kRelease), 1);
}

// Blocks an ended transfer still holds (here: the router aborted while the
// prefill can still write) are reported in every heartbeat, and the router
// counts them against that instance until they are freed.
TEST(PdProtocol, QuarantinedBlocksHoldBackTheRoutersCredits) {
  ProtocolConfig config;
  DecodeSide decode(kDecode, 1, 100, config);
  decode.set_heartbeat_targets({kRouter});
  Outputs out;
  admit_write(decode, &out);
  router_abort(decode, 100, &out);
  ASSERT_EQ(decode.find(kTransfer)->state, DecodeState::kQuarantined);
  EXPECT_EQ(decode.quarantined_blocks(), 7);
  out.clear();
  decode.on_timer(200, &out);
  const Message* hb = nullptr;
  for (const Message& m : out.messages)
    if (m.kind == MessageKind::kHeartbeat) hb = &m;
  ASSERT_NE(hb, nullptr);
  EXPECT_EQ(hb->capacity_blocks, 100);
  EXPECT_EQ(hb->quarantined_blocks, 7);

  RouterCore router(kRouter, 1, config);
  Message hbp = heartbeat(kPrefill, kRouter, Role::kPrefill);
  hbp.capacity_blocks = 100;
  router.on_message(hbp, 0, &out);
  Message hbd = *hb;
  hbd.to = kRouter;
  hbd.quarantined_blocks = 95;  // 5 blocks left for new work
  router.on_message(hbd, 0, &out);
  out.clear();
  RequestSpec spec;
  spec.prompt_tokens = 40;  // 3 blocks of 16, plus 1 for its 16 outputs
  spec.max_tokens = 16;
  spec.n_siblings = 2;      // the second sibling: 1 output block and a copy of the last prompt block
  EXPECT_EQ(decode_blocks(spec.prompt_tokens, spec.n_siblings, spec.max_tokens, 16), 6);
  TransferId id = router.submit(spec, 1, &out);
  EXPECT_EQ(router.find(id)->state, RouterState::kQueued) << "6 blocks do not fit in the 5 not quarantined";
  EXPECT_EQ(count_messages(out, MessageKind::kStartDecode), 0);
  hbd.quarantined_blocks = 94;
  router.on_message(hbd, 500, &out);
  EXPECT_EQ(router.find(id)->state, RouterState::kDispatched);
  EXPECT_EQ(count_messages(out, MessageKind::kStartDecode), 1);
  EXPECT_EQ(router.reserved_blocks(kDecode), 6);
}

// In WRITE mode the router sends both legs at once, so the decode's block
// addresses can reach the prefill before its Start. They are kept and handled
// when the Start comes: the write goes out as soon as the KV is computed, not
// a retransmit interval later. Kept messages are bounded in age.
TEST(PdProtocol, APeersMessageThatOvertookTheStartIsReplayedWhenItComes) {
  ProtocolConfig config;
  PrefillSide prefill(kPrefill, 1, 64, config);
  Outputs out;
  Message early = peer_message(MessageKind::kRemoteBlocks, kDecode, kPrefill);
  early.blocks = iota_blocks(2, 10);  // 40 tokens: 3 blocks move, the first one cached on the decode
  early.first_block = 1;
  prefill.on_message(early, 0, &out);
  EXPECT_EQ(prefill.find(kTransfer), nullptr);
  EXPECT_EQ(prefill.stats().drops[static_cast<int>(DropReason::kUnknown)], 0);
  prefill.on_message(start(MessageKind::kStartPrefill, TransferMode::kWrite, 40, 1), 5, &out);
  ASSERT_NE(prefill.find(kTransfer), nullptr);
  EXPECT_EQ(prefill.stats().early_messages_replayed, 1);
  EXPECT_TRUE(prefill.find(kTransfer)->addresses_known);
  EXPECT_EQ(prefill.stats().addresses_before_kv, 1);
  out.clear();
  prefill.on_prefill_computed(kTransfer, iota_blocks(3, 0), kNoSlot, 20, &out);
  EXPECT_NE(find_effect(out, EffectKind::kPostWrite), nullptr) << "the write needs no resend of the addresses";

  // Kept for one retransmit interval at most (the sender has resent it since).
  PrefillSide later(kPrefill, 1, 64, config);
  later.on_message(early, 0, &out);
  later.on_message(start(MessageKind::kStartPrefill, TransferMode::kWrite, 40, 1),
                   config.retransmit_interval_ms + 1, &out);
  EXPECT_EQ(later.stats().early_messages_replayed, 0);
  EXPECT_FALSE(later.find(kTransfer)->addresses_known);
}

// The router mints one id per request and reports exactly one terminal state.
TEST(PdProtocol, RouterEndsEachRequestOnce) {
  ProtocolConfig config;
  RouterCore router(kRouter, 1, config);
  Outputs out;
  router.on_message(heartbeat(kPrefill, kRouter, Role::kPrefill), 0, &out);
  Message hb = heartbeat(kDecode, kRouter, Role::kDecode);
  hb.capacity_blocks = 100;
  router.on_message(hb, 0, &out);
  Message hbp = heartbeat(kPrefill, kRouter, Role::kPrefill);
  hbp.capacity_blocks = 100;
  router.on_message(hbp, 0, &out);
  out.clear();
  RequestSpec spec;
  spec.prompt_tokens = 40;
  spec.n_siblings = 3;
  TransferId id = router.submit(spec, 1, &out);
  EXPECT_EQ(count_messages(out, MessageKind::kStartPrefill), 1);
  EXPECT_EQ(count_messages(out, MessageKind::kStartDecode), 1);
  out.clear();
  Message outcome = peer_message(MessageKind::kOutcome, kDecode, kRouter);
  outcome.transfer = id;
  router.on_message(outcome, 10, &out);
  router.on_message(outcome, 11, &out);  // duplicate
  ASSERT_EQ(out.request_ends.size(), 1u);
  EXPECT_EQ(out.request_ends[0].state, RouterState::kCompleted);
  EXPECT_EQ(router.reserved_blocks(kPrefill), 0);
  EXPECT_EQ(router.reserved_blocks(kDecode), 0);
  // A request that can never fit fails at once with a reason.
  spec.prompt_tokens = 100 * 16;
  router.submit(spec, 12, &out);
  ASSERT_EQ(out.request_ends.size(), 2u);
  EXPECT_EQ(out.request_ends[1].reason, EndReason::kCapacity);
}

}  // namespace
}  // namespace tandem::pd

namespace tandem::pd {
namespace {

// Runs the decode side's timers every `step_ms` up to `until_ms`, with the
// prefill heartbeating (alive), and returns everything it produced.
Outputs run_decode_until(DecodeSide& decode, TimeMs from_ms, TimeMs until_ms, TimeMs step_ms) {
  Outputs all, out;
  for (TimeMs t = from_ms; t <= until_ms; t += step_ms) {
    decode.on_message(heartbeat(kPrefill, kDecode, Role::kPrefill), t, &out);
    decode.on_timer(t, &out);
    all.messages.insert(all.messages.end(), out.messages.begin(), out.messages.end());
    all.effects.insert(all.effects.end(), out.effects.begin(), out.effects.end());
    out.clear();
  }
  return all;
}

// The request deadline (audit: never reached by the simulated runs): an
// admission that never completes ends at the Start's budget, not before and
// not never, with the allocation cancelled and the router told why.
TEST(PdProtocolLongRuns, TheRequestDeadlineEndsAWaitThatNeverCompletes) {
  ProtocolConfig config;
  DecodeSide decode(kDecode, 1, 256, config);
  Outputs out;
  Message s = start(MessageKind::kStartDecode, TransferMode::kWrite, 40, 1);
  s.budget_ms = 900'000;
  decode.on_message(s, 0, &out);
  Outputs before = run_decode_until(decode, 1'000, 899'000, 1'000);
  EXPECT_EQ(decode.find(kTransfer)->state, DecodeState::kAdmitting);
  EXPECT_EQ(find_effect(before, EffectKind::kCancel), nullptr);
  Outputs at = run_decode_until(decode, 900'000, 901'000, 1'000);
  EXPECT_EQ(decode.find(kTransfer)->end_reason, EndReason::kDeadline);
  EXPECT_EQ(decode.find(kTransfer)->state, DecodeState::kEnded);
  EXPECT_NE(find_effect(at, EffectKind::kCancel), nullptr);
  const Message* outcome = find_message(at, MessageKind::kOutcome);
  ASSERT_NE(outcome, nullptr);
  EXPECT_EQ(outcome->reason, EndReason::kDeadline);
}

// The retransmit limit (audit: never reached): a peer that heartbeats but
// never acknowledges the addresses ends the transfer after max_retransmits
// sends, with the blocks freed only once the peer is treated as dead.
TEST(PdProtocolLongRuns, TheRetransmitLimitEndsAnUnacknowledgedTransfer) {
  ProtocolConfig config;
  config.max_retransmits = 20;
  DecodeSide decode(kDecode, 1, 256, config);
  Outputs out;
  decode.on_message(start(MessageKind::kStartDecode, TransferMode::kWrite, 40, 1), 0, &out);
  decode.on_blocks_allocated(kTransfer, iota_blocks(3, 0), kNoSlot, 0, 10, &out);
  out.clear();
  Outputs all = run_decode_until(decode, 100, 60'000, 100);
  EXPECT_EQ(count_messages(all, MessageKind::kRemoteBlocks), config.max_retransmits - 1);  // the first went at 10 ms
  const DecodeTransfer* t = decode.find(kTransfer);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->end_reason, EndReason::kRetransmitLimit);
  EXPECT_GE(decode.stats().retransmit_exhausted, 1);  // then its Release and the unanswered Outcome too
  // It told the live prefill to stop, waited (quarantine) for it, then, with
  // its Release unanswered for max_retransmits too, treated it as dead: the
  // whole peer is fenced (there is no per-transfer revoke), and the blocks
  // are freed once the fence completes.
  EXPECT_EQ(t->state, DecodeState::kQuarantined);
  EXPECT_TRUE(t->peer_dead);
  ASSERT_NE(find_effect(all, EffectKind::kFencePeer), nullptr);
  EXPECT_EQ(find_effect(all, EffectKind::kFree), nullptr);
  EXPECT_EQ(decode.blocks_held(), 3);
  out.clear();
  decode.on_peer_fenced(kPrefill, 1, 60'100, &out);
  EXPECT_EQ(decode.find(kTransfer)->state, DecodeState::kEnded);
  ASSERT_NE(find_effect(out, EffectKind::kFree), nullptr);
  EXPECT_EQ(decode.blocks_held(), 0);
}

// A local cancel (the client left the decode instance) goes through the one
// release path: siblings stop, the prefill is released, blocks wait in
// quarantine for the prefill's answer, nothing is reported as a failure.
TEST(PdProtocolInputs, ALocalCancelEndsTheTransferThroughTheReleasePath) {
  ProtocolConfig config;
  DecodeSide decode(kDecode, 1, 256, config);
  Outputs out;
  decode.on_message(start(MessageKind::kStartDecode, TransferMode::kWrite, 40, 2), 0, &out);
  decode.on_blocks_allocated(kTransfer, iota_blocks(3, 0), kNoSlot, 0, 10, &out);
  out.clear();
  decode.cancel(kTransfer, EndReason::kClientAbort, 20, &out);
  EXPECT_EQ(decode.find(kTransfer)->state, DecodeState::kQuarantined);
  EXPECT_EQ(count_messages(out, MessageKind::kRelease), 1);
  EXPECT_EQ(count_messages(out, MessageKind::kOutcome), 0);
  EXPECT_EQ(find_effect(out, EffectKind::kFree), nullptr);
  decode.on_message(peer_message(MessageKind::kRelease, kPrefill, kDecode), 30, &out);
  EXPECT_NE(find_effect(out, EffectKind::kFree), nullptr);
  EXPECT_EQ(decode.blocks_held(), 0);
  // Idempotent.
  out.clear();
  decode.cancel(kTransfer, EndReason::kClientAbort, 40, &out);
  EXPECT_TRUE(out.effects.empty());
}

// The engine failing a request mid-decode ends it with kEngineFailed: the
// siblings stop, the blocks are freed, the router hears the reason.
TEST(PdProtocolInputs, AnEngineFailureAfterDecodingStartedEndsTheTransfer) {
  ProtocolConfig config;
  DecodeSide decode(kDecode, 1, 256, config);
  Outputs out;
  decode.on_message(start(MessageKind::kStartDecode, TransferMode::kWrite, 40, 2), 0, &out);
  decode.on_blocks_allocated(kTransfer, iota_blocks(3, 0), kNoSlot, 0, 10, &out);
  decode.on_message(peer_message(MessageKind::kWriteDone, kPrefill, kDecode), 20, &out);
  ASSERT_EQ(decode.find(kTransfer)->state, DecodeState::kDecoding);
  out.clear();
  decode.on_engine_failed(kTransfer, 30, &out);
  EXPECT_EQ(decode.find(kTransfer)->end_reason, EndReason::kEngineFailed);
  const Effect* stop = find_effect(out, EffectKind::kStopSiblings);
  ASSERT_NE(stop, nullptr);
  EXPECT_EQ(stop->siblings.size(), 2u);
  EXPECT_NE(find_effect(out, EffectKind::kFree), nullptr);
  const Message* outcome = find_message(out, MessageKind::kOutcome);
  ASSERT_NE(outcome, nullptr);
  EXPECT_EQ(outcome->reason, EndReason::kEngineFailed);
  EXPECT_EQ(decode.check_sibling_maps(), "");
}

// A draining instance refuses every new Start (the router hears kDraining,
// the peer a Release) and lets the live transfers finish.
TEST(PdProtocolInputs, ADrainingInstanceRefusesNewTransfersAndFinishesOld) {
  ProtocolConfig config;
  PrefillSide prefill(kPrefill, 1, 64, config);
  Outputs out;
  prefill.on_message(start(MessageKind::kStartPrefill, TransferMode::kWrite, 40, 1), 0, &out);
  prefill.begin_drain();
  out.clear();
  Message late = start(MessageKind::kStartPrefill, TransferMode::kWrite, 40, 1);
  late.transfer = kTransfer + 1;
  prefill.on_message(late, 10, &out);
  EXPECT_EQ(find_effect(out, EffectKind::kComputePrefill), nullptr);
  EXPECT_EQ(prefill.find(kTransfer + 1)->state, PrefillState::kEnded);
  const Message* outcome = find_message(out, MessageKind::kOutcome);
  ASSERT_NE(outcome, nullptr);
  EXPECT_EQ(outcome->reason, EndReason::kDraining);
  EXPECT_EQ(count_messages(out, MessageKind::kRelease), 1);
  // The transfer from before the drain goes on to completion.
  prefill.on_prefill_computed(kTransfer, iota_blocks(3, 0), kNoSlot, 20, &out);
  EXPECT_EQ(prefill.find(kTransfer)->state, PrefillState::kAwaitingAddresses);
}

}  // namespace
}  // namespace tandem::pd
