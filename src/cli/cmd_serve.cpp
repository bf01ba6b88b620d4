// `tandem serve`: the OpenAI-compatible server of one instance.
#include <pthread.h>
#include <signal.h>

#include <cstdlib>
#include <fstream>
#include <iterator>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "cli/child_process.h"
#include "cli/commands.h"
#include "cli/data_parallel.h"
#include "cli/demo_model.h"
#include "cli/loaded_model.h"
#include "cli/pd_instance.h"
#include "cli/tensor_parallel.h"
#include "engine/engine_core.h"
#include "server/http_server.h"
#include "server/shutdown_drain.h"
#include "util/error.h"

namespace tandem::cli {

namespace {

struct ServeArgs {
  std::string model_path;
  server::ServerConfig server;
  EngineConfig engine;
  int64_t kv_cache_mb = 1024;
  std::string kv_dtype = "f16";
  bool no_prefix_caching = false;
  int shutdown_timeout_s = 30;
  // P/D.
  std::string role = "both";
  std::string mode = "write";
  std::string kv_transfer_config;
  PdInstanceOptions pd;
  bool role_given = false;
  DataParallelOptions dp;
  TensorParallelOptions tp;
};

// This process's command line, for starting the host's other ranks (the
// program by its real path, whatever argv[0] said).
std::vector<std::string> own_argv() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> argv;
  for (size_t start = 0; start < all.size();) {
    const size_t end = all.find('\0', start);
    argv.push_back(all.substr(start, end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  if (!argv.empty()) argv[0] = self_exe();
  return argv;
}

// Which rank this process runs and where the ranks meet; throws Error on a
// combination that cannot work. Returns whether this process owns (created)
// the rendezvous directory.
bool resolve_data_parallel(ServeArgs& a, int* rank, bool* spawned) {
  DataParallelOptions& dp = a.dp;
  *rank = dp.start_rank;
  *spawned = false;
  if (const char* r = std::getenv(kRankEnv)) {
    *rank = std::atoi(r);
    const char* dir = std::getenv(kRendezvousEnv);
    dp.rendezvous_dir = dir != nullptr ? dir : "";
    *spawned = true;
    return false;
  }
  if (!dp.enabled()) return false;
  if (dp.start_rank >= dp.size || dp.start_rank + dp.local_count() > dp.size)
    throw Error("--data-parallel-start-rank " + std::to_string(dp.start_rank) + " with --data-parallel-size-local " +
                std::to_string(dp.local_count()) + " does not fit --data-parallel-size " + std::to_string(dp.size));
  if (!dp.rendezvous_dir.empty()) {
    std::filesystem::create_directories(dp.rendezvous_dir);
    return false;
  }
  if (dp.local_count() < dp.size)
    throw Error("--data-parallel-rendezvous DIR is required when the ranks run on several hosts (a directory every "
                "rank can reach, empty at start)");
  char tmpl[] = "/tmp/tandem-dp-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) throw Error("cannot create a rendezvous directory under /tmp");
  dp.rendezvous_dir = tmpl;
  return true;
}

// The cluster secret: the flag, else the environment (kept out of `ps`).
std::string cluster_secret(const std::string& flag) {
  if (!flag.empty()) return flag;
  const char* env = std::getenv("TANDEM_CLUSTER_SECRET");
  return env != nullptr ? env : "";
}

void run_serve(ServeArgs& a) {
  // SIGTERM/SIGINT are taken by one thread with sigwait; block them everywhere
  // else before any thread exists.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  int dp_rank = 0;
  bool dp_spawned = false;
  const bool dp_owns_dir = resolve_data_parallel(a, &dp_rank, &dp_spawned);
  const bool data_parallel = a.dp.enabled();
  if (data_parallel && dp_rank != 0) {
    // Only the front serves the public port; a rank's listener is internal.
    a.server.host = a.dp.host;
    a.server.port = 0;
  }

  const std::string path = a.model_path.empty() ? ensure_demo_model() : a.model_path;
  const bool expert_parallel = data_parallel && a.dp.expert_parallel;
  if (a.dp.expert_parallel && !data_parallel)
    throw Error("--enable-expert-parallel splits the experts over the data-parallel ranks: give --data-parallel-size N (N > 1)");
  if (a.tp.enabled() && expert_parallel)
    throw Error("--tensor-parallel-size and --enable-expert-parallel together are not supported: choose one");
  LoadOptions load;
  if (expert_parallel) load.expert_rank = dp_rank, load.expert_ranks = a.dp.size;
  if (a.tp.enabled()) load = tensor_parallel_core_load(a.tp.size);
  LoadedModel lm = load_model(path, false, load);
  if (expert_parallel && lm.model->n_expert_layers() == 0)
    throw Error("--enable-expert-parallel: " + lm.model->config().arch + " has no expert layers");
  if (expert_parallel && lm.model->config().n_expert < a.dp.size)
    throw Error("--enable-expert-parallel: " + std::to_string(lm.model->config().n_expert) +
                " experts cannot be split over " + std::to_string(a.dp.size) + " ranks");
  if (a.server.served_model_name.empty()) a.server.served_model_name = lm.model->config().name.empty() ? path : lm.model->config().name;
  a.engine.kv_cache_bytes = a.kv_cache_mb << 20;
  a.engine.kv_dtype = kernels::parse_dtype(a.kv_dtype);
  a.engine.enable_prefix_caching = !a.no_prefix_caching;
  if (!a.kv_transfer_config.empty()) {
    PdInstanceOptions from_json = a.pd;
    apply_kv_transfer_config(a.kv_transfer_config, &from_json);
    pd::Role flag_role = a.pd.role;
    a.pd = from_json;
    if (a.role_given) a.pd.role = flag_role;  // an explicit --role wins
    if (!a.role_given) a.role = a.pd.role == pd::Role::kPrefill ? "prefill" : "decode";
  } else {
    a.pd.mode = a.mode == "read" ? pd::TransferMode::kRead : pd::TransferMode::kWrite;
  }
  if (a.role == "prefill") a.pd.role = pd::Role::kPrefill;
  if (a.role == "decode") a.pd.role = pd::Role::kDecode;
  if (a.tp.local_workers > a.tp.size)
    throw Error("--tensor-parallel-local-workers " + std::to_string(a.tp.local_workers) + " is more than --tensor-parallel-size " +
                std::to_string(a.tp.size));
  if (a.tp.enabled() && a.tp.cross_host() && a.role != "both")
    throw Error("--role " + a.role + " with tensor-parallel workers on other hosts is not supported: the KV transfer "
                "registers this host's KV pool, which holds only the heads of the workers on this host; run every "
                "worker here (--tensor-parallel-local-workers " + std::to_string(a.tp.size) + ")");
  std::unique_ptr<TensorParallelDir> tp_dir;
  if (a.tp.enabled()) {
    tp_dir = std::make_unique<TensorParallelDir>();
    a.engine.kv_backing = tp_dir->kv_backing();
  }
  EngineCore engine(*lm.model, *lm.tokenizer, a.engine);
  std::unique_ptr<TensorParallelExecutor> tp;
  if (a.tp.enabled()) {
    size_tensor_parallel(a.tp, path, lm.model->config().n_vocab, a.engine.max_num_batched_tokens, a.engine.max_num_seqs,
                         engine.max_model_len(), a.engine.block_size, a.engine.threads);
    tp = std::make_unique<TensorParallelExecutor>(a.tp, engine.kv_pool(), tp_dir->kv_path());
    engine.set_executor(tp.get());
  }
  if (engine.max_model_len_capped_by_cache())
    std::fprintf(stderr, "tandem: max model len %lld, not the model's %lld: the KV cache (%lld blocks of %d tokens) "
                 "holds no more for one sequence; give it more memory (--kv-cache-mb) or pass --max-model-len\n",
                 static_cast<long long>(engine.max_model_len()), static_cast<long long>(lm.model->config().n_ctx_train),
                 static_cast<long long>(engine.n_kv_blocks()), a.engine.block_size);
  if (engine.metrics().prefix_caching_off_for_recurrent_state)
    std::fprintf(stderr, "tandem: prefix caching is off for %s: a cached block holds KV, not the recurrent state "
                 "after it\n", lm.model->config().arch.c_str());
  if (lm.model->config().hybrid()) {
    const KvPoolShape& shape = engine.kv_pool().shape();
    std::fprintf(stderr,
                 "tandem: recurrent state: %lld slots (--max-num-seqs) of %.1f MiB, %.1f MiB beside the KV cache\n",
                 static_cast<long long>(shape.n_state_slots), static_cast<double>(shape.state_slot_bytes) / (1 << 20),
                 static_cast<double>(shape.state_slot_bytes) * static_cast<double>(shape.n_state_slots) / (1 << 20));
  }
  std::unique_ptr<DataParallelRank> dp;
  if (data_parallel) {
    dp = std::make_unique<DataParallelRank>(a.dp, dp_rank, parallel::LockstepConfig{});
    engine.set_lockstep(dp->hooks(expert_parallel ? lm.model->n_expert_layers() : 0));
  }
  server::HttpServer http(engine, *lm.model, *lm.tokenizer, a.server);
  if (tp) http.set_tp_hook(tensor_parallel_hook(*tp));
  const int port = http.bind();
  std::unique_ptr<DataParallelFront> front;
  std::unique_ptr<RankSupervisor> supervisor;
  if (data_parallel) {
    dp->dir().publish_http(dp_rank, a.server.host, port);
    // Behind a router (P/D) every rank registers and is picked on its own;
    // alone, the front hands requests to the ranks.
    if (dp_rank == 0 && a.role == "both") {
      front = std::make_unique<DataParallelFront>(a.dp, engine, dp->dir(), a.server.api_key);
      http.set_dp_hook(front->hook());
    }
    if (!dp_spawned && a.dp.local_count() > 1) supervisor = std::make_unique<RankSupervisor>(a.dp, dp->dir(), own_argv(), [&dp](int) { dp->peer_lost(); });
    dp->watch(engine);
  }
  engine.start();
  std::unique_ptr<PdInstance> pd_instance;
  if (a.role != "both") {
    a.pd.secret = cluster_secret(a.pd.secret);
    if (data_parallel) {
      // Each rank is its own node (--node-id + 1000 x rank) with its own
      // transfer listener (--transfer-port + rank when one is given).
      a.pd.dp_group = a.dp.rendezvous_dir;
      a.pd.dp_rank = dp_rank;
      a.pd.dp_size = a.dp.size;
      if (a.pd.node != 0) a.pd.node += static_cast<pd::NodeId>(1000 * dp_rank);
      if (a.pd.transfer_port != 0) a.pd.transfer_port = static_cast<uint16_t>(a.pd.transfer_port + dp_rank);
      if (dp_rank != 0) a.pd.transfer_host = a.dp.host;
    }
    pd_instance = std::make_unique<PdInstance>(engine, *lm.file, http, a.server.served_model_name, a.pd);
  }
  if (data_parallel)
    std::fprintf(stderr, "tandem: data-parallel rank %d of %d (rendezvous %s)%s\n", dp_rank, a.dp.size,
                 a.dp.rendezvous_dir.c_str(), dp_rank == 0 ? ", the front" : "");
  std::fprintf(stderr,
               "tandem: serving '%s' on http://%s:%d (KV cache %lld blocks of %d tokens, max model len %lld, "
               "chat template: %s)\n",
               a.server.served_model_name.c_str(), a.server.host.c_str(), port,
               static_cast<long long>(engine.n_kv_blocks()), a.engine.block_size,
               static_cast<long long>(engine.max_model_len()), http.chat_template().describe().c_str());

  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    std::fprintf(stderr, "tandem: signal %d: draining (up to %d s)\n", sig, a.shutdown_timeout_s);
    http.begin_drain();
    if (pd_instance) pd_instance->begin_drain();
    // This server's own requests, and on a data-parallel front those it
    // relays to other ranks.
    server::drain_then_cut_off(
        "tandem", "server", a.shutdown_timeout_s,
        [&] { return http.in_flight() + (front ? front->relayed_in_flight() : 0); },
        [&](const std::string& why) {
          http.cut_off(why);
          if (front) front->cut_off_relays(why);
        });
    http.stop();
  });
  std::thread serve_thread([&] { http.serve(); });
  try {
    if (pd_instance) pd_instance->join(a.server.host, port);
  } catch (const Error& e) {
    std::fprintf(stderr, "tandem: error: %s\n", e.what());
    pthread_kill(signal_thread.native_handle(), SIGTERM);
    serve_thread.join();
    signal_thread.join();
    pd_instance.reset();
    engine.stop();
    throw Error("could not join the cluster");
  }
  serve_thread.join();
  signal_thread.join();
  pd_instance.reset();
  supervisor.reset();  // the host's other ranks stop first (SIGTERM, bounded)
  engine.stop();
  tp.reset();  // the workers stop after the engine's last step
  dp.reset();
  if (dp_owns_dir) std::filesystem::remove_all(a.dp.rendezvous_dir);
  std::fprintf(stderr, "tandem: stopped\n");
}

}  // namespace

void add_serve(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* cmd = app.add_subcommand("serve", "OpenAI-compatible server (no -m: the demo model)");
  cmd->add_option("-m,--model", a->model_path, "GGUF model file");
  cmd->add_option("--host", a->server.host, "Address to bind (default loopback only)");
  cmd->add_option("--port", a->server.port, "Port (0: any free port)")->check(CLI::Range(0, 65535));
  cmd->add_option("--api-key", a->server.api_key, "Require 'Authorization: Bearer KEY' on API requests");
  cmd->add_option("--served-model-name", a->server.served_model_name, "Model id clients use");
  cmd->add_option("--chat-template", a->server.chat_template, "Jinja chat template file (or the template text) to use instead of the model's tokenizer.chat_template");
  cmd->add_option("--http-threads", a->server.http_threads, "Concurrent HTTP connections")->check(CLI::Range(4, 4096));
  cmd->add_option("--max-queued-connections", a->server.max_queued_connections,
                  "Connections that may wait beyond --http-threads (beyond: HTTP 503 at once)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("-t,--threads", a->engine.threads, "Compute threads (0: one per core)")->check(CLI::Range(0, 1024));
  cmd->add_option("--max-num-batched-tokens", a->engine.max_num_batched_tokens, "Token budget per step")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--max-num-seqs", a->engine.max_num_seqs, "Running sequences at most")->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--max-model-len", a->engine.max_model_len, "Context length (0: the model's, or what the KV cache holds for one sequence if less)");
  cmd->add_option("--max-waiting", a->engine.max_waiting_requests, "Admission queue bound (beyond it: HTTP 429)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--kv-cache-mb", a->kv_cache_mb, "KV cache memory in MiB (allocated and backed at start)")->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--block-size", a->engine.block_size, "KV block size in tokens")->check(CLI::Range(1, 1024));
  cmd->add_option("--kv-dtype", a->kv_dtype, "KV cache type")->check(CLI::IsMember({"f32", "f16", "bf16"}));
  cmd->add_flag("--no-prefix-caching", a->no_prefix_caching, "Disable prefix caching");
  cmd->add_option("--shutdown-timeout", a->shutdown_timeout_s, "Seconds SIGTERM waits for in-flight requests")
      ->check(CLI::Range(0, 3600));
  cmd->add_option("--role", a->role, "both (one instance), or prefill/decode behind a router")
      ->check(CLI::IsMember({"both", "prefill", "decode"}))
      ->each([a](const std::string&) { a->role_given = true; });
  cmd->add_option("--router", a->pd.router_url, "Router to join (prefill/decode), e.g. http://127.0.0.1:8000");
  cmd->add_option("--cluster-secret", a->pd.secret,
                  "Shared secret of the cluster (default: $TANDEM_CLUSTER_SECRET; prefer the variable: flags show in ps)");
  cmd->add_option("--kv-mode", a->mode, "KV transfer mode: write (prefill pushes) or read (decode pulls)")
      ->check(CLI::IsMember({"write", "read"}));
  cmd->add_option("--kv-transfer-config", a->kv_transfer_config,
                  "vLLM-style JSON: kv_role, kv_ip, kv_port, kv_connector_extra_config{mode, tls, router} "
                  "(docs/PD_PROTOCOL.md)");
  cmd->add_option("--data-parallel-size", a->dp.size, "Engine ranks in lockstep (each a process with its own KV cache)")
      ->check(CLI::Range(1, parallel::kMaxRanks));
  cmd->add_option("--data-parallel-size-local", a->dp.size_local, "Ranks this host runs (0: all)")
      ->check(CLI::Range(0, parallel::kMaxRanks));
  cmd->add_option("--data-parallel-start-rank", a->dp.start_rank, "The first rank this host runs")
      ->check(CLI::Range(0, parallel::kMaxRanks - 1));
  cmd->add_option("--data-parallel-rendezvous", a->dp.rendezvous_dir,
                  "Directory every rank reaches, empty at start (default: a fresh one when all ranks are local)");
  cmd->add_option("--data-parallel-host", a->dp.host, "This host's address for the ranks (gloo, rank listeners)");
  cmd->add_option("--data-parallel-timeout-ms", a->dp.timeout_ms, "gloo timeout: rendezvous and every collective")
      ->check(CLI::Range(100, 3'600'000));
  cmd->add_option("--data-parallel-soft-deadline-ms", a->dp.soft_deadline_ms,
                  "Report a rank that waits in a collective longer than this")
      ->check(CLI::Range(10, 3'600'000));
  cmd->add_flag("--enable-expert-parallel", a->dp.expert_parallel,
               "Split every MoE layer's experts over the data-parallel ranks (all-to-all over gloo)");
  cmd->add_option("--tensor-parallel-size", a->tp.size,
                  "Worker processes each holding a shard of every matrix (output bitwise equal to 1)")
      ->check(CLI::Range(1, parallel::kMaxRingReaders));
  cmd->add_option("--tensor-parallel-soft-deadline-ms", a->tp.soft_deadline_ms,
                  "Report a step whose workers have not all answered after this long")
      ->check(CLI::Range(10, 3'600'000));
  cmd->add_option("--tensor-parallel-timeout-ms", a->tp.timeout_ms,
                  "Fail a step (and restart the workers) whose workers have not answered after this long")
      ->check(CLI::Range(100, 3'600'000));
  cmd->add_option("--tensor-parallel-local-workers", a->tp.local_workers,
                  "Workers this host runs (ranks 0..L-1; the others join from their hosts with tandem tensor-worker "
                  "--join; 0: all)")
      ->check(CLI::Range(0, parallel::kMaxRingReaders));
  cmd->add_option("--tensor-parallel-host", a->tp.host,
                  "This host's address for the workers on other hosts (their join listener, gloo)");
  cmd->add_option("--tensor-parallel-port", a->tp.port, "The join listener's port (0: any free port, logged)")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--tensor-parallel-rendezvous", a->tp.rendezvous_dir,
                  "A directory every worker's host reaches, where each set of workers meets (with workers on other hosts)");
  cmd->add_option("--node-id", a->pd.node, "Node id in the cluster (0: random)");
  cmd->add_option("--transfer-host", a->pd.transfer_host, "Address of the KV transfer listener (default loopback)");
  cmd->add_option("--transfer-port", a->pd.transfer_port, "Port of the KV transfer listener (0: any free port)");
  cmd->add_option("--ucx-tls", a->pd.tls, "UCX transports for KV transfer (tcp fences by closing; see docs)");
  cmd->add_option("--ucx-net-devices", a->pd.net_devices, "UCX_NET_DEVICES for KV transfer");
  cmd->add_option("--test-faults", a->pd.test_faults,
                  "TEST KNOB: inject control-frame faults, e.g. seed=1,drop=0.05,dup=0.05,delay=0.1,max_delay_ms=200");
  cmd->add_option("--test-admission-delay-ms", a->pd.test_admission_delay_ms,
                  "TEST KNOB: a decode admits each transferred request this much later");
  cmd->callback([a] { run_serve(*a); });
}

}  // namespace tandem::cli
