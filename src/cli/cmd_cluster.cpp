// `tandem cluster`: a router and P prefill + D decode instances on this host
// as child processes: starts them, waits until every instance has joined,
// says where to point a client, restarts a child that dies (an instance
// comes back in a new epoch), and tears everything down on SIGINT/SIGTERM.
#include <httplib.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cli/child_process.h"
#include "cli/commands.h"
#include "cli/demo_model.h"
#include "util/clock.h"
#include "util/error.h"

namespace tandem::cli {
namespace {

struct ClusterArgs {
  int prefill = 1;
  int decode = 1;
  std::string mode = "write";
  std::string model_path;
  int port = 8000;
  int64_t kv_cache_mb = 256;
  int threads = 0;  // per instance; 0: cores / instances, at least 1
  std::string tls = "tcp";
  int ready_timeout_s = 120;
  std::string prefill_args, decode_args;  // extra `tandem serve` arguments per role
  std::string router_args;                // extra `tandem router` arguments
};

std::vector<std::string> split_words(const std::string& s) {
  std::vector<std::string> words;
  std::string w;
  for (char c : s) {
    if (c == ' ') {
      if (!w.empty()) words.push_back(w);
      w.clear();
    } else {
      w += c;
    }
  }
  if (!w.empty()) words.push_back(w);
  return words;
}

struct Child {
  std::string name;
  std::vector<std::string> args;
  pid_t pid = -1;
  int restarts = 0;
};

std::string random_secret() {
  std::random_device rd;
  std::string s;
  for (int i = 0; i < 32; ++i) s += "0123456789abcdef"[rd() % 16];
  return s;
}

void run_cluster(const ClusterArgs& a) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  const std::string exe = self_exe();
  const std::string model = a.model_path.empty() ? ensure_demo_model() : a.model_path;
  // The secret reaches the children through the environment, never argv.
  setenv("TANDEM_CLUSTER_SECRET", random_secret().c_str(), 1);
  const std::string router_url = "http://127.0.0.1:" + std::to_string(a.port);
  int n_instances = a.prefill + a.decode;
  int threads = a.threads > 0 ? a.threads
                              : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / n_instances);

  std::vector<Child> children;
  children.push_back({"router", {exe, "router", "--port", std::to_string(a.port)}});
  for (const std::string& w : split_words(a.router_args)) children.back().args.push_back(w);
  for (int i = 0; i < n_instances; ++i) {
    bool prefill = i < a.prefill;
    children.push_back({std::string(prefill ? "prefill" : "decode") + " " + std::to_string(prefill ? i : i - a.prefill),
                        {exe, "serve", "--role", prefill ? "prefill" : "decode", "--router", router_url, "-m", model,
                         "--port", "0", "--node-id", std::to_string(2 + i), "--kv-mode", a.mode, "--kv-cache-mb",
                         std::to_string(a.kv_cache_mb), "-t", std::to_string(threads), "--ucx-tls", a.tls}});
    for (const std::string& w : split_words(prefill ? a.prefill_args : a.decode_args)) children.back().args.push_back(w);
  }
  for (Child& c : children) c.pid = spawn_child(c.args);

