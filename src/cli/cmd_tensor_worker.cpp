// `tandem tensor-worker`: one tensor-parallel worker, spawned by the engine
// core (cli/tensor_parallel.h), never by hand. It maps the engine's KV pool,
// the step ring (as reader `rank`) and its reply ring (as writer), loads its
// shards of the model, meets its peers as a lockstep group, and then runs
// every step it reads: the step consensus, the forward with its gathers, the
// reply. A failure in a step is voted on (every worker raises the same error
// in the same op), replied, and ends the worker; the core starts a fresh set.
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "cli/commands.h"
#include "cli/tensor_wire.h"
#include "engine/lockstep_tensor_gather.h"
#include "gguf/gguf.h"
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

struct WorkerArgs {
  std::string model_path, dir, kv_dtype = "f16";
  int rank = 0, size = 2, generation = 1, threads = 1, block_size = 16;
  int64_t kv_blocks = 0, state_slots = 0, timeout_ms = 60000;
  int core_pid = 0;
};

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

void reply(parallel::BroadcastRing& ring, int64_t step, ReplyKind kind, std::span<const uint8_t> payload) {
  parallel::RingWait w;
  w.soft_deadline_ms = 0;
  w.hard_deadline_ms = 10000;
  ring.publish(step, static_cast<uint32_t>(kind), payload, w);
}

void reply_failed(parallel::BroadcastRing& ring, int64_t step, bool own, const std::string& text) {
  std::vector<uint8_t> p(4 + text.size());
  const int32_t o = own ? 1 : 0;
  std::memcpy(p.data(), &o, 4);
  std::memcpy(p.data() + 4, text.data(), text.size());
  reply(ring, step, ReplyKind::kFailed, p);
}

