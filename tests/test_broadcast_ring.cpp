// The broadcast ring (parallel/broadcast_ring.h): every reader reads every
// message once, in order, untorn, across threads and processes; the writer
// never overwrites an unread slot; waits report past their soft deadline and
// fail past their hard one, naming the side, slot and sequence; a dead peer
// ends a wait.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "parallel/broadcast_ring.h"

namespace tandem::parallel {
namespace {

std::string ring_path(const std::string& tag) {
  return "/dev/shm/tandem-test-ring-" + std::to_string(::getpid()) + "-" + tag;
}

// A message whose every byte is derived from its seq, so a torn or stale read shows.
std::vector<uint8_t> message_of(uint64_t seq, size_t max_bytes) {
  std::vector<uint8_t> m(1 + seq * 37 % max_bytes);
  for (size_t i = 0; i < m.size(); ++i) m[i] = static_cast<uint8_t>(seq * 131 + i * 7);
  return m;
}

bool intact(const RingMessage& msg, size_t max_bytes) {
  const std::vector<uint8_t> want = message_of(msg.seq, max_bytes);
  return msg.payload.size() == want.size() && std::memcmp(msg.payload.data(), want.data(), want.size()) == 0 &&
         msg.step_id == static_cast<int64_t>(msg.seq) + 1000;
}

RingWait quick_wait() {
  RingWait w;
  w.soft_deadline_ms = 0;
  w.hard_deadline_ms = 10000;
  return w;
}

TEST(BroadcastRing, EveryReaderReadsEveryMessageOnceInOrderAcrossThreads) {
  const std::string path = ring_path("threads");
  constexpr int kReaders = 3;
  constexpr uint64_t kMessages = 20000;
  constexpr size_t kBytes = 256;
  auto writer = BroadcastRing::create(path, RingShape{4, kBytes, kReaders}, BroadcastRing::kWriter, "test");
  std::vector<std::unique_ptr<BroadcastRing>> readers;
  for (int r = 0; r < kReaders; ++r) readers.push_back(BroadcastRing::attach(path, r, "test"));
  writer->unlink();
  std::vector<uint64_t> bad(kReaders, 0), got(kReaders, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < kReaders; ++r)
    threads.emplace_back([&, r] {
      for (uint64_t i = 0; i < kMessages; ++i) {
        auto g = readers[static_cast<size_t>(r)]->read(quick_wait());
        if (g.message().seq != i || !intact(g.message(), kBytes)) ++bad[static_cast<size_t>(r)];
        ++got[static_cast<size_t>(r)];
        if (r == 1 && i % 1000 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));  // a slow reader
      }
    });
  for (uint64_t i = 0; i < kMessages; ++i) {
    const auto m = message_of(i, kBytes);
    writer->publish(static_cast<int64_t>(i) + 1000, 7, m, quick_wait());
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kReaders; ++r) {
    EXPECT_EQ(got[static_cast<size_t>(r)], kMessages);
    EXPECT_EQ(bad[static_cast<size_t>(r)], 0u) << "reader " << r;
  }
  const RingCounters c = writer->counters();
  EXPECT_EQ(c.published, kMessages);
  for (uint64_t n : c.read) EXPECT_EQ(n, kMessages);
}

TEST(BroadcastRing, TheWriterNeverOverwritesASlotAReaderStillHolds) {
  const std::string path = ring_path("hold");
  auto writer = BroadcastRing::create(path, RingShape{2, 64, 1}, BroadcastRing::kWriter, "test");
  auto reader = BroadcastRing::attach(path, 0, "test");
  writer->unlink();
  writer->publish(1000, 0, message_of(0, 64), quick_wait());
  writer->publish(1001, 0, message_of(1, 64), quick_wait());
  BroadcastRing::ReadGuard held = reader->read(quick_wait());  // holds slot 0 (seq 0)
  // The ring is full: the third message needs slot 0, which is held.
  std::vector<std::string> reports;
  RingWait short_wait;
  short_wait.soft_deadline_ms = 30;
  short_wait.hard_deadline_ms = 100;
  short_wait.report = [&](const std::string& m) { reports.push_back(m); };
  try {
    writer->publish(1002, 0, message_of(2, 64), short_wait);
    FAIL() << "published over a held slot";
  } catch (const RingError& e) {
    EXPECT_EQ(e.kind(), RingError::Kind::kTimeout);
    const std::string what = e.what();
    EXPECT_NE(what.find("the writer"), std::string::npos) << what;
    EXPECT_NE(what.find("slot 0 (message seq 2)"), std::string::npos) << what;
    EXPECT_NE(what.find("reader(s) 0 (read 0)"), std::string::npos) << what;
  }
  // The writer's side reported once past its soft deadline, with the dump.
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_NE(reports[0].find("the writer (pid " + std::to_string(::getpid()) + ") waits for slot 0"), std::string::npos)
      << reports[0];
  EXPECT_NE(reports[0].find("slots (seq held): 0 1"), std::string::npos) << reports[0];
  EXPECT_TRUE(intact(held.message(), 64));
  held.release();
  writer->publish(1002, 0, message_of(2, 64), quick_wait());  // now it fits
  for (uint64_t i = 1; i <= 2; ++i) {
    auto g = reader->read(quick_wait());
    EXPECT_EQ(g.message().seq, i);
    EXPECT_TRUE(intact(g.message(), 64));
  }
}

TEST(BroadcastRing, AGuardReleasesItsSlotOnEveryExitPath) {
  const std::string path = ring_path("guard");
  auto writer = BroadcastRing::create(path, RingShape{1, 64, 1}, BroadcastRing::kWriter, "test");
  auto reader = BroadcastRing::attach(path, 0, "test");
  writer->unlink();
  for (uint64_t i = 0; i < 3; ++i) {
    writer->publish(static_cast<int64_t>(i) + 1000, 0, message_of(i, 64), quick_wait());
    try {
      auto g = reader->read(quick_wait());
      EXPECT_TRUE(intact(g.message(), 64));
      throw std::runtime_error("the step failed");
    } catch (const std::runtime_error&) {
    }
    EXPECT_EQ(writer->counters().read[0], i + 1);  // released by the guard's destructor
  }
}

TEST(BroadcastRing, AMessageTooLargeForASlotIsRefusedNamingBothSizes) {
  const std::string path = ring_path("large");
  auto writer = BroadcastRing::create(path, RingShape{2, 16, 1}, BroadcastRing::kWriter, "steps");
  writer->unlink();
  std::vector<uint8_t> big(17);
  try {
    writer->publish(1, 0, big, quick_wait());
    FAIL();
  } catch (const RingError& e) {
    EXPECT_EQ(e.kind(), RingError::Kind::kTooLarge);
    EXPECT_NE(std::string(e.what()).find("17 bytes does not fit a slot of the ring 'steps' (16 bytes)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(writer->counters().published, 0u);
}

TEST(BroadcastRing, AReaderPastItsSoftDeadlineReportsOnceThenFailsAtTheHardOneWithTheRingDump) {
  const std::string path = ring_path("deadline");
  auto writer = BroadcastRing::create(path, RingShape{4, 64, 2}, BroadcastRing::kWriter, "steps");
  auto r0 = BroadcastRing::attach(path, 0, "steps");
  auto r1 = BroadcastRing::attach(path, 1, "steps");
  writer->unlink();
  writer->publish(1000, 0, message_of(0, 64), quick_wait());
  r0->read(quick_wait()).release();
  std::vector<std::string> reports;
  RingWait w;
  w.soft_deadline_ms = 50;
  w.hard_deadline_ms = 300;
  w.report = [&](const std::string& m) { reports.push_back(m); };
  try {
    r0->read(w);  // seq 1 never comes
    FAIL();
  } catch (const RingError& e) {
    EXPECT_EQ(e.kind(), RingError::Kind::kTimeout);
    const std::string what = e.what();
    EXPECT_NE(what.find("reader 0"), std::string::npos) << what;
    EXPECT_NE(what.find("waits for message seq 1 in slot 1"), std::string::npos) << what;
    EXPECT_NE(what.find("past the hard deadline of 300 ms"), std::string::npos) << what;
    // The dump: writer index, each reader's count and pid.
    EXPECT_NE(what.find("writer pid " + std::to_string(::getpid()) + " index 1"), std::string::npos) << what;
    EXPECT_NE(what.find("[0: pid " + std::to_string(::getpid()) + ", read 1"), std::string::npos) << what;
    EXPECT_NE(what.find("[1: pid " + std::to_string(::getpid()) + ", read 0"), std::string::npos) << what;
  }
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_NE(reports[0].find("soft deadline 50 ms"), std::string::npos) << reports[0];
  EXPECT_EQ(writer->counters().soft_deadline_reports, 1u);
  EXPECT_EQ(writer->counters().reader_waiting_since_ns[0], 0) << "the wait is over";
}

TEST(BroadcastRing, AWaitForWorkHasNoDeadlineButEndsWhenThePeerSaysItIsGone) {
  const std::string path = ring_path("gone");
  auto writer = BroadcastRing::create(path, RingShape{2, 64, 1}, BroadcastRing::kWriter, "steps");
  auto reader = BroadcastRing::attach(path, 0, "steps");
  writer->unlink();
  std::atomic<bool> gone{false};
  RingWait w;
  w.soft_deadline_ms = 0;
  w.hard_deadline_ms = 0;  // a wait for work
  w.peer_gone = [&] { return gone.load() ? std::string("the engine core exited") : std::string(); };
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    gone = true;
  });
  try {
    reader->read(w);
    FAIL();
  } catch (const RingError& e) {
    EXPECT_EQ(e.kind(), RingError::Kind::kPeerGone);
    EXPECT_NE(std::string(e.what()).find("the engine core exited"), std::string::npos) << e.what();
  }
  t.join();
}

// Across processes: a forked reader checks every message; then kill -9 of a
// reader ends the writer's wait for a slot with the reader named.
TEST(BroadcastRing, AcrossProcessesEveryMessageArrivesAndAKilledReaderIsNamed) {
  const std::string path = ring_path("procs");
  constexpr uint64_t kMessages = 5000;
  constexpr size_t kBytes = 512;
  auto writer = BroadcastRing::create(path, RingShape{4, kBytes, 2}, BroadcastRing::kWriter, "steps");
  std::vector<pid_t> kids;
  for (int r = 0; r < 2; ++r) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int status = 0;
      try {
        auto reader = BroadcastRing::attach(path, r, "steps");
        for (uint64_t i = 0; i < kMessages; ++i) {
          auto g = reader->read(quick_wait());
          if (g.message().seq != i || !intact(g.message(), kBytes)) status = 3;
        }
        if (r == 1) ::pause();  // reader 1 then parks, holding nothing, until killed
      } catch (...) {
        status = 4;
      }
      ::_exit(status);
    }
    kids.push_back(pid);
  }
  for (uint64_t i = 0; i < kMessages; ++i) writer->publish(static_cast<int64_t>(i) + 1000, 1, message_of(i, kBytes), quick_wait());
  int status = 0;
  ASSERT_EQ(::waitpid(kids[0], &status, 0), kids[0]);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  // Reader 0 has exited: fill the ring, then the next publish waits for it.
  ::kill(kids[1], SIGKILL);
  ASSERT_EQ(::waitpid(kids[1], &status, 0), kids[1]);
  writer->unlink();
  try {
    for (int i = 0; i < 8; ++i) writer->publish(1, 1, message_of(0, kBytes), quick_wait());
    FAIL() << "published into a ring whose readers are gone";
  } catch (const RingError& e) {
    EXPECT_EQ(e.kind(), RingError::Kind::kPeerGone);
    EXPECT_NE(std::string(e.what()).find("is gone"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tandem::parallel
