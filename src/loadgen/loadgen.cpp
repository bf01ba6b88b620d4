#include "loadgen/loadgen.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "util/clock.h"
#include "util/error.h"

namespace tandem::loadgen {

namespace {

using nlohmann::json;

// A fixed word list: prompts are made of these so that every server
// tokenizes the same text the same way.
const char* const kWords[] = {
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on", "not",
    "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an", "had", "they", "you", "were",
    "their", "one", "all", "we", "can", "her", "has", "there", "been", "if", "more", "when", "will", "would",
    "who", "so", "no", "time", "day", "water", "light", "house", "world", "people", "number", "river", "city"};

struct Url {
  std::string scheme_host_port;
  std::string base_path;  // e.g. "" or "/v1" prefix without trailing slash
};

Url parse_url(const std::string& url) {
  const size_t scheme = url.find("://");
  if (scheme == std::string::npos) throw Error("--url must look like http://HOST:PORT, got '" + url + "'");
  const size_t path = url.find('/', scheme + 3);
  Url u;
  u.scheme_host_port = path == std::string::npos ? url : url.substr(0, path);
  u.base_path = path == std::string::npos ? "" : url.substr(path);
  while (!u.base_path.empty() && u.base_path.back() == '/') u.base_path.pop_back();
  if (u.base_path.size() >= 3 && u.base_path.substr(u.base_path.size() - 3) == "/v1")
    u.base_path.resize(u.base_path.size() - 3);
  return u;
}

struct Rng {
  uint64_t s;
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  double unit() { return static_cast<double>(next() >> 11) / static_cast<double>(1ull << 53); }
};

int jittered(int base, double jitter, Rng& rng) {
  if (jitter <= 0) return base;
  const double f = 1.0 + jitter * (2.0 * rng.unit() - 1.0);
  return std::max(1, static_cast<int>(std::lround(base * f)));
}

std::string make_prompt(int words, int shared_words, Rng& rng) {
  std::string p;
  Rng shared{0x5eedull};
  for (int i = 0; i < words; ++i) {
    Rng& r = i < shared_words ? shared : rng;
    if (!p.empty()) p += ' ';
    p += kWords[r.next() % (sizeof kWords / sizeof kWords[0])];
  }
  return p;
}

struct Sample {
  bool ok = false;
  std::string error;
  double ttft_s = 0, e2e_s = 0;
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
};

httplib::Headers headers_for(const LoadConfig& c) {
  httplib::Headers h;
  if (!c.api_key.empty()) h.emplace("Authorization", "Bearer " + c.api_key);
  return h;
}

void read_usage(const json& j, Sample& s) {
  if (!j.contains("usage") || !j["usage"].is_object()) return;
  const json& u = j["usage"];
  s.prompt_tokens = u.value("prompt_tokens", int64_t{0});
  s.completion_tokens = u.value("completion_tokens", int64_t{0});
  if (u.contains("prompt_tokens_details") && u["prompt_tokens_details"].is_object())
    s.cached_tokens = u["prompt_tokens_details"].value("cached_tokens", int64_t{0});
}

Sample one_request(const LoadConfig& c, const Url& url, const std::string& model, Rng& rng) {
  json body;
  body["model"] = model;
  const int out_tokens = jittered(c.output_tokens, c.jitter, rng);
  const std::string prompt = make_prompt(jittered(c.input_words, c.jitter, rng), c.shared_prefix_words, rng);
  std::string path = url.base_path;
  if (c.endpoint == "chat") {
    path += "/v1/chat/completions";
    body["messages"] = json::array({{{"role", "user"}, {"content", prompt}}});
  } else {
    path += "/v1/completions";
    if (c.input_tokens > 0) {
      // Token ids in [256, 1024): present in any real vocabulary, and the
      // prompt length is then exact for every server.
      json ids = json::array();
      const int n_ids = jittered(c.input_tokens, c.jitter, rng);
      for (int i = 0; i < n_ids; ++i) ids.push_back(256 + static_cast<int>(rng.next() % 768));
      body["prompt"] = ids;
    } else {
      body["prompt"] = prompt;
    }
  }
  body["max_tokens"] = out_tokens;
  body["temperature"] = c.temperature;
  body["ignore_eos"] = true;
  if (c.n != 1) body["n"] = c.n;
  if (c.best_of > 0) body["best_of"] = c.best_of;
  body["stream"] = c.stream;
  if (c.stream) body["stream_options"] = {{"include_usage", true}};

  httplib::Client cli(url.scheme_host_port);

  cli.set_tcp_nodelay(true);
  cli.set_read_timeout(c.timeout_s, 0);
  cli.set_write_timeout(c.timeout_s, 0);
  cli.set_connection_timeout(10, 0);
  Sample s;
  Stopwatch sw;
  bool first = true;
  std::string buffer;
  std::string error_body;
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.headers = headers_for(c);
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  int status = 0;
  req.response_handler = [&](const httplib::Response& r) {
    status = r.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    if (status != 200) {
      error_body.append(data, len);
      return true;
    }
    if (!c.stream) {
      buffer.append(data, len);
      return true;
    }
    buffer.append(data, len);
    size_t pos;
    while ((pos = buffer.find("\n\n")) != std::string::npos) {
      const std::string event = buffer.substr(0, pos);
      buffer.erase(0, pos + 2);
      if (event.rfind("data: ", 0) != 0) continue;
      const std::string payload = event.substr(6);
      if (payload == "[DONE]") continue;
      const json j = json::parse(payload, nullptr, false);
      if (j.is_discarded()) continue;
      bool has_text = false;
      if (j.contains("choices") && j["choices"].is_array()) {
        for (const auto& ch : j["choices"]) {
          if (ch.contains("text") && ch["text"].is_string() && !ch["text"].get<std::string>().empty()) has_text = true;
          if (ch.contains("delta") && ch["delta"].is_object() && ch["delta"].contains("content") &&
              ch["delta"]["content"].is_string() && !ch["delta"]["content"].get<std::string>().empty())
            has_text = true;
        }
      }
      if (has_text && first) {
        s.ttft_s = sw.elapsed_s();
        first = false;
      }
      read_usage(j, s);
    }
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  const bool sent = cli.send(req, res, err);
  s.e2e_s = sw.elapsed_s();
  if (!sent) {
    s.error = "connection error: " + httplib::to_string(err);
    return s;
  }
  if (status != 200) {
    s.error = "HTTP " + std::to_string(status) + ": " + error_body.substr(0, 200);
    return s;
  }
  if (!c.stream) {
    const json j = json::parse(buffer, nullptr, false);
    if (j.is_discarded()) {
      s.error = "response is not JSON";
      return s;
    }
    read_usage(j, s);
    s.ttft_s = s.e2e_s;  // unknown without streaming: the whole response
  }
  if (first && c.stream) s.ttft_s = s.e2e_s;
  s.ok = true;
  return s;
}

Percentiles percentiles(std::vector<double> v) {
  Percentiles p;
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  p.mean = sum / static_cast<double>(v.size());
  auto at = [&](double q) {
    const double idx = q * static_cast<double>(v.size() - 1);
    const auto lo = static_cast<size_t>(std::floor(idx));
    const auto hi = std::min(lo + 1, v.size() - 1);
    return v[lo] + (v[hi] - v[lo]) * (idx - static_cast<double>(lo));
  };
  p.p50 = at(0.50);
  p.p90 = at(0.90);
  p.p95 = at(0.95);
  p.p99 = at(0.99);
  return p;
}

std::string discover_model(const LoadConfig& c, const Url& url) {
  httplib::Client cli(url.scheme_host_port);
  cli.set_tcp_nodelay(true);
  cli.set_connection_timeout(10, 0);
  cli.set_read_timeout(30, 0);
  auto res = cli.Get((url.base_path + "/v1/models").c_str(), headers_for(c));
  if (!res) throw Error("cannot reach " + c.url + ": " + httplib::to_string(res.error()));
  if (res->status != 200) throw Error("GET /v1/models returned HTTP " + std::to_string(res->status) + "; pass --model");
  const json j = json::parse(res->body, nullptr, false);
  if (j.is_discarded() || !j.contains("data") || !j["data"].is_array() || j["data"].empty())
    throw Error("GET /v1/models returned no model; pass --model");
  return j["data"][0].value("id", "");
}

}  // namespace

std::vector<LevelResult> run_sweep(const LoadConfig& c, const std::function<void(const std::string&)>& progress) {
  const Url url = parse_url(c.url);
  const std::string model = c.model.empty() ? discover_model(c, url) : c.model;
  std::vector<LevelResult> results;
  for (int level : c.concurrency) {
    const int total = c.requests_per_level > 0 ? c.requests_per_level : std::max(8, 4 * level);
    std::vector<Sample> samples(static_cast<size_t>(total));
    std::atomic<int> next{0}, done{0};
    Stopwatch sw;
    std::vector<std::thread> workers;
    for (int w = 0; w < level; ++w) {
      workers.emplace_back([&, w] {
        Rng rng{c.seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(w) * 7919 + 1};
        for (int i = next++; i < total; i = next++) {
          samples[static_cast<size_t>(i)] = one_request(c, url, model, rng);
          ++done;
        }
      });
    }
    while (done.load() < total) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      if (progress) {
        char line[160];
        std::snprintf(line, sizeof line, "concurrency %d: %d/%d requests, %.1f s", level, done.load(), total, sw.elapsed_s());
        progress(line);
      }
    }
    for (auto& t : workers) t.join();
    LevelResult r;
    r.concurrency = level;
    r.requests = total;
    r.duration_s = sw.elapsed_s();
    std::vector<double> ttft, tpot, e2e;
    int64_t in_tokens = 0, out_tokens = 0, cached = 0;
    int ok = 0;
    for (const Sample& s : samples) {
      if (!s.ok) {
        ++r.errors;
        if (r.first_error.empty()) r.first_error = s.error;
        continue;
      }
      ++ok;
      ttft.push_back(s.ttft_s);
      e2e.push_back(s.e2e_s);
      const int64_t per_seq = c.n > 0 ? s.completion_tokens / c.n : s.completion_tokens;
      if (per_seq > 1) tpot.push_back((s.e2e_s - s.ttft_s) / static_cast<double>(per_seq - 1));
      in_tokens += s.prompt_tokens;
      out_tokens += s.completion_tokens;
      cached += s.cached_tokens;
    }
    r.requests_per_s = ok / r.duration_s;
    r.output_tokens_per_s = static_cast<double>(out_tokens) / r.duration_s;
    r.ttft_s = percentiles(ttft);
    r.tpot_s = percentiles(tpot);
    r.e2e_s = percentiles(e2e);
    r.mean_input_tokens = ok ? static_cast<double>(in_tokens) / ok : 0;
    r.mean_output_tokens = ok ? static_cast<double>(out_tokens) / ok : 0;
    r.prefix_cache_hit_rate = in_tokens ? static_cast<double>(cached) / static_cast<double>(in_tokens) : 0;
    results.push_back(r);
    if (c.max_p99_e2e_s > 0 && r.e2e_s.p99 > c.max_p99_e2e_s) {
      if (progress) progress("stopping the sweep: p99 e2e latency exceeded the bound");
      break;
    }
  }
  return results;
}

std::string results_to_json(const LoadConfig& c, const std::vector<LevelResult>& results) {
  json levels = json::array();
  auto pct = [](const Percentiles& p) {
    return json{{"mean", p.mean}, {"p50", p.p50}, {"p90", p.p90}, {"p95", p.p95}, {"p99", p.p99}};
  };
  for (const LevelResult& r : results) {
    levels.push_back({{"concurrency", r.concurrency}, {"requests", r.requests}, {"errors", r.errors},
                      {"first_error", r.first_error}, {"duration_s", r.duration_s},
                      {"requests_per_s", r.requests_per_s}, {"output_tokens_per_s", r.output_tokens_per_s},
                      {"ttft_s", pct(r.ttft_s)}, {"tpot_s", pct(r.tpot_s)}, {"e2e_s", pct(r.e2e_s)},
                      {"mean_input_tokens", r.mean_input_tokens}, {"mean_output_tokens", r.mean_output_tokens},
                      {"prefix_cache_hit_rate", r.prefix_cache_hit_rate}});
  }
  json out = {{"url", c.url}, {"endpoint", c.endpoint}, {"input_words", c.input_words},
              {"output_tokens", c.output_tokens}, {"n", c.n}, {"stream", c.stream}, {"levels", levels}};
  return out.dump(2);
}

std::string results_to_table(const std::vector<LevelResult>& results) {
  std::string s;
  char line[512];
  std::snprintf(line, sizeof line, "%5s %5s %4s %8s %9s %9s %9s %9s %9s %9s %9s %7s %7s %6s\n", "conc", "reqs",
                "err", "req/s", "out tok/s", "ttft p50", "ttft p99", "tpot p50", "tpot p99", "e2e p50", "e2e p99",
                "in tok", "out tok", "cache");
  s += line;
  for (const LevelResult& r : results) {
    std::snprintf(line, sizeof line, "%5d %5d %4d %8.2f %9.1f %8.3fs %8.3fs %8.4fs %8.4fs %8.2fs %8.2fs %7.1f %7.1f %5.1f%%\n",
                  r.concurrency, r.requests, r.errors, r.requests_per_s, r.output_tokens_per_s, r.ttft_s.p50,
                  r.ttft_s.p99, r.tpot_s.p50, r.tpot_s.p99, r.e2e_s.p50, r.e2e_s.p99, r.mean_input_tokens,
                  r.mean_output_tokens, 100.0 * r.prefix_cache_hit_rate);
    s += line;
    if (!r.first_error.empty()) s += "      first error: " + r.first_error + "\n";
  }
  return s;
}

}  // namespace tandem::loadgen
