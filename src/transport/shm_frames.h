// The lockstep group's control frames through shared memory, for ranks that
// all run on one host (gloo over TCP costs a few hundred microseconds a
// round trip on a loaded host; this costs a few).
//
// One mapped file per generation of the group (in the rendezvous
// directory): per rank a ring of frames, the count it posted, and the count
// of each peer's frames it has read. A writer never overwrites a frame some
// reader has not read; a reader reads every frame of every peer once, in
// order. Waiting spins briefly, then sleeps on one futex word that every post
// and every read bumps; a wake-up is only a hint: the waiter always rechecks
// the counters, and sleeps at most a millisecond at a time. Every wait ends
// by its deadline, when a peer's process is gone, or when interrupted, with
// a TransportError.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "parallel/frame.h"

namespace tandem {

class ShmFrames {
 public:
  static constexpr uint32_t kSlots = 64;
  // Each rank's data region (a decode step's expert rows fit many times
  // over; a larger phase, a long prompt's, goes through gloo).
  static constexpr int64_t kDataBytes = int64_t{4} << 20;
  // Where a group's ring lives: /dev/shm (not a disk), named after the
  // rendezvous directory and generation.
  static std::string path_for(const std::string& rendezvous_dir, const std::string& generation);
  // Rank 0, before the ranks meet: a fresh, zeroed file at `path` for `size` ranks.
  static void create(const std::string& path, int size);
  // Maps the file rank 0 created (throws parallel::TransportError).
  ShmFrames(const std::string& path, int rank, int size, int timeout_ms, const std::atomic<bool>* interrupted);
  ~ShmFrames();
  ShmFrames(const ShmFrames&) = delete;
  ShmFrames& operator=(const ShmFrames&) = delete;

  void exchange(const parallel::Frame& mine, std::span<parallel::Frame> all, const std::function<void(int)>& arrived);
  // A data phase whose every sender's bytes fit kDataBytes: each rank writes
  // its rows (with their offsets) to its region, each reads its slice of
  // every peer's, and a region is rewritten only once every peer has read it.
  void all_to_all(const void* send, std::span<const int64_t> send_bytes, void* recv, std::span<const int64_t> recv_bytes);

 // The mapping's layout (shm_frames.cpp).
  struct Shared;

 private:
  // Waits until `ready()`; throws on the deadline, a dead peer, or an interrupt.
  template <typename Ready>
  void wait_until(Ready ready, const char* what);

  Shared* shared_ = nullptr;
  std::string path_;
  size_t map_bytes_ = 0;
  uint32_t data_phases_ = 0;  // data phases this rank took part in
  bool unlinked_ = false;
  int rank_;
  int size_;
  int timeout_ms_;
  const std::atomic<bool>* interrupted_;
  uint32_t next_ = 0;  // frames this rank posted
};

}  // namespace tandem
