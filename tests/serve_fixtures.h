// Helpers for tests that run `tandem serve` processes and compare their
// answers: a server in its own process group, JSON over HTTP, and a set of
// concurrent requests (greedy and seeded, n = 2 among them) checked against
// another server's answers.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "model_fixtures.h"
#include "process_fixtures.h"
#include "server/upstream_relay.h"

namespace tandem::testing {

using json = nlohmann::json;

inline std::string tiny_model(const std::string& arch = "llama") { return testing::tiny_model_path(arch, kernels::DType::kF16); }

// A server (data- or tensor-parallel, or neither) in its own process group.
struct Serve {
  int port = free_port();
  std::unique_ptr<ProcessGroup> group;
  // `env`: "NAME=value ..." set for the server (empty: none).
  explicit Serve(const std::string& extra, const std::string& arch = "llama", const std::string& env = "") {
    group = std::make_unique<ProcessGroup>((env.empty() ? "" : "env " + env + " ") + std::string(TANDEM_BINARY) +
                                           " serve -m " + tiny_model(arch) + " --port " +
                                           std::to_string(port) + " -t 1 --kv-cache-mb 16 " + extra);
  }
  // Waits for `n` "group formed" lines (one per rank), or the server line.
  bool ready(int n_ranks) {
    if (n_ranks == 1) return group->wait_for("tandem: serving", 30'000);
    for (int i = 0; i < n_ranks; ++i)
      if (!group->wait_for("group formed", 30'000)) return false;
    return true;
  }
};

// A JSON object from GET (an empty object when the call or the parse failed,
// so a missing field reads as its default below).
inline json get(int port, const std::string& path, const std::string& host = "127.0.0.1") {
  httplib::Client cli(host, port);
  cli.set_connection_timeout(2, 0);
  cli.set_read_timeout(10, 0);
  auto r = cli.Get(path);
  json j = r ? json::parse(r->body, nullptr, false) : json();
  return j.is_object() ? j : json::object();
}

inline int health(int port) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_connection_timeout(1, 0);
  auto r = cli.Get("/health");
  return r ? r->status : -1;
}

inline json post(int port, const json& body, const std::string& host = "127.0.0.1") {
  httplib::Client cli(host, port);
  cli.set_connection_timeout(2, 0);
  cli.set_read_timeout(60, 0);
  auto r = cli.Post("/v1/completions", body.dump(), "application/json");
  if (!r) return json{{"client_error", httplib::to_string(r.error())}};
  return json::parse(r->body, nullptr, false);
}

inline std::vector<std::string> texts(const json& response) {
  if (!response.is_object() || !response.contains("choices")) return {"<no choices: " + response.dump() + ">"};
  std::vector<std::string> out;
  for (const json& c : response["choices"]) out.push_back(c["text"].get<std::string>());
  return out;
}

inline json request(int i) {
  json b = {{"prompt", "request " + std::to_string(i) + " says"}, {"max_tokens", 24 + i % 9}, {"ignore_eos", true}};
  if (i % 3 == 0) {
    b["n"] = 2;
    b["temperature"] = 0.8;
    b["seed"] = 100 + i;
  } else {
    b["temperature"] = 0;
  }
  return b;
}

// request(0 .. n-1), all at once through `port`, each equal to one
// instance's answer on `single_port`.
inline void expect_concurrent_requests_equal(int port, int single_port, int n) {
  std::vector<json> got(static_cast<size_t>(n));
  std::vector<std::thread> clients;
  for (int i = 0; i < n; ++i) clients.emplace_back([&, i] { got[static_cast<size_t>(i)] = post(port, request(i)); });
  for (auto& t : clients) t.join();
  for (int i = 0; i < n; ++i)
    EXPECT_EQ(texts(got[static_cast<size_t>(i)]), texts(post(single_port, request(i)))) << "request " << i;
}

// A streamed request through `port`, read on its own thread.
struct Stream {
  std::shared_ptr<server::Upstream> up = std::make_shared<server::Upstream>();
  std::mutex mu;
  std::string text;
  Stream(int port, json body) {
    body["stream"] = true;
    server::UpstreamCall call;
    call.host = "127.0.0.1";
    call.port = port;
    call.path = "/v1/completions";
    call.body = body.dump();
    call.who = "the front";
    up->start(std::move(call), [this](const std::string& chunk) {
      std::lock_guard<std::mutex> lock(mu);
      text += chunk;
    });
  }
  std::string body_so_far() {
    std::lock_guard<std::mutex> lock(mu);
    return text;
  }
  bool wait_for_token(int timeout_ms) {
    for (int i = 0; i < timeout_ms; ++i) {
      if (body_so_far().find("\"text\"") != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
  }
};

}  // namespace tandem::testing
