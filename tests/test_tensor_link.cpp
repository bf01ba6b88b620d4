// The tensor-parallel wire between hosts: the job a joined worker gets, its
// status (times as ages, so two hosts' clocks never mix), a step's KV copies,
// and the link itself, which ends with an error (never an assert) on
// whatever a peer sends that is not a message within bounds.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>

#include "cli/tensor_link.h"
#include "cli/tensor_wire.h"
#include "util/error.h"

namespace tandem::cli {
namespace {

TEST(TensorWire, AJobSurvivesTheWireAndAMalformedOneIsRefusedNamingTheField) {
  TensorJob j;
  j.model_path = "/models/a b.gguf";
  j.model_hash = 0xfedcba9876543210ull;
  j.rank = 3;
  j.size = 4;
  j.generation = 7;
  j.threads = 5;
  j.rendezvous_dir = "/shared/tp/g7";
  j.shared_memory_frames = false;
  j.block_size = 32;
  j.kv_blocks = 1234;
  j.state_slots = 9;
  j.timeout_ms = 4321;
  j.kv_dtype = "bf16";
  j.dir = "/dev/shm/core-only";
  const TensorJob k = decode_job(encode_job(j));
  EXPECT_EQ(k.model_path, j.model_path);
  EXPECT_EQ(k.model_hash, j.model_hash);
  EXPECT_EQ(k.rank, 3);
  EXPECT_EQ(k.size, 4);
  EXPECT_EQ(k.generation, 7);
  EXPECT_EQ(k.threads, 5);
  EXPECT_EQ(k.rendezvous_dir, j.rendezvous_dir);
  EXPECT_FALSE(k.shared_memory_frames);
  EXPECT_EQ(k.block_size, 32);
  EXPECT_EQ(k.kv_blocks, 1234);
  EXPECT_EQ(k.state_slots, 9);
  EXPECT_EQ(k.timeout_ms, 4321);
  EXPECT_EQ(k.kv_dtype, "bf16");
  EXPECT_TRUE(k.remote()) << "the core's shared files do not travel";

  const auto refused = [](std::string text) {
    try {
      (void)decode_job(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  std::vector<uint8_t> bytes = encode_job(j);
  std::string text(bytes.begin(), bytes.end());
  EXPECT_NE(refused(text.substr(0, text.find("kv_dtype="))).find("without kv_dtype"), std::string::npos);
  std::string bad_rank = text;
  bad_rank.replace(bad_rank.find("rank=3"), 6, "rank=9");
  EXPECT_NE(refused(bad_rank).find("bad rank"), std::string::npos);
  std::string bad_number = text;
  bad_number.replace(bad_number.find("kv_blocks=1234"), 14, "kv_blocks=12x4");
  EXPECT_NE(refused(bad_number).find("bad kv_blocks"), std::string::npos);
  EXPECT_NE(refused("no equals sign\n").find("malformed"), std::string::npos);
}

TEST(TensorWire, AStatusTravelsWithItsTimesAsAges) {
  WorkerStatus a;
  std::memset(static_cast<void*>(&a), 0, sizeof(a));
  a.pid = 42;
  a.phase = static_cast<int32_t>(WorkerPhase::kInStep);
  a.step_id = 17;
  a.op_kind = 6;
  a.op_seq = 99;
  a.op_since_ns = 1'000'000;  // the worker's clock
  a.op_arrived = 0b10;
  a.gathers = 5;
  a.heartbeat_ns = 123;
  const std::vector<uint8_t> wire = encode_status(a, 1'000'000 + 250'000'000);  // 250 ms into the op
  WorkerStatus b;
  std::memset(static_cast<void*>(&b), 0, sizeof(b));
  decode_status(wire, b, 9'000'000'000);  // the core's clock
  EXPECT_EQ(b.pid.load(), 42);
  EXPECT_EQ(b.step_id.load(), 17);
  EXPECT_EQ(b.op_kind.load(), 6);
  EXPECT_EQ(b.op_seq.load(), 99);
  EXPECT_EQ(b.op_arrived.load(), 0b10u);
  EXPECT_EQ(b.gathers.load(), 5);
  EXPECT_EQ(b.heartbeat_ns.load(), 9'000'000'000) << "stamped on arrival";
  EXPECT_EQ(b.op_since_ns.load(), 9'000'000'000 - 250'000'000) << "the op's age, on the core's clock";
  std::vector<uint8_t> short_wire(wire.begin(), wire.end() - 1);
  EXPECT_THROW(decode_status(short_wire, b, 0), Error);
}

TEST(TensorWire, AStepCarriesTheKvCopiesAndAnOddListIsRefused) {
  Batch b;
  b.add_sequence(std::vector<int32_t>{1, 2, 3}, 0, {4, 5}, true, 2);
  b.block_copies = {4, 6};
  b.state_copies = {2, 3};
  const Batch c = decode_batch(encode_batch(b));
  EXPECT_EQ(c.tokens, b.tokens);
  EXPECT_EQ(c.block_copies, b.block_copies);
  EXPECT_EQ(c.state_copies, b.state_copies);
  EXPECT_EQ(c.sequences.at(0).state_slot, 2);
  EXPECT_LE(encode_batch(b).size(), max_batch_bytes(3, 1, 2));
  b.block_copies = {4};
  EXPECT_THROW(decode_batch(encode_batch(b)), Error);
}

// A connected pair: (the listener's side, the connecting side).
std::pair<std::unique_ptr<TensorLink>, std::unique_ptr<TensorLink>> linked() {
  LinkListener l("127.0.0.1", 0);
  auto client = TensorLink::connect("127.0.0.1", l.port(), 2000);
  auto server = l.accept(2000);
  return {std::move(server), std::move(client)};
}

TEST(TensorLinkTest, MessagesArriveWholeAndInOrderAndATimeoutConsumesNothing) {
  auto [server, client] = linked();
  ASSERT_TRUE(server && client);
  LinkMessage m;
  EXPECT_FALSE(server->receive(m, 20, 1 << 20)) << "nothing sent yet";
  std::vector<uint8_t> big(3 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 7);
  std::thread writer([&, c = client.get()] {
    c->send(2, 11, big, 10'000);
    c->send(3, 12, {}, 10'000);
  });
  ASSERT_TRUE(server->receive(m, 5000, 4 << 20));
  EXPECT_EQ(m.kind, 2u);
  EXPECT_EQ(m.step_id, 11);
  EXPECT_EQ(m.payload, big);
  ASSERT_TRUE(server->receive(m, 5000, 4 << 20));
  EXPECT_EQ(m.kind, 3u);
  EXPECT_EQ(m.step_id, 12);
  EXPECT_TRUE(m.payload.empty());
  writer.join();
}

TEST(TensorLinkTest, AnOversizedAnnouncementABadMagicOrAClosedPeerIsAnErrorNamingThePeer) {
  {
    auto [server, client] = linked();
    client->send(1, 1, std::vector<uint8_t>(100), 1000);
    LinkMessage m;
    try {
      (void)server->receive(m, 1000, 99);
      ADD_FAILURE() << "an announcement over the bound was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("over the bound of 99"), std::string::npos) << e.what();
    }
  }
  {
    // Raw bytes that are no message.
    LinkListener l("127.0.0.1", 0);
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(l.port()));
    ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    auto server = l.accept(2000);
    ASSERT_TRUE(server);
    const char junk[32] = "GET / HTTP/1.1\r\n\r\n";
    ASSERT_EQ(::write(fd, junk, sizeof(junk)), static_cast<ssize_t>(sizeof(junk)));
    LinkMessage m;
    EXPECT_THROW((void)server->receive(m, 1000, 1 << 20), Error);
    ::close(fd);
  }
  {
    auto [server, client] = linked();
    client.reset();
    LinkMessage m;
    try {
      (void)server->receive(m, 1000, 1 << 20);
      ADD_FAILURE() << "a closed link read as a message or a timeout";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("closed by the other side"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("127.0.0.1:"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(TensorLink::connect("127.0.0.1", 1, 500), Error) << "nothing listens on port 1";
  EXPECT_THROW(LinkListener("not-an-address", 0), Error);
}

}  // namespace
}  // namespace tandem::cli
