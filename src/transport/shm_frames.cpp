#include "transport/shm_frames.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <immintrin.h>
#include <vector>

#include "parallel/frame_transport.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/futex.h"

namespace tandem {

using parallel::Frame;
using parallel::kMaxRanks;
using parallel::TransportError;

struct ShmFrames::Shared {
  struct alignas(64) Rank {
    std::atomic<uint32_t> posted;               // frames this rank wrote
    std::atomic<int32_t> pid;                   // 0 until it attached
    std::atomic<uint32_t> consumed[kMaxRanks];  // frames of rank p this rank has read
    std::atomic<uint32_t> data_posted;          // data phases this rank wrote
    std::atomic<uint32_t> data_read[kMaxRanks];  // data phases of rank p this rank has read
  };
  alignas(64) std::atomic<uint32_t> bell;  // bumped by every post and read: the futex word
  Rank ranks[kMaxRanks];
  Frame ring[kMaxRanks][kSlots];
  // Then, per rank, its data region: kMaxRanks + 1 offsets, then the bytes.
};

namespace {
constexpr size_t kRegionHeader = (parallel::kMaxRanks + 1) * sizeof(int64_t);
size_t region_bytes() { return kRegionHeader + static_cast<size_t>(ShmFrames::kDataBytes); }
size_t mapping_bytes(int size) { return sizeof(ShmFrames::Shared) + region_bytes() * static_cast<size_t>(size); }
}  // namespace
static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<int32_t>::is_always_lock_free);

namespace {

// Sequence numbers wrap: a is at or after b when a - b, signed, is >= 0.
bool at_or_after(uint32_t a, uint32_t b) { return static_cast<int32_t>(a - b) >= 0; }

}  // namespace

std::string ShmFrames::path_for(const std::string& rendezvous_dir, const std::string& generation) {
  const std::string dir = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : rendezvous_dir;
  return dir + "/tandem-" + std::to_string(std::hash<std::string>{}(rendezvous_dir)) + "-" + generation + ".frames";
}

void ShmFrames::create(const std::string& path, int size) {
  const int fd = ::open(path.c_str(), O_CREAT | O_RDWR | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(mapping_bytes(size))) != 0) {
    if (fd >= 0) ::close(fd);
    throw TransportError("cannot create the shared frame ring " + path + ": " + std::strerror(errno));
  }
  ::close(fd);
}

ShmFrames::ShmFrames(const std::string& path, int rank, int size, int timeout_ms, const std::atomic<bool>* interrupted)
    : path_(path), map_bytes_(mapping_bytes(size)), rank_(rank), size_(size), timeout_ms_(timeout_ms),
      interrupted_(interrupted) {
  TANDEM_ASSERT(size >= 1 && size <= kMaxRanks && rank >= 0 && rank < size, "a rank of a group that fits the ring");
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) throw TransportError("cannot open the shared frame ring " + path + ": " + std::strerror(errno));
  void* p = ::mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) throw TransportError("cannot map the shared frame ring " + path + ": " + std::strerror(errno));
  shared_ = static_cast<Shared*>(p);
  shared_->ranks[rank].pid.store(static_cast<int32_t>(::getpid()), std::memory_order_release);
}

ShmFrames::~ShmFrames() {
  if (shared_ != nullptr) ::munmap(shared_, map_bytes_);
  if (rank_ == 0 && !unlinked_) ::unlink(path_.c_str());
}

template <typename Ready>
void ShmFrames::wait_until(Ready ready, const char* what) {
  // A short spin first: a peer a few microseconds behind is the common case.
  for (int i = 0; i < 4000; ++i) {
    if (ready()) return;
    _mm_pause();
  }
  const int64_t deadline = monotonic_ns() + int64_t{timeout_ms_} * 1'000'000;
  int64_t next_liveness_check = 0;
  for (;;) {
    const uint32_t seen = shared_->bell.load(std::memory_order_acquire);
    if (ready()) return;  // rechecked after reading the bell: a wake-up is only a hint
    const int64_t now = monotonic_ns();
    if (now >= deadline)
      throw TransportError(std::string("timed out after ") + std::to_string(timeout_ms_) + " ms waiting for " + what);
    if (interrupted_ != nullptr && interrupted_->load()) throw TransportError(std::string("interrupted waiting for ") + what);
    if (now >= next_liveness_check) {
      next_liveness_check = now + 100'000'000;
      for (int q = 0; q < size_; ++q) {
        const int32_t pid = shared_->ranks[q].pid.load(std::memory_order_acquire);
        if (q != rank_ && pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH)
          throw TransportError("rank " + std::to_string(q) + " (pid " + std::to_string(pid) + ") is gone");
      }
    }
    futex_wait(&shared_->bell, seen, std::min<int64_t>(1'000'000, deadline - now));
  }
}

