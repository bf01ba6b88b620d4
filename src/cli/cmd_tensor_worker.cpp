// `tandem tensor-worker`: one tensor-parallel worker. On the engine core's
// host the core spawns it (cli/tensor_parallel.h) with its job as arguments:
// it maps the engine's KV pool, the step ring (as reader `rank`) and its
// reply ring (as writer). On another host an operator starts it with --join:
// it connects to the core, gets its job over the link (tensor_link.h), and
// keeps its own share of the KV pool. Either way it loads its shards of the
// model, meets its peers as a lockstep group, and then runs every step it is
// sent: the step consensus, the forward with its gathers, the reply. A
// failure in a step is voted on (every worker raises the same error in the
// same op) and replied; a spawned worker then ends (the core starts a fresh
// set), a joined one joins the next set.
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

#include "cli/child_process.h"
#include "cli/commands.h"
#include "cli/tensor_link.h"
#include "cli/tensor_wire.h"
#include "engine/lockstep_tensor_gather.h"
#include "gguf/gguf.h"
#include "instance/fingerprint.h"
#include "kernels/dtype.h"
#include "kv/kv_pool.h"
#include "model/model.h"
#include "parallel/broadcast_ring.h"
#include "parallel/lockstep_group.h"
#include "transport/gloo_transport.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/shared_file.h"
#include "util/thread_pool.h"

namespace tandem::cli {

namespace {

WorkerStatus* map_status(const std::string& path, int size) {
  std::string error;
  void* p = map_shared_file(path, sizeof(WorkerStatus) * static_cast<size_t>(size), false, &error);
  if (p == nullptr) throw Error("the tensor-parallel status page: " + error);
  return static_cast<WorkerStatus*>(p);
}

// Test hook: TANDEM_TP_FAULT="<rank>:<step>" makes worker <rank> of the
// first set of workers (generation 1) throw in step <step>, after the
// consensus, while its peers wait in the first gather.
int64_t fault_step_for(int rank, int generation) {
  const char* spec = std::getenv("TANDEM_TP_FAULT");
  if (spec == nullptr || generation != 1) return -1;
  int r = -1;
  long long step = -1;
  if (std::sscanf(spec, "%d:%lld", &r, &step) != 2 || r != rank) return -1;
  return step;
}

std::vector<uint8_t> failure_payload(bool own, const std::string& text) {
  std::vector<uint8_t> p(4 + text.size());
  const int32_t o = own ? 1 : 0;
  std::memcpy(p.data(), &o, 4);
  std::memcpy(p.data() + 4, text.data(), text.size());
  return p;
}

// Where a worker's steps come from and where its replies and status go: the
// rings and the status page on the core's host, or a link from another host.
class WorkerChannel {
 public:
  virtual ~WorkerChannel() = default;
  // The next step message (kStep or kShutdown); waits without a deadline,
  // but throws Error once the core is gone or its link broke.
  virtual LinkMessage next_step() = 0;
  virtual void reply(int64_t step, ReplyKind kind, std::span<const uint8_t> payload) = 0;
  void reply_failed(int64_t step, bool own, const std::string& text) {
    try {
      reply(step, ReplyKind::kFailed, failure_payload(own, text));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tandem: could not report '%s': %s\n", text.c_str(), e.what());
    }
  }
  virtual WorkerStatus& status() = 0;
  // From the status thread, every heartbeat.
  virtual void beat() { status().heartbeat_ns.store(monotonic_ns()); }
};

class RingChannel : public WorkerChannel {
 public:
  explicit RingChannel(const TensorJob& j) : job_(j) {
    all_ = map_status(j.dir + "/status", j.size);
    replies_ = parallel::BroadcastRing::attach(j.dir + "/reply." + std::to_string(j.rank) + ".ring",
                                               parallel::BroadcastRing::kWriter,
                                               "replies of worker " + std::to_string(j.rank));
  }
  void attach_steps() { steps_ = parallel::BroadcastRing::attach(job_.dir + "/steps.ring", job_.rank, "steps"); }
  LinkMessage next_step() override {
    parallel::RingWait w;
    w.soft_deadline_ms = 0;
    w.hard_deadline_ms = 0;  // between steps: no deadline, but the core must live
    w.peer_gone = [pid = job_.core_pid] {
      return ::getppid() != pid ? "the engine core (pid " + std::to_string(pid) + ") is gone" : std::string();
    };
    try {
      parallel::BroadcastRing::ReadGuard g = steps_->read(w);
      const parallel::RingMessage& m = g.message();
      return LinkMessage{m.kind, m.step_id, {m.payload.begin(), m.payload.end()}};
    } catch (const parallel::RingError& e) {
      throw Error(e.what());
    }
  }
  void reply(int64_t step, ReplyKind kind, std::span<const uint8_t> payload) override {
    parallel::RingWait w;
    w.soft_deadline_ms = 0;
    w.hard_deadline_ms = 10000;
    replies_->publish(step, static_cast<uint32_t>(kind), payload, w);
  }
  WorkerStatus& status() override { return all_[job_.rank]; }

