// `tandem serve` as a process: it binds loopback, serves, and on SIGTERM
// stops admitting (503) while an in-flight request finishes, then exits 0.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "model_fixtures.h"
#include "serve_fixtures.h"

namespace tandem {
namespace {

using testing::json;

struct ServerProcess {
  pid_t pid = -1;
  int port = 0;
  FILE* stderr_stream = nullptr;
};

// Starts `tandem serve` on a free port and reads the port from its start-up line.
ServerProcess start_server(const std::string& model, const std::string& extra_args) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  ServerProcess p;
  p.pid = fork();
  if (p.pid == 0) {
    dup2(fds[1], STDERR_FILENO);
    close(fds[0]);
    const std::string cmd = std::string(TANDEM_BINARY) + " serve -m " + model + " --port 0 -t 1 --kv-cache-mb 16 " + extra_args;
    execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fds[1]);
  p.stderr_stream = fdopen(fds[0], "r");
  char line[1024];
  while (std::fgets(line, sizeof line, p.stderr_stream) != nullptr) {
    const std::string s(line);
    const size_t at = s.find("http://127.0.0.1:");
    if (at != std::string::npos) {
      p.port = std::stoi(s.substr(at + 17));
      break;
    }
  }
  return p;
}

TEST(ServeProcess, SigtermDrainsInFlightRequestsThenExitsCleanly) {
  const std::string model = testing::tiny_model_path("llama", kernels::DType::kF16);
  ServerProcess p = start_server(model, "--shutdown-timeout 30");
  ASSERT_GT(p.port, 0) << "the server did not print its address";
  httplib::Client cli("127.0.0.1", p.port);
  cli.set_read_timeout(60, 0);
  auto health = cli.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);

