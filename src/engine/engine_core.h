// The engine core: one loop that owns the scheduler, the KV blocks and the
// model, and talks to the outside only through a bounded input queue (new
// requests, aborts) and per-request output sinks.
//
// Each step: apply aborts, schedule, run one forward over the flat batch,
// sample, detokenize and apply stop conditions, emit outputs, release what
// finished. The loop keeps stepping while any work is pending and otherwise
// waits for input with a bounded wait, so a request arriving after an idle
// period starts at once and /health can tell a live loop from a stuck one.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/metrics.h"
#include "engine/request.h"
#include "engine/scheduler.h"
#include "kernels/dtype.h"
#include "kv/block_manager.h"
#include "kv/kv_pool.h"
#include "util/clock.h"
#include "engine/lockstep_experts.h"
#include "engine/model_executor.h"
#include "parallel/lockstep_group.h"

namespace tandem {

class Model;
class Tokenizer;
class ThreadPool;

struct EngineConfig {
  int64_t max_num_batched_tokens = 512;
  int64_t max_num_seqs = 64;
  int64_t max_waiting_requests = 256;  // admission queue bound (beyond it: rejected)
  int64_t kv_cache_bytes = int64_t{1} << 30;
  int block_size = 16;
  kernels::DType kv_dtype = kernels::DType::kF16;
  bool enable_prefix_caching = true;
  int64_t max_model_len = 0;  // 0 = the model's training context, or what the KV pool holds if less
  int threads = 0;            // 0 = one per core
  int idle_wait_ms = 50;      // bounded wait of an idle loop
  // Where the KV pool lives (a shared file when tensor-parallel workers map it).
  KvPoolBacking kv_backing;
  // Test-only (built with TANDEM_PD_MUTATIONS): a decode recomputes the last
  // moved prompt token, advancing a recurrent state twice by it.
  bool mutation_advance_state_twice = false;
};

// Data parallelism: the engine is one rank of a lockstep group (DESIGN.md,
// principle 5). Every loop iteration is a step of the group: the step
// consensus first, with what this rank scheduled (nothing: a dummy step of
// the agreed shape), then the step. When no rank has work the group idles
// with a bounded wait between consensus rounds.
struct LockstepHooks {
  // Builds the group; called on the engine thread (which then owns it) at
  // start and after every group failure. Throws when the peers do not come
  // (the loop retries; the engine reports itself not ready meanwhile).
  std::function<std::unique_ptr<parallel::LockstepGroup>()> connect;
  // Once the engine serves with a new group (ready() is true from then on).
  std::function<void()> on_connected;
  // After a group failure failed the in-flight requests, before reconnecting.
  std::function<void(const parallel::LockstepError&)> on_failure;
  // Called by stop(): makes a connect under way give up soon.
  std::function<void()> interrupt;
  // The model's experts are split over the group's ranks (the model loaded
  // with LoadOptions::expert_ranks = the group's size); the group's config
  // must plan the model's n_expert_layers().
  bool expert_parallel = false;
  int rank = 0;  // this engine's rank (the model's expert rank)
  int size = 1;
  int idle_wait_ms = 5;         // between consensus rounds when no rank has work
  int reconnect_wait_ms = 200;  // between attempts to (re)build the group
};

// What /debug/parallel and /metrics show of a lockstep engine.
struct LockstepStatus {
  bool enabled = false;
  bool connected = false;
  int rank = 0;
  int size = 1;
  int64_t step_id = 0;
  int64_t group_failures = 0;
  std::string last_error;
  parallel::GroupCounters counters;
  parallel::InFlightOp in_flight;
  std::vector<parallel::RankLoad> loads;  // per rank, from the last consensus
};

class EngineCore {
 public:
  EngineCore(Model& model, const Tokenizer& tokenizer, const EngineConfig& config);
  ~EngineCore();
  EngineCore(const EngineCore&) = delete;
  EngineCore& operator=(const EngineCore&) = delete;

  // Makes this engine a rank of a lockstep group; before start().
  void set_lockstep(LockstepHooks hooks);
  // Runs the forward passes on `executor` (tensor parallelism) instead of
  // this engine's thread pool; before start(). Not owned.
  void set_executor(ModelExecutor* executor) { executor_ = executor; }
  // Runs the loop on its own thread until stop().
  void start();
  void stop();

  // Why a request was refused.
  enum class Refusal { kNone, kInvalid, kContextTooLong, kTooLargeForCache, kQueueFull };
  // Thread-safe. Returns an error message (and takes nothing) when the request
  // is invalid, can never be served (too long for the context or the whole KV
  // pool), or the admission queue is full; `*why` says which.
  std::optional<std::string> add_request(EngineRequest request, Refusal* why = nullptr);
  // Tokens the KV pool holds in all (for error messages).
  int64_t kv_capacity_tokens() const { return n_blocks_ * config_.block_size; }
  // Thread-safe; idempotent; an unknown or finished id is ignored.
  void abort_request(uint64_t id);
  // Thread-safe: ends the request with an error the client sees (`message`).
  void fail_request(uint64_t id, std::string message);
  // Thread-safe: ends every request added so far with that error (a
  // shutdown past its timeout), at the engine's next step.
  void fail_all_requests(std::string message);
  // P/D, thread-safe. The remote KV of a kRemoteKv request has landed in its
  // blocks: it starts computing token N. Unknown ids are ignored.
  void remote_kv_arrived(uint64_t id);
  // Drops the reference a transfer holds on these blocks (the protocol's Free).
  void release_transfer_blocks(std::vector<int32_t> blocks);
  // The pool the transfer transport registers (its base and size never change).
  KvPool& kv_pool() { return *kv_; }

