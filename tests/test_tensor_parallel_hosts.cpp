// Tensor parallelism across hosts: the engine core and worker 0 in one
// network namespace, worker 1 in another (`tandem tensor-worker --join`),
// joined over a veth pair; the collectives go through gloo over TCP, the
// steps and replies over the worker's link. Answers equal one instance's to
// the bit; a stopped remote worker is named past the soft deadline and the
// step resumes on SIGCONT; a killed one fails what was in flight naming its
// host, the core says why on /health, and once a new worker joins the
// instance serves again, with the prefix cache forgotten (the new process
// holds none of the KV). As root only (namespaces); each process owned.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "process_fixtures.h"
#include "serve_fixtures.h"

namespace tandem {
namespace {

using json = nlohmann::json;
using testing::get;
using testing::post;
using testing::ProcessGroup;
using testing::Serve;
using testing::texts;

constexpr const char* kCore = "192.0.2.1";
constexpr const char* kRemote = "192.0.2.2";

// The core (and worker 0) in namespace a, worker 1 joined from namespace b.
struct TwoHosts {
  testing::Namespaces ns;
  std::string dir = "/tmp/tandem-tp-hosts-" + std::to_string(::getpid());
  std::unique_ptr<ProcessGroup> core, remote;
  std::string at;  // the core's join address
  std::string remote_cmd;
  explicit TwoHosts(const std::string& arch) {
    if (!ns.ok) return;
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    core = std::make_unique<ProcessGroup>(
        "ip netns exec " + ns.a + " " + std::string(TANDEM_BINARY) + " serve -m " + testing::tiny_model(arch) +
        " -t 1 --kv-cache-mb 16 --host " + kCore + " --port 8000 --tensor-parallel-size 2"
        " --tensor-parallel-local-workers 1 --tensor-parallel-host " + kCore + " --tensor-parallel-rendezvous " + dir +
        " --tensor-parallel-soft-deadline-ms 300 --tensor-parallel-timeout-ms 30000");
    std::string line;
    if (!core->wait_for("join at ", 30'000, &line)) return;
    const size_t from = line.find("join at ") + 8;
    at = line.substr(from, line.find(' ', from) - from);
    remote_cmd = "ip netns exec " + ns.b + " " + std::string(TANDEM_BINARY) + " tensor-worker --join " + at +
                 " --rank 1 --host " + kRemote + " -t 1 --join-timeout-ms 60000";
    remote = std::make_unique<ProcessGroup>(remote_cmd);
  }
  ~TwoHosts() {
    remote.reset();
    core.reset();
    std::filesystem::remove_all(dir);
  }
  bool serving() { return core && remote && core->wait_for("tandem: serving", 60'000); }
  std::string log() const { return (core ? core->log() : "") + (remote ? remote->log() : ""); }
  json post_core(const json& body) {
    return testing::in_namespace(ns.a, [&] { return post(8000, body, kCore); });
  }
  json debug() {
    return testing::in_namespace(ns.a, [] { return get(8000, "/debug/parallel", kCore); })
        .value("tensor_parallel", json::object());
  }
};

// Concurrent requests (greedy, and seeded with n = 2: the siblings' copied
// KV and recurrent state must reach the remote worker's own pool) equal one
// instance's, on a plain and on a hybrid architecture.
class TensorParallelTwoHosts : public ::testing::TestWithParam<std::string> {};

TEST_P(TensorParallelTwoHosts, AWorkerOnAnotherHostAnswersAsOneInstanceDoes) {
  TwoHosts h(GetParam());
  if (!h.ns.ok) GTEST_SKIP() << h.ns.why;
  ASSERT_TRUE(h.serving()) << h.log();
  Serve single("", GetParam());
  ASSERT_TRUE(single.ready(1)) << single.group->log();
  constexpr int kRequests = 6;
  std::vector<json> got(kRequests);
  std::vector<std::thread> clients;
  for (int i = 0; i < kRequests; ++i)
    clients.emplace_back([&, i] { got[static_cast<size_t>(i)] = h.post_core(testing::request(i)); });
  for (auto& t : clients) t.join();
  const json tp = h.debug();  // at once: a status a heartbeat behind would show
  for (int i = 0; i < kRequests; ++i)
    EXPECT_EQ(texts(got[static_cast<size_t>(i)]), texts(post(single.port, testing::request(i)))) << "request " << i;
  ASSERT_TRUE(tp.contains("workers")) << tp.dump();
  EXPECT_EQ(tp["workers"][0].value("host", ""), "local");
  EXPECT_EQ(tp["workers"][1].value("host", "").rfind(std::string(kRemote) + ":", 0), 0u) << tp.dump();
  EXPECT_GT(tp["workers"][1].value("tensor_gathers", 0), 0) << "worker 1's counters come over its link";
  // ...sent with every reply, so once the requests are answered they are
  // worker 0's, not a heartbeat behind.
  EXPECT_EQ(tp["workers"][1].value("steps_done", -1), tp["workers"][0].value("steps_done", -2)) << tp.dump();
  EXPECT_EQ(tp["workers"][1].value("tensor_gathers", -1), tp["workers"][0].value("tensor_gathers", -2)) << tp.dump();
  EXPECT_EQ(tp.value("join_address", ""), h.at);
  EXPECT_EQ(tp.value("failures", -1), 0);
}

INSTANTIATE_TEST_SUITE_P(Arch, TensorParallelTwoHosts, ::testing::Values("llama", "qwen3next"),
                         [](const auto& info) { return info.param; });

TEST(TensorParallelTwoHostsFailures, ARemoteWorkerIsNamedWhenStoppedOrKilledAndANewOneRejoinsWithTheCacheForgotten) {
  TwoHosts h("llama");
  if (!h.ns.ok) GTEST_SKIP() << h.ns.why;
  ASSERT_TRUE(h.serving()) << h.log();
  Serve single("");
  ASSERT_TRUE(single.ready(1)) << single.group->log();
  ProcessGroup& core = *h.core;
  std::string line;

  // A prompt of several blocks, twice: the second reuses its cached prefix.
  std::vector<int> prompt;
  for (int i = 0; i < 70; ++i) prompt.push_back((i * 53 + 7) % 1000);
  const json cached_body = {{"prompt", prompt}, {"max_tokens", 8}, {"temperature", 0}};
  const json first = h.post_core(cached_body), again = h.post_core(cached_body);
  EXPECT_EQ(texts(first), texts(post(single.port, cached_body)));
  EXPECT_EQ(texts(again), texts(first));
  EXPECT_GE(again["usage"]["prompt_tokens_details"].value("cached_tokens", 0), 64) << again.dump();
  // SIGSTOP of the remote worker: the soft-deadline report names it, with
  // its host and its heartbeat; SIGCONT and the request completes.
  const json long_body = {{"prompt", "long"}, {"max_tokens", 300}, {"temperature", 0}, {"ignore_eos", true}};
  json long_answer;
  std::thread in_flight([&] { long_answer = h.post_core(long_body); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_EQ(::kill(-h.remote->pid(), SIGSTOP), 0);
  const bool reported = core.wait_for("the engine core (reader) waits for the reply of worker", 10'000, &line);
  ASSERT_EQ(::kill(-h.remote->pid(), SIGCONT), 0);
  in_flight.join();
  ASSERT_TRUE(reported) << core.log();
  EXPECT_NE(line.find("worker 1 (no reply): on " + std::string(kRemote) + ":"), std::string::npos) << line;
  // Where the stop caught it: inside a collective worker 0 waits in (worker
  // 0's op misses rank 1), past the collectives' frames (their data phase),
  // or after its step's last collective and before its reply (worker 0 has
  // replied).
  EXPECT_TRUE(line.find("missing {1}") != std::string::npos || line.find("(its data phase") != std::string::npos ||
              line.find("worker 0 (replied)") != std::string::npos)
      << line;
  EXPECT_EQ(texts(long_answer), texts(post(single.port, long_body))) << long_answer.dump();
  EXPECT_EQ(h.debug().value("failures", -1), 0);

  // kill -9 of the remote worker mid-request: the request fails naming it
  // (or finished first), the core is unhealthy saying why, and a new worker
  // that joins is taken into a fresh set.
  std::thread doomed([&] { long_answer = h.post_core(long_body); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  h.remote.reset();  // SIGTERM then SIGKILL of its process group
  doomed.join();
  const std::string answer = long_answer.dump();
  EXPECT_TRUE(answer.find("tensor-parallel worker 1 on " + std::string(kRemote)) != std::string::npos ||
              texts(long_answer).size() == 1)
      << answer;
  // The core names it whichever way it learns first: its link's reader
  // finds it gone, or the next step's send finds the link broken.
  ASSERT_TRUE(core.wait_for("the workers are restarted", 10'000, &line)) << core.log();
  EXPECT_NE(line.find("tensor-parallel worker 1 on " + std::string(kRemote)), std::string::npos) << line;
  EXPECT_TRUE(line.find("is gone") != std::string::npos || line.find("could not be sent") != std::string::npos) << line;
  const std::string health = testing::in_namespace(h.ns.a, [] {
    httplib::Client cli(kCore, 8000);
    auto r = cli.Get("/health");
    return r ? std::to_string(r->status) + " " + r->body : std::string("no answer");
  });
  EXPECT_EQ(health.rfind("503", 0), 0u) << health;
  EXPECT_NE(health.find("worker 1"), std::string::npos) << health;
  h.remote = std::make_unique<ProcessGroup>(h.remote_cmd);
  ASSERT_TRUE(core.wait_for("workers ready (generation", 30'000)) << h.log();
  // The same prompt: the same answer, computed afresh (its cached blocks were forgotten).
  const json after = h.post_core(cached_body);
  EXPECT_EQ(texts(after), texts(first)) << after.dump();
  EXPECT_EQ(after["usage"]["prompt_tokens_details"].value("cached_tokens", -1), 0) << after.dump();
  const json tp = h.debug();
  EXPECT_GE(tp.value("generation", 0), 2);
  EXPECT_GE(tp.value("failures", 0), 1);
}

}  // namespace
}  // namespace tandem
