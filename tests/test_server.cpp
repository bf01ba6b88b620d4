// HTTP conformance of the OpenAI-compatible server: real requests over
// 127.0.0.1 to an in-process HttpServer backed by a running EngineCore on a
// tiny generated model. Checks response shapes, usage accounting, streaming
// framing, determinism under concurrency, error statuses and shapes,
// admission control, aborts on disconnect, draining, and that the KV cache
// is fully released once the requests are done.
//
// Nothing here sleeps to synchronize: waits are bounded polling loops on an
// observable condition, and pass/fail never depends on timing.
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <map>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine_core.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "model_fixtures.h"
#include "server/api_error.h"
#include "loadgen/loadgen.h"
#include "server/http_server.h"
#include "tokenizer/tokenizer.h"

namespace tandem::server {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr const char* kServedName = "tiny-test";
constexpr int kMaxModelLen = 512;  // the tiny preset's context

// The model served: tiny llama, or the architecture TANDEM_TEST_ARCH names
// (CTest runs the ServerApi suite once more for each of qwen3moe and
// qwen3next: every architecture serves the whole API).
const std::string& served_arch() {
  static const std::string arch = [] {
    const char* a = std::getenv("TANDEM_TEST_ARCH");
    return std::string(a != nullptr && *a != 0 ? a : "llama");
  }();
  return arch;
}
testing::LoadedTinyModel& tiny() { return testing::tiny_f16(served_arch()); }
// Off for models with recurrent state (a cached block has no state after it).
bool prefix_caching_on() { return !tiny().model->config().hybrid(); }

EngineConfig engine_config() {
  EngineConfig c;
  // A hybrid model's block holds one attention layer, not all: the same
  // number of blocks (4096) in a quarter of the memory.
  c.kv_cache_bytes = tiny().model->config().hybrid() ? 2 << 20 : 8 << 20;
  c.block_size = 4;
  c.threads = 2;
  c.idle_wait_ms = 10;
  return c;
}

// Polls `cond` until it holds or `limit` passes; returns whether it held.
bool wait_for(const std::function<bool()>& cond, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
  const auto deadline = Clock::now() + limit;
  while (!cond()) {
    if (Clock::now() >= deadline) return cond();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

// ---------------------------------------------------------------------------
// Clients

httplib::Client client(int port) {
  httplib::Client c("127.0.0.1", port);
  c.set_connection_timeout(10, 0);
  c.set_read_timeout(60, 0);
  c.set_write_timeout(60, 0);
  return c;
}

struct Reply {
  int status = 0;  // 0: no response (the error says why)
  std::string error;
  std::string body;
  std::string content_type;
  json j;  // the body parsed; discarded when it is not JSON
};

Reply to_reply(const httplib::Result& res) {
  Reply r;
  if (!res) {
    r.error = httplib::to_string(res.error());
    return r;
  }
  r.status = res->status;
  r.body = res->body;
  r.content_type = res->get_header_value("Content-Type");
  r.j = json::parse(r.body, nullptr, false);
  return r;
}

Reply get(int port, const std::string& path, const httplib::Headers& headers = {}) {
  auto c = client(port);
  return to_reply(c.Get(path.c_str(), headers));
}

Reply post_raw(int port, const std::string& path, const std::string& body, const httplib::Headers& headers = {}) {
  auto c = client(port);
  return to_reply(c.Post(path.c_str(), headers, body, "application/json"));
}

Reply post(int port, const std::string& path, const json& body, const httplib::Headers& headers = {}) {
  return post_raw(port, path, body.dump(), headers);
}

// A streamed response: the raw bytes, and the JSON of each data event.
struct Stream {
  int status = 0;
  httplib::Error error = httplib::Error::Success;
  std::string raw;
  std::vector<json> chunks;  // data events other than [DONE], in order
  bool done = false;         // "data: [DONE]" arrived
};

// POSTs `body` and reads the server-sent events as they arrive. on_chunk sees
// each parsed chunk; returning false closes the connection.
Stream post_stream(int port, const std::string& path, const json& body,
                   const std::function<bool(const json&)>& on_chunk = {}, const httplib::Headers& headers = {}) {
  Stream s;
  std::string pending;
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.headers = headers;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.response_handler = [&](const httplib::Response& r) {
    s.status = r.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    s.raw.append(data, len);
    if (s.status != 200) return true;
    pending.append(data, len);
    size_t pos;
    while ((pos = pending.find("\n\n")) != std::string::npos) {
      const std::string event = pending.substr(0, pos);
      pending.erase(0, pos + 2);
      if (event.rfind("data: ", 0) != 0) continue;  // a comment (keep-alive)
      const std::string payload = event.substr(6);
      if (payload == "[DONE]") {
        s.done = true;
        continue;
      }
      s.chunks.push_back(json::parse(payload, nullptr, false));
      if (on_chunk && !on_chunk(s.chunks.back())) return false;
    }
    return true;
  };
  httplib::Response res;
  auto c = client(port);
  c.send(req, res, s.error);
  return s;
}

// Every event is one "data: <payload>\n\n" (or a ": comment\n\n" keep-alive),
// each data payload but the last is a JSON object, and the last is [DONE].
::testing::AssertionResult sse_framing_ok(const std::string& raw) {
  const std::string done = "data: [DONE]\n\n";
  if (raw.size() < done.size() || raw.compare(raw.size() - done.size(), done.size(), done) != 0)
    return ::testing::AssertionFailure() << "the stream does not end with data: [DONE]: ..."
                                         << raw.substr(raw.size() > 80 ? raw.size() - 80 : 0);
  size_t pos = 0;
  int data_events = 0;
  while (pos < raw.size()) {
    const size_t end = raw.find("\n\n", pos);
    if (end == std::string::npos) return ::testing::AssertionFailure() << "unterminated event at byte " << pos;
    const std::string event = raw.substr(pos, end - pos);
    pos = end + 2;
    if (event.find('\n') != std::string::npos)
      return ::testing::AssertionFailure() << "a multi-line event: " << event;
    if (event.rfind(":", 0) == 0) continue;
    if (event.rfind("data: ", 0) != 0) return ::testing::AssertionFailure() << "not a data event: " << event;
    ++data_events;
    const std::string payload = event.substr(6);
    if (payload == "[DONE]") {
      if (pos != raw.size()) return ::testing::AssertionFailure() << "events after [DONE]";
      continue;
    }
    const json j = json::parse(payload, nullptr, false);
    if (!j.is_object()) return ::testing::AssertionFailure() << "a payload that is not a JSON object: " << payload;
  }
  if (data_events < 2) return ::testing::AssertionFailure() << "no chunk before [DONE]";
  return ::testing::AssertionSuccess();
}

// The OpenAI error shape, {"error": {"message", "type", "param", "code"}},
// with the given status; param and code are checked when given (a null json
// means the field must be null).
::testing::AssertionResult is_error(const Reply& r, int status, const std::optional<json>& param = std::nullopt,
                                    const std::optional<json>& code = std::nullopt,
                                    const std::string& type = "invalid_request_error") {
  if (r.status != status)
    return ::testing::AssertionFailure() << "status " << r.status << " (want " << status << "): " << r.body << r.error;
  if (!r.j.is_object() || r.j.size() != 1 || !r.j.contains("error") || !r.j["error"].is_object())
    return ::testing::AssertionFailure() << "not an error object: " << r.body;
  const json& e = r.j["error"];
  for (const char* k : {"message", "type", "param", "code"})
    if (!e.contains(k)) return ::testing::AssertionFailure() << "error without " << k << ": " << r.body;
  if (!e["message"].is_string() || e["message"].get<std::string>().empty())
    return ::testing::AssertionFailure() << "empty message: " << r.body;
  if (e["type"] != type) return ::testing::AssertionFailure() << "type " << e["type"] << " (want " << type << ")";
  if (!e["param"].is_null() && !e["param"].is_string()) return ::testing::AssertionFailure() << "param type: " << r.body;
  if (!e["code"].is_null() && !e["code"].is_string()) return ::testing::AssertionFailure() << "code type: " << r.body;
  if (param && e["param"] != *param) return ::testing::AssertionFailure() << "param " << e["param"] << " (want " << *param << ")";
  if (code && e["code"] != *code) return ::testing::AssertionFailure() << "code " << e["code"] << " (want " << *code << ")";
  return ::testing::AssertionSuccess();
}

// Deterministic prompt text of `n` words; different seeds give different
// texts from the first word on.
std::string words(int n, int seed) {
  static const char* kWords[] = {"river", "stone", "light", "garden", "window", "paper", "music", "cloud",
                                 "bridge", "forest", "candle", "silver", "orange", "winter", "harbor", "quiet"};
  std::string out;
  uint64_t x = static_cast<uint64_t>(seed) * 0x9e3779b97f4a7c15ull + 1;
  for (int i = 0; i < n; ++i) {
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    if (!out.empty()) out += ' ';
    out += kWords[(x * 0x2545f4914f6cdd1dull) >> 60];
  }
  return out;
}

// Characters as Python counts them (text_offset's unit): bytes that do not
// continue a UTF-8 sequence.
int64_t chars(const std::string& s) {
  return std::count_if(s.begin(), s.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; });
}

json completion_body(const std::string& prompt, int max_tokens) {
  return {{"model", kServedName}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true}};
}

json chat_body(int max_tokens) {
  return {{"model", kServedName},
          {"messages", json::array({{{"role", "system"}, {"content", "You are a terse assistant."}},
                                    {{"role", "user"}, {"content", "Name three rivers."}}})},
          {"max_tokens", max_tokens},
          {"temperature", 0}};
}

// The text of choice `i` of a successful non-streaming completion.
std::string choice_text(const Reply& r, size_t i = 0) {
  if (r.status != 200 || !r.j.is_object() || !r.j.contains("choices") || r.j["choices"].size() <= i) {
    ADD_FAILURE() << "no choice " << i << " in: " << r.status << " " << r.body << r.error;
    return {};
  }
  return r.j["choices"][i]["text"].get<std::string>();
}

// One value of a Prometheus text exposition: the first sample of `name`
// (exact name, then '{' or ' '); nullopt when absent.
std::optional<double> metric(const std::string& text, const std::string& name) {
  size_t pos = 0;
  while ((pos = text.find(name, pos)) != std::string::npos) {
    const bool line_start = pos == 0 || text[pos - 1] == '\n';
    const size_t after = pos + name.size();
    if (line_start && after < text.size() && (text[after] == '{' || text[after] == ' ')) {
      const size_t eol = text.find('\n', after);
      const std::string line = text.substr(pos, eol - pos);
      const size_t sp = line.rfind(' ');
      return std::stod(line.substr(sp + 1));
    }
    pos = after;
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------
// An engine and a server on 127.0.0.1 (any free port), served on a thread.

class Instance {
 public:
  explicit Instance(EngineConfig ec, ServerConfig sc = {}, bool start_engine = true)
      : engine_(*tiny().model, *tiny().tokenizer, ec) {
    sc.host = "127.0.0.1";
    sc.port = 0;
    if (sc.served_model_name.empty()) sc.served_model_name = kServedName;
    server_ = std::make_unique<HttpServer>(engine_, *tiny().model, *tiny().tokenizer, std::move(sc));
    port_ = server_->bind();
    if (start_engine) engine_.start();
    thread_ = std::thread([this] { server_->serve(); });
    // httplib's stop() is a no-op until the accept loop runs, so wait for it
    // to answer before a test (and later the destructor) can stop it.
    const bool up = wait_for([&] { return get(port_, "/v1/models").status != 0; });
    EXPECT_TRUE(up) << "the server did not answer on port " << port_;
  }
  ~Instance() {
    server_->stop();
    if (thread_.joinable()) thread_.join();
    engine_.stop();
  }

  int port() const { return port_; }
  EngineCore& engine() { return engine_; }
  HttpServer& server() { return *server_; }

  // Waits until no request is in flight and the engine owns no KV block.
  ::testing::AssertionResult drained() {
    const bool ok = wait_for([&] {
      const BlockManagerStats s = engine_.kv_stats();
      return server_->in_flight() == 0 && s.owned == 0 && engine_.metrics().running == 0 &&
             engine_.metrics().waiting == 0;
    });
    const BlockManagerStats s = engine_.kv_stats();
    if (!ok)
      return ::testing::AssertionFailure() << "not drained within 10 s: in_flight " << server_->in_flight()
                                           << ", owned blocks " << s.owned << ", running "
                                           << engine_.metrics().running << ", waiting " << engine_.metrics().waiting;
    if (s.free + s.cached != s.total)
      return ::testing::AssertionFailure() << "free " << s.free << " + cached " << s.cached << " != total " << s.total;
    return ::testing::AssertionSuccess();
  }

 private:
  EngineCore engine_;
  std::unique_ptr<HttpServer> server_;
  std::thread thread_;
  int port_ = 0;
};

// The shared server most tests talk to; every test must leave it drained,
// and the suite checks the KV accounting once more at the end.
class ServerApi : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { inst_ = new Instance(engine_config()); }
  static void TearDownTestSuite() {
    EXPECT_TRUE(inst_->drained());
    const BlockManagerStats s = inst_->engine().kv_stats();
    EXPECT_EQ(s.owned, 0);
    EXPECT_EQ(s.free + s.cached, s.total);
    EXPECT_GT(s.total, 0);
    delete inst_;
    inst_ = nullptr;
  }
  void TearDown() override { EXPECT_TRUE(inst_->drained()); }

  static int port() { return inst_->port(); }
  static EngineCore& engine() { return inst_->engine(); }

  static int64_t token_count(const std::string& prompt) {
    const Reply r = post(port(), "/tokenize", {{"prompt", prompt}});
    EXPECT_EQ(r.status, 200) << r.body;
    return r.j.value("count", int64_t{-1});
  }

  static Instance* inst_;
};

Instance* ServerApi::inst_ = nullptr;

// ---------------------------------------------------------------------------
// Models, health, metrics, tokenizer endpoints

TEST_F(ServerApi, ModelsListsTheServedModel) {
  const Reply r = get(port(), "/v1/models");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_NE(r.content_type.find("application/json"), std::string::npos);
  ASSERT_TRUE(r.j.is_object());
  EXPECT_EQ(r.j["object"], "list");
  ASSERT_TRUE(r.j["data"].is_array());
  ASSERT_EQ(r.j["data"].size(), 1u);
  const json& m = r.j["data"][0];
  EXPECT_EQ(m["id"], kServedName);
  EXPECT_EQ(m["object"], "model");
  EXPECT_TRUE(m["created"].is_number_integer());
  EXPECT_GT(m["created"].get<int64_t>(), 1600000000);
  EXPECT_TRUE(m["owned_by"].is_string());
  EXPECT_EQ(m["max_model_len"], kMaxModelLen);
  EXPECT_EQ(engine().max_model_len(), kMaxModelLen);
}

TEST_F(ServerApi, HealthIsOkWhileTheEngineRuns) {
  const Reply r = get(port(), "/health");
  EXPECT_EQ(r.status, 200) << r.body;
}

TEST_F(ServerApi, MetricsArePrometheusTextAndCountRequests) {
  const Reply before = get(port(), "/metrics");
  ASSERT_EQ(before.status, 200);
  EXPECT_NE(before.content_type.find("text/plain"), std::string::npos) << before.content_type;
  const std::pair<const char*, const char*> series[] = {
      {"tandem_ready", "gauge"},
      {"tandem_num_requests_running", "gauge"},
      {"tandem_num_requests_waiting", "gauge"},
      {"tandem_kv_cache_usage_perc", "gauge"},
      {"tandem_kv_cache_blocks_total", "gauge"},
      {"tandem_prefix_cache_hits_total", "counter"},
      {"tandem_prompt_tokens_total", "counter"},
      {"tandem_generation_tokens_total", "counter"},
      {"tandem_request_success_total", "counter"},
      {"tandem_request_aborted_total", "counter"},
      {"tandem_time_to_first_token_seconds", "histogram"},
      {"tandem_e2e_request_latency_seconds", "histogram"},
      {"tandem_engine_steps_by_kind_total", "counter"},
      {"tandem_engine_step_seconds_by_kind_total", "counter"},
      {"tandem_engine_forward_seconds_by_kind_total", "counter"},
      {"tandem_engine_prefill_tokens_by_kind_total", "counter"},
      {"tandem_engine_decode_rows_by_kind_total", "counter"},
  };
  for (const auto& [name, type] : series) {
    EXPECT_NE(before.body.find(std::string("# HELP ") + name + " "), std::string::npos) << name;
    EXPECT_NE(before.body.find(std::string("# TYPE ") + name + " " + type + "\n"), std::string::npos) << name;
  }
  EXPECT_NE(before.body.find("tandem_request_success_total{model_name=\"" + std::string(kServedName) + "\"} "),
            std::string::npos);
  EXPECT_NE(before.body.find("tandem_e2e_request_latency_seconds_bucket{model_name=\"" + std::string(kServedName) +
                             "\",le=\"+Inf\"} "),
            std::string::npos);
  EXPECT_EQ(metric(before.body, "tandem_ready"), 1.0);
  EXPECT_EQ(metric(before.body, "tandem_kv_cache_blocks_total"), static_cast<double>(engine().n_kv_blocks()));
  // Recurrent-state slots: one per sequence the running set holds, none in use between requests.
  EXPECT_EQ(metric(before.body, "tandem_state_slots_total"), static_cast<double>(engine().state_slots_total()));
  EXPECT_EQ(metric(before.body, "tandem_state_slots_used"), 0.0);
  EXPECT_EQ(engine().state_slots_total() > 0, tiny().model->config().hybrid());
  EXPECT_NE(before.body.find("tandem_prefix_cache_disabled{model_name=\"" + std::string(kServedName) +
                             "\",reason=\"recurrent_state_not_cached\"} " + (prefix_caching_on() ? "0" : "1")),
            std::string::npos);

  const auto value = [](const Reply& r, const char* name) {
    const auto v = metric(r.body, name);
    EXPECT_TRUE(v.has_value()) << name;
    return v.value_or(-1);
  };
  const double ok0 = value(before, "tandem_request_success_total");
  const double gen0 = value(before, "tandem_generation_tokens_total");
  const double prompt0 = value(before, "tandem_prompt_tokens_total");
  const double e2e0 = value(before, "tandem_e2e_request_latency_seconds_count");

  const std::string prompt = words(9, 101);
  const Reply done = post(port(), "/v1/completions", completion_body(prompt, 5));
  ASSERT_EQ(done.status, 200) << done.body;
  const int64_t n_prompt = token_count(prompt);
  // The counters are bumped by the engine step that answered, so poll.
  Reply after;
  const bool counted = wait_for([&] {
    after = get(port(), "/metrics");
    return value(after, "tandem_request_success_total") >= ok0 + 1 &&
           value(after, "tandem_e2e_request_latency_seconds_count") >= e2e0 + 1;
  });
  EXPECT_TRUE(counted) << after.body;
  EXPECT_EQ(value(after, "tandem_request_success_total"), ok0 + 1);
  EXPECT_EQ(value(after, "tandem_generation_tokens_total"), gen0 + 5);
  EXPECT_EQ(value(after, "tandem_prompt_tokens_total"), prompt0 + static_cast<double>(n_prompt));
  // The request's decode rows (5 tokens: 4 run after the prompt) are counted
  // under a kind label.
  double rows0 = 0, rows1 = 0;
  for (const char* kind : {"decode", "prefill", "mixed"}) {
    const std::string series = "tandem_engine_decode_rows_by_kind_total{model_name=\"" + std::string(kServedName) +
                               "\",kind=\"" + kind + "\"} ";
    for (const auto& [reply, sum] : {std::pair<const Reply*, double*>{&before, &rows0}, {&after, &rows1}}) {
      const size_t at = reply->body.find(series);
      ASSERT_NE(at, std::string::npos) << series;
      *sum += std::stod(reply->body.substr(at + series.size()));
    }
  }
  EXPECT_EQ(rows1, rows0 + 4);
}

TEST_F(ServerApi, TokenizeAndDetokenizeRoundTrip) {
  const std::string text = "Hello world, this is tandem speaking.";
  const Reply t = post(port(), "/tokenize", {{"model", kServedName}, {"prompt", text}, {"add_special_tokens", false},
                                             {"return_token_strs", true}});
  ASSERT_EQ(t.status, 200) << t.body;
  ASSERT_TRUE(t.j["tokens"].is_array());
  const auto ids = t.j["tokens"].get<std::vector<int32_t>>();
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(t.j["count"], ids.size());
  EXPECT_EQ(t.j["max_model_len"], kMaxModelLen);
  ASSERT_TRUE(t.j["token_strs"].is_array());
  EXPECT_EQ(t.j["token_strs"].size(), ids.size());
  EXPECT_EQ(ids, tiny().tokenizer->encode(text, false, true));

  const Reply d = post(port(), "/detokenize", {{"model", kServedName}, {"tokens", ids}});
  ASSERT_EQ(d.status, 200) << d.body;
  EXPECT_EQ(d.j["prompt"], text);

  // Defaults: special tokens as the model adds them; no token strings.
  const Reply plain = post(port(), "/tokenize", {{"prompt", text}});
  ASSERT_EQ(plain.status, 200) << plain.body;
  EXPECT_TRUE(plain.j["token_strs"].is_null());
  EXPECT_EQ(plain.j["tokens"].get<std::vector<int32_t>>(), tiny().tokenizer->encode(text, true, true));

  // The messages form renders the chat template (ChatML) before tokenizing.
  const json messages = chat_body(1)["messages"];
  const Reply chat = post(port(), "/tokenize", {{"messages", messages}});
  ASSERT_EQ(chat.status, 200) << chat.body;
  const auto chat_ids = chat.j["tokens"].get<std::vector<int32_t>>();
  const std::string rendered =
      "<|im_start|>system\nYou are a terse assistant.<|im_end|>\n<|im_start|>user\nName three "
      "rivers.<|im_end|>\n<|im_start|>assistant\n";
  EXPECT_EQ(chat_ids, tiny().tokenizer->encode(rendered, true, true));
  const auto im_start = tiny().tokenizer->encode("<|im_start|>", false, true);
  ASSERT_EQ(im_start.size(), 1u) << "<|im_start|> is one special token";
  EXPECT_EQ(std::count(chat_ids.begin(), chat_ids.end(), im_start[0]), 3);
  // The chat endpoint's prompt is the same tokens.
  const Reply c = post(port(), "/v1/chat/completions", chat_body(1));
  ASSERT_EQ(c.status, 200) << c.body;
  EXPECT_EQ(c.j["usage"]["prompt_tokens"], chat_ids.size());
}

// The chat template is the model's Jinja (here given by --chat-template):
// tools, chat_template_kwargs and add_generation_prompt reach it, /tokenize
// shows exactly what it produced, and a template that refuses a
// conversation is a 400 that leaves the server serving.
TEST(ServerChatTemplate, KwargsAndToolsReachTheTemplateAndARefusalIsA400) {
  ServerConfig sc;
  sc.chat_template =
      "{% if messages[0].role == 'assistant' %}{{ raise_exception('a conversation cannot start with the assistant') }}{% endif %}"
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
      "{% if tools %}<|im_start|>system\n{{ tools|map(attribute='function.name')|join(',') }}<|im_end|>\n{% endif %}"
      "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is false %}no-think {% endif %}{% endif %}";
  EngineConfig ec;
  Instance inst(ec, sc);
  const json messages = chat_body(1)["messages"];
  const std::string base =
      "<|im_start|>system\nYou are a terse assistant.<|im_end|>\n<|im_start|>user\nName three rivers.<|im_end|>\n";

  const Reply plain = post(inst.port(), "/tokenize", {{"messages", messages}});
  ASSERT_EQ(plain.status, 200) << plain.body;
  EXPECT_EQ(plain.j["tokens"].get<std::vector<int32_t>>(), tiny().tokenizer->encode(base + "<|im_start|>assistant\n", true, true));
  const Reply kw = post(inst.port(), "/tokenize", {{"messages", messages}, {"chat_template_kwargs", {{"enable_thinking", false}}}});
  ASSERT_EQ(kw.status, 200) << kw.body;
  EXPECT_EQ(kw.j["tokens"].get<std::vector<int32_t>>(), tiny().tokenizer->encode(base + "<|im_start|>assistant\nno-think ", true, true));
  const Reply no_gen = post(inst.port(), "/tokenize", {{"messages", messages}, {"add_generation_prompt", false}});
  ASSERT_EQ(no_gen.status, 200) << no_gen.body;
  EXPECT_EQ(no_gen.j["tokens"].get<std::vector<int32_t>>(), tiny().tokenizer->encode(base, true, true));

  const json tools = json::array({{{"type", "function"}, {"function", {{"name", "get_weather"}}}},
                                  {{"type", "function"}, {"function", {{"name", "search"}}}}});
  const Reply tok_tools = post(inst.port(), "/tokenize", {{"messages", messages}, {"tools", tools}});
  ASSERT_EQ(tok_tools.status, 200) << tok_tools.body;
  const auto tool_ids = tok_tools.j["tokens"].get<std::vector<int32_t>>();
  EXPECT_EQ(tool_ids, tiny().tokenizer->encode(base + "<|im_start|>system\nget_weather,search<|im_end|>\n<|im_start|>assistant\n", true, true));
  json with_tools = chat_body(2);
  with_tools["tools"] = tools;
  with_tools["tool_choice"] = "none";
  const Reply c = post(inst.port(), "/v1/chat/completions", with_tools);
  ASSERT_EQ(c.status, 200) << c.body;
  EXPECT_EQ(c.j["usage"]["prompt_tokens"], tool_ids.size());

  json refused = chat_body(2);
  refused["messages"] = json::array({{{"role", "assistant"}, {"content", "I speak first."}}});
  const Reply r = post(inst.port(), "/v1/chat/completions", refused);
  EXPECT_TRUE(is_error(r, 400, json("messages"), json("chat_template_error")));
  EXPECT_NE(r.body.find("a conversation cannot start with the assistant"), std::string::npos) << r.body;
  EXPECT_TRUE(is_error(post(inst.port(), "/tokenize", {{"messages", refused["messages"]}}), 400, json("messages"), json("chat_template_error")));
  const Reply after = post(inst.port(), "/v1/chat/completions", chat_body(2));
  EXPECT_EQ(after.status, 200) << after.body;
  EXPECT_TRUE(inst.drained());
}

// ---------------------------------------------------------------------------
// /v1/completions

TEST_F(ServerApi, CompletionShapeAndUsage) {
  const std::string prompt = words(12, 1);
  const Reply r = post(port(), "/v1/completions", completion_body(prompt, 8));
  ASSERT_EQ(r.status, 200) << r.body;
  ASSERT_TRUE(r.j.is_object()) << r.body;
  EXPECT_EQ(r.j["object"], "text_completion");
  EXPECT_EQ(r.j["id"].get<std::string>().rfind("cmpl-", 0), 0u) << r.j["id"];
  EXPECT_EQ(r.j["model"], kServedName);
  EXPECT_TRUE(r.j["created"].is_number_integer());
  ASSERT_EQ(r.j["choices"].size(), 1u);
  const json& c = r.j["choices"][0];
  EXPECT_EQ(c["index"], 0);
  EXPECT_TRUE(c["text"].is_string());
  EXPECT_FALSE(c["text"].get<std::string>().empty());
  EXPECT_TRUE(c["logprobs"].is_null());
  EXPECT_EQ(c["finish_reason"], "length");
  const json& u = r.j["usage"];
  EXPECT_EQ(u["prompt_tokens"], token_count(prompt));
  EXPECT_EQ(u["completion_tokens"], 8);
  EXPECT_EQ(u["total_tokens"], u["prompt_tokens"].get<int64_t>() + 8);
  EXPECT_TRUE(u["prompt_tokens_details"]["cached_tokens"].is_number_integer());

  // Greedy is deterministic: the same request, the same text.
  EXPECT_EQ(choice_text(post(port(), "/v1/completions", completion_body(prompt, 8))), c["text"]);
}

TEST_F(ServerApi, RepeatedLongPromptReportsCachedTokens) {
  const std::string prompt = words(150, 2);
  const int64_t n_prompt = token_count(prompt);
  ASSERT_GT(n_prompt, 100);
  const Reply first = post(port(), "/v1/completions", completion_body(prompt, 2));
  ASSERT_EQ(first.status, 200) << first.body;
  const Reply second = post(port(), "/v1/completions", completion_body(prompt, 2));
  ASSERT_EQ(second.status, 200) << second.body;
  const int64_t cached = second.j["usage"]["prompt_tokens_details"]["cached_tokens"];
  if (prefix_caching_on())
    EXPECT_GT(cached, 0);
  else
    EXPECT_EQ(cached, 0);
  EXPECT_LT(cached, n_prompt) << "the last prompt token is always computed";
  EXPECT_EQ(second.j["usage"]["prompt_tokens"], n_prompt);
  EXPECT_EQ(choice_text(second), choice_text(first)) << "cached KV gives the same greedy text";
}

TEST_F(ServerApi, StopStringEndsWithFinishReasonStop) {
  const std::string prompt = words(10, 3);
  const std::string full = choice_text(post(port(), "/v1/completions", completion_body(prompt, 24)));
  // A stop string from the middle of the greedy text, ASCII so it is valid
  // UTF-8 whatever the tokens are.
  std::string stop;
  for (size_t i = full.size() / 3; i + 2 <= full.size() && stop.empty(); ++i)
    if (static_cast<unsigned char>(full[i]) < 0x80 && static_cast<unsigned char>(full[i + 1]) < 0x80 &&
        full[i] != ' ' && full[i + 1] != ' ')
      stop = full.substr(i, 2);
  ASSERT_FALSE(stop.empty()) << "no ASCII pair in: " << full;
  json body = completion_body(prompt, 24);
  body["stop"] = json::array({stop, "\x01never"});
  const Reply r = post(port(), "/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(choice_text(r), full.substr(0, full.find(stop))) << "stop: '" << stop << "' in '" << full << "'";
  EXPECT_LE(r.j["usage"]["completion_tokens"].get<int64_t>(), 24);
}

TEST_F(ServerApi, EchoPrependsThePrompt) {
  const std::string prompt = words(7, 4);
  const std::string plain = choice_text(post(port(), "/v1/completions", completion_body(prompt, 6)));
  json body = completion_body(prompt, 6);
  body["echo"] = true;
  const Reply r = post(port(), "/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(choice_text(r), prompt + plain);
  EXPECT_EQ(r.j["usage"]["completion_tokens"], 6);
}

TEST_F(ServerApi, LogprobsArraysMatchTheTokens) {
  json body = completion_body(words(8, 5), 5);
  body["logprobs"] = 3;
  const Reply r = post(port(), "/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const json& lp = r.j["choices"][0]["logprobs"];
  ASSERT_TRUE(lp.is_object()) << r.body;
  ASSERT_EQ(lp["tokens"].size(), 5u);
  ASSERT_EQ(lp["token_logprobs"].size(), 5u);
  ASSERT_EQ(lp["top_logprobs"].size(), 5u);
  ASSERT_EQ(lp["text_offset"].size(), 5u);
  std::string joined;
  json offsets = json::array();
  for (size_t i = 0; i < 5; ++i) {
    const std::string tok = lp["tokens"][i];
    const double logprob = lp["token_logprobs"][i];
    const json& top = lp["top_logprobs"][i];
    EXPECT_LE(logprob, 0.0);
    ASSERT_TRUE(top.is_object());
    EXPECT_GE(top.size(), 1u);
    EXPECT_LE(top.size(), 3u);
    // Greedy: the sampled token is the most likely one.
    double best = -1e30;
    for (const auto& [k, v] : top.items()) best = std::max(best, v.get<double>());
    EXPECT_NEAR(logprob, best, 1e-5) << "token " << i;
    ASSERT_TRUE(top.contains(tok)) << "token " << i << " '" << tok << "' not among " << top;
    if (i > 0) {
      EXPECT_GE(lp["text_offset"][i], lp["text_offset"][i - 1]);
    }
    offsets.push_back(chars(joined));
    joined += tok;
  }
  // For whole characters (the case of this prompt), the tokens spell the
  // text and text_offset counts characters before each.
  if (chars(choice_text(r)) == static_cast<int64_t>(choice_text(r).size())) {
    EXPECT_EQ(joined, choice_text(r));
    EXPECT_EQ(lp["text_offset"], offsets);
  }
}

TEST_F(ServerApi, NChoicesAreIndexedInOrder) {
  json body = completion_body(words(6, 6), 4);
  body["n"] = 3;
  body["temperature"] = 1.0;
  const Reply r = post(port(), "/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  ASSERT_EQ(r.j["choices"].size(), 3u) << r.body;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(r.j["choices"][i]["index"], i);
    EXPECT_EQ(r.j["choices"][i]["finish_reason"], "length");
  }
  EXPECT_EQ(r.j["usage"]["completion_tokens"], 12);
}

TEST_F(ServerApi, BestOfReturnsTheNMostLikely) {
  json body = completion_body(words(6, 7), 5);
  body["n"] = 2;
  body["best_of"] = 4;
  body["temperature"] = 1.0;
  body["logprobs"] = 0;
  const Reply r = post(port(), "/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  ASSERT_EQ(r.j["choices"].size(), 2u) << r.body;
  double sums[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    const json& c = r.j["choices"][i];
    EXPECT_EQ(c["index"], i);
    ASSERT_EQ(c["logprobs"]["token_logprobs"].size(), 5u);
    for (const json& v : c["logprobs"]["token_logprobs"]) sums[i] += v.get<double>();
  }
  EXPECT_GE(sums[0], sums[1] - 1e-3) << "choices come best first";
  EXPECT_EQ(r.j["usage"]["completion_tokens"], 10) << "usage counts the returned choices";
}

TEST_F(ServerApi, SameSeedSameText) {
  json body = completion_body(words(6, 8), 12);
  body["temperature"] = 1.0;
  body["seed"] = 1234;
  const std::string a = choice_text(post(port(), "/v1/completions", body));
  const std::string b = choice_text(post(port(), "/v1/completions", body));
  EXPECT_FALSE(a.empty());
  EXPECT_EQ(a, b);
  // n > 1 with a seed: each sibling is reproducible too.
  body["n"] = 2;
  const Reply x = post(port(), "/v1/completions", body);
  const Reply y = post(port(), "/v1/completions", body);
  EXPECT_EQ(choice_text(x, 0), choice_text(y, 0));
  EXPECT_EQ(choice_text(x, 1), choice_text(y, 1));
}

TEST_F(ServerApi, PromptAsTokenIds) {
  const std::string prompt = words(9, 9);
  const Reply t = post(port(), "/tokenize", {{"prompt", prompt}});
  ASSERT_EQ(t.status, 200);
  const auto ids = t.j["tokens"].get<std::vector<int32_t>>();
  json body = completion_body(prompt, 6);
  const Reply by_text = post(port(), "/v1/completions", body);
  body["prompt"] = ids;
  const Reply by_ids = post(port(), "/v1/completions", body);
  ASSERT_EQ(by_ids.status, 200) << by_ids.body;
  EXPECT_EQ(by_ids.j["usage"]["prompt_tokens"], ids.size());
  EXPECT_EQ(choice_text(by_ids), choice_text(by_text));
  body["prompt"] = json::array({ids});  // [[ids]]: the single prompt it holds
  EXPECT_EQ(choice_text(post(port(), "/v1/completions", body)), choice_text(by_text));
}

// ---------------------------------------------------------------------------
// Streaming

TEST_F(ServerApi, StreamedCompletionEqualsTheNonStreamedOne) {
  const std::string prompt = words(11, 10);
  const Reply whole = post(port(), "/v1/completions", completion_body(prompt, 10));
  ASSERT_EQ(whole.status, 200) << whole.body;
  json body = completion_body(prompt, 10);
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  const Stream s = post_stream(port(), "/v1/completions", body);
  ASSERT_EQ(s.status, 200) << s.raw;
  EXPECT_TRUE(sse_framing_ok(s.raw));
  EXPECT_TRUE(s.done);
  ASSERT_GE(s.chunks.size(), 2u);
  std::string text;
  const json& usage_chunk = s.chunks.back();
  for (size_t i = 0; i + 1 < s.chunks.size(); ++i) {
    const json& c = s.chunks[i];
    EXPECT_EQ(c["object"], "text_completion");
    EXPECT_EQ(c["id"], s.chunks[0]["id"]) << "one id per stream";
    EXPECT_EQ(c["created"], s.chunks[0]["created"]);
    EXPECT_TRUE(c.contains("usage") && c["usage"].is_null()) << "include_usage: usage null until the end";
    ASSERT_EQ(c["choices"].size(), 1u);
    const json& ch = c["choices"][0];
    EXPECT_EQ(ch["index"], 0);
    text += ch["text"].get<std::string>();
    const bool last = i + 2 == s.chunks.size();
    if (last) {
      EXPECT_EQ(ch["finish_reason"], "length");
    } else {
      EXPECT_TRUE(ch["finish_reason"].is_null()) << "finish_reason before the last chunk: " << c;
    }
  }
  EXPECT_EQ(text, choice_text(whole));
  // The usage chunk: no choices, the same usage as the whole response.
  EXPECT_TRUE(usage_chunk["choices"].is_array() && usage_chunk["choices"].empty()) << usage_chunk;
  EXPECT_EQ(usage_chunk["usage"]["prompt_tokens"], whole.j["usage"]["prompt_tokens"]);
  EXPECT_EQ(usage_chunk["usage"]["completion_tokens"], 10);
  EXPECT_EQ(usage_chunk["usage"]["total_tokens"], whole.j["usage"]["total_tokens"]);

  // Without include_usage no chunk carries a usage field.
  body.erase("stream_options");
  const Stream plain = post_stream(port(), "/v1/completions", body);
  EXPECT_TRUE(sse_framing_ok(plain.raw));
  std::string text2;
  for (const json& c : plain.chunks) {
    EXPECT_FALSE(c.contains("usage")) << c;
    ASSERT_EQ(c["choices"].size(), 1u);
    text2 += c["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text2, text);

  // Echo streams the prompt first.
  body["echo"] = true;
  const Stream echoed = post_stream(port(), "/v1/completions", body);
  std::string text3;
  for (const json& c : echoed.chunks) text3 += c["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(text3, prompt + text);
}

TEST_F(ServerApi, StreamedParallelSamplingFinishesEachChoiceOnce) {
  json body = completion_body(words(6, 11), 7);
  body["n"] = 2;
  body["temperature"] = 1.0;
  body["seed"] = 77;
  const Reply whole = post(port(), "/v1/completions", body);
  ASSERT_EQ(whole.status, 200) << whole.body;
  body["stream"] = true;
  const Stream s = post_stream(port(), "/v1/completions", body);
  ASSERT_EQ(s.status, 200) << s.raw;
  EXPECT_TRUE(sse_framing_ok(s.raw));
  std::map<int, std::string> text;
  std::map<int, int> finishes;
  for (const json& c : s.chunks) {
    for (const json& ch : c["choices"]) {
      const int i = ch["index"];
      ASSERT_TRUE(i == 0 || i == 1) << c;
      EXPECT_EQ(finishes[i], 0) << "choice " << i << " continued after its finish_reason";
      text[i] += ch["text"].get<std::string>();
      if (!ch["finish_reason"].is_null()) {
        EXPECT_EQ(ch["finish_reason"], "length");
        ++finishes[i];
      }
    }
  }
  EXPECT_EQ(finishes[0], 1);
  EXPECT_EQ(finishes[1], 1);
  // Seeded siblings are reproducible, streamed or not.
  EXPECT_EQ(text[0], choice_text(whole, 0));
  EXPECT_EQ(text[1], choice_text(whole, 1));
}

TEST_F(ServerApi, StreamedLogprobsMatchTheNonStreamedOnes) {
  // Prefer a prompt whose greedy text is not all ASCII, where text_offset
  // (characters) and byte counts part.
  json body;
  Reply whole;
  for (int seed = 30; seed < 40; ++seed) {
    body = completion_body(words(8, seed), 12);
    body["logprobs"] = 1;
    whole = post(port(), "/v1/completions", body);
    ASSERT_EQ(whole.status, 200) << whole.body;
    const std::string text = choice_text(whole);
    if (chars(text) != static_cast<int64_t>(text.size())) break;
  }
  body["stream"] = true;
  const Stream s = post_stream(port(), "/v1/completions", body);
  ASSERT_EQ(s.status, 200) << s.raw;
  EXPECT_TRUE(sse_framing_ok(s.raw));
  json tokens = json::array(), logprobs = json::array(), offsets = json::array();
  for (const json& c : s.chunks) {
    ASSERT_EQ(c["choices"].size(), 1u);
    const json& lp = c["choices"][0]["logprobs"];
    ASSERT_TRUE(lp.is_object()) << c;
    for (size_t i = 0; i < lp["tokens"].size(); ++i) {
      tokens.push_back(lp["tokens"][i]);
      logprobs.push_back(lp["token_logprobs"][i]);
      offsets.push_back(lp["text_offset"][i]);
    }
  }
  const json& want = whole.j["choices"][0]["logprobs"];
  EXPECT_EQ(tokens, want["tokens"]);
  EXPECT_EQ(logprobs, want["token_logprobs"]);
  EXPECT_EQ(offsets, want["text_offset"]) << "text: " << choice_text(whole);
}

TEST_F(ServerApi, StreamedChatEqualsTheNonStreamedOne) {
  json body = chat_body(12);
  const Reply whole = post(port(), "/v1/chat/completions", body);
  ASSERT_EQ(whole.status, 200) << whole.body;
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  const Stream s = post_stream(port(), "/v1/chat/completions", body);
  ASSERT_EQ(s.status, 200) << s.raw;
  EXPECT_TRUE(sse_framing_ok(s.raw));
  ASSERT_GE(s.chunks.size(), 2u);
  std::string content;
  for (size_t i = 0; i + 1 < s.chunks.size(); ++i) {
    const json& c = s.chunks[i];
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    EXPECT_EQ(c["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
    EXPECT_EQ(c["id"], s.chunks[0]["id"]);
    ASSERT_EQ(c["choices"].size(), 1u);
    const json& ch = c["choices"][0];
    const json& delta = ch["delta"];
    if (i == 0) {
      EXPECT_EQ(delta["role"], "assistant") << c;
    } else {
      EXPECT_FALSE(delta.contains("role")) << c;
    }
    if (delta.contains("content")) content += delta["content"].get<std::string>();
    const bool last = i + 2 == s.chunks.size();
    if (last) {
      EXPECT_EQ(ch["finish_reason"], whole.j["choices"][0]["finish_reason"]);
    } else {
      EXPECT_TRUE(ch["finish_reason"].is_null()) << c;
    }
  }
  EXPECT_EQ(content, whole.j["choices"][0]["message"]["content"]);
  const json& u = s.chunks.back();
  EXPECT_EQ(u["object"], "chat.completion.chunk");
  EXPECT_TRUE(u["choices"].is_array() && u["choices"].empty());
  for (const char* k : {"prompt_tokens", "completion_tokens", "total_tokens"}) EXPECT_EQ(u["usage"][k], whole.j["usage"][k]) << k;
  // The same prompt again: its full blocks are now in the prefix cache.
  EXPECT_EQ(u["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>() > 0, prefix_caching_on());
  EXPECT_GE(u["usage"]["prompt_tokens_details"]["cached_tokens"], whole.j["usage"]["prompt_tokens_details"]["cached_tokens"]);
}

// ---------------------------------------------------------------------------
// /v1/chat/completions

TEST_F(ServerApi, ChatCompletionShape) {
  const Reply r = post(port(), "/v1/chat/completions", chat_body(8));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j["object"], "chat.completion");
  EXPECT_EQ(r.j["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(r.j["model"], kServedName);
  ASSERT_EQ(r.j["choices"].size(), 1u);
  const json& c = r.j["choices"][0];
  EXPECT_EQ(c["index"], 0);
  EXPECT_EQ(c["message"]["role"], "assistant");
  EXPECT_TRUE(c["message"]["content"].is_string());
  EXPECT_TRUE(c["logprobs"].is_null());
  const std::string finish = c["finish_reason"];
  EXPECT_TRUE(finish == "stop" || finish == "length") << finish;
  const int64_t completion = r.j["usage"]["completion_tokens"];
  EXPECT_GE(completion, 1);
  EXPECT_LE(completion, 8);
  EXPECT_EQ(finish == "length", completion == 8);
  EXPECT_EQ(r.j["usage"]["total_tokens"], r.j["usage"]["prompt_tokens"].get<int64_t>() + completion);
}

TEST_F(ServerApi, ChatLogprobsWithTopAlternatives) {
  json body = chat_body(6);
  body["ignore_eos"] = true;
  body["logprobs"] = true;
  body["top_logprobs"] = 2;
  const Reply r = post(port(), "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const json& lp = r.j["choices"][0]["logprobs"];
  ASSERT_TRUE(lp.is_object()) << r.body;
  ASSERT_TRUE(lp["content"].is_array());
  ASSERT_EQ(lp["content"].size(), 6u);
  EXPECT_EQ(r.j["usage"]["completion_tokens"], 6);
  std::string joined;
  for (const json& t : lp["content"]) {
    ASSERT_TRUE(t["token"].is_string());
    const double logprob = t["logprob"];
    EXPECT_LE(logprob, 0.0);
    ASSERT_TRUE(t["bytes"].is_array());
    std::string bytes;
    for (const json& b : t["bytes"]) bytes += static_cast<char>(b.get<int>());
    joined += bytes;
    ASSERT_EQ(t["top_logprobs"].size(), 2u) << t;
    const json& top = t["top_logprobs"];
    EXPECT_GE(top[0]["logprob"].get<double>(), top[1]["logprob"].get<double>()) << "most likely first";
    // Greedy: the chosen token is the most likely one.
    EXPECT_EQ(top[0]["token"], t["token"]);
    EXPECT_NEAR(top[0]["logprob"].get<double>(), logprob, 1e-5);
  }
  // The content is the tokens' bytes (a character cut off by max_tokens
  // comes out as U+FFFD, as JSON text must be valid UTF-8).
  EXPECT_EQ(valid_utf8(joined), r.j["choices"][0]["message"]["content"]);
}

// ---------------------------------------------------------------------------
// Concurrency

TEST_F(ServerApi, GreedyOutputIsTheSameAloneOrAmong32Clients) {
  struct Case {
    std::string prompt;
    int max_tokens;
    int n;
  };
  std::vector<Case> cases;
  for (int i = 0; i < 32; ++i)
    cases.push_back({words(3 + (i * 37) % 120, 200 + i), 4 + (i * 11) % 29, i % 5 == 0 ? 2 : 1});
  // Alone, one after another.
  std::vector<std::string> alone;
  for (const Case& c : cases) {
    const Reply r = post(port(), "/v1/completions", completion_body(c.prompt, c.max_tokens));
    alone.push_back(choice_text(r));
  }
  ASSERT_TRUE(inst_->drained());

  // All at once, released together.
  std::vector<Reply> together(cases.size());
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (size_t i = 0; i < cases.size(); ++i) {
    threads.emplace_back([&, i] {
      json body = completion_body(cases[i].prompt, cases[i].max_tokens);
      if (cases[i].n > 1) body["n"] = cases[i].n;
      ++ready;
      while (ready.load() < static_cast<int>(cases.size())) std::this_thread::yield();
      together[i] = post(port(), "/v1/completions", body);
    });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    const Reply& r = together[i];
    ASSERT_EQ(r.status, 200) << r.body << r.error;
    ASSERT_EQ(r.j["choices"].size(), static_cast<size_t>(cases[i].n));
    for (int k = 0; k < cases[i].n; ++k) EXPECT_EQ(choice_text(r, static_cast<size_t>(k)), alone[i]);
    EXPECT_EQ(r.j["usage"]["completion_tokens"], cases[i].max_tokens * cases[i].n);
  }
}

// ---------------------------------------------------------------------------
// Bad input: the right status and error shape, and the server keeps serving

TEST_F(ServerApi, BadRequestsGetOpenAIErrors) {
  const int p = port();
  EXPECT_TRUE(is_error(post_raw(p, "/v1/completions", "{\"prompt\": \"hi\", "), 400));
  EXPECT_TRUE(is_error(post_raw(p, "/v1/chat/completions", "not json at all"), 400));
  EXPECT_TRUE(is_error(post_raw(p, "/v1/completions", "[1, 2]"), 400)) << "not an object";

  EXPECT_TRUE(is_error(post(p, "/v1/completions", {{"prompt", "hi"}, {"max_tokens", "ten"}}), 400, json("max_tokens"),
                       json("invalid_type")));
  EXPECT_TRUE(is_error(post(p, "/v1/completions", {{"prompt", "hi"}, {"temperature", "hot"}}), 400, json("temperature")));
  EXPECT_TRUE(is_error(post(p, "/v1/completions", {{"prompt", 42}}), 400, json("prompt")));
  EXPECT_TRUE(is_error(post(p, "/v1/completions", {{"max_tokens", 3}}), 400, json("prompt")));
  EXPECT_TRUE(is_error(post(p, "/v1/chat/completions", {{"messages", "hello"}}), 400, json("messages")));
  EXPECT_TRUE(is_error(post(p, "/v1/completions", {{"prompt", "hi"}, {"n", 0}}), 400, json("n")));

  EXPECT_TRUE(is_error(post(p, "/v1/completions", {{"model", "no-such-model"}, {"prompt", "hi"}}), 404, json("model"),
                       json("model_not_found")));
  EXPECT_TRUE(is_error(post(p, "/tokenize", {{"model", "no-such-model"}, {"prompt", "hi"}}), 404, json("model"),
                       json("model_not_found")));

  // Longer than the context, alone or with max_tokens.
  const std::string huge = words(kMaxModelLen + 50, 12);
  ASSERT_GT(token_count(huge), kMaxModelLen);
  EXPECT_TRUE(is_error(post(p, "/v1/completions", completion_body(huge, 4)), 400, json("prompt"),
                       json("context_length_exceeded")));
  const std::string half = words(300, 13);
  EXPECT_TRUE(is_error(post(p, "/v1/completions", completion_body(half, 300)), 400, json("prompt"),
                       json("context_length_exceeded")));
  json chat = chat_body(4);
  chat["messages"][1]["content"] = huge;
  EXPECT_TRUE(is_error(post(p, "/v1/chat/completions", chat), 400, json("messages"), json("context_length_exceeded")));

  // Fits the context, but n sequences of it can never fit the KV cache.
  {
    json body = completion_body("short", 400);
    body["n"] = 128;
    const int64_t blocks_needed = 128 * ((400 + 3) / 4);
    ASSERT_GT(blocks_needed, engine().n_kv_blocks()) << "the request must exceed the cache";
    EXPECT_TRUE(is_error(post(p, "/v1/completions", body), 400, json("max_tokens")));
  }

  // Features tandem does not implement are refused, not ignored.
  json tools = chat_body(4);
  tools["tools"] = json::array({{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", json::object()}}}}});
  // A body nested past any real request's depth is refused before anything
  // recurses over it (copying or printing it would overflow the stack).
  {
    const int levels = 100000;
    const std::string deep = R"({"messages": [{"role": "user", "content": "hi", "extra": )" + std::string(levels, '[') +
                             std::string(levels, ']') + "}]}";
    httplib::Client cli("127.0.0.1", p);
    const auto r = cli.Post("/v1/chat/completions", deep, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400);
    EXPECT_NE(r->body.find("nests deeper than"), std::string::npos) << r->body;
    EXPECT_EQ(get(p, "/health").status, 200);
  }
  // Tools render into the prompt, but tool calls are not parsed out of the output: tool_choice "none" only.
  EXPECT_TRUE(is_error(post(p, "/v1/chat/completions", tools), 400, json("tool_choice"), json("unsupported_parameter")));
  json suffix = completion_body("hi", 4);
  suffix["suffix"] = "end";
  EXPECT_TRUE(is_error(post(p, "/v1/completions", suffix), 400, json("suffix"), json("unsupported_parameter")));

  EXPECT_TRUE(is_error(post(p, "/detokenize", {{"tokens", {1, 2, 1 << 30}}}), 400, json("tokens")));

  // Unknown routes.
  EXPECT_TRUE(is_error(get(p, "/v1/no-such-route"), 404, json(nullptr)));
  EXPECT_TRUE(is_error(post(p, "/v1/engines/x/completions", {{"prompt", "hi"}}), 404, json(nullptr)));

  // Still serving.
  const Reply ok = post(p, "/v1/completions", completion_body(words(5, 14), 3));
  ASSERT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(ok.j["usage"]["completion_tokens"], 3);
  EXPECT_EQ(get(p, "/health").status, 200);
}

// ---------------------------------------------------------------------------
// Client disconnect aborts the request

TEST_F(ServerApi, ClientDisconnectAbortsTheRequest) {
  const int64_t aborted_before = engine().metrics().requests_aborted.load();
  const std::string prompt = words(6, 15);
  json body = completion_body(prompt, kMaxModelLen - static_cast<int>(token_count(prompt)));
  body["stream"] = true;
  int seen = 0;
  const Stream s = post_stream(port(), "/v1/completions", body, [&](const json&) { return ++seen < 2; });
  EXPECT_EQ(s.status, 200);
  EXPECT_EQ(seen, 2);
  EXPECT_FALSE(s.done);
  EXPECT_EQ(s.error, httplib::Error::Canceled);
  const bool released = wait_for([&] {
    return engine().kv_stats().owned == 0 && engine().metrics().requests_aborted.load() > aborted_before;
  });
  EXPECT_TRUE(released) << "owned blocks " << engine().kv_stats().owned << ", aborted "
                        << engine().metrics().requests_aborted.load() << " (was " << aborted_before << ")";
  EXPECT_TRUE(wait_for([&] { return inst_->server().in_flight() == 0; }));
  // And the server goes on.
  EXPECT_EQ(post(port(), "/v1/completions", completion_body(words(4, 16), 2)).status, 200);
}

// ---------------------------------------------------------------------------
// Authentication and the body limit (a second server)

// The load generator (`tandem bench serve`) against this server: every request
// counted, the token lengths as asked, the prefix-cache hit rate read from usage.
TEST_F(ServerApi, LoadGeneratorMeasuresASweep) {
  loadgen::LoadConfig c;
  c.url = "http://127.0.0.1:" + std::to_string(port());
  c.concurrency = {1, 3};
  c.requests_per_level = 6;
  c.input_words = 40;
  c.shared_prefix_words = 32;  // every prompt starts alike: the cache must hit
  c.output_tokens = 7;
  std::vector<std::string> progress;
  const auto results = loadgen::run_sweep(c, [&](const std::string& line) { progress.push_back(line); });
  ASSERT_EQ(results.size(), 2u);
  for (const auto& r : results) {
    EXPECT_EQ(r.requests, 6);
    EXPECT_EQ(r.errors, 0) << r.first_error;
    EXPECT_DOUBLE_EQ(r.mean_output_tokens, 7.0);
    EXPECT_GT(r.mean_input_tokens, 40.0);  // at least one token per word
    EXPECT_GT(r.output_tokens_per_s, 0.0);
    EXPECT_LE(r.ttft_s.p50, r.e2e_s.p50);
    EXPECT_LE(r.e2e_s.p50, r.e2e_s.p99);
  }
  if (prefix_caching_on())
    EXPECT_GT(results[1].prefix_cache_hit_rate, 0.3);
  else
    EXPECT_EQ(results[1].prefix_cache_hit_rate, 0.0);
  const nlohmann::json j = nlohmann::json::parse(loadgen::results_to_json(c, results));
  EXPECT_EQ(j["levels"].size(), 2u);
  EXPECT_EQ(j["levels"][1]["concurrency"], 3);
  // The sweep stops after a level whose p99 latency exceeds the bound.
  c.max_p99_e2e_s = 1e-9;
  EXPECT_EQ(loadgen::run_sweep(c, nullptr).size(), 1u);
}

TEST(ServerAuth, ApiKeyIsRequiredExceptForHealthAndMetrics) {
  ServerConfig sc;
  sc.api_key = "sekrit";
  sc.max_body_bytes = 4096;
  Instance inst(engine_config(), sc);
  const int p = inst.port();
  const httplib::Headers good = {{"Authorization", "Bearer sekrit"}};
  const httplib::Headers bad = {{"Authorization", "Bearer wrong"}};

  EXPECT_TRUE(is_error(post(p, "/v1/completions", completion_body("hi", 2)), 401, json(nullptr), json("invalid_api_key")));
  EXPECT_TRUE(is_error(post(p, "/v1/completions", completion_body("hi", 2), bad), 401, json(nullptr),
                       json("invalid_api_key")));
  EXPECT_TRUE(is_error(get(p, "/v1/models"), 401, json(nullptr), json("invalid_api_key")));
  EXPECT_TRUE(is_error(post(p, "/tokenize", {{"prompt", "hi"}}), 401, json(nullptr), json("invalid_api_key")));
  EXPECT_EQ(get(p, "/health").status, 200);
  EXPECT_EQ(get(p, "/metrics").status, 200);

  EXPECT_EQ(get(p, "/v1/models", good).status, 200);
  const Reply r = post(p, "/v1/completions", completion_body("hi there", 3), good);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j["usage"]["completion_tokens"], 3);

  // A body over the limit: 413 with the error shape, naming the limit.
  const Reply big = post(p, "/v1/completions", completion_body(std::string(8000, 'a'), 2), good);
  EXPECT_TRUE(is_error(big, 413, json(nullptr), json("payload_too_large")));
  EXPECT_NE(big.body.find("4096"), std::string::npos) << big.body;
  EXPECT_EQ(post(p, "/v1/completions", completion_body("hi there", 3), good).status, 200);
  EXPECT_TRUE(inst.drained());
}

// ---------------------------------------------------------------------------
// A KV pool smaller than the model's context sets max_model_len

TEST(ServerContext, APoolSmallerThanTheContextSetsMaxModelLenAndAChatWithoutMaxTokensFinishes) {
  EngineConfig ec = engine_config();
  const Model& m = *tiny().model;
  const int64_t n_blocks = 40;  // 160 tokens of the tiny preset's 512
  ec.kv_cache_bytes = static_cast<int64_t>(KvPool::bytes_per_block(m.kv_shape(1, ec.block_size, ec.kv_dtype, ec.max_num_seqs))) * n_blocks;
  Instance inst(ec);
  ASSERT_EQ(inst.engine().n_kv_blocks(), n_blocks);
  EXPECT_TRUE(inst.engine().max_model_len_capped_by_cache());
  EXPECT_EQ(inst.engine().max_model_len(), n_blocks * ec.block_size);
  const Reply models = get(inst.port(), "/v1/models");
  EXPECT_EQ(models.j["data"][0]["max_model_len"], n_blocks * ec.block_size);
  // No max_tokens: the completion may fill the context, and the pool holds it.
  const json chat = {{"messages", {{{"role", "user"}, {"content", "tell me everything"}}}},
                     {"temperature", 0}, {"ignore_eos", true}};
  const Reply r = post(inst.port(), "/v1/chat/completions", chat);
  ASSERT_EQ(r.status, 200) << r.j.dump();
  EXPECT_EQ(r.j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r.j["usage"]["total_tokens"], n_blocks * ec.block_size);
  EXPECT_TRUE(inst.drained());

  // Given explicitly, max_model_len is the operator's: a request the pool
  // cannot hold is refused as such, not silently shortened.
  ec.max_model_len = 300;
  Instance explicit_len(ec);
  EXPECT_FALSE(explicit_len.engine().max_model_len_capped_by_cache());
  EXPECT_EQ(explicit_len.engine().max_model_len(), 300);
  const Reply too_big = post(explicit_len.port(), "/v1/chat/completions", chat);
  EXPECT_EQ(too_big.status, 400) << too_big.j.dump();
  EXPECT_EQ(too_big.j["error"]["code"], "request_too_large") << too_big.j.dump();
  EXPECT_TRUE(explicit_len.drained());
}

// ---------------------------------------------------------------------------
// Admission control: a full waiting queue answers 429

TEST(ServerQueue, FullQueueAnswers429) {
  EngineConfig ec = engine_config();
  ec.max_num_seqs = 1;
  ec.max_waiting_requests = 1;
  Instance inst(ec);
  const int p = inst.port();
  const std::string a_prompt = words(4, 17);
  const Reply t = post(p, "/tokenize", {{"prompt", a_prompt}});
  ASSERT_EQ(t.status, 200);
  const int a_max_tokens = kMaxModelLen - t.j["count"].get<int>();

  // While A holds the only running slot and B fills the one waiting place,
  // every further request must be refused. A is as long as the context
  // allows; should it still finish before the others were answered (a very
  // fast machine), the premise did not hold and the round is run again.
  bool premise_held = false;
  for (int attempt = 0; attempt < 3 && !premise_held; ++attempt) {
    SCOPED_TRACE("attempt " + std::to_string(attempt));
    // A: streams until told to hang up (which aborts it).
    std::atomic<bool> hang_up{false}, a_finished{false};
    std::promise<void> a_running;
    bool a_signalled = false;
    json a_body = completion_body(a_prompt, a_max_tokens);
    a_body["stream"] = true;
    std::thread a([&] {
      post_stream(p, "/v1/completions", a_body, [&](const json& chunk) {
        if (!chunk["choices"].empty() && !chunk["choices"][0]["finish_reason"].is_null()) a_finished = true;
        if (!a_signalled) {
          a_signalled = true;
          a_running.set_value();
        }
        return !hang_up.load();
      });
      if (!a_signalled) a_running.set_value();
    });
    ASSERT_EQ(a_running.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);

    // B: queued behind A.
    Reply b_reply;
    std::thread b([&] { b_reply = post(p, "/v1/completions", completion_body(words(4, 18), 3)); });
    const bool queued = wait_for([&] { return inst.engine().metrics().waiting.load() == 1 || a_finished.load(); });

    // C: several more at once.
    std::vector<Reply> c_replies(4);
    std::vector<std::thread> cs;
    for (size_t i = 0; i < c_replies.size(); ++i)
      cs.emplace_back([&, i] { c_replies[i] = post(p, "/v1/completions", completion_body(words(4, 19), 3)); });
    for (auto& th : cs) th.join();
    premise_held = !a_finished.load();
    hang_up = true;
    a.join();
    b.join();

    EXPECT_TRUE(queued) << "B never showed up as waiting";
    EXPECT_EQ(b_reply.status, 200) << b_reply.body << b_reply.error;
    int rejected = 0;
    for (const Reply& r : c_replies) {
      if (r.status == 429) {
        ++rejected;
        EXPECT_TRUE(is_error(r, 429, json(nullptr), json("rate_limit_exceeded"), "rate_limit_error"));
      } else {
        EXPECT_EQ(r.status, 200) << r.body << r.error;
      }
    }
    if (premise_held) {
      EXPECT_GE(rejected, 1);
    }
    EXPECT_TRUE(inst.drained());
  }
  EXPECT_TRUE(premise_held) << "A finished before the queue could be tested, three times";
  // Still serving once the queue has room.
  const Reply ok = post(p, "/v1/completions", completion_body(words(4, 20), 2));
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_TRUE(inst.drained());
}

// ---------------------------------------------------------------------------
// Health follows the engine loop; draining

TEST(ServerLifecycle, HealthFollowsTheEngineLoopAndDrainStopsAdmission) {
  ServerConfig sc;
  sc.health_timeout_ms = 200;
  Instance inst(engine_config(), sc, /*start_engine=*/false);
  const int p = inst.port();
  const Reply dead = get(p, "/health");
  EXPECT_EQ(dead.status, 503) << dead.body;

  inst.engine().start();
  EXPECT_EQ(get(p, "/health").status, 200);

  // A request in flight when draining begins still completes; new ones and
  // /health get 503.
  json body = completion_body(words(5, 21), 200);
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  Reply health_draining, new_request;
  std::string metrics_draining;
  bool drained_once = false;
  const Stream s = post_stream(p, "/v1/completions", body, [&](const json&) {
    if (!drained_once) {
      drained_once = true;
      inst.server().begin_drain();
      health_draining = get(p, "/health");
      new_request = post(p, "/v1/completions", completion_body("hello", 2));
      metrics_draining = get(p, "/metrics").body;
    }
    return true;
  });
  EXPECT_TRUE(inst.server().draining());
  EXPECT_EQ(health_draining.status, 503) << health_draining.body;
  EXPECT_TRUE(is_error(new_request, 503, json(nullptr), std::nullopt, "server_error"));
  EXPECT_EQ(metric(metrics_draining, "tandem_ready"), 0.0);
  ASSERT_EQ(s.status, 200);
  EXPECT_TRUE(sse_framing_ok(s.raw));
  ASSERT_FALSE(s.chunks.empty());
  EXPECT_EQ(s.chunks.back()["usage"]["completion_tokens"], 200) << "the in-flight request ran to the end";
  EXPECT_TRUE(inst.drained());
}

}  // namespace
}  // namespace tandem::server
