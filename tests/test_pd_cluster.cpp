// P/D across processes: `tandem cluster` starts a router and prefill and
// decode instances (real processes, UCX over TCP on loopback); requests go
// through the router's OpenAI API. Output must be token-identical to one
// `tandem serve` instance, and after the drain every instance's pool is back
// to its baseline. Each test owns its processes: a process group per
// cluster, ports picked free, every wait bounded, everything killed and
// reaped on every exit path.
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <map>
#include <vector>

#include "gguf/gguf.h"
#include "instance/fingerprint.h"
#include "model/model.h"
#include "model_fixtures.h"
#include "process_fixtures.h"
#include "serve_fixtures.h"
#include "pd/types.h"
#include "transport/ucx_transport.h"
#include "transport/wire.h"
#include "util/clock.h"

namespace tandem {
namespace {

using json = nlohmann::json;

using testing::free_port;

using testing::ProcessGroup;

struct Cluster {
  int port = free_port();
  std::unique_ptr<ProcessGroup> group;
  std::map<std::string, pid_t> pids;  // "router", "prefill 0", "decode 0", ...
  // `model`: a file of its own instead of the tiny model of `arch`.
  Cluster(int prefill, int decode, const std::string& mode, const std::string& extra = "", int kv_cache_mb = 16,
          const std::string& arch = "llama", const std::string& model_file = "") {
    const std::string model = model_file.empty() ? testing::tiny_model_path(arch, kernels::DType::kF16) : model_file;
    group = std::make_unique<ProcessGroup>(std::string(TANDEM_BINARY) + " cluster --prefill " + std::to_string(prefill) +
                                    " --decode " + std::to_string(decode) + " --mode " + mode + " -m " + model +
                                    " --port " + std::to_string(port) + " --kv-cache-mb " + std::to_string(kv_cache_mb) +
                                    " -t 1 --ready-timeout 60 " +
                                    extra);
  }
  bool ready() {
    std::string line;
    if (!group->wait_for("tandem cluster: pids:", 90'000, &line)) return false;
    // "... pids: router=1 prefill 0=2 decode 0=3"
    std::string rest = line.substr(line.find("pids:") + 5), name;
    size_t pos = 0;
    while (pos < rest.size()) {
      size_t eq = rest.find('=', pos);
      if (eq == std::string::npos) break;
      size_t end = rest.find(' ', eq);
      name = rest.substr(pos, eq - pos);
      while (!name.empty() && name.front() == ' ') name.erase(0, 1);
      pids[name] = std::stoi(rest.substr(eq + 1, end - eq - 1));
      pos = end == std::string::npos ? rest.size() : end + 1;
    }
    return group->wait_for("tandem cluster: ready", 30'000);
  }
};

struct Single {
  std::unique_ptr<ProcessGroup> group;
  int port = 0;
  explicit Single(const std::string& arch = "llama") {
    const std::string model = testing::tiny_model_path(arch, kernels::DType::kF16);
    group = std::make_unique<ProcessGroup>(std::string(TANDEM_BINARY) + " serve -m " + model +
                                    " --port 0 -t 1 --kv-cache-mb 16");
    std::string line;
    if (group->wait_for("http://127.0.0.1:", 30'000, &line)) port = std::stoi(line.substr(line.find("127.0.0.1:") + 10));
  }
};

json post(int port, const std::string& path, const json& body, int* status = nullptr) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(60, 0);
  auto r = cli.Post(path, body.dump(), "application/json");
  if (status) *status = r ? r->status : -1;
  if (!r) return json{{"client_error", httplib::to_string(r.error())}};
  json j = json::parse(r->body, nullptr, false);
  return j.is_discarded() ? json{{"status", r->status}, {"unparsed_body", r->body}} : j;
}

// The text of every choice, in index order.
std::vector<std::string> texts(const json& response) {
  std::vector<std::string> out;
  if (!response.is_object() || !response.contains("choices")) return {"<no choices: " + response.dump() + ">"};
  for (const json& c : response["choices"])
    out.push_back(c.contains("text") ? c["text"].get<std::string>() : c["message"]["content"].get<std::string>());
  return out;
}

// Streams a request and returns the concatenated text of choice 0.
std::string stream_text(int port, const std::string& path, json body) {
  body["stream"] = true;
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(60, 0);
  std::string raw;
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
    raw.append(d, n);
    return true;
  };
  httplib::Response res;
  httplib::Error err;
  cli.send(req, res, err);
  std::string text;
  size_t pos = 0;
  while ((pos = raw.find("data: {", pos)) != std::string::npos) {
    size_t end = raw.find("\n\n", pos);
    json j = json::parse(raw.substr(pos + 6, end - pos - 6), nullptr, false);
    pos = end;
    if (!j.is_object() || !j.contains("choices")) continue;
    for (const json& c : j["choices"]) {
      if (c.contains("text")) text += c["text"].get<std::string>();
      if (c.contains("delta") && c["delta"].contains("content")) text += c["delta"]["content"].get<std::string>();
    }
  }
  if (raw.find("data: [DONE]") == std::string::npos) text += "<no [DONE]>";
  return text;
}

double metric(int port, const std::string& name) { return testing::metric("127.0.0.1", port, name); }
// The router's `name` once it reaches `floor` (bounded: 5 s), for what it
// counts as a relay ends, after the client has read that end.
double metric_at_least(int port, const std::string& name, double floor) {
  return testing::metric_when("127.0.0.1", port, name, [floor](double v) { return v >= floor; });
}

std::vector<int> instance_ports(int router_port) {
  httplib::Client cli("127.0.0.1", router_port);
  auto r = cli.Get("/debug/instances");
  std::vector<int> ports;
  if (!r) return ports;
  const json listed = json::parse(r->body);
  for (const json& i : listed["instances"]) ports.push_back(i["api_port"].get<int>());
  return ports;
}

// An instance back to baseline: nothing held for a transfer, nothing waiting, nothing owned.
bool instance_drained(int port) {
  return metric(port, "tandem_kv_blocks_held_for_transfer") == 0 &&
         metric(port, "tandem_num_requests_waiting_remote_kv") == 0 &&
         metric(port, "tandem_kv_cache_usage_perc") == 0 && metric(port, "tandem_state_slots_used") == 0;
}

void expect_instances_drained(const std::vector<int>& ports) {
  for (int port : ports) {
    bool drained = false;
    for (int64_t until = monotonic_ms() + 10'000; monotonic_ms() < until && !drained;) {
      drained = instance_drained(port);
      if (!drained) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_TRUE(drained) << "instance on port " << port << " did not return to its baseline: held "
                         << metric(port, "tandem_kv_blocks_held_for_transfer") << ", waiting for KV "
                         << metric(port, "tandem_num_requests_waiting_remote_kv") << ", usage "
                         << metric(port, "tandem_kv_cache_usage_perc") << ", state slots "
                         << metric(port, "tandem_state_slots_used");
  }
}

// Every instance the router lists, read again each round (bounded: 15 s): a
// process that was replaced (a restarted data-parallel rank registers as a
// new node) stays listed under its dead port until its eviction (5 s).
void expect_drained(int router_port) {
  std::vector<int> ports;
  for (int64_t until = monotonic_ms() + 15'000; monotonic_ms() < until;) {
    ports = instance_ports(router_port);
    if (!ports.empty() && std::all_of(ports.begin(), ports.end(), instance_drained)) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_FALSE(ports.empty()) << "the router lists no instance";
  expect_instances_drained(ports);
}

json completion(const std::string& prompt, int max_tokens) {
  return {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true}};
}

struct ClusterCase {
  std::string mode;
  std::string tls;
  std::string arch = "llama";
};
void PrintTo(const ClusterCase& c, std::ostream* os) { *os << c.arch << " " << c.mode << " over " << c.tls; }

class PdCluster : public ::testing::TestWithParam<ClusterCase> {};

TEST_P(PdCluster, OneByOneThroughTheRouterEqualsOneInstance) {
  Cluster c(1, 1, GetParam().mode, "--ucx-tls " + GetParam().tls, 16, GetParam().arch);
  Single single(GetParam().arch);
  ASSERT_TRUE(c.ready()) << c.group->log();
  ASSERT_GT(single.port, 0) << single.group->log();
  for (const std::string& p : {std::string("Hi"), std::string("Once upon a time"),
                               std::string("The quick brown fox jumps over the lazy dog, and then again and again")}) {
    int status = 0;
    json got = post(c.port, "/v1/completions", completion(p, 12), &status);
    EXPECT_EQ(status, 200) << got.dump();
    EXPECT_EQ(texts(got), texts(post(single.port, "/v1/completions", completion(p, 12)))) << p;
  }
  // Streamed chat, parallel sampling with a seed (n = 8), and best_of.
  json chat = {{"messages", {{{"role", "user"}, {"content", "Tell me a story"}}}}, {"max_tokens", 10},
               {"temperature", 0}, {"stream_options", {{"include_usage", true}}}};
  EXPECT_EQ(stream_text(c.port, "/v1/chat/completions", chat), stream_text(single.port, "/v1/chat/completions", chat));
  json sampled = completion("Seeded siblings", 8);
  sampled["temperature"] = 0.8;
  sampled["seed"] = 42;
  sampled["n"] = 8;
  EXPECT_EQ(texts(post(c.port, "/v1/completions", sampled)), texts(post(single.port, "/v1/completions", sampled)));
  EXPECT_EQ(texts(post(c.port, "/v1/completions", sampled)).size(), 8u);
  json best = sampled;
  best["n"] = 2;
  best["best_of"] = 5;
  EXPECT_EQ(texts(post(c.port, "/v1/completions", best)), texts(post(single.port, "/v1/completions", best)));
  expect_drained(c.port);
}

INSTANTIATE_TEST_SUITE_P(Modes, PdCluster,
                         ::testing::Values(ClusterCase{"write", "tcp"}, ClusterCase{"read", "tcp"},
                                           ClusterCase{"write", "tcp,sm,self"}, ClusterCase{"read", "tcp,sm,self"},
                                           // MoE, and the hybrid whose recurrent state moves with the KV
                                           ClusterCase{"write", "tcp", "qwen3moe"},
                                           ClusterCase{"write", "tcp", "qwen3next"},
                                           ClusterCase{"read", "tcp", "qwen3next"}),
                         [](const auto& info) {
                           return (info.param.arch == "llama" ? "" : info.param.arch + "_") + info.param.mode +
                                  (info.param.tls == "tcp" ? "_tcp" : "_shared_memory");
                         });

// 32 concurrent mixed requests (completions, chat, seeded n > 1) on 2P2D and
// 1P3D: every one equals one instance's answer, every instance took part.
class PdClusterLoad : public ::testing::TestWithParam<std::pair<int, int>> {};

json mixed_request(int i) {
  if (i % 3 == 1)
    return {{"messages", {{{"role", "user"}, {"content", "chat number " + std::to_string(i)}}}},
            {"max_tokens", 6}, {"temperature", 0}};
  json r = completion("request number " + std::to_string(i) + std::string(static_cast<size_t>(i * 3), 'x'), 8);
  if (i % 3 == 2) {
    r["temperature"] = 0.7;
    r["seed"] = i;
    r["n"] = 3;
  }
  return r;
}

// mixed_request(0 .. n-1), all at once through `port`, each checked against
// one instance's answer (asked one by one on `single_port`); returns how many
// were equal.
int concurrent_mixed_requests_equal(int port, int single_port, int n) {
  auto path = [](int i) { return i % 3 == 1 ? "/v1/chat/completions" : "/v1/completions"; };
  std::vector<std::vector<std::string>> want, got(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) want.push_back(texts(post(single_port, path(i), mixed_request(i))));
  std::vector<std::thread> clients;
  for (int i = 0; i < n; ++i) clients.emplace_back([&, i] { got[i] = texts(post(port, path(i), mixed_request(i))); });
  for (auto& t : clients) t.join();
  int same = 0;
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(got[i], want[i]) << "request " << i;
    same += got[i] == want[i];
  }
  return same;
}

TEST_P(PdClusterLoad, ConcurrentMixedRequestsEqualOneInstance) {
  Cluster c(GetParam().first, GetParam().second, "write");
  Single single;
  ASSERT_TRUE(c.ready()) << c.group->log();
  ASSERT_GT(single.port, 0);
  constexpr int kRequests = 32;
  if (concurrent_mixed_requests_equal(c.port, single.port, kRequests) != kRequests) {
    c.group->wait_for("never printed", 500);
    httplib::Client cli("127.0.0.1", c.port);
    auto m = cli.Get("/metrics");
    ADD_FAILURE() << c.group->log() << (m ? m->body : "");
    for (int p : instance_ports(c.port)) {
      httplib::Client ic("127.0.0.1", p);
      auto im = ic.Get("/metrics");
      if (im) ADD_FAILURE() << "instance " << p << ": " << im->body.substr(im->body.find("tandem_http"));
    }
  }
  // Both prefills and both decodes took part.
  httplib::Client cli("127.0.0.1", c.port);
  auto r = cli.Get("/debug/instances");
  ASSERT_TRUE(r);
  const json listed = json::parse(r->body);
  for (const json& i : listed["instances"]) EXPECT_GT(i["requests"].get<int>(), 0) << i.dump();
  EXPECT_EQ(static_cast<int>(listed["instances"].size()), GetParam().first + GetParam().second);
  expect_drained(c.port);
}

// Seed 000's shape scaled down: 2 prefill and 2 decode instances, each
// decode a data-parallel group of 2 ranks with the experts split over them
// (qwen3moe). 64 concurrent mixed requests (seeded n > 1 among them) equal
// one instance's answers, every rank took part, nothing hangs, every pool
// drains, and the router counts each group as one decode instance.
TEST(PdClusterDataParallel, TwoPrefillsAndTwoExpertParallelDecodeGroupsServeSixtyFourMixedRequests) {
  Cluster c(2, 2, "write", "--decode-args '--data-parallel-size 2 --enable-expert-parallel'", 16, "qwen3moe");
  Single single("qwen3moe");
  ASSERT_TRUE(c.ready()) << c.group->log();
  ASSERT_GT(single.port, 0);
  constexpr int kRequests = 64;
  EXPECT_EQ(concurrent_mixed_requests_equal(c.port, single.port, kRequests), kRequests) << c.group->log();

  httplib::Client cli("127.0.0.1", c.port);
  const json health = json::parse(cli.Get("/health")->body);
  EXPECT_EQ(health.value("decode", 0), 2) << health.dump();
  EXPECT_EQ(health.value("decode_ranks", 0), 4) << health.dump();
  const json listed = json::parse(cli.Get("/debug/instances")->body);
  EXPECT_EQ(listed["instances"].size(), 6u);
  for (const json& i : listed["instances"]) {
    EXPECT_GT(i["requests"].get<int>(), 0) << i.dump();
    if (i["role"] == "decode") {
      EXPECT_EQ(i["data_parallel"]["size"], 2) << i.dump();
      const json dbg = json::parse(
          httplib::Client("127.0.0.1", i["api_port"].get<int>()).Get("/debug/parallel")->body, nullptr, false);
      EXPECT_GT(dbg["ops_by_kind"]["expert_dispatch"].value("count", int64_t{0}), 0) << dbg.dump();
      EXPECT_EQ(dbg.value("group_failures", -1), 0) << dbg.dump();
    }
  }
  expect_drained(c.port);
}

// Tensor parallelism on one side of a transfer: a TP instance's KV pool has
// the single-rank layout (each worker writes its own heads of it, the core
// registers it whole), so a TP=2 prefill feeds a TP=1 decode and the
// reverse, KV and recurrent state alike, in both transfer modes.
struct TpCase {
  std::string arch, mode, prefill_args, decode_args;
};
void PrintTo(const TpCase& c, std::ostream* os) {
  *os << c.arch << " " << c.mode << " prefill[" << c.prefill_args << "] decode[" << c.decode_args << "]";
}
class PdClusterTensorParallel : public ::testing::TestWithParam<TpCase> {};

TEST_P(PdClusterTensorParallel, ATensorParallelSideExchangesKvWithASingleRankOne) {
  const TpCase& tc = GetParam();
  Cluster c(1, 1, tc.mode, "--prefill-args '" + tc.prefill_args + "' --decode-args '" + tc.decode_args + "'", 16, tc.arch);
  Single single(tc.arch);
  ASSERT_TRUE(c.ready()) << c.group->log();
  ASSERT_GT(single.port, 0);
  constexpr int kRequests = 24;
  EXPECT_EQ(concurrent_mixed_requests_equal(c.port, single.port, kRequests), kRequests) << c.group->log();
  // The TP side ran every step on its workers, and moved the KV it computed or received.
  int tp_instances = 0;
  for (int port : instance_ports(c.port)) {
    const json dbg = json::parse(httplib::Client("127.0.0.1", port).Get("/debug/parallel")->body, nullptr, false);
    if (!dbg.is_object() || !dbg.contains("tensor_parallel")) continue;
    ++tp_instances;
    EXPECT_GT(dbg["tensor_parallel"].value("steps", 0), 0) << dbg.dump();
    EXPECT_EQ(dbg["tensor_parallel"].value("failures", -1), 0) << dbg.dump();
  }
  EXPECT_EQ(tp_instances, 1);
  expect_drained(c.port);
}

INSTANTIATE_TEST_SUITE_P(
    Sides, PdClusterTensorParallel,
    ::testing::Values(TpCase{"llama", "write", "--tensor-parallel-size 2", ""},
                      TpCase{"llama", "read", "", "--tensor-parallel-size 2"},
                      TpCase{"qwen3next", "write", "", "--tensor-parallel-size 2"},
                      TpCase{"qwen3next", "read", "--tensor-parallel-size 2", ""}),
    [](const auto& info) {
      return info.param.arch + "_" + info.param.mode + (info.param.prefill_args.empty() ? "_Tp1ToTp2" : "_Tp2ToTp1");
    });

// A decode group loses a rank (kill -9): the router sees the group not
// ready and stops picking its ranks until the restarted rank re-forms it;
// requests meanwhile go to the other decode group, and after it to both.
// (The front abandons its group as soon as its supervisor reaps the rank:
// were it to wait for a collective's timeout instead, the restarted rank
// could be back first, and the group would re-form without ever being seen
// out, as happened 1 run in 10 under ASan.)
TEST(PdClusterDataParallel, AKilledDecodeRankTakesItsGroupOutOfTheRouterUntilItReforms) {
  Cluster c(1, 2, "write", "--decode-args '--data-parallel-size 2 --data-parallel-timeout-ms 5000'");
  ASSERT_TRUE(c.ready()) << c.group->log();
  httplib::Client cli("127.0.0.1", c.port);
  const json listed = json::parse(cli.Get("/debug/instances")->body);
  int rank1_port = 0;
  std::string group;
  for (const json& i : listed["instances"])
    if (i["role"] == "decode" && i["data_parallel"]["rank"] == 1) {
      rank1_port = i["api_port"].get<int>();
      group = i["data_parallel"]["group"].get<std::string>();
    }
  ASSERT_GT(rank1_port, 0) << listed.dump();
  const json dbg = json::parse(httplib::Client("127.0.0.1", rank1_port).Get("/debug/parallel")->body, nullptr, false);
  const int pid = dbg.value("pid", 0);
  ASSERT_GT(pid, 0) << dbg.dump();
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  // The group's failure as the router knows it: rank 0's count of them.
  auto router_group_failures = [&] {
    auto r = cli.Get("/debug/instances");
    const json j = r ? json::parse(r->body, nullptr, false) : json();
    if (!j.is_object() || !j.contains("instances")) return int64_t{-1};
    for (const json& i : j["instances"])
      if (i["data_parallel"]["group"] == group && i["data_parallel"]["rank"] == 0)
        return i["data_parallel"].value("group_failures", int64_t{-1});
    return int64_t{-1};
  };
  bool saw_one = false, reformed = false;
  for (int64_t until = monotonic_ms() + 30'000; monotonic_ms() < until && !reformed;) {
    auto h = cli.Get("/health");
    const json health = h ? json::parse(h->body, nullptr, false) : json();
    const int decodes = health.is_object() ? health.value("decode", -1) : -1;
    if (decodes == 1) {
      saw_one = true;
      // Served meanwhile by the other group.
      EXPECT_EQ(texts(post(c.port, "/v1/completions", completion("while re-forming", 4))).size(), 1u);
    }
    reformed = decodes == 2 && health.value("decode_ranks", 0) == 4 && router_group_failures() >= 1;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  c.group->drain();
  // The router learned of the failure and has the group back. Whether a
  // /health poll fell inside the outage depends on how fast the rank
  // restarts (the front reports not ready from the moment its supervisor
  // reaps the rank until the group re-forms); when one did, the other group
  // served meanwhile (above).
  EXPECT_TRUE(reformed) << "saw the group out: " << saw_one << "\n" << c.group->log();
  EXPECT_NE(c.group->log().find("rank 1 (pid " + std::to_string(pid) + ") was killed by signal 9; restarting it"),
            std::string::npos)
      << c.group->log();
  EXPECT_EQ(texts(post(c.port, "/v1/completions", completion("after", 4))).size(), 1u);
  expect_drained(c.port);
}

INSTANTIATE_TEST_SUITE_P(Topologies, PdClusterLoad, ::testing::Values(std::make_pair(2, 2), std::make_pair(1, 3)),
                         [](const auto& info) {
                           return std::to_string(info.param.first) + "P" + std::to_string(info.param.second) + "D";
                         });

TEST(PdClusterErrors, NoDecodeInstanceIsA503NamingIt) {
  int port = free_port();
  setenv("TANDEM_CLUSTER_SECRET", "s", 1);
  ProcessGroup router(std::string(TANDEM_BINARY) + " router --port " + std::to_string(port));
  ASSERT_TRUE(router.wait_for("OpenAI API on", 10'000)) << router.log();
  int status = 0;
  json body = post(port, "/v1/completions", completion("x", 2), &status);
  EXPECT_EQ(status, 503);
  EXPECT_NE(body.dump().find("no healthy prefill instance"), std::string::npos) << body.dump();
  httplib::Client cli("127.0.0.1", port);
  auto health = cli.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
}

TEST(PdClusterErrors, AnInstanceWithAWrongSecretCannotJoin) {
  int port = free_port();
  setenv("TANDEM_CLUSTER_SECRET", "right", 1);
  ProcessGroup router(std::string(TANDEM_BINARY) + " router --port " + std::to_string(port));
  ASSERT_TRUE(router.wait_for("OpenAI API on", 10'000));
  const std::string model = testing::tiny_model_path("llama", kernels::DType::kF16);
  ProcessGroup intruder("env TANDEM_CLUSTER_SECRET=wrong " + std::string(TANDEM_BINARY) + " serve --role decode --router http://127.0.0.1:" +
                 std::to_string(port) + " -m " + model + " --port 0 -t 1 --kv-cache-mb 16");
  EXPECT_TRUE(intruder.wait_for("cluster secret differs", 20'000)) << intruder.log();
  int wstatus = 0;
  for (int64_t until = monotonic_ms() + 10'000; monotonic_ms() < until && waitpid(intruder.pid(), &wstatus, WNOHANG) == 0;)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) != 0);
  httplib::Client cli("127.0.0.1", port);
  auto r = cli.Get("/debug/instances");
  ASSERT_TRUE(r);
  EXPECT_TRUE(json::parse(r->body)["instances"].empty());
  EXPECT_GE(metric(port, "tandem_router_bad_signatures"), 1);
}

json instance_debug(int router_port, const std::string& role) {
  httplib::Client cli("127.0.0.1", router_port);
  auto r = cli.Get("/debug/instances");
  if (!r) return json();
  const json listed = json::parse(r->body);
  for (const json& i : listed["instances"]) {
    if (i["role"] != role) continue;
    httplib::Client inst("127.0.0.1", i["api_port"].get<int>());
    auto d = inst.Get("/debug/transfers");
    if (d) return json::parse(d->body, nullptr, false);
  }
  return json();
}

// Waits until the router lists an instance of `role` whose epoch differs from `old_epoch`.
bool rejoined(int router_port, const std::string& role, uint32_t old_epoch, int timeout_ms = 30'000) {
  for (int64_t until = monotonic_ms() + timeout_ms; monotonic_ms() < until;) {
    httplib::Client cli("127.0.0.1", router_port);
    auto r = cli.Get("/debug/instances");
    const json listed = r ? json::parse(r->body) : json::object();
    if (listed.contains("instances"))
      for (const json& i : listed["instances"])
        if (i["role"] == role && i["epoch"].get<uint32_t>() != old_epoch) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

uint32_t epoch_of(int router_port, const std::string& role) {
  httplib::Client cli("127.0.0.1", router_port);
  auto r = cli.Get("/debug/instances");
  if (!r) return 0;
  const json listed = json::parse(r->body);
  for (const json& i : listed["instances"])
    if (i["role"] == role) return i["epoch"].get<uint32_t>();
  return 0;
}

// kill -9 of the decode mid-stream: the client's stream ends with an error
// within the lease bound (never a hang); the supervisor restarts the decode
// in a new epoch, the prefill declares the old one dead, new requests succeed.
//
// "Mid-stream" is made certain rather than likely: the tiny model can stream
// all its tokens between the client's first chunk and a kill, so the client
// freezes the decode (SIGSTOP) on its first chunk, and the kill comes only
// once the frozen stream is seen unfinished; a stream that had already ended
// resumes the decode and is tried again.
TEST(PdClusterFailures, KillingTheDecodeMidStreamEndsTheStreamWithAnError) {
  Cluster c(1, 1, "write");
  ASSERT_TRUE(c.ready()) << c.group->log();
  const pid_t decode = c.pids.at("decode 0");
  uint32_t old_epoch = epoch_of(c.port, "decode");
  std::mutex mu;
  std::string raw;
  auto finished = [&] {
    std::lock_guard<std::mutex> lock(mu);
    return raw.find("[DONE]") != std::string::npos;
  };
  int64_t ended_ms = 0, killed_ms = 0;
  bool killed = false;
  for (int attempt = 0; attempt < 5 && !killed; ++attempt) {
    raw.clear();
    std::atomic<bool> stopped{false};
    std::thread client([&] {
      httplib::Client cli("127.0.0.1", c.port);
      cli.set_read_timeout(60, 0);
      httplib::Request req;
      req.method = "POST";
      req.path = "/v1/completions";
      req.body = json{{"prompt", "a long one"}, {"max_tokens", 400}, {"ignore_eos", true}, {"stream", true}}.dump();
      req.set_header("Content-Type", "application/json");
      req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
        std::lock_guard<std::mutex> lock(mu);
        raw.append(d, n);
        if (!stopped && raw.find("data: {") != std::string::npos) {
          ::kill(decode, SIGSTOP);
          stopped = true;
        }
        return true;
      };
      httplib::Response res;
      httplib::Error err;
      cli.send(req, res, err);
      ended_ms = monotonic_ms();
    });
    for (int i = 0; i < 4000 && !stopped; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (!stopped) {
      client.join();
      FAIL() << "no token in 20 s: " << raw << c.group->log();
    }
    // Let what the decode sent before it froze reach the client (well within
    // the 3 s lease, after which the router would end the stream itself).
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    if (finished()) {
      ASSERT_EQ(::kill(decode, SIGCONT), 0);
      client.join();
      continue;
    }
    killed_ms = monotonic_ms();
    ASSERT_EQ(::kill(decode, SIGKILL), 0);
    killed = true;
    client.join();
  }
  ASSERT_TRUE(killed) << "every stream ended before its decode froze";
  // Bounded, not fast: a generous multiple of the 3 s lease (this is no timing test).
  EXPECT_LT(ended_ms - killed_ms, 10'000) << "the client waited past the lease bound";
  EXPECT_NE(raw.find("\"error\""), std::string::npos) << raw.substr(raw.size() > 400 ? raw.size() - 400 : 0);
  EXPECT_EQ(raw.find("\"finish_reason\":\"length\""), std::string::npos);
  // Counted as failed, though the client got the whole (error) response
  // (counted when the relay ends, a moment after the client read its end).
  EXPECT_GE(metric_at_least(c.port, "tandem_router_requests_failed", 1), 1);
  ASSERT_TRUE(rejoined(c.port, "decode", old_epoch)) << c.group->log();
  // The restarted decode connects and serves; the prefill saw the old epoch die.
  bool served = false;
  for (int64_t until = monotonic_ms() + 20'000; monotonic_ms() < until && !served;) {
    int status = 0;
    json r = post(c.port, "/v1/completions", completion("after the restart", 4), &status);
    served = status == 200 && texts(r).size() == 1 && r.dump().find("error") == std::string::npos;
    if (!served) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_TRUE(served);
  json p = instance_debug(c.port, "prefill");
  EXPECT_GE(p.value("peer_deaths", 0), 1) << p.dump();
  expect_drained(c.port);
}

// kill -9 of the prefill while the decode holds its admission back (WRITE:
// the prefill holds computed KV waiting for the addresses): the decode frees
// everything and the router fails the request with a reason.
TEST(PdClusterFailures, KillingThePrefillMidTransferFailsTheRequestCleanly) {
  Cluster c(1, 1, "write", "--decode-args=--test-admission-delay-ms=3000");
  ASSERT_TRUE(c.ready()) << c.group->log();
  std::string body;
  int status = 0;
  int64_t sent_ms = monotonic_ms();
  std::thread client([&] { body = post(c.port, "/v1/completions", completion("doomed", 4), &status).dump(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ASSERT_EQ(kill(c.pids.at("prefill 0"), SIGKILL), 0);
  client.join();
  EXPECT_LT(monotonic_ms() - sent_ms, 20'000);  // bounded: admission delay + lease + grace
  EXPECT_NE(body.find("error"), std::string::npos) << body;
  EXPECT_NE(body.find("peer_dead"), std::string::npos) << body;
  expect_drained(c.port);
}

// Seed 000: the decode's admission takes longer than a fixed deferred-write
// expiry would allow (scaled: 4 s against a 3 s lease). Nothing expires; the
// request completes with the output of one instance.
TEST(PdClusterFailures, ASlowDecodeAdmissionStillCompletes) {
  Cluster c(1, 1, "write", "--decode-args=--test-admission-delay-ms=4000");
  Single single;
  ASSERT_TRUE(c.ready()) << c.group->log();
  ASSERT_GT(single.port, 0);
  int status = 0;
  json got = post(c.port, "/v1/completions", completion("slow admission", 6), &status);
  EXPECT_EQ(status, 200);
  EXPECT_EQ(texts(got), texts(post(single.port, "/v1/completions", completion("slow admission", 6))));
  json p = instance_debug(c.port, "prefill");
  EXPECT_GE(p.value("/transfers_by_state/Ended/count"_json_pointer, 0), 1) << p.dump();
  expect_drained(c.port);
}

// Seeded drops, duplicates and delays of every control frame on both
// instances: 200 requests, 8 at a time, all end, all token-identical to one
// instance, nothing leaks.
TEST(PdClusterSoak, TwoHundredRequestsUnderInjectedFaults) {
  const std::string faults = "--test-faults=seed=7,drop=0.1,dup=0.1,delay=0.2,max_delay_ms=150";
  Cluster c(1, 1, "write", "--prefill-args=" + faults + " --decode-args=" + faults);
  Single single;
  ASSERT_TRUE(c.ready()) << c.group->log();
  ASSERT_GT(single.port, 0);
  constexpr int kRequests = 200, kClients = 8;
  std::vector<std::vector<std::string>> want(kRequests), got(kRequests);
  auto prompt = [](int i) { return "soak " + std::to_string(i % 23) + std::string(static_cast<size_t>(i % 7), '!'); };
  for (int i = 0; i < 23 * 7 && i < kRequests; ++i) want[i] = texts(post(single.port, "/v1/completions", completion(prompt(i), 3)));
  for (int i = 23 * 7; i < kRequests; ++i) want[i] = want[i % (23 * 7)];
  std::atomic<int> next{0};
  std::vector<std::thread> clients;
  int64_t start = monotonic_ms();
  for (int k = 0; k < kClients; ++k)
    clients.emplace_back([&] {
      for (int i; (i = next++) < kRequests;) got[i] = texts(post(c.port, "/v1/completions", completion(prompt(i), 3)));
    });
  for (auto& t : clients) t.join();
  int same = 0;
  for (int i = 0; i < kRequests; ++i) same += got[i] == want[i];
  EXPECT_EQ(same, kRequests);
  std::fprintf(stderr, "soak: %d requests in %lld ms\n", kRequests, static_cast<long long>(monotonic_ms() - start));
  // The router's /metrics shows the cluster's protocol health from the
  // instances' heartbeats: both healthy, the duplicates the faults made, and
  // no transfer left in any state once drained.
  EXPECT_EQ(metric(c.port, "tandem_router_instances_by_health{health=\"healthy\"}"), 2);
  double duplicates = -1;
  for (int64_t until = monotonic_ms() + 5'000; monotonic_ms() < until && duplicates <= 0;) {
    duplicates = metric(c.port, "tandem_router_protocol_drops{reason=\"duplicate\"}");
    if (duplicates <= 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_GT(duplicates, 0);
  for (const char* role : {"prefill", "decode"}) {
    json d = instance_debug(c.port, role);
    EXPECT_GT(d.value("/injected_faults/dropped"_json_pointer, 0), 0) << d.dump() << c.group->log();
    EXPECT_GT(d.value("/drops/duplicate"_json_pointer, 0) + d.value("/drops/unknown"_json_pointer, 0) +
                  d.value("/drops/ended"_json_pointer, 0),
              0)
        << d.dump();
  }
  expect_drained(c.port);
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// A decode that died is still in the registry until its lease runs out; a
// request sent to it meanwhile is retried on the other decode, since nothing
// had reached the client yet.
// (No supervisor here: a restarted decode must not re-register before the request.)
TEST(PdClusterFailures, ARequestIsRetriedOnAnotherDecodeBeforeItsFirstByte) {
  const std::string model = testing::tiny_model_path("llama", kernels::DType::kF16);
  const std::string bin = TANDEM_BINARY;
  int port = free_port();
  setenv("TANDEM_CLUSTER_SECRET", "retry", 1);
  const std::string join = " --router http://127.0.0.1:" + std::to_string(port) + " -m " + model +
                           " --port 0 -t 1 --kv-cache-mb 16";
  ProcessGroup router(bin + " router --port " + std::to_string(port) + " --eviction-ms 60000");
  ASSERT_TRUE(router.wait_for("OpenAI API on", 10'000));
  ProcessGroup prefill(bin + " serve --role prefill --node-id 2" + join);
  ProcessGroup first(bin + " serve --role decode --node-id 3" + join);
  ProcessGroup second(bin + " serve --role decode --node-id 4" + join);
  for (ProcessGroup* g : {&prefill, &first, &second}) ASSERT_TRUE(g->wait_for("registered with", 30'000)) << g->log();
  Single single;
  ASSERT_GT(single.port, 0);
  // Node 3 is picked first (equal load, lowest id); it is gone but still registered.
  ASSERT_EQ(kill(first.pid(), SIGKILL), 0);
  waitpid(first.pid(), nullptr, 0);
  int status = 0;
  json got = post(port, "/v1/completions", completion("retried elsewhere", 6), &status);
  EXPECT_EQ(status, 200) << got.dump();
  EXPECT_EQ(texts(got), texts(post(single.port, "/v1/completions", completion("retried elsewhere", 6))));
  EXPECT_GE(metric(port, "tandem_router_retries"), 1);
}

// More work than the decode's KV cache holds at once: each request reserves
// its worst case (4 sequences of 400 tokens, with their copied blocks: 104 of
// the decode's 256 blocks), so the router never has more than two in flight
// there; the others wait for credits (counted) and all complete.
TEST(PdClusterCredits, RequestsBeyondTheDecodesCreditsWaitAtTheRouterAndComplete) {
  Cluster c(1, 1, "write", "", /*kv_cache_mb=*/1);
  ASSERT_TRUE(c.ready()) << c.group->log();
  json decode_info = json::object();
  const json listed = json::parse(httplib::Client("127.0.0.1", c.port).Get("/debug/instances")->body);
  for (const json& i : listed["instances"])
    if (i["role"] == "decode") decode_info = i;
  const int64_t capacity = decode_info.value("capacity_blocks", int64_t{0});
  ASSERT_EQ(capacity, 256) << listed.dump();
  constexpr int kRequests = 6;
  std::vector<int> statuses(kRequests, 0);
  std::vector<json> bodies(kRequests);
  std::atomic<bool> done{false};
  int64_t most_reserved = 0;
  std::thread watcher([&] {
    httplib::Client cli("127.0.0.1", c.port);
    while (!done) {
      if (auto r = cli.Get("/debug/instances")) {
        const json now = json::parse(r->body);
        for (const json& i : now["instances"])
          if (i["role"] == "decode") most_reserved = std::max(most_reserved, i.value("reserved_blocks", int64_t{0}));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  std::vector<std::thread> clients;
  for (int i = 0; i < kRequests; ++i)
    clients.emplace_back([&, i] {
      json body = completion("credits " + std::to_string(i), 400);
      body["n"] = 4;
      bodies[i] = post(c.port, "/v1/completions", body, &statuses[i]);
    });
  for (auto& t : clients) t.join();
  done = true;
  watcher.join();
  for (int i = 0; i < kRequests; ++i) {
    EXPECT_EQ(statuses[i], 200) << bodies[i].dump();
    ASSERT_EQ(bodies[i]["choices"].size(), 4u) << bodies[i].dump();
    EXPECT_EQ(bodies[i]["usage"]["completion_tokens"], 1600);
  }
  EXPECT_GT(most_reserved, 0);
  EXPECT_LE(most_reserved, capacity);
  EXPECT_GE(metric(c.port, "tandem_router_credit_waits"), 1);
  EXPECT_EQ(metric(c.port, "tandem_router_rejected_no_credits"), 0);
  EXPECT_EQ(metric(c.port, "tandem_router_requests_waiting_for_credits"), 0);
  const json after = json::parse(httplib::Client("127.0.0.1", c.port).Get("/debug/instances")->body);
  for (const json& i : after["instances"]) EXPECT_EQ(i.value("reserved_blocks", int64_t{-1}), 0) << i.dump();
  expect_drained(c.port);
}

// A decode killed and started again comes back in a new epoch (same node
// id): the router takes the new registration, new requests succeed, and a
// message still addressed to the old epoch (here from a peer the test plays,
// authenticated like any prefill) is dropped and counted, never acted on.
TEST(PdClusterFailures, ARestartedDecodeDropsAndCountsMessagesForItsOldEpoch) {
  const std::string model = testing::tiny_model_path("llama", kernels::DType::kF16);
  const std::string bin = TANDEM_BINARY;
  const int port = free_port();
  const std::string secret = "epochs";
  setenv("TANDEM_CLUSTER_SECRET", secret.c_str(), 1);
  const std::string join = " --router http://127.0.0.1:" + std::to_string(port) + " -m " + model +
                           " --port 0 -t 1 --kv-cache-mb 16";
  ProcessGroup router(bin + " router --port " + std::to_string(port) + " --eviction-ms 60000");
  ASSERT_TRUE(router.wait_for("OpenAI API on", 10'000));
  ProcessGroup prefill(bin + " serve --role prefill --node-id 2" + join);
  auto decode = std::make_unique<ProcessGroup>(bin + " serve --role decode --node-id 3" + join);
  ASSERT_TRUE(prefill.wait_for("registered with", 30'000)) << prefill.log();
  ASSERT_TRUE(decode->wait_for("registered with", 30'000)) << decode->log();
  Single single;
  ASSERT_GT(single.port, 0);
  auto decode_entry = [&] {
    httplib::Client cli("127.0.0.1", port);
    auto r = cli.Get("/debug/instances");
    const json listed = r ? json::parse(r->body, nullptr, false) : json();
    if (listed.is_object())
      for (const json& i : listed["instances"])
        if (i["role"] == "decode") return i;
    return json::object();
  };
  const json want = post(single.port, "/v1/completions", completion("before and after", 6));
  EXPECT_EQ(texts(post(port, "/v1/completions", completion("before and after", 6))), texts(want));
  const pd::Epoch old_epoch = decode_entry().value("epoch", pd::Epoch{0});
  ASSERT_GT(old_epoch, 0u);

  ASSERT_EQ(kill(-decode->pid(), SIGKILL), 0);
  waitpid(decode->pid(), nullptr, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(150));  // epochs count tenths of a second
  decode = std::make_unique<ProcessGroup>(bin + " serve --role decode --node-id 3" + join);
  ASSERT_TRUE(decode->wait_for("registered with", 30'000)) << decode->log();
  json entry = decode_entry();
  for (int64_t until = monotonic_ms() + 10'000; entry.value("epoch", pd::Epoch{0}) == old_epoch && monotonic_ms() < until;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    entry = decode_entry();
  }
  const pd::Epoch new_epoch = entry.value("epoch", pd::Epoch{0});
  ASSERT_GT(new_epoch, old_epoch) << entry.dump();
  // The prefill learns of the restart from the new incarnation's hand-shake
  // and heartbeats; a new request succeeds (a retry covers one sent before).
  json got;
  for (int64_t until = monotonic_ms() + 20'000; monotonic_ms() < until;) {
    int status = 0;
    got = post(port, "/v1/completions", completion("before and after", 6), &status);
    if (status == 200) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_EQ(texts(got), texts(want));

  // A peer still speaking to the old incarnation.
  const gguf::File file = gguf::File::open(model);
  auto m = Model::load(std::make_shared<const gguf::File>(gguf::File::open(model)));
  std::vector<uint8_t> region(4 * 4096, 0);
  transport::UcxTransportConfig tc;
  tc.secret = secret;
  tc.self.node = 9;
  tc.self.epoch = 1;
  tc.self.role = pd::Role::kPrefill;
  tc.self.fingerprint = instance::make_fingerprint(file, m->kv_shape(4, 16, kernels::DType::kF16), pd::TransferMode::kWrite);
  tc.region = region.data();
  tc.region_bytes = region.size();
  tc.n_blocks = 4;
  tc.block_bytes = 4096;
  transport::UcxTransport peer(tc);
  peer.connect("127.0.0.1", static_cast<uint16_t>(entry.value("transfer_port", 0)));
  bool connected = false;
  for (int64_t until = monotonic_ms() + 10'000; !connected && monotonic_ms() < until;) {
    std::vector<transport::TransportEvent> events;
    peer.poll(50, &events);
    for (const auto& e : events) connected |= e.kind == transport::TransportEvent::Kind::kConnected && e.peer == 3;
  }
  ASSERT_TRUE(connected) << "the restarted decode refused the hand-shake";
  pd::Message stale;
  stale.kind = pd::MessageKind::kWriteDone;
  stale.from = 9;
  stale.from_epoch = 1;
  stale.to = 3;
  stale.to_epoch = old_epoch;
  stale.transfer = (pd::TransferId{1} << pd::kTransferEpochShift) | 77;
  auto decode_debug = [&] {
    httplib::Client cli("127.0.0.1", entry.value("api_port", 0));
    auto r = cli.Get("/debug/transfers");
    return r ? json::parse(r->body, nullptr, false) : json();
  };
  const int64_t before = decode_debug().value("/drops/stale_epoch"_json_pointer, int64_t{-1});
  ASSERT_GE(before, 0);
  ASSERT_TRUE(peer.send(3, transport::encode_message(stale)));
  int64_t dropped = before;
  for (int64_t until = monotonic_ms() + 10'000; dropped == before && monotonic_ms() < until;) {
    std::vector<transport::TransportEvent> events;
    peer.poll(50, &events);  // keeps the connection served
    dropped = decode_debug().value("/drops/stale_epoch"_json_pointer, int64_t{0});
  }
  EXPECT_GE(dropped, before + 1) << decode_debug().dump();
  json d = decode_debug();
  EXPECT_EQ(d.value("spoofed_frames", -1), 0) << d.dump();
  EXPECT_EQ(d.value("live_transfers", -1), 0) << d.dump();
}

// A client that goes away mid-stream ends both legs: the decode stops
// decoding and every instance drains, well before max_tokens would have.
// SIGTERM on the router past its --shutdown-timeout (here 0 s): the stream
// in flight ends with an error its client sees, both legs end (no KV left
// held on either instance), and the router exits at once, not when the
// request would have finished.
TEST(PdClusterFailures, ARouterStoppedPastItsShutdownTimeoutEndsTheStreamWithAnErrorAndBothLegs) {
  Cluster c(1, 1, "write", "--router-args '--shutdown-timeout 0'");
  ASSERT_TRUE(c.ready()) << c.group->log();
  const std::vector<int> ports = instance_ports(c.port);
  ASSERT_EQ(ports.size(), 2u);
  const pid_t router = c.pids.at("router");
  testing::Stream s(c.port, completion("cut by the router", 450));
  ASSERT_TRUE(s.wait_for_token(20'000)) << c.group->log();
  ASSERT_TRUE(testing::signal_when_resumed(router, SIGTERM));
  (void)s.up->wait_body(60'000);
  const std::string raw = s.body_so_far();
  EXPECT_NE(raw.find("the router shut down before this request finished (--shutdown-timeout 0 s)"), std::string::npos)
      << raw;
  EXPECT_NE(raw.find("data: [DONE]"), std::string::npos) << raw;
  EXPECT_EQ(raw.find("\"finish_reason\":\"length\""), std::string::npos) << "the request ran to its end: " << raw;
  EXPECT_TRUE(c.group->wait_for("router (pid " + std::to_string(router) + ") exited with status 0", 10'000))
      << c.group->log();
  expect_instances_drained(ports);
}

// A cut-off does not wait on a prefill that has stopped answering: the
// prefill leg's call is cut like the decode's (it used to wait out its 30 s
// read timeout).
TEST(PdClusterFailures, ARouterStoppedPastItsShutdownTimeoutDoesNotWaitForAWedgedPrefill) {
  Cluster c(1, 1, "write", "--router-args '--shutdown-timeout 0'");
  ASSERT_TRUE(c.ready()) << c.group->log();
  const pid_t router = c.pids.at("router");
  const pid_t prefill = c.pids.at("prefill 0");
  ASSERT_EQ(::kill(prefill, SIGSTOP), 0);
  testing::Stream s(c.port, completion("a prefill that never answers", 8));
  const double in_prefill =
      metric_at_least(c.port, "tandem_router_transfers{phase=\"prefill\"}", 1);
  if (in_prefill < 1) ::kill(prefill, SIGCONT);
  ASSERT_GE(in_prefill, 1) << c.group->log();
  const int64_t stopped_ms = monotonic_ms();
  ASSERT_EQ(::kill(router, SIGTERM), 0);
  (void)s.up->wait_body(60'000);
  const int64_t ended_ms = monotonic_ms();
  ::kill(prefill, SIGCONT);
  const std::string raw = s.body_so_far();
  EXPECT_EQ(s.up->wait_status(0), 503) << raw;
  EXPECT_NE(raw.find("the router shut down before this request finished (--shutdown-timeout 0 s)"), std::string::npos)
      << raw;
  // Bounded well under the leg's 30 s read timeout (no timing test: the
  // cut's aborts may each take their 2 s read timeout on the stopped prefill).
  EXPECT_LT(ended_ms - stopped_ms, 15'000);
  EXPECT_TRUE(c.group->wait_for("router (pid " + std::to_string(router) + ") exited with status 0", 20'000))
      << c.group->log();
}

// A decode that freezes mid-stream (SIGSTOP: its sockets stay open, so no
// read fails) is evicted for silence, and the stream it was serving ends
// then with an error naming it, not after the request's 900 s timeout.
// Resumed, the instance drops that request and joins again.
TEST(PdClusterFailures, AStreamOnADecodeThatGoesSilentEndsWithAnErrorWhenItIsEvicted) {
  Cluster c(1, 1, "write");
  ASSERT_TRUE(c.ready()) << c.group->log();
  const std::vector<int> ports = instance_ports(c.port);
  const pid_t decode = c.pids.at("decode 0");
  const uint32_t old_epoch = epoch_of(c.port, "decode");
  std::string raw;
  int64_t stopped_ms = 0, ended_ms = 0;
  for (int attempt = 0; attempt < 3 && stopped_ms == 0; ++attempt) {
    testing::Stream s(c.port, completion("frozen mid-stream", 450));
    ASSERT_TRUE(s.wait_for_token(20'000)) << c.group->log();
    ASSERT_EQ(::kill(decode, SIGSTOP), 0);
    const int64_t at = monotonic_ms();
    (void)s.up->wait_body(60'000);
    ended_ms = monotonic_ms();
    raw = s.body_so_far();
    ASSERT_EQ(::kill(decode, SIGCONT), 0);
    // (A stream that had ended before the freeze tests nothing: again.)
    if (raw.find("\"finish_reason\":\"length\"") == std::string::npos) stopped_ms = at;
  }
  ASSERT_NE(stopped_ms, 0) << "every stream ended before its decode froze";
  EXPECT_NE(raw.find("the decode instance (node"), std::string::npos) << raw;
  EXPECT_NE(raw.find("went silent: no heartbeat for 5000 ms"), std::string::npos) << raw;
  EXPECT_NE(raw.find("data: [DONE]"), std::string::npos) << raw;
  // Bounded by the eviction (5 s) and its check (0.5 s), not the request's
  // timeout (no timing test: a generous multiple).
  EXPECT_LT(ended_ms - stopped_ms, 20'000) << raw;
  EXPECT_GE(metric_at_least(c.port, "tandem_router_requests_failed", 1), 1);
  // Resumed, it finds itself unknown at its next heartbeat and registers
  // again (the same process: its epoch is unchanged).
  bool listed = false;
  for (int64_t until = monotonic_ms() + 30'000; monotonic_ms() < until && !listed;) {
    listed = instance_ports(c.port).size() == 2 && epoch_of(c.port, "decode") == old_epoch;
    if (!listed) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(listed) << c.group->log();
  expect_instances_drained(ports);
  int status = 0;
  json r = post(c.port, "/v1/completions", completion("after the freeze", 4), &status);
  EXPECT_EQ(status, 200) << r.dump();
}

// A prefill that freezes before it answers is evicted for silence, and the
// request waiting on it is tried on another pair (here there is none: it
// fails, naming the silent instance) instead of waiting out the prefill
// call's 30 s.
TEST(PdClusterFailures, ARequestOnAPrefillThatGoesSilentIsGivenUpWhenItIsEvicted) {
  Cluster c(1, 1, "write");
  ASSERT_TRUE(c.ready()) << c.group->log();
  const std::vector<int> ports = instance_ports(c.port);
  const pid_t prefill = c.pids.at("prefill 0");
  ASSERT_EQ(::kill(prefill, SIGSTOP), 0);
  const int64_t stopped_ms = monotonic_ms();
  int status = 0;
  json r = post(c.port, "/v1/completions", completion("a prefill that froze", 8), &status);
  const int64_t ended_ms = monotonic_ms();
  ASSERT_EQ(::kill(prefill, SIGCONT), 0);
  EXPECT_EQ(status, 502) << r.dump();
  EXPECT_NE(r.dump().find("the prefill instance (node"), std::string::npos) << r.dump();
  EXPECT_NE(r.dump().find("went silent: no heartbeat for 5000 ms"), std::string::npos) << r.dump();
  EXPECT_NE(r.dump().find("(tried 1 time)"), std::string::npos) << r.dump();
  // Well under the prefill call's 30 s read timeout (the eviction is 5 s).
  EXPECT_LT(ended_ms - stopped_ms, 20'000) << r.dump();
  expect_instances_drained(ports);
}

// The decode samples a P/D request's first token: logits that are NaN there
// (a file with an infinity in one token's embedding) fail that request with the
// decode's reason passed on by the router (it used to abort the decode),
// and the cluster serves the others.
TEST(PdClusterFailures, NonFiniteLogitsFailTheirRequestWithTheReasonAndTheClusterGoesOn) {
  constexpr int kPoisoned = 7;
  Cluster c(1, 1, "write", "", 16, "llama", testing::infinite_token_model_path(kPoisoned));
  ASSERT_TRUE(c.ready()) << c.group->log();
  const std::string why = "the model produced logits that are NaN or infinite";
  json poisoned_prompt = {{"prompt", json::array({5, kPoisoned, 9})}, {"max_tokens", 8}, {"temperature", 0}};
  int status = 0;
  json r = post(c.port, "/v1/completions", poisoned_prompt, &status);
  // (Before any byte reached the client: tried on another decode, of which there is none.)
  EXPECT_EQ(status, 502) << r.dump();
  EXPECT_NE(r.dump().find("the decode instance (node"), std::string::npos) << r.dump();
  EXPECT_NE(r.dump().find("answered HTTP 500: Internal server error: " + why), std::string::npos) << r.dump();
  testing::Stream s(c.port, poisoned_prompt);
  (void)s.up->wait_body(60'000);
  EXPECT_NE(s.body_so_far().find(why), std::string::npos) << s.body_so_far();
  EXPECT_NE(s.body_so_far().find("data: [DONE]"), std::string::npos) << s.body_so_far();
  json clean = post(c.port, "/v1/completions", {{"prompt", json::array({5, 9, 11})}, {"max_tokens", 8}, {"temperature", 0}},
                    &status);
  EXPECT_EQ(status, 200) << clean.dump();
  EXPECT_EQ(clean["usage"]["completion_tokens"], 8) << clean.dump();
  expect_drained(c.port);
}

TEST(PdClusterFailures, AClientDisconnectAbortsBothLegs) {
  Cluster c(1, 1, "write");
  ASSERT_TRUE(c.ready()) << c.group->log();
  {
    httplib::Client cli("127.0.0.1", c.port);
    cli.set_read_timeout(60, 0);
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = json{{"prompt", "leaving early"}, {"max_tokens", 450}, {"ignore_eos", true}, {"stream", true}}.dump();
    req.set_header("Content-Type", "application/json");
    int events = 0;
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++events < 3; };  // then hang up
    httplib::Response res;
    httplib::Error err;
    cli.send(req, res, err);
  }
  expect_drained(c.port);
  EXPECT_GE(metric_at_least(c.port, "tandem_router_client_aborts", 1), 1);
  json d = instance_debug(c.port, "decode");
  EXPECT_EQ(d.value("live_transfers", -1), 0) << d.dump();
  EXPECT_GE(d.value("/ends/client_abort"_json_pointer, 0) + d.value("/ends/router_abort"_json_pointer, 0), 1) << d.dump();
}

// Connections beyond the HTTP workers and the bounded queue are answered at
// once with 503 and an OpenAI error, and counted; none waits unseen.
TEST(ServeOverload, ConnectionsBeyondTheQueueGet503AtOnce) {
  const std::string model = testing::tiny_model_path("llama", kernels::DType::kF16);
  ProcessGroup server(std::string(TANDEM_BINARY) + " serve -m " + model +
               " --port 0 -t 1 --kv-cache-mb 16 --http-threads 4 --max-queued-connections 2");
  std::string line;
  ASSERT_TRUE(server.wait_for("http://127.0.0.1:", 30'000, &line));
  int port = std::stoi(line.substr(line.find("127.0.0.1:") + 10));
  constexpr int kClients = 12;
  std::vector<int> statuses(kClients, 0);
  std::vector<std::string> bodies(kClients);
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i)
    clients.emplace_back([&, i] {
      httplib::Client cli("127.0.0.1", port);
      cli.set_read_timeout(60, 0);
      json body = {{"prompt", "busy"}, {"max_tokens", 400}, {"ignore_eos", true}, {"temperature", 0}};
      auto r = cli.Post("/v1/completions", body.dump(), "application/json");
      statuses[i] = r ? r->status : -1;
      bodies[i] = r ? r->body : "";
    });
  for (auto& t : clients) t.join();
  int ok = 0, rejected = 0;
  for (int i = 0; i < kClients; ++i) {
    if (statuses[i] == 200) ++ok;
    if (statuses[i] == 503) {
      ++rejected;
      EXPECT_NE(bodies[i].find("server_overloaded"), std::string::npos) << bodies[i];
    }
  }
  EXPECT_GE(ok, 1);
  EXPECT_LE(ok, 6);  // 4 workers + 2 waiting at most at once
  EXPECT_GE(rejected, 1);
  EXPECT_EQ(ok + rejected, kClients);
  EXPECT_EQ(metric(port, "tandem_http_connections_rejected"), rejected);
}

}  // namespace
}  // namespace tandem