void ShmFrames::exchange(const Frame& mine, std::span<Frame> all, const std::function<void(int)>& arrived) {
  const uint32_t seq = next_;
  Shared::Rank& me = shared_->ranks[rank_];
  // Never overwrite a frame some peer has not read.
  wait_until(
      [&] {
        for (int q = 0; q < size_; ++q)
          if (q != rank_ && !at_or_after(shared_->ranks[q].consumed[rank_].load(std::memory_order_acquire) + kSlots, seq + 1))
            return false;
        return true;
      },
      "a peer to read this rank's earlier frames");
  shared_->ring[rank_][seq % kSlots] = mine;
  if (seq == 1 && rank_ == 0) {
    // Every rank attached before its first frame: the name can go (the
    // mapping stays), so nothing is left in /dev/shm whatever ends the group.
    ::unlink(path_.c_str());
    unlinked_ = true;
  }
  me.posted.store(seq + 1, std::memory_order_release);
  ring_bell(&shared_->bell);
  next_ = seq + 1;
  all[static_cast<size_t>(rank_)] = mine;
  // Each peer's frame at this position, as it lands.
  uint64_t pending = 0;
  for (int q = 0; q < size_; ++q)
    if (q != rank_) pending |= uint64_t{1} << q;
  while (pending != 0) {
    wait_until(
        [&] {
          for (int q = 0; q < size_; ++q)
            if (((pending >> q) & 1) && at_or_after(shared_->ranks[q].posted.load(std::memory_order_acquire), seq + 1))
              return true;
          return false;
        },
        "the peers' frames");
    for (int q = 0; q < size_; ++q) {
      if (!((pending >> q) & 1) || !at_or_after(shared_->ranks[q].posted.load(std::memory_order_acquire), seq + 1))
        continue;
      all[static_cast<size_t>(q)] = shared_->ring[q][seq % kSlots];
      me.consumed[q].store(seq + 1, std::memory_order_release);
      pending &= ~(uint64_t{1} << q);
      arrived(q);
    }
    ring_bell(&shared_->bell);
  }
}

void ShmFrames::all_to_all(const void* send, std::span<const int64_t> send_bytes, void* recv,
                           std::span<const int64_t> recv_bytes) {
  const uint32_t k = data_phases_;
  const auto region = [&](int r) {
    return reinterpret_cast<char*>(shared_) + sizeof(Shared) + region_bytes() * static_cast<size_t>(r);
  };
  // My region again only once every peer has read the last phase from it.
  wait_until(
      [&] {
        for (int q = 0; q < size_; ++q)
          if (q != rank_ && !at_or_after(shared_->ranks[q].data_read[rank_].load(std::memory_order_acquire), k))
            return false;
        return true;
      },
      "a peer to read this rank's previous rows");
  auto* offsets = reinterpret_cast<int64_t*>(region(rank_));
  offsets[0] = 0;
  for (int r = 0; r < size_; ++r) offsets[r + 1] = offsets[r] + send_bytes[static_cast<size_t>(r)];
  TANDEM_ASSERT(offsets[size_] <= kDataBytes, "a phase that fits the region");
  if (offsets[size_] > 0) std::memcpy(region(rank_) + kRegionHeader, send, static_cast<size_t>(offsets[size_]));
  shared_->ranks[rank_].data_posted.store(k + 1, std::memory_order_release);
  ring_bell(&shared_->bell);
  int64_t at = 0;
  std::vector<int64_t> recv_at(static_cast<size_t>(size_));
  for (int q = 0; q < size_; ++q) recv_at[static_cast<size_t>(q)] = at, at += recv_bytes[static_cast<size_t>(q)];
  for (int q = 0; q < size_; ++q) {
    if (q != rank_)
      wait_until([&] { return at_or_after(shared_->ranks[q].data_posted.load(std::memory_order_acquire), k + 1); },
                 "a peer's rows");
    const auto* their = reinterpret_cast<const int64_t*>(region(q));
    const int64_t bytes = their[rank_ + 1] - their[rank_];
    TANDEM_ASSERT(bytes == recv_bytes[static_cast<size_t>(q)], "the rows a peer wrote are the ones its frame announced");
    if (bytes > 0)  // an empty phase may have no buffers at all
      std::memcpy(static_cast<char*>(recv) + recv_at[static_cast<size_t>(q)], region(q) + kRegionHeader + their[rank_],
                  static_cast<size_t>(bytes));
    if (q != rank_) shared_->ranks[rank_].data_read[q].store(k + 1, std::memory_order_release);
  }
  ring_bell(&shared_->bell);
  data_phases_ = k + 1;
}

}  // namespace tandem