  // A long streaming request; SIGTERM arrives once its first event is in.
  testing::Stream s(p.port, {{"prompt", "drain me"}, {"max_tokens", 300}, {"temperature", 0}, {"ignore_eos", true}});
  ASSERT_TRUE(s.wait_for_token(10'000));
  ASSERT_EQ(kill(p.pid, SIGTERM), 0);
  (void)s.up->wait_body(60'000);
  EXPECT_EQ(s.up->wait_status(0), 200);
  const std::string streamed = s.body_so_far();
  EXPECT_NE(streamed.find("data: [DONE]"), std::string::npos) << "the in-flight request finished";
  EXPECT_NE(streamed.find("\"finish_reason\":\"length\""), std::string::npos);
  int wstatus = 0;
  ASSERT_EQ(waitpid(p.pid, &wstatus, 0), p.pid);
  EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << "exit status " << wstatus;
  std::fclose(p.stderr_stream);
}

// Past --shutdown-timeout (here 0 s) a request still in flight ends with an
// error its client sees, and the server exits at once, not when the request
// would have finished.
TEST(ServeProcess, SigtermPastTheShutdownTimeoutEndsTheRequestWithAnError) {
  const std::string model = testing::tiny_model_path("llama", kernels::DType::kF16);
  ServerProcess p = start_server(model, "--shutdown-timeout 0");
  ASSERT_GT(p.port, 0) << "the server did not print its address";
  testing::Stream s(p.port, {{"prompt", "cut me off"}, {"max_tokens", 480}, {"temperature", 0}, {"ignore_eos", true}});
  ASSERT_TRUE(s.wait_for_token(10'000));
  ASSERT_TRUE(testing::signal_when_resumed(p.pid, SIGTERM));
  (void)s.up->wait_body(60'000);
  const std::string streamed = s.body_so_far();
  EXPECT_NE(streamed.find("the server shut down before this request finished (--shutdown-timeout 0 s)"), std::string::npos)
      << streamed;
  EXPECT_NE(streamed.find("data: [DONE]"), std::string::npos);
  EXPECT_EQ(streamed.find("\"finish_reason\":\"length\""), std::string::npos) << "the request ran to its end: " << streamed;
  int wstatus = 0;
  ASSERT_EQ(waitpid(p.pid, &wstatus, 0), p.pid);
  EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << "exit status " << wstatus;
  std::fclose(p.stderr_stream);
}

// The listening socket's local address, from /proc/net/tcp ("0100007F" is
// 127.0.0.1), or "" if no listener on that port.
std::string listen_address(int port) {
  FILE* f = std::fopen("/proc/net/tcp", "r");
  if (f == nullptr) return "";
  char line[512];
  char want[8];
  std::snprintf(want, sizeof want, "%04X", port);
  std::string found;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    char local[64] = {}, remote[64] = {}, state[8] = {};
    if (std::sscanf(line, " %*d: %63s %63s %7s", local, remote, state) != 3) continue;
    const std::string l(local);
    const size_t colon = l.find(':');
    if (colon != std::string::npos && l.substr(colon + 1) == want && std::string(state) == "0A") found = l.substr(0, colon);
  }
  std::fclose(f);
  return found;
}

TEST(ServeProcess, BindsLoopbackByDefault) {
  const std::string model = testing::tiny_model_path("llama", kernels::DType::kF16);
  ServerProcess p = start_server(model, "");
  ASSERT_GT(p.port, 0);
  EXPECT_EQ(listen_address(p.port), "0100007F");
  kill(p.pid, SIGTERM);
  int wstatus = 0;
  waitpid(p.pid, &wstatus, 0);
  EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0);
  std::fclose(p.stderr_stream);
}

// A model whose logits turn NaN for some prompts (here: an infinity in the
// embedding row of one token, as an overflowing or damaged file gives) fails
// exactly those requests, with an error that says what is wrong with the
// file, and serves the others; the server stays up and frees their blocks.
// (It used to abort on an invariant check.) With q8_0 weights the
// activations are quantized: the NaN must reach the logits through the
// quantization too, not become a finite quant (it did: garbage text, 200).
// (Each ISA's quantizer hid it differently: the scalar one always, the
// vector ones where their max dropped the NaN.)
struct NonFiniteCase {
  kernels::DType dtype;
  std::string isa;  // TANDEM_ISA, or empty: the machine's best
};
class NonFiniteLogits : public ::testing::TestWithParam<NonFiniteCase> {};

TEST_P(NonFiniteLogits, FailTheirRequestAndTheServerGoesOn) {
  constexpr int kPoisoned = 7;
  const std::string model = testing::infinite_token_model_path(kPoisoned, GetParam().dtype);
  const std::string isa = GetParam().isa.empty() ? "" : "env TANDEM_ISA=" + GetParam().isa + " ";
  testing::ProcessGroup server(isa + TANDEM_BINARY + " serve -m " + model + " --port 0 -t 1 --kv-cache-mb 16");
  std::string line;
  ASSERT_TRUE(server.wait_for("http://127.0.0.1:", 30'000, &line)) << server.log();
  const int port = std::stoi(line.substr(line.find("127.0.0.1:") + 10));
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(60, 0);
  auto complete = [&](const json& prompt, bool stream) {
    json body = {{"prompt", prompt}, {"max_tokens", 8}, {"temperature", 0}, {"stream", stream}};
    return cli.Post("/v1/completions", body.dump(), "application/json");
  };
  const std::string why = "the model produced logits that are NaN or infinite";
  auto poisoned = complete(json::array({5, kPoisoned, 9}), false);
  ASSERT_TRUE(poisoned) << server.log();
  EXPECT_EQ(poisoned->status, 500) << poisoned->body;
  EXPECT_NE(poisoned->body.find(why), std::string::npos) << poisoned->body;
  auto streamed = complete(json::array({kPoisoned, 11}), true);
  ASSERT_TRUE(streamed) << server.log();
  EXPECT_NE(streamed->body.find(why), std::string::npos) << streamed->body;
  EXPECT_NE(streamed->body.find("data: [DONE]"), std::string::npos) << streamed->body;
  // The others are served, greedy and whole.
  auto clean_answer = complete(json::array({5, 9, 11}), false);
  ASSERT_TRUE(clean_answer) << server.log();
  EXPECT_EQ(clean_answer->status, 200) << clean_answer->body;
  EXPECT_EQ(json::parse(clean_answer->body)["usage"]["completion_tokens"], 8) << clean_answer->body;
  EXPECT_EQ(cli.Get("/health")->status, 200);
  EXPECT_EQ(testing::metric("127.0.0.1", port, "tandem_nonfinite_logits_total"), 2);
  EXPECT_EQ(testing::kv_usage_when_drained("127.0.0.1", port), 0);
}

INSTANTIATE_TEST_SUITE_P(ServeProcess, NonFiniteLogits,
                         ::testing::Values(NonFiniteCase{kernels::DType::kF16, ""}, NonFiniteCase{kernels::DType::kQ8_0, ""},
                                           NonFiniteCase{kernels::DType::kQ8_0, "scalar"}),
                         [](const auto& info) {
                           return std::string(kernels::dtype_name(info.param.dtype)) +
                                  (info.param.isa.empty() ? "" : "_" + info.param.isa);
                         });

}  // namespace
}  // namespace tandem
