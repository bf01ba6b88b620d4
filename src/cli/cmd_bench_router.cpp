// `tandem bench router`: what one router process costs as the cluster grows.
// The router runs as a child process; the bench registers N lightweight fake
// instances (HTTP servers that accept prefill legs at once and stream a
// canned decode answer), heartbeats them all, and measures the router's CPU
// time (from /proc) idle with N instances, then relaying a load through them:
// requests and streamed tokens per second, CPU milliseconds per request.
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "cli/commands.h"
#include "loadgen/loadgen.h"
#include "router/cluster_api.h"
#include "util/clock.h"
#include "util/error.h"

namespace tandem::cli {
namespace {

using json = nlohmann::json;

struct RouterBenchArgs {
  std::vector<int> instances = {2, 16, 64};
  int requests = 400;
  int concurrency = 16;
  int tokens = 16;
  double idle_s = 5;
  bool json_out = false;
};

int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    throw Error("bench router: no free port");
  close(fd);
  return ntohs(a.sin_port);
}

// utime + stime of a process, in milliseconds.
double cpu_ms(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(f)), {});
  size_t close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(text.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 13; ++i) rest >> field;  // state .. cmajflt
  long long utime = 0, stime = 0;
  rest >> utime >> stime;
  return static_cast<double>(utime + stime) * 1000.0 / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// One fake instance: accepts a prefill leg, streams `tokens` chunks as a decode.
struct FakeInstance {
  httplib::Server server;
  std::thread thread;
  int port = 0;
  FakeInstance(bool prefill, int tokens) {
    server.new_task_queue = [] { return new httplib::ThreadPool(2); };
    auto handler = [prefill, tokens](const httplib::Request& req, httplib::Response& res) {
      if (prefill) return res.set_content(R"({"status":"accepted"})", "application/json");
      json body = json::parse(req.body, nullptr, false);
      bool stream = body.is_object() && body.value("stream", false);
      std::string out;
      if (stream) {
        for (int i = 0; i < tokens; ++i)
          out += "data: " + json{{"choices", {{{"index", 0}, {"text", "x"}, {"finish_reason", nullptr}}}}}.dump() + "\n\n";
        out += "data: " + json{{"choices", json::array()}, {"usage", {{"prompt_tokens", 8}, {"completion_tokens", tokens}}}}.dump() +
               "\n\ndata: [DONE]\n\n";
        res.set_content(out, "text/event-stream");
      } else {
        res.set_content(json{{"choices", {{{"index", 0}, {"text", std::string(static_cast<size_t>(tokens), 'x')}}}},
                             {"usage", {{"prompt_tokens", 8}, {"completion_tokens", tokens}}}}
                            .dump(),
                        "application/json");
      }
    };
    server.Post("/v1/completions", handler);
    server.Post("/internal/pd/abort", [](const httplib::Request&, httplib::Response& res) { res.set_content("{}", "application/json"); });
    port = server.bind_to_any_port("127.0.0.1");
    thread = std::thread([this] { server.listen_after_bind(); });
  }
  ~FakeInstance() {
    server.stop();
    if (thread.joinable()) thread.join();
  }
};

