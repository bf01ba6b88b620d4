// The transfer transport: SHA-256/HMAC against published vectors, the wire
// format of protocol messages (round trips, every refusal, a deterministic
// fuzz corpus), the authenticated hand-shake, and UCX moving real bytes
// between two transports over TCP and over shared memory, with fencing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <random>

#include <arpa/inet.h>
#include <ucp/api/ucp.h>

#include "transport/bytes.h"
#include "transport/handshake.h"
#include "transport/sha256.h"
#include "transport/ucx_transport.h"
#include "transport/wire.h"
#include "util/clock.h"
#include "util/constant_time.h"

namespace tandem::transport {
namespace {

std::string hex(std::span<const uint8_t> d) { return to_hex(d); }
std::span<const uint8_t> bytes_of(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

TEST(Sha256, MatchesFipsVectors) {
  EXPECT_EQ(hex(sha256({})), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hex(sha256(bytes_of("abc"))), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(hex(sha256(bytes_of("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"))),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // One million 'a', fed in uneven pieces (the buffering path).
  Sha256 h;
  std::string chunk(997, 'a');
  size_t left = 1'000'000;
  while (left > 0) {
    size_t n = std::min(left, chunk.size());
    h.update(std::string_view(chunk.data(), n));
    left -= n;
  }
  EXPECT_EQ(hex(h.finish()), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, HmacMatchesRfc4231) {
  EXPECT_EQ(hex(hmac_sha256(std::string(20, '\x0b'), {bytes_of("Hi There")})),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(hex(hmac_sha256("Jefe", {bytes_of("what do ya want "), bytes_of("for nothing?")})),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(hex(hmac_sha256(std::string(131, '\xaa'),
                            {bytes_of("Test Using Larger Than Block-Size Key - Hash Key First")})),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST(Sha256, ConstantTimeEqualComparesWholeStrings) {
  EXPECT_TRUE(constant_time_equal("secret", "secret"));
  EXPECT_FALSE(constant_time_equal("secret", "secreT"));
  EXPECT_FALSE(constant_time_equal("secret", "secret2"));
  EXPECT_TRUE(constant_time_equal("", ""));
}

// ---- wire format ----

pd::Message sample_message() {
  pd::Message m;
  m.kind = pd::MessageKind::kRemoteBlocks;
  m.from = 3;
  m.from_epoch = 2;
  m.to = 2;
  m.to_epoch = 5;
  m.transfer = (uint64_t{1} << 40) | 17;
  m.mode = pd::TransferMode::kRead;
  m.prompt_tokens = 100;
  m.n_siblings = 4;
  m.max_tokens = 64;
  m.budget_ms = 900'000;
  m.first_block = 2;
  m.blocks = {9, 4, 7};
  m.state_slot = 1;
  m.reason = pd::EndReason::kDeadline;
  m.acked = pd::MessageKind::kWriteDone;
  return m;
}

WireLimits limits() {
  WireLimits l;
  l.peer_n_blocks = 10;
  l.peer_n_slots = 2;
  return l;
}

TEST(Wire, RoundTripsEveryField) {
  pd::Message m = sample_message();
  std::vector<uint8_t> frame = encode_message(m);
  pd::Message back;
  ASSERT_EQ(decode_message(frame, limits(), &back), WireError::kNone);
  EXPECT_EQ(describe(back), describe(m));
  EXPECT_EQ(back.blocks, m.blocks);
  EXPECT_EQ(back.budget_ms, m.budget_ms);
  EXPECT_EQ(back.acked, m.acked);
  EXPECT_EQ(encode_message(back), frame);
}

TEST(Wire, RefusesWhatAPeerMustNotSend) {
  auto refused = [](pd::Message m, WireLimits l = limits()) {
    pd::Message out;
    return decode_message(encode_message(m), l, &out);
  };
  pd::Message m = sample_message();
  m.blocks = {9, 10};
  EXPECT_EQ(refused(m), WireError::kBlockOutOfRange);
  m.blocks = {-1};
  EXPECT_EQ(refused(m), WireError::kBlockOutOfRange);
  m.blocks = {3, 5, 3};
  EXPECT_EQ(refused(m), WireError::kDuplicateBlock);
  m.blocks = std::vector<pd::BlockId>(11, 0);
  EXPECT_EQ(refused(m), WireError::kTooManyBlocks);
  m = sample_message();
  m.state_slot = 2;
  EXPECT_EQ(refused(m), WireError::kBadSlot);
  m.state_slot = -2;
  EXPECT_EQ(refused(m), WireError::kBadSlot);
  m = sample_message();
  m.n_siblings = 0;
  EXPECT_EQ(refused(m), WireError::kBadCount);
  m = sample_message();
  m.budget_ms = -1;
  EXPECT_EQ(refused(m), WireError::kBadCount);
  m = sample_message();
  m.prompt_tokens = -5;
  EXPECT_EQ(refused(m), WireError::kBadCount);

  std::vector<uint8_t> frame = encode_message(sample_message());
  pd::Message out;
  std::vector<uint8_t> bad = frame;
  bad[0] ^= 1;
  EXPECT_EQ(decode_message(bad, limits(), &out), WireError::kBadMagic);
  bad = frame;
  bad[4] = 9;
  EXPECT_EQ(decode_message(bad, limits(), &out), WireError::kBadVersion);
  bad = frame;
  bad[6] = pd::kMessageKindCount;  // the kind byte
  EXPECT_EQ(decode_message(bad, limits(), &out), WireError::kBadEnum);
  bad = frame;
  bad.push_back(0);
  EXPECT_EQ(decode_message(bad, limits(), &out), WireError::kTrailingBytes);
  for (size_t n = 0; n < frame.size(); ++n)
    EXPECT_EQ(decode_message(std::span(frame).first(n), limits(), &out), n < 4 ? WireError::kTruncated
              : decode_message(std::span(frame).first(n), limits(), &out))
        << n;
  EXPECT_EQ(decode_message(std::span(frame).first(frame.size() - 1), limits(), &out), WireError::kTruncated);
  // A block count far beyond the frame allocates nothing and is a truncation.
  bad = std::vector<uint8_t>(frame.begin(), frame.end() - 12);
  bad[bad.size() - 1] = 0x7f;
  EXPECT_EQ(decode_message(bad, limits(), &out), WireError::kTruncated);
}

// A deterministic fuzz corpus: valid frames of every kind, then byte flips,
// truncations, extensions and splices. The decoder must never crash (the
// sanitizer build runs this), and whatever it accepts is canonical (encodes
// back to the same bytes) and within the limits.
TEST(Wire, FuzzedFramesAreRefusedOrCanonical) {
  std::mt19937_64 rng(20261201);
  std::vector<std::vector<uint8_t>> seeds;
  for (int kind = 0; kind < pd::kMessageKindCount; ++kind) {
    pd::Message m = sample_message();
    m.kind = static_cast<pd::MessageKind>(kind);
    seeds.push_back(encode_message(m));
    m.blocks.clear();
    m.state_slot = pd::kNoSlot;
    seeds.push_back(encode_message(m));
  }
  int accepted = 0, refused = 0;
  std::array<int, kWireErrorCount> by_reason{};
  for (int i = 0; i < 40'000; ++i) {
    std::vector<uint8_t> f = seeds[rng() % seeds.size()];
    int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      switch (rng() % 5) {
        case 0: if (!f.empty()) f[rng() % f.size()] ^= static_cast<uint8_t>(1u << (rng() % 8)); break;
        case 1: if (!f.empty()) f[rng() % f.size()] = static_cast<uint8_t>(rng()); break;
        case 2: f.resize(rng() % (f.size() + 1)); break;
        case 3: f.push_back(static_cast<uint8_t>(rng())); break;
        default: {
          const auto& other = seeds[rng() % seeds.size()];
          size_t at = rng() % (f.size() + 1);
          f.insert(f.begin() + static_cast<ptrdiff_t>(at), other.begin(), other.begin() + static_cast<ptrdiff_t>(rng() % other.size()));
        }
      }
    }
    pd::Message out;
    WireError err = decode_message(f, limits(), &out);
    ++by_reason[static_cast<size_t>(err)];
    if (err == WireError::kNone) {
      ++accepted;
      EXPECT_EQ(encode_message(out), f);
      EXPECT_LE(out.blocks.size(), 10u);
      for (pd::BlockId b : out.blocks) EXPECT_TRUE(b >= 0 && b < 10);
    } else {
      ++refused;
    }
  }
  EXPECT_GT(accepted, 100);
  EXPECT_GT(refused, 10'000);
  // The corpus reaches most refusal reasons, so the checks above are exercised.
  int reasons_seen = 0;
  for (int r = 1; r < kWireErrorCount; ++r) reasons_seen += by_reason[r] > 0;
  EXPECT_GE(reasons_seen, 7);
}

// ---- hand-shake ----

Fingerprint fingerprint() {
  Fingerprint f;
  f.model_hash = 0x1234;
  f.kv_dtype = 1;
  f.block_size = 16;
  f.kv_layout = 2;
  f.n_layers = 4;
  f.n_kv_heads = 2;
  f.head_dim = 64;
  return f;
}
PeerIdentity identity(pd::NodeId node, pd::Role role) {
  PeerIdentity id;
  id.node = node;
  id.epoch = 1;
  id.role = role;
  id.fingerprint = fingerprint();
  return id;
}
RegionKeys keys(uint8_t marker) {
  RegionKeys k;
  k.endpoint_address = std::vector<uint8_t>(40, marker);
  k.rkey = std::vector<uint8_t>(24, marker);
  k.base_address = 0x7f0000000000;
  k.size_bytes = 1 << 20;
  k.n_blocks = 16;
  k.block_bytes = 1 << 16;
  return k;
}
Nonce nonce(uint8_t v) {
  Nonce n;
  n.fill(v);
  return n;
}

struct HandshakeRun {
  Handshake client, server;
  std::vector<std::vector<uint8_t>> wire;  // every frame either side sent
};

// Runs the exchange to its end, frame by frame, recording what crossed.
void run_exchange(HandshakeRun& run) {
  std::vector<uint8_t> to_server = run.client.start();
  for (int i = 0; i < 8 && !to_server.empty(); ++i) {
    run.wire.push_back(to_server);
    std::vector<uint8_t> to_client = run.server.on_frame(to_server);
    to_server.clear();
    if (to_client.empty()) break;
    run.wire.push_back(to_client);
    to_server = run.client.on_frame(to_client);
  }
}

bool contains(const std::vector<std::vector<uint8_t>>& frames, const std::vector<uint8_t>& needle) {
  for (const auto& f : frames)
    if (std::search(f.begin(), f.end(), needle.begin(), needle.end()) != f.end()) return true;
  return false;
}

TEST(Handshake, SameSecretAndFingerprintExchangeKeys) {
  HandshakeRun run{Handshake(Handshake::Side::kClient, "s3cret", identity(2, pd::Role::kPrefill), keys(0xc1), nonce(1)),
                   Handshake(Handshake::Side::kServer, "s3cret", identity(3, pd::Role::kDecode), keys(0x5e), nonce(2)),
                   {}};
  run_exchange(run);
  ASSERT_EQ(run.client.state(), Handshake::State::kDone) << run.client.why();
  ASSERT_EQ(run.server.state(), Handshake::State::kDone) << run.server.why();
  EXPECT_EQ(run.client.peer().node, 3u);
  EXPECT_EQ(run.server.peer().node, 2u);
  EXPECT_EQ(run.client.peer_keys().rkey, keys(0x5e).rkey);
  EXPECT_EQ(run.server.peer_keys().rkey, keys(0xc1).rkey);
  EXPECT_EQ(run.server.peer_keys().size_bytes, uint64_t{1} << 20);
  // The secret itself never crossed.
  EXPECT_FALSE(contains(run.wire, std::vector<uint8_t>{'s', '3', 'c', 'r', 'e', 't'}));
}

TEST(Handshake, WrongSecretIsRefusedAndNoKeyIsSent) {
  for (bool client_wrong : {true, false}) {
    HandshakeRun run{
        Handshake(Handshake::Side::kClient, client_wrong ? "guess" : "s3cret", identity(2, pd::Role::kPrefill),
                  keys(0xc1), nonce(1)),
        Handshake(Handshake::Side::kServer, client_wrong ? "s3cret" : "guess", identity(3, pd::Role::kDecode),
                  keys(0x5e), nonce(2)),
        {}};
    run_exchange(run);
    EXPECT_EQ(run.client.state(), Handshake::State::kRefused);
    EXPECT_EQ(run.server.state(), Handshake::State::kRefused);
    // The client checks the server's proof first, so it refuses in both cases.
    EXPECT_EQ(run.client.failure(), HandshakeFailure::kBadProof) << run.client.why();
    EXPECT_NE(run.client.why().find("cluster secret"), std::string::npos);
    EXPECT_FALSE(contains(run.wire, keys(0xc1).rkey));
    EXPECT_FALSE(contains(run.wire, keys(0x5e).rkey));
    EXPECT_FALSE(contains(run.wire, keys(0xc1).endpoint_address));
    EXPECT_FALSE(contains(run.wire, keys(0x5e).endpoint_address));
  }
}

TEST(Handshake, AClientWithoutTheSecretCannotReplayAProof) {
  // A recorded Proof from an earlier exchange does not pass a fresh server nonce.
  HandshakeRun first{Handshake(Handshake::Side::kClient, "s3cret", identity(2, pd::Role::kPrefill), keys(1), nonce(1)),
                     Handshake(Handshake::Side::kServer, "s3cret", identity(3, pd::Role::kDecode), keys(2), nonce(2)),
                     {}};
  run_exchange(first);
  ASSERT_EQ(first.server.state(), Handshake::State::kDone);
  Handshake server(Handshake::Side::kServer, "s3cret", identity(3, pd::Role::kDecode), keys(2), nonce(9));
  server.on_frame(first.wire[0]);  // the recorded Hello
  std::vector<uint8_t> reply = server.on_frame(first.wire[2]);  // the recorded Proof
  EXPECT_EQ(server.state(), Handshake::State::kRefused);
  EXPECT_EQ(server.failure(), HandshakeFailure::kBadProof);
  EXPECT_FALSE(contains({reply}, keys(2).rkey));
}

TEST(Handshake, AFingerprintMismatchNamesTheFieldOnBothSides) {
  struct Case {
    std::function<void(Fingerprint&)> change;
    std::string field;
  };
  std::vector<Case> cases = {
      {[](Fingerprint& f) { f.kv_dtype = 2; }, "kv_dtype differs: server has f16, client has bf16"},
      {[](Fingerprint& f) { f.block_size = 32; }, "block_size differs: server has 16, client has 32"},
      {[](Fingerprint& f) { f.model_hash = 99; }, "model (tensor table hash) differs"},
      {[](Fingerprint& f) { f.n_layers = 5; }, "n_layers differs"},
      {[](Fingerprint& f) { f.mode = pd::TransferMode::kRead; }, "transfer mode differs: server has write, client has read"},
      {[](Fingerprint& f) { f.kv_layout = 1; }, "kv_layout differs"},
  };
  for (const Case& c : cases) {
    PeerIdentity client_id = identity(2, pd::Role::kPrefill);
    c.change(client_id.fingerprint);
    HandshakeRun run{Handshake(Handshake::Side::kClient, "s", client_id, keys(0xc1), nonce(1)),
                     Handshake(Handshake::Side::kServer, "s", identity(3, pd::Role::kDecode), keys(0x5e), nonce(2)),
                     {}};
    run_exchange(run);
    EXPECT_EQ(run.server.failure(), HandshakeFailure::kFingerprint);
    EXPECT_NE(run.server.why().find(c.field), std::string::npos) << run.server.why();
    EXPECT_EQ(run.client.failure(), HandshakeFailure::kRefusedByPeer);
    EXPECT_NE(run.client.why().find(c.field), std::string::npos) << run.client.why();
    EXPECT_FALSE(contains(run.wire, keys(0xc1).rkey));
    EXPECT_FALSE(contains(run.wire, keys(0x5e).rkey));
  }
}

TEST(Handshake, MalformedAndOutOfOrderFramesAreRefusedNeverFatal) {
  std::mt19937_64 rng(7);
  HandshakeRun good{Handshake(Handshake::Side::kClient, "s", identity(2, pd::Role::kPrefill), keys(1), nonce(1)),
                    Handshake(Handshake::Side::kServer, "s", identity(3, pd::Role::kDecode), keys(2), nonce(2)), {}};
  run_exchange(good);
  ASSERT_EQ(good.wire.size(), 4u);
  int refused = 0;
  for (int i = 0; i < 5000; ++i) {
    bool to_server = rng() % 2 == 0;
    Handshake side(to_server ? Handshake::Side::kServer : Handshake::Side::kClient, "s",
                   identity(to_server ? 3 : 2, pd::Role::kDecode), keys(3), nonce(4));
    if (!to_server) side.start();
    std::vector<uint8_t> f = good.wire[rng() % good.wire.size()];
    if (rng() % 4 != 0 && !f.empty()) f[rng() % f.size()] ^= static_cast<uint8_t>(rng() | 1);
    if (rng() % 3 == 0) f.resize(rng() % (f.size() + 1));
    side.on_frame(f);
    refused += side.state() == Handshake::State::kRefused;
    EXPECT_NE(side.state(), Handshake::State::kDone);  // nothing forged completes
  }
  EXPECT_GT(refused, 3000);
}

// ---- UCX ----

struct Endpoint {
  std::vector<uint8_t> pool;
  std::unique_ptr<UcxTransport> transport;
  std::vector<TransportEvent> events;
};

constexpr int kBlocks = 64;
constexpr uint64_t kBlockBytes = 8192;

Endpoint make_endpoint(pd::NodeId node, pd::Role role, const std::string& secret, const std::string& tls,
                       uint8_t fill) {
  Endpoint e;
  e.pool.assign(kBlocks * kBlockBytes, fill);
  UcxTransportConfig c;
  c.secret = secret;
  c.self = identity(node, role);
  c.region = e.pool.data();
  c.region_bytes = e.pool.size();
  c.n_blocks = kBlocks;
  c.block_bytes = kBlockBytes;
  c.tls = tls;
  c.handshake_timeout_ms = 3000;
  e.transport = std::make_unique<UcxTransport>(c);
  return e;
}

// Polls both transports until `done` holds, for at most timeout_ms.
bool pump(Endpoint& a, Endpoint& b, const std::function<bool()>& done, int timeout_ms = 5000) {
  int64_t until = monotonic_ms() + timeout_ms;
  while (monotonic_ms() < until) {
    a.transport->poll(1, &a.events);
    b.transport->poll(1, &b.events);
    if (done()) return true;
  }
  return done();
}

const TransportEvent* find_event(const Endpoint& e, TransportEvent::Kind kind, uint64_t tag = 0) {
  for (const TransportEvent& ev : e.events)
    if (ev.kind == kind && (kind != TransportEvent::Kind::kRmaDone || ev.tag == tag)) return &ev;
  return nullptr;
}

// The connection a side's peer addresses came on (its one hand-shake).
uint64_t conn(const Endpoint& e) {
  const TransportEvent* c = find_event(e, TransportEvent::Kind::kConnected);
  return c != nullptr ? c->connection : 0;
}

std::string describe_events(const Endpoint& e) {
  std::string s;
  for (const TransportEvent& ev : e.events) s += std::to_string(static_cast<int>(ev.kind)) + ":" + ev.detail + "; ";
  return s;
}

// Returns whether both sides saw the hand-shake complete.
bool connect_pair(Endpoint& prefill, Endpoint& decode) {
  prefill.transport->connect("127.0.0.1", decode.transport->listen_port());
  bool ok = pump(prefill, decode, [&] {
    return find_event(prefill, TransportEvent::Kind::kConnected) && find_event(decode, TransportEvent::Kind::kConnected);
  });
  EXPECT_TRUE(ok) << "no hand-shake; prefill: " << describe_events(prefill) << " decode: " << describe_events(decode);
  return ok;
}

class UcxTransportTest : public ::testing::TestWithParam<std::string> {};

// Messages both ways, then a put and a get of scattered runs: the bytes land
// exactly where the runs say and nowhere else, and a put is reported only
// after its data is at the target.
TEST_P(UcxTransportTest, MovesMessagesAndRunsOfBlocks) {
  Endpoint prefill = make_endpoint(2, pd::Role::kPrefill, "k", GetParam(), 0x11);
  Endpoint decode = make_endpoint(3, pd::Role::kDecode, "k", GetParam(), 0x00);
  ASSERT_TRUE(connect_pair(prefill, decode));
  EXPECT_EQ(find_event(decode, TransportEvent::Kind::kConnected)->identity.node, 2u);
  EXPECT_EQ(find_event(prefill, TransportEvent::Kind::kConnected)->keys.n_blocks, kBlocks);

  std::vector<uint8_t> hello = encode_message(sample_message());
  ASSERT_TRUE(prefill.transport->send(3, hello));
  ASSERT_TRUE(decode.transport->send(2, hello));
  ASSERT_TRUE(pump(prefill, decode, [&] {
    return find_event(decode, TransportEvent::Kind::kMessage) && find_event(prefill, TransportEvent::Kind::kMessage);
  }));
  EXPECT_EQ(find_event(decode, TransportEvent::Kind::kMessage)->frame, hello);
  EXPECT_EQ(find_event(decode, TransportEvent::Kind::kMessage)->peer, 2u);

  for (size_t i = 0; i < prefill.pool.size(); ++i) prefill.pool[i] = static_cast<uint8_t>(i * 7 + i / 8192);
  // Blocks 1-3 to decode blocks 10-12, block 20 to decode block 5.
  std::vector<RmaRun> runs = {{1 * kBlockBytes, 10 * kBlockBytes, 3 * kBlockBytes},
                              {20 * kBlockBytes, 5 * kBlockBytes, 1 * kBlockBytes}};
  prefill.transport->post(3, RmaOp::kPut, runs, 77, monotonic_ms() + 5000, conn(prefill));
  ASSERT_TRUE(pump(prefill, decode, [&] { return find_event(prefill, TransportEvent::Kind::kRmaDone, 77); }));
  ASSERT_TRUE(find_event(prefill, TransportEvent::Kind::kRmaDone, 77)->ok)
      << find_event(prefill, TransportEvent::Kind::kRmaDone, 77)->detail;
  // Flushed: the data is at the target when the put is reported, before any
  // later message could tell the decode so.
  for (int b = 0; b < kBlocks; ++b) {
    int src = b >= 10 && b <= 12 ? b - 9 : b == 5 ? 20 : -1;
    for (uint64_t i = 0; i < kBlockBytes; i += 511) {
      uint8_t want = src < 0 ? 0 : prefill.pool[src * kBlockBytes + i];
      ASSERT_EQ(decode.pool[b * kBlockBytes + i], want) << "block " << b << " byte " << i;
    }
  }
  // READ: the decode pulls prefill blocks 30-31 into its blocks 40-41.
  decode.transport->post(2, RmaOp::kGet, {{40 * kBlockBytes, 30 * kBlockBytes, 2 * kBlockBytes}}, 78,
                         monotonic_ms() + 5000, conn(decode));
  ASSERT_TRUE(pump(prefill, decode, [&] { return find_event(decode, TransportEvent::Kind::kRmaDone, 78); }));
  ASSERT_TRUE(find_event(decode, TransportEvent::Kind::kRmaDone, 78)->ok);
  EXPECT_EQ(std::memcmp(decode.pool.data() + 40 * kBlockBytes, prefill.pool.data() + 30 * kBlockBytes, 2 * kBlockBytes), 0);
  EXPECT_EQ(prefill.transport->counters().bytes_moved, int64_t{4 * kBlockBytes});
  EXPECT_EQ(decode.transport->counters().bytes_moved, int64_t{2 * kBlockBytes});
}

TEST_P(UcxTransportTest, RunsOutsideAPoolFailWithoutTouchingMemory) {
  Endpoint prefill = make_endpoint(2, pd::Role::kPrefill, "k", GetParam(), 0x11);
  Endpoint decode = make_endpoint(3, pd::Role::kDecode, "k", GetParam(), 0x00);
  ASSERT_TRUE(connect_pair(prefill, decode));
  prefill.transport->post(3, RmaOp::kPut, {{0, (kBlocks - 1) * kBlockBytes, 2 * kBlockBytes}}, 5, monotonic_ms() + 5000, conn(prefill));
  prefill.transport->post(9, RmaOp::kPut, {{0, 0, kBlockBytes}}, 6, monotonic_ms() + 5000, conn(prefill));
  ASSERT_TRUE(pump(prefill, decode, [&] {
    return find_event(prefill, TransportEvent::Kind::kRmaDone, 5) && find_event(prefill, TransportEvent::Kind::kRmaDone, 6);
  }));
  EXPECT_FALSE(find_event(prefill, TransportEvent::Kind::kRmaDone, 5)->ok);
  EXPECT_FALSE(find_event(prefill, TransportEvent::Kind::kRmaDone, 6)->ok);
  EXPECT_TRUE(std::all_of(decode.pool.begin(), decode.pool.end(), [](uint8_t b) { return b == 0; }));
}

INSTANTIATE_TEST_SUITE_P(Tls, UcxTransportTest, ::testing::Values("tcp", "tcp,sm,self"),
                         [](const auto& info) { return info.param == "tcp" ? std::string("Tcp") : std::string("SharedMemory"); });

TEST(UcxTransport, AWrongSecretIsRefusedOnBothSidesWithNoEndpoint) {
  Endpoint prefill = make_endpoint(2, pd::Role::kPrefill, "right", "tcp", 0x11);
  Endpoint decode = make_endpoint(3, pd::Role::kDecode, "wrong", "tcp", 0x00);
  prefill.transport->connect("127.0.0.1", decode.transport->listen_port());
  ASSERT_TRUE(pump(prefill, decode, [&] {
    return find_event(prefill, TransportEvent::Kind::kRefused) && find_event(decode, TransportEvent::Kind::kRefused);
  }));
  EXPECT_NE(find_event(prefill, TransportEvent::Kind::kRefused)->detail.find("cluster secret"), std::string::npos);
  EXPECT_EQ(find_event(prefill, TransportEvent::Kind::kConnected), nullptr);
  EXPECT_EQ(find_event(decode, TransportEvent::Kind::kConnected), nullptr);
  EXPECT_FALSE(prefill.transport->send(3, encode_message(sample_message())));
  EXPECT_EQ(prefill.transport->counters().handshakes_refused, 1);
  EXPECT_EQ(decode.transport->counters().handshakes_refused, 1);
}

TEST(UcxTransport, AnUnansweredHandshakeTimesOut) {
  Endpoint prefill = make_endpoint(2, pd::Role::kPrefill, "k", "tcp", 0x11);
  // A listener that accepts and never speaks.
  Endpoint silent = make_endpoint(3, pd::Role::kDecode, "k", "tcp", 0x00);
  prefill.transport->connect("127.0.0.1", silent.transport->listen_port());
  int64_t until = monotonic_ms() + 6000;
  while (monotonic_ms() < until && !find_event(prefill, TransportEvent::Kind::kRefused))
    prefill.transport->poll(5, &prefill.events);  // the silent side is never polled
  ASSERT_NE(find_event(prefill, TransportEvent::Kind::kRefused), nullptr);
  EXPECT_NE(find_event(prefill, TransportEvent::Kind::kRefused)->detail.find("timed out"), std::string::npos);
}

// A UCX connection request that did not come from a peer that passed the
// hand-shake (here: a bare UCX worker that learnt the listener's port) gets no
// endpoint.
TEST(UcxTransport, AConnectionRequestWithoutHandshakeIsRejected) {
  Endpoint prefill = make_endpoint(2, pd::Role::kPrefill, "k", "tcp", 0x11);
  Endpoint decode = make_endpoint(3, pd::Role::kDecode, "k", "tcp", 0x00);
  ASSERT_TRUE(connect_pair(prefill, decode));
  ByteReader r(find_event(prefill, TransportEvent::Kind::kConnected)->keys.endpoint_address);
  uint16_t ucx_port = r.get<uint16_t>();
  ASSERT_TRUE(r.ok());

  ucp_config_t* config = nullptr;
  ASSERT_EQ(ucp_config_read(nullptr, nullptr, &config), UCS_OK);
  ucp_config_modify(config, "TLS", "tcp");
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_RMA;
  ucp_context_h context = nullptr;
  ASSERT_EQ(ucp_init(&params, config, &context), UCS_OK);
  ucp_config_release(config);
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_CLIENT_ID;
  wp.client_id = 42;
  ucp_worker_h worker = nullptr;
  ASSERT_EQ(ucp_worker_create(context, &wp, &worker), UCS_OK);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(ucx_port);
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER | UCP_EP_PARAMS_FLAGS_SEND_CLIENT_ID;
  ep.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
  ep.sockaddr.addrlen = sizeof(addr);
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ucp_ep_h intruder = nullptr;
  ASSERT_EQ(ucp_ep_create(worker, &ep, &intruder), UCS_OK);
  int64_t until = monotonic_ms() + 5000;
  while (monotonic_ms() < until && decode.transport->counters().connections_rejected == 0) {
    ucp_worker_progress(worker);
    decode.transport->poll(1, &decode.events);
    prefill.transport->poll(1, &prefill.events);
  }
  EXPECT_EQ(decode.transport->counters().connections_rejected, 1);
  EXPECT_EQ(decode.transport->counters().handshakes_ok, 1);  // only the real peer
  ucp_request_param_t close{};
  close.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  close.flags = UCP_EP_CLOSE_FLAG_FORCE;
  void* request = ucp_ep_close_nbx(intruder, &close);
  for (int i = 0; i < 1000 && request != nullptr && !UCS_PTR_IS_ERR(request) &&
                  ucp_request_check_status(request) == UCS_INPROGRESS;
       ++i)
    ucp_worker_progress(worker);
  if (request != nullptr && !UCS_PTR_IS_ERR(request)) ucp_request_free(request);
  ucp_worker_destroy(worker);
  ucp_cleanup(context);
}

// Over TCP a forced close is a fence: once the decode has fenced the prefill,
// a write the prefill posts fails and the decode's blocks stay untouched.
TEST(UcxTransport, AFencedPeersLateWriteNeverLands) {
  Endpoint prefill = make_endpoint(2, pd::Role::kPrefill, "k", "tcp", 0x11);
  Endpoint decode = make_endpoint(3, pd::Role::kDecode, "k", "tcp", 0x00);
  ASSERT_TRUE(decode.transport->fences_by_close());
  ASSERT_TRUE(connect_pair(prefill, decode));
  decode.transport->fence(2, 1);
  ASSERT_TRUE(pump(prefill, decode, [&] { return find_event(decode, TransportEvent::Kind::kPeerFenced); }));
  EXPECT_EQ(find_event(decode, TransportEvent::Kind::kPeerFenced)->detail, "endpoint force-closed");
  // The prefill posts before and after it has noticed: either way nothing lands.
  prefill.transport->post(3, RmaOp::kPut, {{0, 0, 8 * kBlockBytes}}, 9, monotonic_ms() + 3000, conn(prefill));
  prefill.transport->send(3, encode_message(sample_message()));
  ASSERT_TRUE(pump(prefill, decode, [&] { return find_event(prefill, TransportEvent::Kind::kRmaDone, 9); }));
  EXPECT_FALSE(find_event(prefill, TransportEvent::Kind::kRmaDone, 9)->ok);
  ASSERT_TRUE(pump(prefill, decode, [&] { return find_event(prefill, TransportEvent::Kind::kPeerFailed); }));
  prefill.transport->post(3, RmaOp::kPut, {{0, 0, 8 * kBlockBytes}}, 10, monotonic_ms() + 3000, conn(prefill));
  ASSERT_TRUE(pump(prefill, decode, [&] { return find_event(prefill, TransportEvent::Kind::kRmaDone, 10); }));
  EXPECT_FALSE(find_event(prefill, TransportEvent::Kind::kRmaDone, 10)->ok);
  pump(prefill, decode, [] { return false; }, 200);
  EXPECT_TRUE(std::all_of(decode.pool.begin(), decode.pool.end(), [](uint8_t b) { return b == 0; }));
  EXPECT_EQ(find_event(decode, TransportEvent::Kind::kMessage), nullptr);
}

// With shared memory a closed endpoint fences nothing (CMA writes straight
// into our pages), so a live peer is never reported fenced.
TEST(UcxTransport, SharedMemoryPeersAreFencedOnlyByTheirExit) {
  Endpoint prefill = make_endpoint(2, pd::Role::kPrefill, "k", "tcp,sm,self", 0x11);
  Endpoint decode = make_endpoint(3, pd::Role::kDecode, "k", "tcp,sm,self", 0x00);
  ASSERT_FALSE(decode.transport->fences_by_close());
  ASSERT_TRUE(connect_pair(prefill, decode));
  decode.transport->fence(2, 1);
  pump(prefill, decode, [] { return false; }, 300);
  EXPECT_EQ(find_event(decode, TransportEvent::Kind::kPeerFenced), nullptr);
}

}  // namespace
}  // namespace tandem::transport
