#include "server/http_server.h"

#include "server/bounded_task_queue.h"

#include <httplib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>
#include <random>
#include <thread>

#include "engine/engine_core.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "server/openai_protocol.h"
#include "server/parallel_status.h"
#include "server/prometheus.h"
#include "server/request_channel.h"
#include "tokenizer/tokenizer.h"
#include "util/constant_time.h"
#include "util/error.h"

namespace tandem::server {

namespace {

using nlohmann::json;

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(dump_body(body), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) { send_json(res, e.status, e.to_json()); }

int64_t unix_now() { return static_cast<int64_t>(std::time(nullptr)); }

uint64_t random_u64() {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  return rng();
}

std::string token_text(const Tokenizer& tok, int32_t id) { return tok.token_to_piece(id, /*render_special=*/true); }

OutputLogprob to_output_logprob(const Tokenizer& tok, const SampleResult& s) {
  OutputLogprob o;
  o.token = token_text(tok, s.token);
  o.logprob = s.logprob;
  for (const TokenLogprob& t : s.top) o.top.push_back({token_text(tok, t.token), t.logprob});
  return o;
}

// Everything one generation request needs while its outputs are relayed.
struct Job {
  bool chat = false;
  bool stream = false;
  bool include_usage = false;
  std::string echo_text;  // completions with echo: the prompt text
  bool want_logprobs = false;
  ResponseHeader header;
  std::function<void()> abort;  // ends the request early (client gone, timeout)
  int32_t n = 1;
  int32_t best_of = 1;
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
  uint64_t id = 0;
  std::shared_ptr<RequestChannel> channel;
  std::shared_ptr<void> dp_hold;  // the data-parallel front's count of this request (DpPlacement)
  int error_status = 0;           // the HTTP status of the error the request ended with, if it did

  struct Seq {
    std::string text;
    std::vector<OutputLogprob> logprobs;
    std::string finish;
    double cumulative_logprob = 0;
    int64_t tokens = 0;
    int64_t chars_sent = 0;  // of the tokens streamed so far (text_offset of the next chunk)
    bool started = false;    // streaming: the first chunk went out
  };
  std::vector<Seq> seqs;
};

}  // namespace

HttpServer::HttpServer(EngineCore& engine, const Model& model, const Tokenizer& tokenizer, ServerConfig config)
    : engine_(engine),
      model_(model),
      tokenizer_(tokenizer),
      config_(std::move(config)),
      template_(ChatTemplate::from_options(
          config_.chat_template, model.file().get_string_or("tokenizer.chat_template", ""),
          tokenizer.bos_id() >= 0 ? tokenizer.token_text(tokenizer.bos_id()) : std::string(),
          tokenizer.eos_id() >= 0 ? tokenizer.token_text(tokenizer.eos_id()) : std::string())),
      http_(std::make_unique<httplib::Server>()) {
  if (config_.served_model_name.empty()) config_.served_model_name = "tandem";
  const int threads = std::max(4, config_.http_threads);
  queue_stats_ = std::make_unique<QueueStats>();
  http_->new_task_queue = [this, threads] {
    return new BoundedTaskQueue(threads, config_.max_queued_connections, queue_stats_.get());
  };
  http_->set_payload_max_length(static_cast<size_t>(config_.max_body_bytes));
  http_->set_read_timeout(60, 0);
  http_->set_write_timeout(60, 0);
  http_->set_keep_alive_timeout(5);
  use_exclusive_listener(*http_, &listen_fd_);
  install_routes();
}

void use_exclusive_listener(httplib::Server& server, int* listen_fd) {
  // Streamed tokens are small writes: without TCP_NODELAY, Nagle holds each
  // behind the previous one's (delayed, up to 40 ms) acknowledgement.
  server.set_tcp_nodelay(true);
  server.set_socket_options([listen_fd](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    *listen_fd = sock;
  });
}

int bind_listener(httplib::Server& server, const std::string& host, int port, const int* listen_fd) {
  if (port == 0) {
    port = server.bind_to_any_port(host.c_str());
    if (port < 0) throw Error("cannot bind " + host + " to any port");
  } else if (!server.bind_to_port(host.c_str(), port)) {
    throw Error("cannot bind " + host + ":" + std::to_string(port) +
                " (in use, or not an address of this machine); pick another --port or --host");
  }
  // The packaged httplib listens with a backlog of 5: a burst of clients (64
  // connecting at once) overflows it, SYNs are dropped and those clients wait
  // a 1 s retransmission or fail. listen() again just raises the backlog.
  if (*listen_fd >= 0) ::listen(*listen_fd, SOMAXCONN);
  return port;
}

HttpServer::~HttpServer() { stop(); }

int HttpServer::bind() {
  config_.port = bind_listener(*http_, config_.host, config_.port, &listen_fd_);
  return config_.port;
}

void HttpServer::serve() {
  serving_ = true;
  if (!stop_requested_) http_->listen_after_bind();
  serving_ = false;
}

void HttpServer::begin_drain() { draining_ = true; }

void HttpServer::cut_off(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(cut_off_mu_);
    cut_off_why_ = why;
  }
  engine_.fail_all_requests(why);
}