void run(const RouterBenchArgs& a) {
  const std::string secret = "bench-router";
  setenv("TANDEM_CLUSTER_SECRET", secret.c_str(), 1);
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) throw Error("cannot find this program's path");
  exe[n] = 0;
  std::printf("%s\n", a.json_out ? "" : "instances  idle CPU %   heartbeats/s  req/s   tok/s   router CPU ms/req  errors");
  json results = json::array();
  for (int n_instances : a.instances) {
    int port = free_port();
    pid_t router = fork();
    if (router == 0) {
      execl(exe, exe, "router", "--port", std::to_string(port).c_str(), "--eviction-ms", "60000",
            static_cast<char*>(nullptr));
      _exit(127);
    }
    struct Reaper {
      pid_t pid;
      ~Reaper() {
        kill(pid, SIGTERM);
        waitpid(pid, nullptr, 0);
      }
    } reaper{router};
    httplib::Client cli("127.0.0.1", port);
    cli.set_tcp_nodelay(true);
    cli.set_connection_timeout(1, 0);
    for (int64_t until = monotonic_ms() + 10'000; monotonic_ms() < until && !cli.Get("/metrics");)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));

    std::vector<std::unique_ptr<FakeInstance>> fakes;
    std::vector<router::InstanceInfo> infos;
    for (int i = 0; i < n_instances; ++i) {
      bool prefill = i % 2 == 0;
      fakes.push_back(std::make_unique<FakeInstance>(prefill, a.tokens));
      router::InstanceInfo info;
      info.node = static_cast<pd::NodeId>(2 + i);
      info.epoch = 1;
      info.role = prefill ? pd::Role::kPrefill : pd::Role::kDecode;
      info.api_host = info.transfer_host = "127.0.0.1";
      info.api_port = static_cast<uint16_t>(fakes.back()->port);
      info.transfer_port = static_cast<uint16_t>(40000 + i);
      info.model_name = "fake";
      info.max_model_len = 4096;
      info.fingerprint.block_size = 16;
      info.capacity_blocks = 4096;
      std::string body = router::to_json(info).dump();
      auto r = cli.Post("/internal/register", {{router::kSignatureHeader, router::sign(secret, body)}}, body,
                        "application/json");
      if (!r || r->status != 200) throw Error("bench router: registration refused");
      infos.push_back(info);
    }
    // Heartbeats from every instance, once a second, as real ones send them.
    std::atomic<bool> beating{true};
    std::atomic<int64_t> beats{0};
    uint64_t seen_version = 0;  // one shared view stands for every instance's
    std::thread heart([&] {
      httplib::Client hb("127.0.0.1", port);
      hb.set_tcp_nodelay(true);
      hb.set_keep_alive(true);  // as instances send them
      while (beating) {
        for (const auto& info : infos) {
          std::string body = json{{"node", info.node}, {"epoch", info.epoch}, {"free_blocks", 4096}, {"waiting", 0},
                                  {"registry_version", seen_version}}
                                 .dump();
          auto r = hb.Post("/internal/heartbeat", {{router::kSignatureHeader, router::sign(secret, body)}}, body,
                           "application/json");
          if (r && r->status == 200) {
            json j = json::parse(r->body, nullptr, false);
            if (j.is_object()) seen_version = j.value("registry_version", uint64_t{0});
          }
          ++beats;
        }
        for (int i = 0; i < 20 && beating; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    });
    struct Stop {
      std::atomic<bool>& flag;
      std::thread& t;
      ~Stop() {
        flag = false;
        t.join();
      }
    } stop{beating, heart};

    double cpu0 = cpu_ms(router);
    int64_t beats0 = beats.load(), t0 = monotonic_ms();
    std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int64_t>(a.idle_s * 1000)));
    double idle_pct = (cpu_ms(router) - cpu0) / static_cast<double>(monotonic_ms() - t0) * 100.0;
    double beats_per_s = static_cast<double>(beats.load() - beats0) * 1000.0 / static_cast<double>(monotonic_ms() - t0);

    loadgen::LoadConfig lc;
    lc.url = "http://127.0.0.1:" + std::to_string(port);
    lc.model = "fake";
    lc.concurrency = {a.concurrency};
    lc.requests_per_level = a.requests;
    lc.input_words = 16;
    lc.output_tokens = a.tokens;
    double cpu1 = cpu_ms(router);
    auto levels = loadgen::run_sweep(lc, [](const std::string&) {});
    double per_request = (cpu_ms(router) - cpu1) / std::max(1, a.requests);
    const loadgen::LevelResult& l = levels.front();
    if (a.json_out) {
      results.push_back({{"instances", n_instances}, {"idle_cpu_percent", idle_pct}, {"heartbeats_per_s", beats_per_s},
                         {"requests_per_s", l.requests_per_s}, {"tokens_per_s", l.output_tokens_per_s},
                         {"router_cpu_ms_per_request", per_request}, {"errors", l.errors}});
    } else {
      std::printf("%9d  %10.2f  %12.1f  %6.1f  %6.0f  %17.2f  %6d\n", n_instances, idle_pct, beats_per_s,
                  l.requests_per_s, l.output_tokens_per_s, per_request, l.errors);
      std::fflush(stdout);
    }
  }
  if (a.json_out) std::printf("%s\n", results.dump().c_str());
}

}  // namespace

void add_bench_router(CLI::App& bench) {
  auto a = std::make_shared<RouterBenchArgs>();
  CLI::App* cmd = bench.add_subcommand("router", "What one router process costs as the cluster grows (fake instances)");
  cmd->add_option("--instances", a->instances, "Registered instances per run, e.g. 2,16,64")->delimiter(',');
  cmd->add_option("--requests", a->requests, "Requests relayed per run")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("-c,--concurrency", a->concurrency, "Concurrent streams")->check(CLI::Range(1, 4096));
  cmd->add_option("--tokens", a->tokens, "Streamed chunks per response")->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--idle-seconds", a->idle_s, "How long the idle (heartbeats only) cost is measured")
      ->check(CLI::Range(0.5, 600.0));
  cmd->add_flag("--json", a->json_out, "One JSON array");
  cmd->callback([a] { run(*a); });
}

}  // namespace tandem::cli
