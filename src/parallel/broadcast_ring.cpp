#include "parallel/broadcast_ring.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <immintrin.h>

#include "util/clock.h"
#include "util/error.h"
#include "util/futex.h"
#include "util/shared_file.h"

namespace tandem::parallel {

namespace {
constexpr uint64_t kMagic = 0x74616e64656d5247ull;  // "tandemRG"
constexpr size_t kSlotHeaderBytes = 64;
size_t round_up_64(uint64_t n) { return static_cast<size_t>((n + 63) / 64 * 64); }
}  // namespace

struct BroadcastRing::Header {
  std::atomic<uint64_t> magic;  // stored last by create(), with release
  uint32_t n_slots;
  int32_t n_readers;
  uint64_t slot_bytes;
  alignas(64) std::atomic<uint64_t> published;  // messages published: the writer's index
  std::atomic<uint64_t> bytes;
  std::atomic<int32_t> writer_pid;
  std::atomic<int64_t> writer_waiting_since_ns;
  std::atomic<uint64_t> soft_reports;
  alignas(64) std::atomic<uint32_t> bell;  // bumped by every publish and release: the futex word
  struct alignas(64) Reader {
    std::atomic<uint64_t> read;  // messages this reader has released
    std::atomic<int32_t> pid;
    std::atomic<int64_t> waiting_since_ns;
  };
  Reader readers[kMaxRingReaders];
};

namespace {
struct SlotHeader {
  std::atomic<uint64_t> state;  // seq + 1 of the message held (0: none yet), release/acquire
  uint64_t seq;
  int64_t step_id;
  uint64_t bytes;
  uint32_t kind;
};
static_assert(sizeof(SlotHeader) <= kSlotHeaderBytes);
static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<int64_t>::is_always_lock_free);

size_t slot_stride(uint64_t slot_bytes) { return kSlotHeaderBytes + round_up_64(slot_bytes); }

bool process_gone(int32_t pid) { return pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH; }

void* map_ring(const std::string& path, size_t bytes, bool create) {
  std::string error;
  void* p = map_shared_file(path, bytes, create, &error);
  if (p == nullptr) throw RingError(RingError::Kind::kCorrupt, "the ring: " + error);
  return p;
}
}  // namespace

size_t BroadcastRing::mapping_bytes(const RingShape& s) {
  return round_up_64(sizeof(Header)) + slot_stride(s.slot_bytes) * s.n_slots;
}

std::unique_ptr<BroadcastRing> BroadcastRing::create(const std::string& path, const RingShape& shape, int role,
                                                     std::string name) {
  TANDEM_ASSERT(shape.n_slots >= 1 && shape.n_readers >= 1 && shape.n_readers <= kMaxRingReaders,
                "a ring of at least one slot and 1..32 readers");
  const size_t bytes = mapping_bytes(shape);
  void* p = map_ring(path, bytes, true);
  auto* h = new (p) Header{};  // the file is zero-filled; the atomics start at 0
  h->n_slots = shape.n_slots;
  h->n_readers = shape.n_readers;
  h->slot_bytes = shape.slot_bytes;
  h->magic.store(kMagic, std::memory_order_release);
  return std::unique_ptr<BroadcastRing>(new BroadcastRing(p, bytes, role, std::move(name), path));
}

std::unique_ptr<BroadcastRing> BroadcastRing::attach(const std::string& path, int role, std::string name) {
  // Map the header first to learn the size.
  void* head = map_ring(path, sizeof(Header), false);
  const auto* h = static_cast<const Header*>(head);
  if (h->magic.load(std::memory_order_acquire) != kMagic) {
    ::munmap(head, sizeof(Header));
    throw RingError(RingError::Kind::kCorrupt, "the ring " + path + " is not initialised");
  }
  const RingShape shape{h->n_slots, h->slot_bytes, h->n_readers};
  ::munmap(head, sizeof(Header));
  const size_t bytes = mapping_bytes(shape);
  return std::unique_ptr<BroadcastRing>(new BroadcastRing(map_ring(path, bytes, false), bytes, role,
                                                          std::move(name), path));
}