  auto stop_all = [&] {
    for (Child& c : children)
      if (c.pid > 0) kill(c.pid, SIGTERM);
    for (int64_t until = monotonic_ms() + 10'000; monotonic_ms() < until;) {
      bool any = false;
      for (Child& c : children) {
        if (c.pid <= 0) continue;
        if (waitpid(c.pid, nullptr, WNOHANG) == c.pid) c.pid = -1;
        else any = true;
      }
      if (!any) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    for (Child& c : children)
      if (c.pid > 0) {
        kill(c.pid, SIGKILL);
        waitpid(c.pid, nullptr, 0);
        c.pid = -1;
      }
  };

  // Ready when the router sees every instance.
  httplib::Client cli("127.0.0.1", a.port);
  cli.set_connection_timeout(1, 0);
  cli.set_read_timeout(2, 0);
  bool ready = false;
  for (int64_t until = monotonic_ms() + a.ready_timeout_s * 1000LL; monotonic_ms() < until && !ready;) {
    auto r = cli.Get("/health");
    if (r) {
      auto j = nlohmann::json::parse(r->body, nullptr, false);
      ready = j.is_object() && j.value("prefill", 0) == a.prefill && j.value("decode", 0) == a.decode;
    }
    for (const Child& c : children)
      if (waitpid(c.pid, nullptr, WNOHANG) == c.pid) {
        stop_all();
        throw Error("the " + c.name + " process exited during start-up (its error is above)");
      }
    sigset_t pending;
    sigpending(&pending);
    if (sigismember(&pending, SIGINT) || sigismember(&pending, SIGTERM)) break;
    if (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!ready) {
    stop_all();
    throw Error("the cluster did not become ready within " + std::to_string(a.ready_timeout_s) + " s");
  }
  std::string pids;
  for (const Child& c : children) pids += " " + c.name + "=" + std::to_string(c.pid);
  std::fprintf(stderr, "tandem cluster: pids:%s\n", pids.c_str());
  std::fprintf(stderr,
               "tandem cluster: ready: %d prefill + %d decode (%s mode), OpenAI API at %s/v1 (Ctrl-C stops everything)\n"
               "  try: curl -sN %s/v1/chat/completions -d '{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],"
               "\"max_tokens\":32,\"stream\":true}'\n",
               a.prefill, a.decode, a.mode.c_str(), router_url.c_str(), router_url.c_str());

  // Supervise until a signal: a child that dies is reported and restarted.
  for (;;) {
    timespec tick{0, 100'000'000};
    int sig = sigtimedwait(&signals, nullptr, &tick);
    if (sig == SIGINT || sig == SIGTERM) {
      std::fprintf(stderr, "tandem cluster: signal %d: stopping every process\n", sig);
      break;
    }
    for (Child& c : children) {
      int status = 0;
      if (c.pid > 0 && waitpid(c.pid, &status, WNOHANG) == c.pid) {
        std::fprintf(stderr, "tandem cluster: %s (pid %d) %s %d; restarting it\n", c.name.c_str(), c.pid,
                     WIFSIGNALED(status) ? "was killed by signal" : "exited with status",
                     WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
        ++c.restarts;
        c.pid = spawn_child(c.args);
        std::fprintf(stderr, "tandem cluster: %s restarted as pid %d\n", c.name.c_str(), c.pid);
      }
    }
  }
  stop_all();
  std::fprintf(stderr, "tandem cluster: stopped\n");
}

}  // namespace

void add_cluster(CLI::App& app) {
  auto a = std::make_shared<ClusterArgs>();
  CLI::App* cmd = app.add_subcommand("cluster", "A router and P prefill + D decode instances on this host (no -m: the demo model)");
  cmd->add_option("--prefill", a->prefill, "Prefill instances")->check(CLI::Range(1, 64));
  cmd->add_option("--decode", a->decode, "Decode instances")->check(CLI::Range(1, 64));
  cmd->add_option("--mode", a->mode, "KV transfer mode")->check(CLI::IsMember({"write", "read"}));
  cmd->add_option("-m,--model", a->model_path, "GGUF model file");
  cmd->add_option("--port", a->port, "The router's port")->check(CLI::Range(1, 65535));
  cmd->add_option("--kv-cache-mb", a->kv_cache_mb, "KV cache per instance (MiB)")->check(CLI::Range(1, 1 << 24));
  cmd->add_option("-t,--threads", a->threads, "Compute threads per instance (0: the cores shared out)");
  cmd->add_option("--ucx-tls", a->tls, "UCX transports for KV transfer");
  cmd->add_option("--ready-timeout", a->ready_timeout_s, "Seconds to wait for every instance to join")
      ->check(CLI::Range(1, 3600));
  cmd->add_option("--prefill-args", a->prefill_args, "Extra `tandem serve` arguments for prefill instances");
  cmd->add_option("--decode-args", a->decode_args, "Extra `tandem serve` arguments for decode instances");
  cmd->add_option("--router-args", a->router_args, "Extra `tandem router` arguments");
  cmd->callback([a] { run_cluster(*a); });
}

}  // namespace tandem::cli
