// Tensor parallelism across processes (`--tensor-parallel-size N`): the
// engine core schedules and samples; N worker processes (`tandem
// tensor-worker`, spawned here) each hold their shards of the weights
// (model/tensor_parallel.h) and write their KV heads into the engine's KV
// pool, one shared mapping. Each step goes to every worker through the
// broadcast ring (parallel/broadcast_ring.h); each worker answers on its own
// response ring, rank 0 with the logits. Between themselves the workers run
// the step as a lockstep group (parallel/lockstep_group.h): the consensus,
// then every gather as a planned op, over shared memory (gloo over TCP for
// what does not fit), so a worker that fails makes every worker raise the
// same error after the vote.
//
// Nothing waits silently (seed 003). The core's wait for the replies has a
// soft deadline, past which it reports which workers have not answered, what
// each is doing (its status page: the collective it is in and who is
// missing, its heartbeat, its process state: a stopped process shows as
// such) and the ring's state; and a hard deadline, past which the step's
// requests fail with that report, /health says why, and the workers are
// restarted. A worker that dies is seen within a heartbeat (waitpid) and
// named in the error. After any failure the workers are replaced by a fresh
// set (new rings, a new group generation) before the next step.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cli/tensor_link.h"
#include "cli/tensor_wire.h"
#include "engine/model_executor.h"
#include "kv/kv_pool.h"
#include "model/model.h"
#include "parallel/broadcast_ring.h"
#include "server/http_server.h"

namespace tandem::cli {

struct TensorParallelOptions {
  int size = 1;
  std::string model_path;
  int threads_per_worker = 0;        // 0: the cores divided by the size
  int64_t soft_deadline_ms = 5000;   // a step's replies: report past this
  int64_t timeout_ms = 60000;        // a step's replies: fail past this
  int64_t start_timeout_ms = 120000;  // workers loading and meeting
  // Sizes the rings: the largest step and its logits.
  int64_t max_num_batched_tokens = 512;
  int64_t max_num_seqs = 64;
  int64_t max_model_len = 4096;
  int block_size = 16;
  int64_t n_vocab = 0;
  // Workers on other hosts (serve): the core spawns ranks 0 .. local_workers-1;
  // the others join at host:port (`tandem tensor-worker --join`). Then every
  // collective goes through gloo over TCP, bound to `host` here, and the
  // group meets in rendezvous_dir, a directory every host reaches.
  int local_workers = 0;            // 0: all of them
  std::string host = "127.0.0.1";   // the join listener's and the local workers' address
  int port = 0;                     // the join listener's (0: any free port)
  std::string rendezvous_dir;       // required with workers on other hosts
  int64_t rejoin_wait_ms = 2000;    // a restart waits this long for a joined worker to come back
  bool enabled() const { return size > 1; }
  int n_local() const { return local_workers <= 0 ? size : local_workers; }
  bool cross_host() const { return n_local() < size; }
};

// The workers' state for /debug/parallel and /metrics.
struct TensorWorkerSnapshot {
  int rank = 0;
  int32_t pid = 0;
  std::string host;           // empty: the core's host; else the address it joined from
  char process_state = '?';  // from /proc (the core's host only): R running, S sleeping, T stopped, Z zombie
  int32_t phase = 0;
  int64_t step_id = 0, steps_done = 0;
  int64_t heartbeat_age_ms = -1;
  int64_t op_kind = 0, op_seq = 0, op_age_ms = -1;
  uint64_t op_arrived = 0;
  bool op_data_phase = false;
  int64_t ops = 0, gathers = 0, gather_bytes = 0, gather_ns = 0, consensus_ns = 0, step_ns = 0;
};

struct TensorParallelSnapshot {
  bool enabled = false;
  bool ready = false;
  int size = 0;
  int generation = 0;
  int64_t step_id = 0;
  int64_t steps = 0;
  int64_t failures = 0;
  int64_t restarts = 0;
  int64_t soft_deadline_reports = 0;
  std::string join_address;       // where workers on other hosts join (empty: none do)
  int64_t forward_ns = 0;         // the core's time in forward(): the steps as it sees them
  int64_t waiting_since_ms = -1;  // the core waits for replies since (ms ago; -1: not waiting)
  std::string last_error;
  parallel::RingCounters ring;
  std::vector<TensorWorkerSnapshot> workers;
};

// A fresh directory for a TP instance's shared files (the KV pool, the
// rings, the status page; in /dev/shm), removed with everything in it when
// this goes.
class TensorParallelDir {
 public:
  TensorParallelDir();
  ~TensorParallelDir();
  TensorParallelDir(const TensorParallelDir&) = delete;
  TensorParallelDir& operator=(const TensorParallelDir&) = delete;
  const std::string& path() const { return path_; }
  std::string kv_path() const { return path_ + "/kv.pool"; }
  KvPoolBacking kv_backing() const { return KvPoolBacking{kv_path(), true}; }