BroadcastRing::BroadcastRing(void* map, size_t bytes, int role, std::string name, std::string path)
    : header_(static_cast<Header*>(map)), map_bytes_(bytes), role_(role), name_(std::move(name)),
      path_(std::move(path)) {
  shape_ = RingShape{header_->n_slots, header_->slot_bytes, header_->n_readers};
  TANDEM_ASSERT(role == kWriter || (role >= 0 && role < shape_.n_readers), "a ring role: the writer or a reader");
  const auto pid = static_cast<int32_t>(::getpid());
  if (role == kWriter) {
    next_ = header_->published.load(std::memory_order_acquire);
    header_->writer_pid.store(pid, std::memory_order_release);
  } else {
    next_ = header_->readers[role].read.load(std::memory_order_acquire);
    header_->readers[role].pid.store(pid, std::memory_order_release);
  }
}

BroadcastRing::~BroadcastRing() { ::munmap(header_, map_bytes_); }

void BroadcastRing::unlink() {
  if (!unlinked_) ::unlink(path_.c_str());
  unlinked_ = true;
}

uint8_t* BroadcastRing::slot(uint64_t index) const {
  return reinterpret_cast<uint8_t*>(header_) + round_up_64(sizeof(Header)) +
         slot_stride(shape_.slot_bytes) * (index % shape_.n_slots);
}

template <typename Ready>
void BroadcastRing::wait_until(Ready ready, const RingWait& wait, const std::function<std::string()>& what,
                               std::atomic<int64_t>* waiting_since) {
  // A short spin first: the peer a few microseconds behind is the common case.
  for (int i = 0; i < 2000; ++i) {
    if (ready()) return;
    _mm_pause();
  }
  const int64_t start = monotonic_ns();
  waiting_since->store(start, std::memory_order_release);
  struct Clear {
    std::atomic<int64_t>* since;
    ~Clear() { since->store(0, std::memory_order_release); }
  } clear{waiting_since};
  const int64_t soft = wait.soft_deadline_ms > 0 ? start + wait.soft_deadline_ms * 1'000'000 : 0;
  const int64_t hard = wait.hard_deadline_ms > 0 ? start + wait.hard_deadline_ms * 1'000'000 : 0;
  bool reported = false;
  int64_t next_liveness_ns = 0;
  for (;;) {
    const uint32_t seen = header_->bell.load(std::memory_order_acquire);
    if (ready()) return;  // rechecked after reading the bell: a wake-up is only a hint
    const int64_t now = monotonic_ns();
    const auto waited = [&] { return std::to_string((now - start) / 1'000'000) + " ms"; };
    if (wait.interrupted != nullptr && wait.interrupted->load())
      throw RingError(RingError::Kind::kInterrupted, what() + ": interrupted after " + waited());
    if (now >= next_liveness_ns) {
      next_liveness_ns = now + 50'000'000;
      std::string gone = wait.peer_gone ? wait.peer_gone() : std::string();
      if (gone.empty() && role_ != kWriter && process_gone(header_->writer_pid.load(std::memory_order_acquire)))
        gone = "the writer (pid " + std::to_string(header_->writer_pid.load()) + ") is gone";
      for (int r = 0; gone.empty() && role_ == kWriter && r < shape_.n_readers; ++r)
        if (process_gone(header_->readers[r].pid.load(std::memory_order_acquire)))
          gone = "reader " + std::to_string(r) + " (pid " + std::to_string(header_->readers[r].pid.load()) + ") is gone";
      if (!gone.empty())
        throw RingError(RingError::Kind::kPeerGone, what() + ": " + gone + " (after " + waited() + "); " + dump());
    }
    if (soft != 0 && !reported && now >= soft) {
      reported = true;
      header_->soft_reports.fetch_add(1, std::memory_order_relaxed);
      const std::string msg = what() + " for " + waited() + " (soft deadline " + std::to_string(wait.soft_deadline_ms) +
                              " ms); " + dump();
      if (wait.report)
        wait.report(msg);
      else
        std::fprintf(stderr, "tandem: %s\n", msg.c_str());
    }
    if (hard != 0 && now >= hard)
      throw RingError(RingError::Kind::kTimeout, what() + " for " + waited() + ", past the hard deadline of " +
                                                     std::to_string(wait.hard_deadline_ms) + " ms; " + dump());
    int64_t sleep_ns = kMaxSleepMs * 1'000'000;
    if (hard != 0) sleep_ns = std::min(sleep_ns, hard - now);
    futex_wait(&header_->bell, seen, sleep_ns);
  }
}

