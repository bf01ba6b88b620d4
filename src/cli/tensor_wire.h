// What travels between the tensor-parallel engine core and its workers: the
// step message on the broadcast ring (a Batch), each worker's reply on its
// response ring, and each worker's status in a shared page, which the core
// reads for its wait reports and /debug/parallel.
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/batch.h"

namespace tandem::cli {

// Broadcast ring message kinds.
enum class StepKind : uint32_t { kStep = 1, kShutdown = 2 };
// Response ring message kinds.
enum class ReplyKind : uint32_t { kReady = 1, kDone = 2, kFailed = 3 };

std::vector<uint8_t> encode_batch(const Batch& b);
// Throws tandem::Error on a malformed message.
Batch decode_batch(std::span<const uint8_t> bytes);
// Bytes the largest step can take (for sizing the ring's slots).
uint64_t max_batch_bytes(int64_t max_tokens, int64_t max_seqs, int64_t max_blocks_per_seq);

// A worker's state, written by the worker, read by the core.
enum class WorkerPhase : int32_t { kStarting = 0, kIdle = 1, kInStep = 2, kFailed = 3 };

struct alignas(64) WorkerStatus {
  std::atomic<int32_t> pid;
  std::atomic<int32_t> phase;           // WorkerPhase
  std::atomic<int64_t> step_id;         // the step it runs, or ran last
  std::atomic<int64_t> steps_done;
  std::atomic<int64_t> heartbeat_ns;    // monotonic; bumped every kHeartbeatMs by the worker's status thread
  std::atomic<int64_t> op_kind;         // the collective it is inside (parallel::OpKind; 0: none)
  std::atomic<int64_t> op_seq;
  std::atomic<int64_t> op_since_ns;
  std::atomic<uint64_t> op_arrived;     // ranks whose frame of that op has landed
  std::atomic<int32_t> op_data_phase;   // 1: past the frames, moving the op's data
  std::atomic<int64_t> ops;             // collectives completed (consensus included)
  std::atomic<int64_t> gathers;         // of which tensor gathers
  std::atomic<int64_t> gather_bytes;
  std::atomic<int64_t> gather_ns;
  std::atomic<int64_t> consensus_ns;
  std::atomic<int64_t> step_ns;         // in steps: from reading the message to publishing the reply
};
inline constexpr int kHeartbeatMs = 50;

}  // namespace tandem::cli
