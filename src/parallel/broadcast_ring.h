// A single-writer, N-reader message ring in one shared mapping: how the
// tensor-parallel engine core hands each step to its workers, and how each
// worker answers (a ring with one reader).
//
// Fixed slots. Each slot's state is the sequence number of the message it
// holds (+1), stored with release after the message, loaded with acquire
// before it is read, so a reader never sees a torn message. Each reader has
// its own count of messages read, stored with release once it is done with
// the slot; the writer reuses a slot only when every reader's count says it
// has read what the slot holds, so nothing unread is overwritten, and every
// reader reads every message once, in order. A reader holds its slot through
// a ReadGuard, released on every exit path.
//
// Waiting (seed 003): a futex word bumped by every publish and every
// release is a hint only; a waiter rechecks the shared state after every
// wake-up and sleeps at most kMaxSleepMs at a time. A wait past its soft
// deadline reports once which side waits, on which slot and sequence, since
// when, with a dump of the ring; past its hard deadline it throws RingError
// with the same. A wait for work (a worker between steps) has no deadline but
// still wakes on the bound to check that its peer lives. spec/broadcast_ring.pml
// is the Spin model of this protocol.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace tandem::parallel {

inline constexpr int kMaxRingReaders = 32;

struct RingShape {
  uint32_t n_slots = 4;
  uint64_t slot_bytes = uint64_t{1} << 20;  // payload bytes a slot holds
  int n_readers = 1;
};

class RingError : public std::runtime_error {
 public:
  enum class Kind { kTimeout, kPeerGone, kInterrupted, kTooLarge, kCorrupt };
  RingError(Kind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

// The bounds of one wait.
struct RingWait {
  int64_t soft_deadline_ms = 5000;  // report once past this (<= 0: never)
  int64_t hard_deadline_ms = 60000;  // then throw kTimeout (<= 0: wait for work, no deadline)
  // Why waiting is hopeless (the peer process died), or empty; checked on
  // every bounded sleep.
  std::function<std::string()> peer_gone;
  // The soft-deadline report (default: a warning in the log).
  std::function<void(const std::string&)> report;
  const std::atomic<bool>* interrupted = nullptr;
};

// One message as a reader sees it, valid while its guard lives.
struct RingMessage {
  uint64_t seq = 0;
  int64_t step_id = 0;
  uint32_t kind = 0;
  std::span<const uint8_t> payload;
};

// A snapshot, for /debug/parallel and /metrics.
struct RingCounters {
  uint64_t published = 0;                // messages the writer published
  std::vector<uint64_t> read;            // per reader, messages it has released
  std::vector<int32_t> reader_pids;      // 0 until attached
  int32_t writer_pid = 0;
  int64_t writer_waiting_since_ns = 0;   // monotonic; 0 when not waiting for a slot
  std::vector<int64_t> reader_waiting_since_ns;  // per reader; 0 when not waiting for a message
  uint64_t soft_deadline_reports = 0;
  uint64_t bytes = 0;                    // payload bytes published
};

class BroadcastRing {
 public:
  static constexpr int kWriter = -1;
  static constexpr int64_t kMaxSleepMs = 1;

  // Bytes of the mapping a shape needs.
  static size_t mapping_bytes(const RingShape& shape);
  // A fresh ring in a new file at `path` (truncated), mapped by the caller as
  // `role` (kWriter or a reader index). `name` appears in reports.
  static std::unique_ptr<BroadcastRing> create(const std::string& path, const RingShape& shape, int role,
                                               std::string name);
  // Maps a ring another process created, as `role`.
  static std::unique_ptr<BroadcastRing> attach(const std::string& path, int role, std::string name);
  ~BroadcastRing();
  BroadcastRing(const BroadcastRing&) = delete;
  BroadcastRing& operator=(const BroadcastRing&) = delete;

  const RingShape& shape() const { return shape_; }
  const std::string& name() const { return name_; }
  // Removes the file's name (the mapping stays): once every party attached.
  void unlink();

  // Writer: waits for the next slot to be free, then publishes the message.
  // Throws RingError (kTooLarge when it does not fit a slot).
  void publish(int64_t step_id, uint32_t kind, std::span<const uint8_t> payload, const RingWait& wait);

  // Reader: holds a read slot; releasing it (on destruction, or release())
  // lets the writer reuse the slot.
  class ReadGuard {
   public:
    ReadGuard() = default;
    ReadGuard(ReadGuard&& other) noexcept;
    ReadGuard& operator=(ReadGuard&& other) noexcept;
    ~ReadGuard() { release(); }
    const RingMessage& message() const { return message_; }
    void release();

   private:
    friend class BroadcastRing;
    BroadcastRing* ring_ = nullptr;
    RingMessage message_;
  };
  // Reader: the next message, waiting for it within `wait`'s bounds.
  ReadGuard read(const RingWait& wait);
  // Reader: whether a message is waiting (no wait).
  bool readable() const;

  RingCounters counters() const;
  // Writer index, per-reader counts and pids, each slot's sequence, and who waits since when.
  std::string dump() const;

  struct Header;  // the mapping's layout (broadcast_ring.cpp)

 private:
  BroadcastRing(void* map, size_t bytes, int role, std::string name, std::string path);
  uint8_t* slot(uint64_t index) const;
  // Waits until ready(); `what` says who waits for what, for reports.
  template <typename Ready>
  void wait_until(Ready ready, const RingWait& wait, const std::function<std::string()>& what,
                  std::atomic<int64_t>* waiting_since);

  Header* header_ = nullptr;
  size_t map_bytes_ = 0;
  RingShape shape_;
  int role_;
  std::string name_;
  std::string path_;
  bool unlinked_ = false;
  uint64_t next_ = 0;  // writer: next message; reader: next message to read
};

}  // namespace tandem::parallel