void BroadcastRing::publish(int64_t step_id, uint32_t kind, std::span<const uint8_t> payload, const RingWait& wait) {
  TANDEM_ASSERT(role_ == kWriter, "only the writer publishes");
  if (payload.size() > shape_.slot_bytes)
    throw RingError(RingError::Kind::kTooLarge, "a message of " + std::to_string(payload.size()) +
                                                    " bytes does not fit a slot of the ring '" + name_ + "' (" +
                                                    std::to_string(shape_.slot_bytes) + " bytes)");
  const uint64_t m = next_;
  // The slot is free once every reader has released message m - n_slots.
  auto free = [&] {
    for (int r = 0; r < shape_.n_readers; ++r)
      if (header_->readers[r].read.load(std::memory_order_acquire) + shape_.n_slots <= m) return false;
    return true;
  };
  auto what = [&] {
    std::string late;
    for (int r = 0; r < shape_.n_readers; ++r) {
      const uint64_t read = header_->readers[r].read.load(std::memory_order_acquire);
      if (read + shape_.n_slots <= m) late += (late.empty() ? "" : ", ") + std::to_string(r) + " (read " + std::to_string(read) + ")";
    }
    return "ring '" + name_ + "': the writer (pid " + std::to_string(::getpid()) + ") waits for slot " +
           std::to_string(m % shape_.n_slots) + " (message seq " + std::to_string(m) +
           ") to be released by reader(s) " + late;
  };
  wait_until(free, wait, what, &header_->writer_waiting_since_ns);
  uint8_t* s = slot(m);
  auto* sh = reinterpret_cast<SlotHeader*>(s);
  sh->seq = m;
  sh->step_id = step_id;
  sh->kind = kind;
  sh->bytes = payload.size();
  if (!payload.empty()) std::memcpy(s + kSlotHeaderBytes, payload.data(), payload.size());
  sh->state.store(m + 1, std::memory_order_release);
  header_->bytes.fetch_add(payload.size(), std::memory_order_relaxed);
  header_->published.store(m + 1, std::memory_order_release);
  next_ = m + 1;
  ring_bell(&header_->bell);
}

bool BroadcastRing::readable() const {
  TANDEM_ASSERT(role_ != kWriter, "only a reader reads");
  return reinterpret_cast<const SlotHeader*>(slot(next_))->state.load(std::memory_order_acquire) == next_ + 1;
}

