// `tandem serve --tensor-parallel-size 2` as real processes: the engine core
// and two workers over the broadcast ring and a shared KV pool. Answers equal
// one instance's to the bit; a killed worker is named and replaced; a stopped
// one is reported past the soft deadline and the step resumes on SIGCONT; a
// worker that throws fails the step on every worker and the next request is
// served; seed 003's idle cycles and storm pass; P/D between TP=2 and TP=1
// instances moves the KV correctly both ways. Each test owns its processes.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdio>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "process_fixtures.h"
#include "serve_fixtures.h"

namespace tandem {
namespace {

using json = nlohmann::json;
using testing::expect_concurrent_requests_equal;
using testing::get;
using testing::health;
using testing::kv_usage_when_drained;
using testing::metric;
using testing::post;
using testing::ProcessGroup;
using testing::Serve;
using testing::Stream;
using testing::texts;

const char* kTp2 = "--tensor-parallel-size 2 ";

int worker_pid(int port, int rank) {
  const json dbg = get(port, "/debug/parallel");
  if (!dbg.contains("tensor_parallel")) return 0;
  return dbg["tensor_parallel"]["workers"][static_cast<size_t>(rank)].value("pid", 0);
}

// Waits (bounded) until a set of workers of `generation` or later is ready.
bool workers_ready(int port, int generation, int timeout_ms) {
  for (int i = 0; i < timeout_ms / 20; ++i) {
    const json tp = get(port, "/debug/parallel").value("tensor_parallel", json::object());
    if (tp.value("generation", 0) >= generation && tp.value("ready", false)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

class TensorParallelServe : public ::testing::TestWithParam<std::string> {};

TEST_P(TensorParallelServe, TwoWorkersAnswerAsOneInstanceDoesWithTheSameLogprobs) {
  Serve single("", GetParam());
  Serve tp(kTp2, GetParam());
  ASSERT_TRUE(single.ready(1)) << single.group->log();
  ASSERT_TRUE(tp.ready(1)) << tp.group->log();
  expect_concurrent_requests_equal(tp.port, single.port, 10);
  // The log-probabilities too, to the last digit printed (the shortest
  // round-trip form of each float).
  const json body = {{"prompt", "logprobs of"}, {"max_tokens", 12}, {"temperature", 0}, {"logprobs", 3}};
  const json a = post(tp.port, body), b = post(single.port, body);
  ASSERT_TRUE(a.contains("choices")) << a.dump();
  EXPECT_EQ(a["choices"][0]["logprobs"], b["choices"][0]["logprobs"]);
  EXPECT_EQ(kv_usage_when_drained("127.0.0.1", tp.port), 0);
  EXPECT_EQ(metric("127.0.0.1", tp.port, "tandem_tp_failures_total"), 0);
  EXPECT_GT(metric("127.0.0.1", tp.port, "tandem_tp_worker_gathers_total{rank=\"1\"}"), 0);
}

INSTANTIATE_TEST_SUITE_P(Arch, TensorParallelServe, ::testing::Values("llama", "qwen2", "qwen3moe", "qwen3next"),
                         [](const auto& info) { return info.param; });

TEST(TensorParallelFailures, AKilledWorkerFailsTheStepsRequestsNamingItThenTheWorkersRestartAndServe) {
  Serve tp(std::string(kTp2) + "--tensor-parallel-timeout-ms 10000");
  ASSERT_TRUE(tp.ready(1)) << tp.group->log();
  const int pid1 = worker_pid(tp.port, 1);
  ASSERT_GT(pid1, 0);
  Stream s(tp.port, {{"prompt", "long"}, {"max_tokens", 480}, {"temperature", 0}, {"ignore_eos", true}});
  ASSERT_TRUE(s.wait_for_token(10'000));
  ASSERT_EQ(::kill(pid1, SIGKILL), 0);
  (void)s.up->wait_body(20'000);
  const std::string named = "tensor-parallel worker 1 (pid " + std::to_string(pid1) + ") was killed by signal 9";
  EXPECT_NE(s.body_so_far().find(named), std::string::npos) << s.body_so_far();
  EXPECT_TRUE(workers_ready(tp.port, 2, 30'000)) << tp.group->log();
  EXPECT_EQ(health(tp.port), 200);
  const int new_pid1 = worker_pid(tp.port, 1);
  EXPECT_GT(new_pid1, 0);
  EXPECT_NE(new_pid1, pid1);
  const json next = post(tp.port, {{"prompt", "after"}, {"max_tokens", 8}, {"temperature", 0}});
  EXPECT_EQ(texts(next).size(), 1u) << next.dump();
  EXPECT_EQ(metric("127.0.0.1", tp.port, "tandem_tp_failures_total"), 1);
  EXPECT_EQ(kv_usage_when_drained("127.0.0.1", tp.port), 0);
}

// SIGSTOP of a worker: past the soft deadline the core reports that it waits
// (as the reader) for the replies, with each worker's process state and the
// collective the other is parked in; sampled twice, the stopped worker is
// told apart; after SIGCONT (within the hard deadline) the stream finishes.
TEST(TensorParallelFailures, AStoppedWorkerIsNamedPastTheSoftDeadlineAndTheStepResumesAfterSigcont) {
  Serve tp(std::string(kTp2) + "--tensor-parallel-soft-deadline-ms 300 --tensor-parallel-timeout-ms 30000");
  ASSERT_TRUE(tp.ready(1)) << tp.group->log();
  const int pid1 = worker_pid(tp.port, 1);
  ASSERT_GT(pid1, 0);
  Stream s(tp.port, {{"prompt", "long"}, {"max_tokens", 200}, {"temperature", 0}, {"ignore_eos", true}});
  ASSERT_TRUE(s.wait_for_token(10'000));
  ASSERT_EQ(::kill(pid1, SIGSTOP), 0);
  std::string line;
  const bool reported = tp.group->wait_for("the engine core (reader) waits for the reply of worker", 10'000, &line);
  const json first = get(tp.port, "/debug/parallel");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const json second = get(tp.port, "/debug/parallel");
  ASSERT_EQ(::kill(pid1, SIGCONT), 0);
  ASSERT_TRUE(reported) << tp.group->log();
  EXPECT_NE(line.find("worker 1 (no reply): pid " + std::to_string(pid1) + " STOPPED"), std::string::npos) << line;
  // Where the stop caught worker 1: inside a collective worker 0 is parked
  // in (waiting for worker 1's frame, or, when both frames were in, for its
  // data), or after its step's last collective and before its reply (worker
  // 0 has replied and waits in no op; a window of a ring publish).
  const bool w0_replied = line.find("worker 0 (replied)") != std::string::npos;
  EXPECT_TRUE(line.find("missing {1}") != std::string::npos || line.find("(its data phase") != std::string::npos || w0_replied)
      << line;
  EXPECT_NE(line.find("ring 'steps' state"), std::string::npos) << line;
  ASSERT_TRUE(first.contains("tensor_parallel")) << first.dump();
  const json& w0a = first["tensor_parallel"]["workers"][0];
  const json& w1a = first["tensor_parallel"]["workers"][1];
  const json& w0b = second["tensor_parallel"]["workers"][0];
  const json& w1b = second["tensor_parallel"]["workers"][1];
  EXPECT_EQ(w1a.value("process_state", ""), "T");
  EXPECT_GT(w1b.value("heartbeat_age_ms", 0), w1a.value("heartbeat_age_ms", 0)) << "a stopped worker's heartbeat stands";
  if (w0_replied) {
    EXPECT_FALSE(w0a.contains("in_op")) << w0a.dump();
  } else {
    ASSERT_TRUE(w0a.contains("in_op")) << w0a.dump();
    EXPECT_EQ(w0a["in_op"]["seq"], w0b["in_op"]["seq"]) << "worker 0 is parked in one op";
    EXPECT_TRUE(w0a["in_op"]["arrived_mask"] == 1 || w0a["in_op"]["data_phase"] == true) << w0a.dump();
  }
  EXPECT_GE(first["tensor_parallel"].value("core_waiting_ms", -1), 300);
  (void)s.up->wait_body(60'000);
  EXPECT_NE(s.body_so_far().find("[DONE]"), std::string::npos) << s.body_so_far();
  EXPECT_EQ(s.body_so_far().find("error"), std::string::npos) << s.body_so_far();
  EXPECT_EQ(metric("127.0.0.1", tp.port, "tandem_tp_failures_total"), 0);
}

// A worker stopped for good: the step fails at the hard deadline with the
// report (the stopped worker named), /health says why while the workers
// cannot be restarted (here: the model file is gone), and once they can, the
// instance serves again.
TEST(TensorParallelFailures, PastTheHardDeadlineTheStepFailsTheInstanceIsUnhealthyUntilTheWorkersAreBack) {
  const std::string model = std::filesystem::temp_directory_path() / ("tandem-tp-model-" + std::to_string(::getpid()) + ".gguf");
  std::filesystem::copy_file(testing::tiny_model(), model, std::filesystem::copy_options::overwrite_existing);
  ProcessGroup tp(std::string(TANDEM_BINARY) + " serve -m " + model + " --port 0 -t 1 --kv-cache-mb 16 " + kTp2 +
                  "--tensor-parallel-soft-deadline-ms 200 --tensor-parallel-timeout-ms 1500");
  std::string line;
  ASSERT_TRUE(tp.wait_for("http://127.0.0.1:", 30'000, &line)) << tp.log();
  const int port = std::stoi(line.substr(line.find("127.0.0.1:") + 10));
  const int pid1 = worker_pid(port, 1);
  ASSERT_GT(pid1, 0);
  ASSERT_EQ(::kill(pid1, SIGSTOP), 0);
  std::filesystem::rename(model, model + ".away");
  const json failed = post(port, {{"prompt", "stuck"}, {"max_tokens", 8}, {"temperature", 0}});
  const std::string text = failed.dump();
  EXPECT_NE(text.find("past the hard deadline of"), std::string::npos) << text;
  EXPECT_NE(text.find("worker 1 (no reply): pid " + std::to_string(pid1) + " STOPPED"), std::string::npos) << text;
  // The restart cannot load the model: unhealthy, saying why.
  EXPECT_TRUE(tp.wait_for("the tensor-parallel workers did not start", 10'000)) << tp.log();
  httplib::Client cli("127.0.0.1", port);
  auto r = cli.Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_NE(r->body.find("the tensor-parallel workers are restarting"), std::string::npos) << r->body;
  EXPECT_NE(r->body.find("cannot open"), std::string::npos) << r->body;
  std::filesystem::rename(model + ".away", model);
  EXPECT_TRUE(workers_ready(port, 3, 30'000)) << tp.log();  // (generation 2 could not load the model)
  EXPECT_EQ(health(port), 200);
  const json next = post(port, {{"prompt", "after"}, {"max_tokens", 8}, {"temperature", 0}});
  EXPECT_EQ(texts(next).size(), 1u) << next.dump();
  std::filesystem::remove(model);
}

// A worker that throws mid-step: the group votes, every worker raises after
// the vote, the step's request fails with the thrower's error, and the
// workers are replaced; a request after it is served.
TEST(TensorParallelFailures, AWorkerThatThrowsFailsTheStepOnEveryWorkerAndTheNextRequestIsServed) {
  Serve tp(kTp2, "llama", "TANDEM_TP_FAULT=1:3");
  ASSERT_TRUE(tp.ready(1)) << tp.group->log();
  const json failed = post(tp.port, {{"prompt", "fault"}, {"max_tokens", 8}, {"temperature", 0}});
  const std::string text = failed.dump();
  EXPECT_NE(text.find("failed on worker 1"), std::string::npos) << text;
  EXPECT_NE(text.find("injected fault (TANDEM_TP_FAULT) in step 3"), std::string::npos) << text;
  // Worker 0 raised the failure after the vote, in the op it was in.
  EXPECT_NE(text.find("after the vote: worker 0: tensor-parallel worker 0: tensor-parallel rank 1 failed (local_error) in step 3"),
            std::string::npos)
      << text;
  EXPECT_TRUE(workers_ready(tp.port, 2, 30'000)) << tp.group->log();
  const json next = post(tp.port, {{"prompt", "after"}, {"max_tokens", 8}, {"temperature", 0}});
  EXPECT_EQ(texts(next).size(), 1u) << next.dump();
  EXPECT_EQ(metric("127.0.0.1", tp.port, "tandem_tp_failures_total"), 1);
  EXPECT_EQ(kv_usage_when_drained("127.0.0.1", tp.port), 0);
}

// Seed 003's idle cycles, scaled: the largest timeout in the stack is 1 s
// (the replies' hard deadline and the workers' collectives); each idle gap
// is three times that. Every request completes, and nothing waits past a
// deadline: no report, no failure, no restart.
TEST(TensorParallelSeed003, IdleCyclesLongerThanEveryTimeoutThenServeAgainFourTimes) {
  Serve tp(std::string(kTp2) + "--tensor-parallel-soft-deadline-ms 300 --tensor-parallel-timeout-ms 1000");
  ASSERT_TRUE(tp.ready(1)) << tp.group->log();
  for (int cycle = 0; cycle < 4; ++cycle) {
    const json r = post(tp.port, {{"prompt", "cycle " + std::to_string(cycle)}, {"max_tokens", 16}, {"temperature", 0}});
    ASSERT_EQ(texts(r).size(), 1u) << "cycle " << cycle << ": " << r.dump() << tp.group->log();
    std::this_thread::sleep_for(std::chrono::milliseconds(3000));
  }
  (void)tp.group->wait_for("<nothing>", 200);  // collect the log so far
  EXPECT_EQ(tp.group->log().find("waits for"), std::string::npos) << tp.group->log();
  EXPECT_EQ(tp.group->log().find("soft deadline"), std::string::npos) << tp.group->log();
  EXPECT_EQ(metric("127.0.0.1", tp.port, "tandem_tp_failures_total"), 0);
  EXPECT_EQ(metric("127.0.0.1", tp.port, "tandem_tp_restarts_total"), 0);
  EXPECT_EQ(metric("127.0.0.1", tp.port, "tandem_tp_steps_total"),
            metric("127.0.0.1", tp.port, "tandem_tp_worker_steps_total{rank=\"1\"}"));
}

// Seed 003's storm, scaled: 12 concurrent requests and a cold prefill as
// long as the tiny model's context allows, at TP=2; all complete, equal to
// one instance's answers, and the pool is back to its baseline.
TEST(TensorParallelSeed003, StormOfTwelveRequestsAndALongColdPrefill) {
  Serve single("");
  Serve tp(kTp2);
  ASSERT_TRUE(single.ready(1)) << single.group->log();
  ASSERT_TRUE(tp.ready(1)) << tp.group->log();
  std::vector<int> long_prompt;
  for (int i = 0; i < 500; ++i) long_prompt.push_back((i * 37 + 11) % 1000);
  const json longest = {{"prompt", long_prompt}, {"max_tokens", 8}, {"temperature", 0}};
  json long_answer;
  std::thread cold([&] { long_answer = post(tp.port, longest); });
  expect_concurrent_requests_equal(tp.port, single.port, 12);
  cold.join();
  EXPECT_EQ(texts(long_answer), texts(post(single.port, longest))) << long_answer.dump();
  EXPECT_EQ(kv_usage_when_drained("127.0.0.1", tp.port), 0);
  EXPECT_EQ(metric("127.0.0.1", tp.port, "tandem_tp_failures_total"), 0);
}

// `generate` and `bench model` take the flag too: the same text as one
// process, and the bench reports where a TP step's time goes.
std::string output_of(const std::string& command) {
  std::string out;
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return "<popen failed>";
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ::pclose(p);
  return out;
}

TEST(TensorParallelCommands, GenerateAndBenchModelRunOnTheWorkers) {
  const std::string gen = std::string(TANDEM_BINARY) + " generate -m " + testing::tiny_model() +
                          " -n 24 -p 'tensor parallel' -t 1 --ignore-eos";
  // The generated text: stdout before the report (the workers' start-up lines on stderr left out).
  const auto text_of = [](std::string out) {
    for (size_t at; (at = out.find("tandem: ")) != std::string::npos;) out.erase(at, out.find('\n', at) + 1 - at);
    return out.substr(0, out.find("\nmodel: "));
  };
  const std::string one = output_of(gen), two = output_of(gen + " --tensor-parallel-size 2");
  EXPECT_NE(two.find("(2 tensor-parallel workers)"), std::string::npos) << two;
  EXPECT_EQ(text_of(two), text_of(one));
  const std::string bench = output_of(std::string(TANDEM_BINARY) + " bench model -m " + testing::tiny_model() +
                                      " -r 1 -p 16 -n 4 --batches 2 --tensor-parallel-size 2");
  EXPECT_NE(bench.find("tensor-parallel size 2"), std::string::npos) << bench;
  EXPECT_NE(bench.find("worker 1: "), std::string::npos) << bench;
  EXPECT_NE(bench.find(" in 9 gathers"), std::string::npos) << bench;  // 4 per layer of the 2-layer tiny model, and the vocabulary's
}

}  // namespace
}  // namespace tandem
