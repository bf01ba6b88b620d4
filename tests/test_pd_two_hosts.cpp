// Two hosts: the prefill (with the router) in one network namespace, the
// decode in another, joined by a veth pair the test creates (as root). UCX is
// restricted to TCP over the veth (namespaces share IPC and PIDs, so UCX would
// otherwise pick shared memory). The output must equal one instance's.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <future>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "model_fixtures.h"
#include "util/clock.h"

namespace tandem {
namespace {

using json = nlohmann::json;

bool run(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()) == 0; }

// Two namespaces and a veth pair between them; all deleted on every exit path.
struct Namespaces {
  std::string a, b, va, vb;
  bool ok = false;
  std::string why;
  Namespaces() {
    std::string tag = std::to_string(getpid() % 100000);
    a = "tdm-p" + tag;
    b = "tdm-d" + tag;
    va = "tdmp" + tag;
    vb = "tdmd" + tag;
    if (geteuid() != 0) {
      why = "not root: network namespaces cannot be created";
      return;
    }
    ok = run("ip netns add " + a) && run("ip netns add " + b) &&
         run("ip link add " + va + " type veth peer name " + vb) && run("ip link set " + va + " netns " + a) &&
         run("ip link set " + vb + " netns " + b) && run("ip -n " + a + " addr add 192.0.2.1/24 dev " + va) &&
         run("ip -n " + b + " addr add 192.0.2.2/24 dev " + vb) && run("ip -n " + a + " link set " + va + " up") &&
         run("ip -n " + b + " link set " + vb + " up") && run("ip -n " + a + " link set lo up") &&
         run("ip -n " + b + " link set lo up");
    if (!ok) why = "ip netns / veth set-up failed (is iproute2 installed, and may this user create namespaces?)";
  }
  ~Namespaces() {
    run("ip netns del " + a);
    run("ip netns del " + b);
  }
};

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

// Runs `f` on a thread that has entered network namespace `ns`.
template <typename F>
auto in_namespace(const std::string& ns, F f) {
  return std::async(std::launch::async, [ns, f] {
    int fd = open(("/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
    bool entered = fd >= 0 && setns(fd, CLONE_NEWNET) == 0;
    if (fd >= 0) close(fd);
    if (!entered) throw std::runtime_error("setns into " + ns + " failed");
    return f();
  }).get();
}

std::string complete(const std::string& host, int port, const std::string& prompt) {
  httplib::Client cli(host, port);
  cli.set_read_timeout(60, 0);
  json body = {{"prompt", prompt}, {"max_tokens", 10}, {"temperature", 0}, {"ignore_eos", true}};
  auto r = cli.Post("/v1/completions", body.dump(), "application/json");
  if (!r || r->status != 200) return "<" + (r ? std::to_string(r->status) + " " + r->body : std::string("no answer")) + ">";
  json j = json::parse(r->body, nullptr, false);
  return j.is_object() ? j["choices"][0]["text"].get<std::string>() : "<bad json>";
}

TEST(PdTwoHosts, PrefillAndDecodeInSeparateNetworkNamespacesOverTcp) {
  Namespaces ns;
  if (!ns.ok) {
    if (std::getenv("CI") != nullptr) FAIL() << "CI runs as root and must run this test: " << ns.why;
    GTEST_SKIP() << ns.why;
  }
  const std::string model = testing::tiny_model_path("llama", kernels::DType::kF16);
  const std::string bin = TANDEM_BINARY;
  setenv("TANDEM_CLUSTER_SECRET", "two-hosts", 1);
  const std::string common = " -m " + model + " --port 8001 -t 1 --kv-cache-mb 16 --kv-mode write --ucx-tls tcp --router http://192.0.2.1:8000";
  Proc router("ip netns exec " + ns.a + " " + bin + " router --host 192.0.2.1 --port 8000");
  Proc prefill("ip netns exec " + ns.a + " " + bin + " serve --role prefill --node-id 2 --host 192.0.2.1 --transfer-host 192.0.2.1 --ucx-net-devices " + ns.va + common);
  Proc decode("ip netns exec " + ns.b + " " + bin + " serve --role decode --node-id 3 --host 192.0.2.2 --transfer-host 192.0.2.2 --ucx-net-devices " + ns.vb + common);
  Proc single(bin + " serve -m " + model + " --port 18931 -t 1 --kv-cache-mb 16");

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
  for (const std::string& p : {std::string("across two hosts"), std::string("a longer prompt that spans several KV blocks of sixteen tokens each, or nearly")}) {
    std::string got = in_namespace(ns.a, [&] { return complete("192.0.2.1", 8000, p); });
    std::string want;
    for (int64_t until = monotonic_ms() + 30'000; monotonic_ms() < until;) {
      want = complete("127.0.0.1", 18931, p);
      if (want.rfind("<no answer", 0) != 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_EQ(got, want) << p;
  }
  // The KV really crossed the veth: the decode's agent posted nothing itself
  // (WRITE), the prefill wrote over TCP and both sides are drained.
  json d = in_namespace(ns.b, [] {
    httplib::Client cli("192.0.2.2", 8001);
    auto r = cli.Get("/debug/transfers");
    return r ? json::parse(r->body, nullptr, false) : json();
  });
  ASSERT_TRUE(d.is_object());
  EXPECT_EQ(d.value("live_transfers", -1), 0) << d.dump();
  EXPECT_EQ(d.value("blocks_held", -1), 0) << d.dump();
  EXPECT_GE(d.value("/ends/completed"_json_pointer, 0), 2) << d.dump();
}

}  // namespace
}  // namespace tandem
