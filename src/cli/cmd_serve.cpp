// `tandem serve`: the OpenAI-compatible server of one instance.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "cli/commands.h"
#include "cli/demo_model.h"
#include "cli/loaded_model.h"
#include "engine/engine_core.h"
#include "server/http_server.h"
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
};

void run_serve(ServeArgs& a) {
  // SIGTERM/SIGINT are taken by one thread with sigwait; block them everywhere
  // else before any thread exists.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  const std::string path = a.model_path.empty() ? ensure_demo_model() : a.model_path;
  LoadedModel lm = load_model(path);
  if (a.server.served_model_name.empty()) a.server.served_model_name = lm.model->config().name.empty() ? path : lm.model->config().name;
  a.engine.kv_cache_bytes = a.kv_cache_mb << 20;
  a.engine.kv_dtype = kernels::parse_dtype(a.kv_dtype);
  a.engine.enable_prefix_caching = !a.no_prefix_caching;
  EngineCore engine(*lm.model, *lm.tokenizer, a.engine);
  server::HttpServer http(engine, *lm.model, *lm.tokenizer, a.server);
  const int port = http.bind();
  engine.start();
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
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(a.shutdown_timeout_s);
    while (http.in_flight() > 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (http.in_flight() > 0)
      std::fprintf(stderr, "tandem: %lld requests still in flight at the shutdown timeout; they are cut off\n",
                   static_cast<long long>(http.in_flight()));
    http.stop();
  });
  http.serve();
  signal_thread.join();
  engine.stop();
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
  cmd->add_option("--chat-template", a->server.chat_template, "Chat template family: chatml, llama3, llama2, mistral");
  cmd->add_option("--http-threads", a->server.http_threads, "Concurrent HTTP connections")->check(CLI::Range(4, 4096));
  cmd->add_option("-t,--threads", a->engine.threads, "Compute threads (0: one per core)")->check(CLI::Range(0, 1024));
  cmd->add_option("--max-num-batched-tokens", a->engine.max_num_batched_tokens, "Token budget per step")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--max-num-seqs", a->engine.max_num_seqs, "Running sequences at most")->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--max-model-len", a->engine.max_model_len, "Context length (0: the model's)");
  cmd->add_option("--max-waiting", a->engine.max_waiting_requests, "Admission queue bound (beyond it: HTTP 429)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--kv-cache-mb", a->kv_cache_mb, "KV cache memory in MiB (allocated and backed at start)")->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--block-size", a->engine.block_size, "KV block size in tokens")->check(CLI::Range(1, 1024));
  cmd->add_option("--kv-dtype", a->kv_dtype, "KV cache type")->check(CLI::IsMember({"f32", "f16", "bf16"}));
  cmd->add_flag("--no-prefix-caching", a->no_prefix_caching, "Disable prefix caching");
  cmd->add_option("--shutdown-timeout", a->shutdown_timeout_s, "Seconds SIGTERM waits for in-flight requests")
      ->check(CLI::Range(0, 3600));
  cmd->callback([a] { run_serve(*a); });
}

}  // namespace tandem::cli