 private:
  TensorJob job_;
  WorkerStatus* all_ = nullptr;
  std::unique_ptr<parallel::BroadcastRing> replies_, steps_;
};

class LinkChannel : public WorkerChannel {
 public:
  LinkChannel(TensorLink& link, uint64_t max_step_bytes) : link_(link), max_step_bytes_(max_step_bytes) {
    std::memset(static_cast<void*>(&status_), 0, sizeof(status_));
  }
  LinkMessage next_step() override {
    LinkMessage m;
    while (!link_.receive(m, 200, max_step_bytes_)) {
    }
    if (m.kind != static_cast<uint32_t>(StepKind::kStep) && m.kind != static_cast<uint32_t>(StepKind::kShutdown))
      throw Error("the engine core at " + link_.peer() + " sent a message of kind " + std::to_string(m.kind) +
                  " where a step belongs");
    return m;
  }
  void reply(int64_t step, ReplyKind kind, std::span<const uint8_t> payload) override {
    // The status goes first, so the core never holds a status older than
    // the last reply it read (a heartbeat alone can lag by kHeartbeatMs,
    // and a report would show a collective the worker has long left).
    beat();
    link_.send(static_cast<uint32_t>(kind), step, payload, 10000);
  }
  WorkerStatus& status() override { return status_; }
  void beat() override {
    // Encoded and sent under one lock (the status thread and the step loop
    // both beat): otherwise a status read before a step's end could be sent
    // after the one sent with its reply, and the core's copy would go back.
    std::lock_guard<std::mutex> lock(beat_mu_);
    try {
      link_.send(static_cast<uint32_t>(LinkKind::kStatus), 0, encode_status(status_, monotonic_ns()), 1000);
    } catch (const std::exception&) {
      // The step loop finds the broken link itself.
    }
  }