void HttpServer::stop() {
  stop_requested_ = true;
  if (!http_) return;
  // httplib ignores stop() until its accept loop runs: a stop that arrives
  // while serve() is starting (SIGTERM right after start-up) waits for it, up
  // to 2 s.
  for (int i = 0; i < 2000 && serving_ && !http_->is_running(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  http_->stop();
}

void HttpServer::set_pd_hook(PdHook hook) {
  pd_hook_ = std::move(hook);
  http_->Post("/internal/pd/abort", [this](const httplib::Request& req, httplib::Response& res) {
    if (!pd_hook_.verify || !pd_hook_.verify(req.body, req.get_header_value("X-Tandem-Signature")))
      return send_json(res, 403, {{"error", "bad or missing cluster signature"}});
    json j = json::parse(req.body, nullptr, false);
    if (!j.is_object() || !j.contains("transfer_id") || !j["transfer_id"].is_number_unsigned())
      return send_json(res, 400, {{"error", "transfer_id missing"}});
    pd_hook_.router_abort(j["transfer_id"].get<uint64_t>());
    send_json(res, 200, {{"status", "aborting"}});
  });
  http_->Get("/debug/transfers", [this](const httplib::Request&, httplib::Response& res) {
    if (!pd_hook_.debug_transfers) return send_json(res, 404, {{"error", "not a P/D instance"}});
    res.set_content(pd_hook_.debug_transfers(), "application/json");
  });
}

void HttpServer::set_dp_hook(DpHook hook) { dp_hook_ = std::move(hook); }

void HttpServer::install_routes() {
  httplib::Server& s = *http_;

  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (BoundedTaskQueue::rejecting()) {
      send_error(res, connections_exhausted(config_.http_threads, config_.max_queued_connections));
      res.set_header("Connection", "close");
      return httplib::Server::HandlerResponse::Handled;
    }
    if (config_.api_key.empty()) return httplib::Server::HandlerResponse::Unhandled;
    if (req.path == "/health" || req.path == "/metrics") return httplib::Server::HandlerResponse::Unhandled;
    if (!constant_time_equal(req.get_header_value("Authorization"), "Bearer " + config_.api_key)) {
      send_error(res, unauthorized());
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  s.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;  // a handler already wrote an error body
    if (res.status == 404) send_error(res, route_not_found(req.method, req.path));
    else if (res.status == 413) send_error(res, payload_too_large(config_.max_body_bytes));
  });
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, internal_error(what));
  });

  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (draining_) {
      send_json(res, 503, {{"status", "draining"}});
      return;
    }
    // Not ready (a group not formed, tensor-parallel workers restarting):
    // said at once, whatever the loop is doing meanwhile.
    std::string why;
    if (!engine_.ready(&why)) return send_json(res, 503, {{"status", why}});
    // Healthy only if the engine loop itself ticks within the bound (an idle
    // loop wakes up every idle_wait_ms).
    const uint64_t before = engine_.heartbeat();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(config_.health_timeout_ms);
    while (engine_.heartbeat() == before && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (engine_.heartbeat() == before) {
      send_json(res, 503, {{"status", "engine loop did not answer within " + std::to_string(config_.health_timeout_ms) + " ms"}});
      return;
    }
    if (!engine_.ready(&why)) return send_json(res, 503, {{"status", why}});
    send_json(res, 200, {{"status", "ok"}});
  });

  s.Get("/debug/parallel", [this](const httplib::Request&, httplib::Response& res) {
    const LockstepStatus st = engine_.lockstep_status();
    if (!st.enabled && !tp_hook_.status_json)
      return send_json(res, 404, {{"error", "neither data- nor tensor-parallel (--data-parallel-size 1, --tensor-parallel-size 1)"}});
    json body = st.enabled ? lockstep_status_json(st) : json::object();
    body["pid"] = ::getpid();
    if (dp_hook_.ranks_json) body["ranks"] = json::parse(dp_hook_.ranks_json(), nullptr, false);
    if (tp_hook_.status_json) body["tensor_parallel"] = json::parse(tp_hook_.status_json(), nullptr, false);
    send_json(res, 200, body);
  });

  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    std::string text = render_prometheus(engine_.metrics(), config_.served_model_name, !draining_);
    text += render_queue_metrics(*queue_stats_);
    text += "# HELP tandem_http_requests_in_flight Completion and chat requests this server is answering\n"
            "# TYPE tandem_http_requests_in_flight gauge\ntandem_http_requests_in_flight " +
            std::to_string(in_flight_.load()) + "\n";
    const LockstepStatus st = engine_.lockstep_status();
    if (st.enabled) text += render_lockstep_metrics(st);
    if (tp_hook_.metrics) text += tp_hook_.metrics();
    res.set_content(text, "text/plain; version=0.0.4");
  });

  s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    ModelCard card;
    card.id = config_.served_model_name;
    card.created = unix_now();
    card.max_model_len = engine_.max_model_len();
    send_json(res, 200, models_response(std::span<const ModelCard>(&card, 1)));
  });

  s.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    auto parsed = parse_tokenize_request(req.body);
    if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(res, *e);
    const auto& t = std::get<TokenizeRequest>(parsed);
    const std::string served[] = {config_.served_model_name};
    if (auto e = check_model(t.model, served)) return send_error(res, *e);
    std::vector<int32_t> ids;
    if (t.is_chat) {
      auto r = template_.render(t.conversation);
      if (auto* e = std::get_if<ApiError>(&r)) return send_error(res, *e);
      const auto& p = std::get<RenderedPrompt>(r);
      ids = tokenizer_.encode(p.text, t.add_special_tokens.value_or(p.add_special), p.parse_special);
    } else {
      ids = tokenizer_.encode(t.prompt, t.add_special_tokens.value_or(true), true);
    }
    std::vector<std::string> strs;
    if (t.return_token_strs)
      for (int32_t id : ids) strs.push_back(tokenizer_.token_text(id));
    send_json(res, 200, tokenize_response(ids, engine_.max_model_len(), t.return_token_strs ? &strs : nullptr));
  });

  s.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    auto parsed = parse_detokenize_request(req.body, model_.config().n_vocab);
    if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(res, *e);
    const auto& d = std::get<DetokenizeRequest>(parsed);
    const std::string served[] = {config_.served_model_name};
    if (auto e = check_model(d.model, served)) return send_error(res, *e);
    send_json(res, 200, detokenize_response(tokenizer_.decode(d.tokens)));
  });

  auto generate = [this](const httplib::Request& req, httplib::Response& res, bool chat) {
    if (draining_) return send_error(res, engine_unavailable("the server is shutting down"));
    DpPlacement placement;
    if (dp_hook_.pick) {
      placement = dp_hook_.pick();
      if (placement.rank != dp_hook_.self) return dp_hook_.forward(std::move(placement), req, res);
    }
    if (std::string why; !engine_.ready(&why)) return send_error(res, engine_unavailable(why));
    const int64_t n_vocab = model_.config().n_vocab;
    auto job = std::make_shared<Job>();
    job->dp_hold = std::move(placement.hold);
    job->chat = chat;
    SamplingParams params;
    std::vector<int32_t> prompt;
    std::string model_name;
    std::optional<int32_t> max_tokens;
    std::string param_name = chat ? "messages" : "prompt";
    if (chat) {
      auto parsed = parse_chat_request(req.body, n_vocab);
      if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(res, *e);
      auto& c = std::get<ChatRequest>(parsed);
      auto rendered = template_.render(c.conversation);
      if (auto* e = std::get_if<ApiError>(&rendered)) return send_error(res, *e);
      const auto& p = std::get<RenderedPrompt>(rendered);
      prompt = tokenizer_.encode(p.text, p.add_special, p.parse_special);
      params = c.sampling;
      model_name = c.model;
      max_tokens = c.max_tokens;
      job->stream = c.stream;
      job->include_usage = c.include_usage;
    } else {
      auto parsed = parse_completion_request(req.body, n_vocab);
      if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(res, *e);
      auto& c = std::get<CompletionRequest>(parsed);
      prompt = c.prompt_is_tokens ? c.prompt_tokens : tokenizer_.encode(c.prompt_text, true, true);
      if (c.echo) job->echo_text = c.prompt_is_tokens ? tokenizer_.decode(c.prompt_tokens) : c.prompt_text;
      params = c.sampling;
      model_name = c.model;
      max_tokens = c.max_tokens;
      job->stream = c.stream;
      job->include_usage = c.include_usage;
    }
    const std::string served[] = {config_.served_model_name};
    if (auto e = check_model(model_name, served)) return send_error(res, *e);
    if (auto e = fit_to_context(max_tokens, static_cast<int64_t>(prompt.size()), engine_.max_model_len(), param_name, params))
      return send_error(res, *e);
    if (job->stream && params.best_of > params.n)
      return send_error(res, unsupported("best_of", "streaming with best_of greater than n (the best sequences are only known at the end)"));

    job->want_logprobs = params.logprobs >= 0;
    job->n = params.n;
    job->best_of = params.best_of;
    job->prompt_tokens = static_cast<int64_t>(prompt.size());
    job->seqs.resize(static_cast<size_t>(params.best_of));
    job->header.id = make_response_id(chat ? "chatcmpl-" : "cmpl-", random_u64());
    job->header.created = unix_now();
    job->header.model = config_.served_model_name;
    job->id = next_request_id_++;
    job->channel = std::make_shared<RequestChannel>();

    job->abort = [this, id = job->id] { engine_.abort_request(id); };
    auto sink = [channel = job->channel](RequestOutput&& out) { channel->push(std::move(out)); };

    // P/D: a request the router hands over with its transfer.
    bool handed_to_pd = false;
    if (pd_hook_.submit) {
      json body = json::parse(req.body, nullptr, false);
      if (body.is_object() && body.contains("kv_transfer_params")) {
        const std::string kv = body["kv_transfer_params"].dump();
        uint64_t transfer = 0;
        if (auto err = pd_hook_.submit(kv, std::move(prompt), params, pd_hook_.prefill ? OutputSink{} : OutputSink{sink},
                                       &transfer))
          return send_error(res, invalid_value("kv_transfer_params", *err));
        // The acceptance tells the router the request's exact size (its
        // credits were reserved on an estimate: it tokenizes nothing).
        if (pd_hook_.prefill)
          return send_json(res, 200, {{"status", "accepted"},
                                      {"kv_transfer_params", body["kv_transfer_params"]},
                                      {"prompt_tokens", job->prompt_tokens},
                                      {"max_tokens", params.max_tokens},
                                      {"best_of", params.best_of}});
        job->abort = [cancel = pd_hook_.cancel, transfer] { cancel(transfer); };
        handed_to_pd = true;
      }
    }
    EngineRequest er;
    er.id = job->id;
    er.prompt = std::move(prompt);
    er.params = params;
    er.sink = sink;
    EngineCore::Refusal why = EngineCore::Refusal::kNone;
    if (auto err = handed_to_pd ? std::nullopt : engine_.add_request(std::move(er), &why)) {
      switch (why) {
        case EngineCore::Refusal::kQueueFull: return send_error(res, queue_full(engine_.max_waiting_requests()));
        case EngineCore::Refusal::kTooLargeForCache: {
          const int64_t per_seq = job->prompt_tokens + params.max_tokens;
          return send_error(res, capacity_exceeded(per_seq * params.best_of, engine_.kv_capacity_tokens()));
        }
        default: return send_error(res, invalid_value("max_tokens", *err));
      }
    }
    ++in_flight_;

    // Relays outputs until the request finishes. Returns false when the client
    // is gone (the request is then aborted by the releaser).
    auto cut_off_reason = [this] {
      std::lock_guard<std::mutex> lock(cut_off_mu_);
      return cut_off_why_;
    };
    auto relay = [this, job, cut_off_reason](httplib::DataSink& sink) -> bool {
      const auto tick = std::chrono::milliseconds(config_.keepalive_ms);
      auto waited = std::chrono::milliseconds(0);
      for (;;) {
        std::optional<RequestOutput> out = job->channel->pop(tick);
        if (!out) {
          if (std::string why = cut_off_reason(); !why.empty()) {
            job->abort();
            const ApiError e = internal_error(why);
            const std::string body = job->stream ? sse_event(e.to_json()) + std::string(kSseDone) : dump_body(e.to_json());
            sink.write(body.data(), body.size());
            sink.done();
            return true;
          }
          waited += tick;
          if (waited >= std::chrono::seconds(config_.output_timeout_s)) {
            job->abort();
            const ApiError e = internal_error("no output from the engine for " + std::to_string(config_.output_timeout_s) + " s; the request was aborted");
            const std::string body = job->stream ? sse_event(e.to_json()) : dump_body(e.to_json());
            sink.write(body.data(), body.size());
            sink.done();
            return true;
          }
          // A comment line (stream) or a space before the JSON (non-stream):
          // both are ignored by clients, and a failed write means they left.
          const char* ping = job->stream ? ": keep-alive\n\n" : " ";
          if (!sink.write(ping, std::strlen(ping))) return false;
          continue;
        }
        waited = std::chrono::milliseconds(0);
        job->cached_tokens = out->cached_tokens;
        std::vector<CompletionChoice> cchoices;
        std::vector<ChatChunkChoice> kchoices;
        for (SequenceDelta& d : out->sequences) {
          Job::Seq& q = job->seqs[static_cast<size_t>(d.index)];
          std::vector<OutputLogprob> lps;
          for (const SampleResult& s : d.logprobs) lps.push_back(to_output_logprob(tokenizer_, s));
          q.tokens += static_cast<int64_t>(d.tokens.size());
          q.cumulative_logprob = d.cumulative_logprob;
          if (d.finish != FinishReason::kNone) q.finish = finish_reason_name(d.finish);
          if (!job->stream) {
            q.text += d.text;
            q.logprobs.insert(q.logprobs.end(), lps.begin(), lps.end());
            continue;
          }
          std::string text = d.text;
          if (!q.started && !job->echo_text.empty()) text = job->echo_text + text;
          if (job->chat) {
            ChatChunkChoice c;
            c.index = d.index;
            c.first = !q.started;
            c.content = text;
            if (job->want_logprobs) c.logprobs = lps;
            c.finish_reason = q.finish;
            kchoices.push_back(std::move(c));
          } else {
            CompletionChoice c;
            c.index = d.index;
            c.text = text;
            if (job->want_logprobs) c.logprobs = lps;
            c.text_offset = q.chars_sent;
            c.finish_reason = q.finish;
            cchoices.push_back(std::move(c));
          }
          q.started = true;
          // The next chunk's text_offset: characters of the tokens so far,
          // counted as the non-streamed response counts them (the tokens'
          // pieces; continuation bytes of UTF-8 do not start a character).
          for (const OutputLogprob& lp : lps)
            q.chars_sent += std::count_if(lp.token.begin(), lp.token.end(), [](char ch) {
              return (static_cast<unsigned char>(ch) & 0xC0) != 0x80;
            });
        }
        if (job->stream && (!cchoices.empty() || !kchoices.empty())) {
          const json chunk = job->chat ? chat_chunk(job->header, kchoices, job->include_usage)
                                       : completion_chunk(job->header, cchoices, job->include_usage);
          const std::string ev = sse_event(chunk);
          if (!sink.write(ev.data(), ev.size())) return false;
        }
        if (!out->finished) continue;
        if (!out->error.empty()) {
          // The request failed after the response began (a P/D transfer that
          // broke): the client gets the error in the body, never a silent end.
          const ApiError e = internal_error(out->error);
          job->error_status = e.status;
          std::string tail = job->stream ? sse_event(e.to_json()) + std::string(kSseDone) : dump_body(e.to_json());
          sink.write(tail.data(), tail.size());
          sink.done();
          return true;
        }

        // Which siblings are returned: all n, or the n best of best_of by
        // cumulative log-probability.
        std::vector<int32_t> order(job->seqs.size());
        for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
        if (job->best_of > job->n) {
          std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
            return job->seqs[static_cast<size_t>(a)].cumulative_logprob > job->seqs[static_cast<size_t>(b)].cumulative_logprob;
          });
          order.resize(static_cast<size_t>(job->n));
        }
        Usage usage;
        usage.prompt_tokens = job->prompt_tokens;
        usage.cached_tokens = job->cached_tokens;
        for (int32_t i : order) usage.completion_tokens += job->seqs[static_cast<size_t>(i)].tokens;
        std::string tail;
        if (job->stream) {
          if (job->include_usage)
            tail += sse_event(job->chat ? chat_usage_chunk(job->header, usage) : completion_usage_chunk(job->header, usage));
          tail += std::string(kSseDone);
        } else if (job->chat) {
          std::vector<ChatChoice> choices;
          for (size_t k = 0; k < order.size(); ++k) {
            Job::Seq& q = job->seqs[static_cast<size_t>(order[k])];
            ChatChoice c;
            c.index = static_cast<int32_t>(k);
            c.content = q.text;
            if (job->want_logprobs) c.logprobs = q.logprobs;
            c.finish_reason = q.finish;
            choices.push_back(std::move(c));
          }
          tail = dump_body(chat_response(job->header, choices, usage));
        } else {
          std::vector<CompletionChoice> choices;
          for (size_t k = 0; k < order.size(); ++k) {
            Job::Seq& q = job->seqs[static_cast<size_t>(order[k])];
            CompletionChoice c;
            c.index = static_cast<int32_t>(k);
            c.text = job->echo_text + q.text;
            if (job->want_logprobs) c.logprobs = q.logprobs;
            c.finish_reason = q.finish;
            choices.push_back(std::move(c));
          }
          tail = dump_body(completion_response(job->header, choices, usage));
        }
        if (!sink.write(tail.data(), tail.size())) return false;
        sink.done();
        return true;
      }
    };
    // Runs once the response is over, whether it completed or the client
    // left: an abort of a finished request is a no-op.
    auto release = [this, job](bool success) {
      if (!success) job->abort();
      job->dp_hold.reset();
      --in_flight_;
    };
    // A non-streamed request that ends within the first keep-alive period
    // is answered whole, with the status of its outcome: an engine error is
    // a 500, not a 200 whose body is the error, as it must be once the
    // keep-alive spaces have committed the headers.
    if (!job->stream && job->channel->wait_finished(std::chrono::milliseconds(config_.keepalive_ms))) {
      std::string body;
      httplib::DataSink buffer;
      buffer.write = [&body](const char* data, size_t n) {
        body.append(data, n);
        return true;
      };
      buffer.done = [] {};
      buffer.is_writable = [] { return true; };
      relay(buffer);
      release(true);
      res.status = job->error_status != 0 ? job->error_status : 200;
      res.set_content(body, "application/json");
      return;
    }
    res.set_chunked_content_provider(job->stream ? "text/event-stream" : "application/json",
                                     [relay](size_t, httplib::DataSink& sink) { return relay(sink); }, release);
  };
  s.Post("/v1/completions", [generate](const httplib::Request& req, httplib::Response& res) { generate(req, res, false); });
  s.Post("/v1/chat/completions", [generate](const httplib::Request& req, httplib::Response& res) { generate(req, res, true); });
}

}  // namespace tandem::server
