// Two hosts: the prefill (with the router) in one network namespace, the
// decode in another, joined by a veth pair the test creates (as root). UCX is
// restricted to TCP over the veth (namespaces share IPC and PIDs, so UCX would
// otherwise pick shared memory). In WRITE and READ: the output must equal one
// instance's (greedy, seeded n = 8, best_of, concurrent), every pool drains,
// and a decode killed mid-stream leaves an error at the client and nothing
// held on the prefill.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <future>
#include <nlohmann/json.hpp>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "model_fixtures.h"
#include "process_fixtures.h"
#include "util/clock.h"

namespace tandem {
namespace {

using json = nlohmann::json;

// One process (its own group), killed and reaped on every exit path.
struct Proc {
  pid_t pid = -1;
  explicit Proc(const std::string& cmd) {
    pid = fork();
    if (pid == 0) {
      setpgid(0, 0);
      execl("/bin/sh", "sh", "-c", ("exec " + cmd + " 2>/dev/null").c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    setpgid(pid, pid);
  }
  ~Proc() {
    kill(-pid, SIGTERM);
    for (int64_t until = monotonic_ms() + 10'000; monotonic_ms() < until && waitpid(pid, nullptr, WNOHANG) == 0;)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    kill(-pid, SIGKILL);
    waitpid(pid, nullptr, WNOHANG);
  }
};

using testing::in_namespace;
using testing::Namespaces;

using testing::free_port;
using testing::metric;

json post(const std::string& host, int port, const json& body) {
  httplib::Client cli(host, port);
  cli.set_connection_timeout(2, 0);
  cli.set_read_timeout(60, 0);
  auto r = cli.Post("/v1/completions", body.dump(), "application/json");
  if (!r) return json{{"client_error", httplib::to_string(r.error())}};
  json j = json::parse(r->body, nullptr, false);
  return j.is_discarded() ? json{{"status", r->status}, {"unparsed_body", r->body}} : j;
}

// The text of every choice, in index order.
std::vector<std::string> texts(const json& response) {
  if (!response.is_object() || !response.contains("choices")) return {"<no choices: " + response.dump() + ">"};
  std::vector<std::string> out;
  for (const json& c : response["choices"]) out.push_back(c["text"].get<std::string>());
  return out;
}

json greedy(const std::string& prompt, int max_tokens) {
  return {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true}};
}

json get(const std::string& host, int port, const std::string& path) {
  httplib::Client cli(host, port);
  cli.set_connection_timeout(2, 0);
  auto r = cli.Get(path);
  return r ? json::parse(r->body, nullptr, false) : json();
}

class PdTwoHosts : public ::testing::TestWithParam<std::string> {};

// The end-to-end checks of one host, across two: greedy, seeded n = 8 and
// best_of, concurrent requests, every pool back to its baseline; then the
// decode killed mid-stream: the client gets an error, the prefill frees all.
TEST_P(PdTwoHosts, PrefillAndDecodeInSeparateNetworkNamespacesOverTcp) {
  const std::string mode = GetParam();
  Namespaces ns;
  if (!ns.ok) {
    if (std::getenv("CI") != nullptr) FAIL() << "CI runs as root and must run this test: " << ns.why;
    GTEST_SKIP() << ns.why;
  }
  const std::string model = testing::tiny_model_path("llama", kernels::DType::kF16);
  const std::string bin = TANDEM_BINARY;
  setenv("TANDEM_CLUSTER_SECRET", "two-hosts", 1);
  const std::string common = " -m " + model + " --port 8001 -t 1 --kv-cache-mb 16 --kv-mode " + mode +
                             " --ucx-tls tcp --router http://192.0.2.1:8000";
  const int single_port = free_port();
  Proc router("ip netns exec " + ns.a + " " + bin + " router --host 192.0.2.1 --port 8000");
  Proc prefill("ip netns exec " + ns.a + " " + bin + " serve --role prefill --node-id 2 --host 192.0.2.1 --transfer-host 192.0.2.1 --ucx-net-devices " + ns.va + common);
  auto decode = std::make_unique<Proc>("ip netns exec " + ns.b + " " + bin + " serve --role decode --node-id 3 --host 192.0.2.2 --transfer-host 192.0.2.2 --ucx-net-devices " + ns.vb + common);
  Proc single(bin + " serve -m " + model + " --port " + std::to_string(single_port) + " -t 1 --kv-cache-mb 16");
  auto at_router = [&](const json& body) { return in_namespace(ns.a, [&] { return post("192.0.2.1", 8000, body); }); };

  bool healthy = in_namespace(ns.a, [] {
    for (int64_t until = monotonic_ms() + 60'000; monotonic_ms() < until;) {
      httplib::Client cli("192.0.2.1", 8000);
      cli.set_connection_timeout(1, 0);
      auto r = cli.Get("/health");
      if (r && r->status == 200) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  });
  ASSERT_TRUE(healthy) << "the router in " << ns.a << " never saw both instances";
  std::vector<json> bodies = {greedy("across two hosts", 10),
                              greedy("a longer prompt that spans several KV blocks of sixteen tokens each, or nearly", 10)};
  json sampled = greedy("seeded siblings across hosts", 8);
  sampled["temperature"] = 0.8;
  sampled["seed"] = 42;
  sampled["n"] = 8;
  bodies.push_back(sampled);
  json best = sampled;
  best["n"] = 2;
  best["best_of"] = 5;
  bodies.push_back(best);
  std::vector<std::vector<std::string>> want;
  for (const json& b : bodies) {
    json w;
    for (int64_t until = monotonic_ms() + 30'000; monotonic_ms() < until;) {
      w = post("127.0.0.1", single_port, b);
      if (!w.contains("client_error")) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    want.push_back(texts(w));
  }
  for (size_t i = 0; i < bodies.size(); ++i) EXPECT_EQ(texts(at_router(bodies[i])), want[i]) << bodies[i].dump();
  EXPECT_EQ(want[2].size(), 8u);

  // Concurrent requests, each client on its own thread in the router's namespace.
  constexpr int kConcurrent = 16;
  std::vector<std::vector<std::string>> got(kConcurrent);
  std::vector<std::thread> clients;
  for (int i = 0; i < kConcurrent; ++i)
    clients.emplace_back([&, i] { got[i] = texts(at_router(bodies[static_cast<size_t>(i) % bodies.size()])); });
  for (auto& t : clients) t.join();
  for (int i = 0; i < kConcurrent; ++i) EXPECT_EQ(got[i], want[static_cast<size_t>(i) % bodies.size()]) << i;

  // Every pool back to its baseline, on both hosts; the KV crossed the veth.
  auto drained = [](const std::string& host) {
    for (int64_t until = monotonic_ms() + 10'000; monotonic_ms() < until;) {
      if (metric(host, 8001, "tandem_kv_blocks_held_for_transfer") == 0 &&
          metric(host, 8001, "tandem_num_requests_waiting_remote_kv") == 0 &&
          metric(host, 8001, "tandem_kv_cache_usage_perc") == 0)
        return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  };
  EXPECT_TRUE(in_namespace(ns.a, [&] { return drained("192.0.2.1"); })) << "the prefill did not drain";
  EXPECT_TRUE(in_namespace(ns.b, [&] { return drained("192.0.2.2"); })) << "the decode did not drain";
  json d = in_namespace(ns.b, [] { return get("192.0.2.2", 8001, "/debug/transfers"); });
  json p = in_namespace(ns.a, [] { return get("192.0.2.1", 8001, "/debug/transfers"); });
  ASSERT_TRUE(d.is_object() && p.is_object());
  EXPECT_EQ(d.value("live_transfers", -1), 0) << d.dump();
  EXPECT_EQ(d.value("blocks_held", -1), 0) << d.dump();
  EXPECT_GE(d.value("/ends/completed"_json_pointer, 0), static_cast<int>(bodies.size()) + kConcurrent) << d.dump();
  // WRITE: the prefill posts the puts; READ: the decode posts the gets.
  EXPECT_GT((mode == "write" ? p : d).value("rma_posts", 0), 0) << p.dump() << d.dump();
  EXPECT_EQ((mode == "write" ? d : p).value("rma_posts", -1), 0) << p.dump() << d.dump();

  // kill -9 of the decode mid-stream (once its first token is in): the
  // client's stream ends with an error (never a silent truncation), and the
  // prefill frees everything.
  std::string raw;
  std::atomic<int64_t> killed_ms{0};
  const pid_t decode_pid = decode->pid;
  std::thread streamer([&] {
    in_namespace(ns.a, [&] {
      httplib::Client cli("192.0.2.1", 8000);
      cli.set_read_timeout(60, 0);
      httplib::Request req;
      req.method = "POST";
      req.path = "/v1/completions";
      json body = greedy("killed across hosts", 450);
      body["stream"] = true;
      req.body = body.dump();
      req.set_header("Content-Type", "application/json");
      req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
        raw.append(data, n);
        if (killed_ms == 0 && raw.find("data: {") != std::string::npos) {
          kill(-decode_pid, SIGKILL);
          killed_ms = monotonic_ms();
        }
        return true;
      };
      httplib::Response res;
      httplib::Error err;
      cli.send(req, res, err);
      return 0;
    });
  });
  streamer.join();
  ASSERT_GT(killed_ms.load(), 0) << "no token was streamed: " << raw.substr(0, 300);
  EXPECT_LT(monotonic_ms() - killed_ms, 15'000) << "the stream did not end within the lease bound";
  EXPECT_NE(raw.find("\"error\""), std::string::npos) << raw.substr(0, 300);
  decode.reset();
  EXPECT_TRUE(in_namespace(ns.a, [&] { return drained("192.0.2.1"); })) << "the prefill kept blocks of the dead decode";
}

INSTANTIATE_TEST_SUITE_P(Modes, PdTwoHosts, ::testing::Values("write", "read"));

}  // namespace
}  // namespace tandem