int run_worker(const WorkerArgs& a) {
  WorkerStatus* all = map_status(a.dir + "/status", a.size);
  WorkerStatus& me = all[a.rank];
  me.pid.store(static_cast<int32_t>(::getpid()));
  me.phase.store(static_cast<int32_t>(WorkerPhase::kStarting));
  auto replies = parallel::BroadcastRing::attach(a.dir + "/reply." + std::to_string(a.rank) + ".ring",
                                                 parallel::BroadcastRing::kWriter, "replies of worker " + std::to_string(a.rank));
  const std::string who = "tensor-parallel worker " + std::to_string(a.rank);
  std::unique_ptr<parallel::BroadcastRing> steps;
  std::unique_ptr<Model> model;
  std::unique_ptr<KvPool> kv;
  std::unique_ptr<parallel::LockstepGroup> group;
  LockstepTensorGather gather;
  std::atomic<bool> interrupted{false};
  const auto core_gone = [&] {
    return ::getppid() != a.core_pid ? std::string("the engine core (pid ") + std::to_string(a.core_pid) + ") is gone"
                                     : std::string();
  };
  try {
    steps = parallel::BroadcastRing::attach(a.dir + "/steps.ring", a.rank, "steps");
    auto file = std::make_shared<const gguf::File>(gguf::File::open(a.model_path));
    LoadOptions o;
    o.tensor_rank = a.rank;
    o.tensor_ranks = a.size;
    model = Model::load(file, o);
    kv = std::make_unique<KvPool>(
        model->kv_shape(a.kv_blocks, a.block_size, kernels::parse_dtype(a.kv_dtype), a.state_slots),
        KvPoolBacking{a.dir + "/kv.pool", false});
    GlooGroupOptions g;
    g.rank = a.rank;
    g.size = a.size;
    g.rendezvous_dir = a.dir + "/g" + std::to_string(a.generation);
    g.generation = "g" + std::to_string(a.generation);
    g.timeout_ms = static_cast<int>(a.timeout_ms);
    g.interrupted = &interrupted;
    g.shared_memory_frames = true;
    group = std::make_unique<parallel::LockstepGroup>(std::make_unique<GlooTransport>(g),
                                                      parallel::LockstepConfig{0, 0, model->n_tensor_gathers(), "tensor-parallel"});
  } catch (const std::exception& e) {
    reply_failed(*replies, 0, true, who + " could not start: " + e.what());
    return 1;
  }
  gather.bind(group.get());
  model->set_tensor_gather(&gather);
  ThreadPool pool(a.threads);
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
      me.heartbeat_ns.store(monotonic_ns());
      std::this_thread::sleep_for(std::chrono::milliseconds(kHeartbeatMs));
    }
  });
  struct JoinStatus {
    std::atomic<bool>& done;
    std::thread& t;
    ~JoinStatus() {
      done = true;
      t.join();
    }
  } join_status{done, status_thread};

  reply(*replies, 0, ReplyKind::kReady, {});
  me.phase.store(static_cast<int32_t>(WorkerPhase::kIdle));
  const int64_t fault_step = fault_step_for(a.rank, a.generation);
  const int64_t n_vocab = model->config().n_vocab;
  std::vector<float> logits;
  int64_t last = 0;
  for (;;) {
    parallel::RingWait wait_for_work;
    wait_for_work.soft_deadline_ms = 0;
    wait_for_work.hard_deadline_ms = 0;  // between steps: no deadline, but the core must live
    wait_for_work.peer_gone = core_gone;
    Batch batch;
    int64_t step = 0;
    {
      parallel::BroadcastRing::ReadGuard g;
      try {
        g = steps->read(wait_for_work);
      } catch (const parallel::RingError& e) {
        std::fprintf(stderr, "tandem: %s: %s\n", who.c_str(), e.what());
        return 1;
      }
      if (static_cast<StepKind>(g.message().kind) == StepKind::kShutdown) return 0;
      step = g.message().step_id;
      if (step != last + 1) {
        reply_failed(*replies, step, true, who + " expected step " + std::to_string(last + 1) + ", got step " + std::to_string(step));
        return 1;
      }
      try {
        batch = decode_batch(g.message().payload);
      } catch (const std::exception& e) {
        reply_failed(*replies, step, true, who + ": " + e.what());
        return 1;
      }
    }  // the slot is released before the step runs
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
        model->forward(batch, *kv, pool, logits.data());
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
        reply_failed(*replies, step, true, text);
        return 1;
      }
    } catch (const parallel::LockstepError& e) {
      me.phase.store(static_cast<int32_t>(WorkerPhase::kFailed));
      reply_failed(*replies, step, e.rank() == a.rank, who + ": " + e.what());
      return 1;
    }
    store_counters();
    me.step_ns.store(me.step_ns.load() + monotonic_ns() - step_start_ns);
    me.steps_done.store(me.steps_done.load() + 1);
    me.phase.store(static_cast<int32_t>(WorkerPhase::kIdle));
    const auto* p = reinterpret_cast<const uint8_t*>(logits.data());
    reply(*replies, step, ReplyKind::kDone,
          a.rank == 0 ? std::span<const uint8_t>(p, logits.size() * sizeof(float)) : std::span<const uint8_t>());
    last = step;
  }
}

}  // namespace

void add_tensor_worker(CLI::App& app) {
  auto a = std::make_shared<WorkerArgs>();
  CLI::App* cmd = app.add_subcommand("tensor-worker", "A tensor-parallel worker (spawned by serve --tensor-parallel-size)");
  cmd->group("");  // not listed: never run by hand
  cmd->add_option("--model", a->model_path)->required();
  cmd->add_option("--rank", a->rank)->required();
  cmd->add_option("--size", a->size)->required();
  cmd->add_option("--dir", a->dir)->required();
  cmd->add_option("--generation", a->generation)->required();
  cmd->add_option("--threads", a->threads);
  cmd->add_option("--kv-blocks", a->kv_blocks)->required();
  cmd->add_option("--block-size", a->block_size);
  cmd->add_option("--kv-dtype", a->kv_dtype);
  cmd->add_option("--state-slots", a->state_slots);
  cmd->add_option("--timeout-ms", a->timeout_ms);
  cmd->add_option("--core-pid", a->core_pid)->required();
  cmd->callback([a] { std::exit(run_worker(*a)); });
}

}  // namespace tandem::cli