  // Without a thread (tests): runs one step if there is work. Returns whether it did.
  bool step();
  bool has_work() const;

  // Incremented by every loop iteration, busy or idle.
  uint64_t heartbeat() const { return heartbeat_.load(std::memory_order_acquire); }
  uint64_t steps() const { return step_.load(std::memory_order_acquire); }
  const EngineMetrics& metrics() const { return metrics_; }
  int64_t max_model_len() const { return max_model_len_; }
  // True when max_model_len was left to default and the KV pool holds fewer
  // tokens than the model's training context, so the pool set it.
  bool max_model_len_capped_by_cache() const { return max_model_len_capped_; }
  int64_t n_kv_blocks() const { return n_blocks_; }
  int64_t max_waiting_requests() const { return config_.max_waiting_requests; }
  // Snapshot of the KV accounting (taken on the engine thread between steps).
  BlockManagerStats kv_stats() const;
  // Recurrent-state slots (hybrid models; 0 otherwise), in all and in use
  // (the same snapshot as kv_stats).
  int64_t state_slots_total() const;
  int64_t state_slots_used() const;
  // Whether the engine can serve: always, unless it is a rank whose group is
  // not formed (then *why says so).
  bool ready(std::string* why = nullptr) const;
  LockstepStatus lockstep_status() const;

 private:
  struct SeqState;
  struct RequestState;

  void loop();
  void lockstep_loop();
  // Something for the loop to take in (or stop); with mu_ held.
  bool has_input_locked() const;
  // One step of the group; returns whether any rank had work.
  bool lockstep_step();
  // Runs a scheduled step: the forward, sampling, outputs.
  void run_step(SchedulerOutput& out, uint64_t step_no, Stopwatch& step_sw, int64_t schedule_ns);
  void publish();
  // After the executor lost the KV of every block (take_kv_lost): fails
  // every live request (with `why`, or a default) and forgets the prefix cache.
  void forget_lost_kv(const std::string& why);
  // Ends every live request with `error` (the group failed under them).
  void fail_all(const std::string& error);
  // Ends every request not yet admitted with `error` (no group to serve it).
  void fail_pending_adds(const std::string& error);
  void drain_inputs();
  void admit(EngineRequest&& req);
  void abort_now(uint64_t id, std::string error = {});
  void admit_remote(std::unique_ptr<RequestState> r);
  // Allocates a kRemoteKv request's blocks; false (nothing taken) when the
  // pool cannot hold them now.
  bool allocate_remote(RequestState& r);
  void finish_prefill_only(RequestState& r, SeqState& s);
  // Appends the block ids a state slot spans (what a transfer moves of it).
  void append_state_blocks(int32_t slot, std::vector<int32_t>& blocks);
  void process_logits(SeqState& s, const float* logits, std::vector<RequestState*>& touched);
  void append_token(RequestState& r, SeqState& s, const SampleResult& sample);
  void finish_sequence(RequestState& r, SeqState& s, FinishReason reason, std::string stop_reason = {});
  void emit(RequestState& r, std::string error = {});

  Model& model_;
  ModelExecutor* executor_ = nullptr;
  const Tokenizer& tokenizer_;
  EngineConfig config_;
  int64_t max_model_len_ = 0;
  bool max_model_len_capped_ = false;
  int64_t n_blocks_ = 0;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<KvPool> kv_;
  std::unique_ptr<BlockManager> blocks_;
  std::unique_ptr<StateSlots> states_;  // hybrid models: the recurrent-state slots
  std::unique_ptr<Scheduler> scheduler_;
  // State slots copied since the last step, (from, to) flattened: the next
  // batch carries them to workers that keep their own pool (Batch::state_copies).
  std::vector<int32_t> pending_state_copies_;
  std::map<uint64_t, std::unique_ptr<RequestState>> requests_;  // live requests
  uint64_t arrivals_ = 0;
  std::vector<float> logits_;

  mutable std::mutex mu_;  // guards the input queues and kv_stats_
  std::condition_variable cv_;
  std::deque<EngineRequest> pending_adds_;
  std::vector<std::pair<uint64_t, std::string>> pending_aborts_;  // (id, error or empty)
  std::vector<uint64_t> pending_arrivals_;
  std::vector<std::vector<int32_t>> pending_releases_;
  std::string pending_fail_all_;  // fail_all_requests' message, empty when none
  std::map<uint64_t, SeqState*> awaiting_remote_kv_;  // decode: allocated, KV not yet here
  std::deque<uint64_t> awaiting_allocation_;          // decode: admitted, blocks not yet free (FIFO)
  BlockManagerStats kv_stats_;
  int64_t state_slots_used_ = 0;
  std::atomic<bool> running_{false};
  std::thread thread_;
  std::atomic<uint64_t> heartbeat_{0};
  std::atomic<uint64_t> step_{0};
  EngineMetrics metrics_;

  LockstepHooks lockstep_;
  bool lockstep_enabled_ = false;
  std::unique_ptr<parallel::LockstepGroup> group_;  // used by the engine thread only
  std::unique_ptr<LockstepExpertExchange> experts_;  // expert parallelism
  int64_t lockstep_step_ = 0;
  mutable std::mutex lockstep_mu_;  // guards group_ swaps (against readers) and lockstep_info_
  LockstepStatus lockstep_info_;
};

}  // namespace tandem