 private:
  std::string path_;
};

// How the engine core loads the model under tensor parallelism: rank 0's
// shards as views of the file (which checks the split), nothing paged in or
// copied (the workers load their own).
LoadOptions tensor_parallel_core_load(int size);

// The executor's sizes for a command: `size` workers of `model_path`, steps
// of up to max_tokens tokens over max_seqs sequences of max_len, `threads`
// compute threads in all (0: every core), split among the workers.
void size_tensor_parallel(TensorParallelOptions& o, const std::string& model_path, int64_t n_vocab, int64_t max_tokens,
                          int64_t max_seqs, int64_t max_len, int block_size, int threads);

// The command line of a worker the core spawns on its own host (cmd_tensor_worker.cpp).
std::vector<std::string> tensor_worker_args(const TensorJob& job);

class TensorParallelExecutor : public ModelExecutor {
 public:
  // `kv`: the engine's pool, backed by `kv_path` (KvPoolBacking). Starts the
  // workers and waits for them (throws tandem::Error if they do not come).
  TensorParallelExecutor(const TensorParallelOptions& options, const KvPool& kv, const std::string& kv_path);
  ~TensorParallelExecutor() override;

  void forward(const Batch& batch, float* logits) override;
  bool ready(std::string* why) const override;
  void idle() override;
  bool take_kv_lost() override;
  TensorParallelSnapshot snapshot() const;


 private:
  struct RemoteLink;  // a joined worker's link and its reader thread
  struct Worker {
    Worker();
    ~Worker();
    Worker(Worker&&) noexcept;
    pid_t pid = -1;                                    // on this host
    std::unique_ptr<parallel::BroadcastRing> replies;  // on this host
    std::unique_ptr<RemoteLink> remote;                // on another host
  };
  // One reply, from a ring (held while `guard` lives) or a link (owned).
  struct Reply {
    int64_t step_id = 0;
    uint32_t kind = 0;
    std::span<const uint8_t> payload;
    parallel::BroadcastRing::ReadGuard guard;
    std::vector<uint8_t> owned;
  };
  Reply read_reply(int rank, const parallel::RingWait& wait);
  // Joined workers: accepts them and keeps each rank's latest until a set takes it.
  void accept_joins();
  void stop_joins();
  void start_workers(int64_t join_wait_ms);
  void stop_workers(bool graceful);
  // Why waiting is hopeless: a worker that exited, named (reaps it).
  std::string dead_worker();
  // Each worker: replied or not (this step), process state, phase, heartbeat, the op it is in.
  std::string describe_workers() const;
  // A fresh set after a failure; the error when it did not start (retried a second later).
  std::string restart_workers();
  std::string who(int rank) const;
  parallel::RingWait reply_wait(int rank, int64_t deadline_ns);
  [[noreturn]] void fail(const std::string& message);

  TensorParallelOptions options_;
  KvPoolShape kv_shape_;
  std::string dir_;
  std::string kv_path_;
  std::unique_ptr<parallel::BroadcastRing> steps_;
  std::vector<Worker> workers_;
  WorkerStatus* status_ = nullptr;  // one per worker, in a shared file
  size_t status_bytes_ = 0;
  int64_t step_id_ = 0;
  uint64_t replied_mask_ = 0;   // the workers whose reply to the current step arrived

  mutable std::mutex mu_;  // guards what snapshot() and ready() read below
  bool ready_ = false;
  int generation_ = 0;
  std::string last_error_;
  int64_t failures_ = 0, restarts_ = 0, steps_done_ = 0, soft_reports_ = 0, forward_ns_ = 0;
  std::atomic<int64_t> waiting_since_ns_{0};
  int64_t next_restart_ns_ = 0;
  bool kv_lost_ = false;

  struct Join {
    std::unique_ptr<TensorLink> link;
    int32_t pid = 0;
    bool kv_fresh = true;
  };
  std::unique_ptr<LinkListener> listener_;
  std::thread accept_thread_;
  std::atomic<bool> stopping_{false};
  std::mutex joins_mu_;
  std::vector<Join> joins_;  // by rank
  std::string group_base_;   // where each set's group meets
  uint64_t model_hash_ = 0;
};

// /debug/parallel and /metrics of a tensor-parallel instance (tensor_parallel_status.cpp).
server::TpHook tensor_parallel_hook(const TensorParallelExecutor& tp);

}  // namespace tandem::cli
