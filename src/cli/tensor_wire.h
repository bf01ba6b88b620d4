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

// A worker on another host sends its status over its link (tensor_link.h)
// each heartbeat; the core stores it in that worker's entry of its page.
// Times travel as ages (the hosts' monotonic clocks differ): the core stamps
// the heartbeat on arrival, and the op's start from its age.
std::vector<uint8_t> encode_status(const WorkerStatus& s, int64_t now_ns);
// Throws tandem::Error on a malformed message.
void decode_status(std::span<const uint8_t> bytes, WorkerStatus& into, int64_t arrived_ns);

// What one worker is to do: spawned on the core's host it gets these as
// arguments; on another host it gets them over its link when it joins.
struct TensorJob {
  std::string model_path;
  uint64_t model_hash = 0;  // instance::model_hash of the core's file (0: not checked)
  int rank = 0, size = 2, generation = 1, threads = 1;
  std::string dir;             // the core's shared files (the rings, the KV pool, the status page); empty on another host
  std::string rendezvous_dir;  // where the group meets (gloo's FileStore); every worker reaches it
  std::string bind_host = "127.0.0.1";  // this worker's address for its peers
  bool shared_memory_frames = true;     // every worker on the core's host
  int block_size = 16;
  int64_t kv_blocks = 0, state_slots = 0, timeout_ms = 60000;
  std::string kv_dtype = "f16";
  int core_pid = 0;
  bool remote() const { return dir.empty(); }
};
std::vector<uint8_t> encode_job(const TensorJob& j);
// Throws tandem::Error naming a malformed or missing field.
TensorJob decode_job(std::span<const uint8_t> bytes);

}  // namespace tandem::cli