BroadcastRing::ReadGuard BroadcastRing::read(const RingWait& wait) {
  TANDEM_ASSERT(role_ != kWriter, "only a reader reads");
  const uint64_t m = next_;
  TANDEM_ASSERT(header_->readers[role_].read.load(std::memory_order_relaxed) == m,
                "a reader releases each message before it reads the next");
  auto* sh = reinterpret_cast<SlotHeader*>(slot(m));
  auto what = [&] {
    return "ring '" + name_ + "': reader " + std::to_string(role_) + " (pid " + std::to_string(::getpid()) +
           ") waits for message seq " + std::to_string(m) + " in slot " + std::to_string(m % shape_.n_slots) +
           " from the writer (pid " + std::to_string(header_->writer_pid.load()) + ")";
  };
  wait_until([&] { return sh->state.load(std::memory_order_acquire) == m + 1; }, wait, what,
             &header_->readers[role_].waiting_since_ns);
  if (sh->seq != m || sh->bytes > shape_.slot_bytes)
    throw RingError(RingError::Kind::kCorrupt, "ring '" + name_ + "': slot " + std::to_string(m % shape_.n_slots) +
                                                   " holds seq " + std::to_string(sh->seq) + ", not " + std::to_string(m));
  ReadGuard g;
  g.ring_ = this;
  g.message_ = RingMessage{m, sh->step_id, sh->kind,
                           std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(sh) + kSlotHeaderBytes, sh->bytes)};
  next_ = m + 1;
  return g;
}

BroadcastRing::ReadGuard::ReadGuard(ReadGuard&& o) noexcept : ring_(o.ring_), message_(o.message_) { o.ring_ = nullptr; }

BroadcastRing::ReadGuard& BroadcastRing::ReadGuard::operator=(ReadGuard&& o) noexcept {
  if (this != &o) {
    release();
    ring_ = o.ring_;
    message_ = o.message_;
    o.ring_ = nullptr;
  }
  return *this;
}

void BroadcastRing::ReadGuard::release() {
  if (ring_ == nullptr) return;
  Header* h = ring_->header_;
  h->readers[ring_->role_].read.store(message_.seq + 1, std::memory_order_release);
  ring_bell(&h->bell);
  ring_ = nullptr;
}

RingCounters BroadcastRing::counters() const {
  RingCounters c;
  c.published = header_->published.load(std::memory_order_acquire);
  c.writer_pid = header_->writer_pid.load(std::memory_order_acquire);
  c.writer_waiting_since_ns = header_->writer_waiting_since_ns.load(std::memory_order_acquire);
  c.soft_deadline_reports = header_->soft_reports.load(std::memory_order_relaxed);
  c.bytes = header_->bytes.load(std::memory_order_relaxed);
  for (int r = 0; r < shape_.n_readers; ++r) {
    c.read.push_back(header_->readers[r].read.load(std::memory_order_acquire));
    c.reader_pids.push_back(header_->readers[r].pid.load(std::memory_order_acquire));
    c.reader_waiting_since_ns.push_back(header_->readers[r].waiting_since_ns.load(std::memory_order_acquire));
  }
  return c;
}

std::string BroadcastRing::dump() const {
  const RingCounters c = counters();
  const int64_t now = monotonic_ns();
  auto since = [&](int64_t t) { return t == 0 ? std::string("-") : std::to_string((now - t) / 1'000'000) + " ms"; };
  std::string s = "ring '" + name_ + "' state: " + std::to_string(shape_.n_slots) + " slots, " +
                  std::to_string(shape_.n_readers) + " readers; writer pid " + std::to_string(c.writer_pid) +
                  " index " + std::to_string(c.published) + " (next slot " +
                  std::to_string(c.published % shape_.n_slots) + "), waiting " + since(c.writer_waiting_since_ns) +
                  "; readers:";
  for (int r = 0; r < shape_.n_readers; ++r) {
    const size_t i = static_cast<size_t>(r);
    s += " [" + std::to_string(r) + ": pid " + std::to_string(c.reader_pids[i]) + ", read " + std::to_string(c.read[i]) +
         ", waiting " + since(c.reader_waiting_since_ns[i]) + "]";
  }
  s += "; slots (seq held):";
  for (uint32_t i = 0; i < shape_.n_slots; ++i) {
    const uint64_t st = reinterpret_cast<const SlotHeader*>(slot(i))->state.load(std::memory_order_acquire);
    s += " " + (st == 0 ? std::string("-") : std::to_string(st - 1));
  }
  return s;
}

}  // namespace tandem::parallel