 private:
  TensorLink& link_;
  uint64_t max_step_bytes_;
  WorkerStatus status_;
  std::mutex beat_mu_;
};

// A worker with its own share of the pool repeats the copies the engine made
// in its own (Batch::block_copies, state_copies); the indices are checked
// first: they came over the wire.
void repeat_copies(const Batch& b, KvPool& kv) {
  const KvPoolShape& shape = kv.shape();
  for (size_t i = 0; i + 1 < b.block_copies.size(); i += 2) {
    const int32_t from = b.block_copies[i], to = b.block_copies[i + 1];
    if (from < 0 || to < 0 || from >= shape.n_blocks || to >= shape.n_blocks || from == to)
      throw Error("a block copy " + std::to_string(from) + " -> " + std::to_string(to) + " outside the pool");
    std::memcpy(kv.block(to), kv.block(from), kv.block_bytes());
  }
  for (size_t i = 0; i + 1 < b.state_copies.size(); i += 2) {
    const int32_t from = b.state_copies[i], to = b.state_copies[i + 1];
    if (from < 0 || to < 0 || from >= shape.n_state_slots || to >= shape.n_state_slots || from == to)
      throw Error("a state copy " + std::to_string(from) + " -> " + std::to_string(to) + " outside the pool");
    std::memcpy(kv.state_slot(to), kv.state_slot(from), static_cast<size_t>(shape.state_slot_bytes));
  }
}

enum class Outcome { kShutdown, kFailed };

// One set of workers' life, for this worker: meets its peers as a lockstep
// group, says it is ready, then runs every step it is sent until the core
// shuts it down or a step fails (voted on, so every worker fails alike).
Outcome serve_job(const TensorJob& job, WorkerChannel& ch, Model& model, KvPool& kv, ThreadPool& pool) {
  WorkerStatus& me = ch.status();
  const std::string who = "tensor-parallel worker " + std::to_string(job.rank);
  std::atomic<bool> interrupted{false};
  LockstepTensorGather gather;
  std::unique_ptr<parallel::LockstepGroup> group;
  try {
    GlooGroupOptions g;
    g.rank = job.rank;
    g.size = job.size;
    g.rendezvous_dir = job.rendezvous_dir;
    g.generation = "g" + std::to_string(job.generation);
    g.bind_host = job.bind_host;
    g.timeout_ms = static_cast<int>(job.timeout_ms);
    g.interrupted = &interrupted;
    g.shared_memory_frames = job.shared_memory_frames;
    group = std::make_unique<parallel::LockstepGroup>(std::make_unique<GlooTransport>(g),
                                                      parallel::LockstepConfig{0, 0, model.n_tensor_gathers(), "tensor-parallel"});
  } catch (const std::exception& e) {
    ch.reply_failed(0, true, who + " could not meet its peers: " + e.what());
    return Outcome::kFailed;
  }
  gather.bind(group.get());
  model.set_tensor_gather(&gather);
  // The status thread: a heartbeat and the collective this worker is in,
  // so a parked worker (heartbeat moving, op stuck) can be told from a
  // frozen one (heartbeat stuck).
  std::atomic<bool> done{false};
  // The group's counters, exact at the end of every step (stored before the
  // reply is published, so the core reads them with the reply).
  const auto store_counters = [&] {
    const parallel::GroupCounters c = group->counters();
    me.ops.store(c.ops);
    const auto& tg = c.by_kind[static_cast<size_t>(parallel::OpKind::kTensorGather)];
    me.gathers.store(tg.count);
    me.gather_bytes.store(tg.bytes);
    me.gather_ns.store(tg.total_ns);
    me.consensus_ns.store(c.by_kind[static_cast<size_t>(parallel::OpKind::kStepConsensus)].total_ns);
  };
  std::thread status_thread([&] {
    while (!done.load()) {
      const parallel::InFlightOp op = group->in_flight();
      me.op_kind.store(op.kind);
      me.op_seq.store(op.seq);
      me.op_since_ns.store(op.since_ns);
      me.op_arrived.store(op.arrived_mask);
      me.op_data_phase.store(op.data_phase ? 1 : 0);
      ch.beat();
      std::this_thread::sleep_for(std::chrono::milliseconds(kHeartbeatMs));
    }
  });
  struct JoinStatus {
    std::atomic<bool>& done;
    std::thread& t;
    Model& model;
    ~JoinStatus() {
      done = true;
      t.join();
      model.set_tensor_gather(nullptr);
    }
  } join_status{done, status_thread, model};

  ch.reply(0, ReplyKind::kReady, {});
  me.phase.store(static_cast<int32_t>(WorkerPhase::kIdle));
  const int64_t fault_step = fault_step_for(job.rank, job.generation);
  const int64_t n_vocab = model.config().n_vocab;
  std::vector<float> logits;
  int64_t last = 0;
  for (;;) {
    Batch batch;
    LinkMessage m;
    try {
      m = ch.next_step();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tandem: %s: %s\n", who.c_str(), e.what());
      return Outcome::kFailed;
    }
    if (static_cast<StepKind>(m.kind) == StepKind::kShutdown) return Outcome::kShutdown;
    const int64_t step = m.step_id;
    if (step != last + 1) {
      ch.reply_failed(step, true, who + " expected step " + std::to_string(last + 1) + ", got step " + std::to_string(step));
      return Outcome::kFailed;
    }
    try {
      batch = decode_batch(m.payload);
      if (job.remote()) repeat_copies(batch, kv);
    } catch (const std::exception& e) {
      ch.reply_failed(step, true, who + ": " + e.what());
      return Outcome::kFailed;
    }
    me.step_id.store(step);
    me.phase.store(static_cast<int32_t>(WorkerPhase::kInStep));
    const int64_t step_start_ns = monotonic_ns();
    try {
      try {
        parallel::StepHeader h;
        h.phase = parallel::StepPhase::kMixed;
        h.n_tokens = batch.n_rows();
        h.produces_output = !batch.logit_rows.empty();
        group->begin_step(step, h);
        if (step == fault_step) throw Error("injected fault (TANDEM_TP_FAULT) in step " + std::to_string(step));
        logits.resize(batch.logit_rows.size() * static_cast<size_t>(n_vocab));
        model.forward(batch, kv, pool, logits.data());
        group->end_step();
      } catch (const parallel::LockstepError&) {
        throw;
      } catch (const std::exception& e) {
        // A local failure: the remaining ops run with it in their frames,
        // so no peer is left inside one, then every worker raises.
        const std::string text = who + " in step " + std::to_string(step) + ": " + e.what();
        try {
          group->fail_step(parallel::FailureCode::kLocalError);
        } catch (const parallel::LockstepError&) {
        }
        me.phase.store(static_cast<int32_t>(WorkerPhase::kFailed));
        ch.reply_failed(step, true, text);
        return Outcome::kFailed;
      }
    } catch (const parallel::LockstepError& e) {
      me.phase.store(static_cast<int32_t>(WorkerPhase::kFailed));
      ch.reply_failed(step, e.rank() == job.rank, who + ": " + e.what());
      return Outcome::kFailed;
    }
    store_counters();
    me.step_ns.store(me.step_ns.load() + monotonic_ns() - step_start_ns);
    me.steps_done.store(me.steps_done.load() + 1);
    me.phase.store(static_cast<int32_t>(WorkerPhase::kIdle));
    const auto* p = reinterpret_cast<const uint8_t*>(logits.data());
    try {
      ch.reply(step, ReplyKind::kDone,
               job.rank == 0 ? std::span<const uint8_t>(p, logits.size() * sizeof(float)) : std::span<const uint8_t>());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tandem: %s: its reply to step %lld: %s\n", who.c_str(), static_cast<long long>(step), e.what());
      return Outcome::kFailed;
    }
    last = step;
  }
}

std::unique_ptr<Model> load_shards(const std::string& path, const TensorJob& job, uint64_t* hash) {
  auto file = std::make_shared<const gguf::File>(gguf::File::open(path));
  if (hash != nullptr) *hash = instance::model_hash(*file);
  LoadOptions o;
  o.tensor_rank = job.rank;
  o.tensor_ranks = job.size;
  return Model::load(file, o);
}

KvPoolShape kv_shape_of(const Model& model, const TensorJob& job) {
  return model.kv_shape(job.kv_blocks, job.block_size, kernels::parse_dtype(job.kv_dtype), job.state_slots);
}

// A worker on the core's host: its shards, the core's KV pool (mapped), one set's life.
int run_local_worker(const TensorJob& job) {
  RingChannel ch(job);
  ch.status().pid.store(static_cast<int32_t>(::getpid()));
  ch.status().phase.store(static_cast<int32_t>(WorkerPhase::kStarting));
  std::unique_ptr<Model> model;
  std::unique_ptr<KvPool> kv;
  try {
    ch.attach_steps();
    model = load_shards(job.model_path, job, nullptr);
    kv = std::make_unique<KvPool>(kv_shape_of(*model, job), KvPoolBacking{job.dir + "/kv.pool", false});
  } catch (const std::exception& e) {
    ch.reply_failed(0, true, "tensor-parallel worker " + std::to_string(job.rank) + " could not start: " + e.what());
    return 1;
  }
  ThreadPool pool(job.threads);
  return serve_job(job, ch, *model, *kv, pool) == Outcome::kShutdown ? 0 : 1;
}

struct JoinArgs {
  std::string join, model_path, host = "127.0.0.1";
  int rank = -1, threads = 0;
  int64_t join_timeout_ms = 120000;
};

// A worker on another host: joins the core at --join, gets its job, and
// serves set after set (its weights and its KV pool kept across them) until
// the core shuts it down, or no core takes it for --join-timeout-ms.
int run_joined_worker(const JoinArgs& a) {
  const size_t colon = a.join.rfind(':');
  if (colon == std::string::npos) throw Error("--join must be HOST:PORT (got '" + a.join + "')");
  const std::string core_host = a.join.substr(0, colon);
  const int core_port = std::atoi(a.join.c_str() + colon + 1);
  const std::string who = "tensor-parallel worker " + std::to_string(a.rank);
  std::unique_ptr<Model> model;
  std::unique_ptr<KvPool> kv;
  std::unique_ptr<ThreadPool> pool;
  std::string loaded_path;
  uint64_t loaded_hash = 0;
  int64_t alone_since = monotonic_ns();
  for (;;) {
    std::unique_ptr<TensorLink> link;
    try {
      link = TensorLink::connect(core_host, core_port, 2000);
      const std::string hello = "rank=" + std::to_string(a.rank) + "\npid=" + std::to_string(::getpid()) +
                                "\nkv_fresh=" + (kv ? "0" : "1") + "\n";
      link->send(static_cast<uint32_t>(LinkKind::kHello), 0, {reinterpret_cast<const uint8_t*>(hello.data()), hello.size()},
                 5000);
    } catch (const std::exception& e) {
      if (monotonic_ns() - alone_since > a.join_timeout_ms * 1'000'000) {
        std::fprintf(stderr, "tandem: %s: no engine core took it for %lld ms: %s\n", who.c_str(),
                     static_cast<long long>(a.join_timeout_ms), e.what());
        return 1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      continue;
    }
    // The core sends the job when it starts a set (or a refusal).
    LinkMessage m;
    try {
      bool got = false;
      while (!got && monotonic_ns() - alone_since <= a.join_timeout_ms * 1'000'000) got = link->receive(m, 200, 1 << 20);
      if (!got) {
        std::fprintf(stderr, "tandem: %s: joined %s, but no job came for %lld ms\n", who.c_str(), a.join.c_str(),
                     static_cast<long long>(a.join_timeout_ms));
        return 1;
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tandem: %s: %s; joining again\n", who.c_str(), e.what());
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      continue;
    }
    if (m.kind == static_cast<uint32_t>(ReplyKind::kFailed)) {
      std::fprintf(stderr, "tandem: %s: the engine core refused it: %s\n", who.c_str(),
                   std::string(m.payload.begin(), m.payload.end()).c_str());
      return 1;
    }
    TensorJob job;
    try {
      if (m.kind != static_cast<uint32_t>(LinkKind::kJob)) throw Error("expected a job, got a message of kind " + std::to_string(m.kind));
      job = decode_job(m.payload);
      if (job.rank != a.rank) throw Error("the job is for rank " + std::to_string(job.rank));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tandem: %s: a bad job from %s: %s\n", who.c_str(), link->peer().c_str(), e.what());
      return 1;
    }
    job.bind_host = a.host;
    LinkChannel ch(*link, max_batch_bytes(1 << 20, 1 << 12, 1 << 16));
    ch.status().pid.store(static_cast<int32_t>(::getpid()));
    try {
      const std::string path = a.model_path.empty() ? job.model_path : a.model_path;
      if (!model || path != loaded_path) {
        model = load_shards(path, job, &loaded_hash);
        loaded_path = path;
        kv.reset();
      }
      if (job.model_hash != 0 && loaded_hash != job.model_hash)
        throw Error("its model file " + path + " is not the engine core's (another file, or other weights); give "
                    "--model the same GGUF");
      if (!kv || kv->shape().n_blocks != job.kv_blocks) kv = std::make_unique<KvPool>(kv_shape_of(*model, job));
      if (!pool) pool = std::make_unique<ThreadPool>(a.threads);  // 0: one per core
    } catch (const std::exception& e) {
      ch.reply_failed(0, true, who + " could not start: " + e.what());
      std::fprintf(stderr, "tandem: %s could not start: %s\n", who.c_str(), e.what());
      return 1;
    }
    std::fprintf(stderr, "tandem: %s joined the engine core at %s (generation %d)\n", who.c_str(), a.join.c_str(),
                 job.generation);
    if (serve_job(job, ch, *model, *kv, *pool) == Outcome::kShutdown) return 0;
    std::fprintf(stderr, "tandem: %s: its set of workers ended; joining again\n", who.c_str());
    alone_since = monotonic_ns();
  }
}

}  // namespace

void add_tensor_worker(CLI::App& app) {
  auto local = std::make_shared<TensorJob>();
  auto join = std::make_shared<JoinArgs>();
  CLI::App* cmd = app.add_subcommand(
      "tensor-worker", "A tensor-parallel worker on another host: --join the engine core of serve --tensor-parallel-size");
  cmd->add_option("--join", join->join, "The engine core's --tensor-parallel-host:--tensor-parallel-port");
  cmd->add_option("--rank", join->rank, "This worker's rank (the core runs ranks 0 .. --tensor-parallel-local-workers - 1)")
      ->check(CLI::Range(1, 63));
  cmd->add_option("--model", join->model_path, "The same GGUF as the core's, on this host (default: the core's path)");
  cmd->add_option("--host", join->host, "This host's address for its peers (gloo)");
  cmd->add_option("--threads,-t", join->threads, "Compute threads (0: every core)");
  cmd->add_option("--join-timeout-ms", join->join_timeout_ms, "Give up when no engine core takes this worker for this long")
      ->check(CLI::Range(100, 86'400'000));
  // Spawned by the core on its own host (not for hand use): the job as arguments.
  for (auto* o : {cmd->add_option("--spawned-model", local->model_path), cmd->add_option("--spawned-rank", local->rank),
                  cmd->add_option("--size", local->size), cmd->add_option("--dir", local->dir),
                  cmd->add_option("--rendezvous", local->rendezvous_dir), cmd->add_option("--generation", local->generation),
                  cmd->add_option("--spawned-threads", local->threads), cmd->add_option("--kv-blocks", local->kv_blocks),
                  cmd->add_option("--block-size", local->block_size), cmd->add_option("--kv-dtype", local->kv_dtype),
                  cmd->add_option("--state-slots", local->state_slots), cmd->add_option("--timeout-ms", local->timeout_ms),
                  cmd->add_option("--bind-host", local->bind_host),
                  cmd->add_option("--shared-memory-frames", local->shared_memory_frames),
                  cmd->add_option("--core-pid", local->core_pid)})
    o->group("");
  cmd->callback([local, join] {
    if (!local->dir.empty()) std::exit(run_local_worker(*local));
    if (join->join.empty() || join->rank < 1) throw Error("tensor-worker needs --join HOST:PORT and --rank R");
    std::exit(run_joined_worker(*join));
  });
}

std::vector<std::string> tensor_worker_args(const TensorJob& j) {
  return {self_exe(), "tensor-worker", "--spawned-model", j.model_path, "--spawned-rank", std::to_string(j.rank),
          "--size", std::to_string(j.size), "--dir", j.dir, "--rendezvous", j.rendezvous_dir,
          "--generation", std::to_string(j.generation), "--spawned-threads", std::to_string(j.threads),
          "--kv-blocks", std::to_string(j.kv_blocks), "--block-size", std::to_string(j.block_size),
          "--kv-dtype", j.kv_dtype, "--state-slots", std::to_string(j.state_slots),
          "--timeout-ms", std::to_string(j.timeout_ms), "--bind-host", j.bind_host,
          "--shared-memory-frames", j.shared_memory_frames ? "1" : "0", "--core-pid", std::to_string(j.core_pid)};
}

}  // namespace tandem::cli
