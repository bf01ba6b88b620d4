#include "server/upstream_relay.h"

#include <httplib.h>

#include "server/api_error.h"
#include "server/openai_protocol.h"

namespace tandem::server {

ApiError upstream_error(const std::string& what) {
  ApiError e;
  e.status = 502;
  e.type = "server_error";
  e.code = "upstream_failed";
  e.message = what;
  return e;
}

Upstream::~Upstream() {
  stop();
  if (reader_.joinable()) reader_.join();
}

void Upstream::stop(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!why.empty() && stop_reason_.empty()) stop_reason_ = why;
  cancel_ = true;
  if (client_ != nullptr) client_->stop();
}

void Upstream::start(UpstreamCall call, std::function<void(const std::string&)> on_chunk) {
  // The thread uses this Upstream through `this`: the destructor joins it.
  reader_ = std::thread([this, call = std::move(call), on_chunk = std::move(on_chunk)] {
    httplib::Client cli(call.host, call.port);
    cli.set_tcp_nodelay(true);
    cli.set_connection_timeout(0, call.connect_timeout_ms * 1000);
    cli.set_read_timeout(call.read_timeout_s, 0);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (cancel_) {
        status_ = -1;
        error_ = stop_reason_.empty() ? std::string("cancelled") : stop_reason_;
        ended_ = true;
        cv_.notify_all();
        return;
      }
      client_ = &cli;
    }
    httplib::Request r;
    r.method = "POST";
    r.path = call.path;
    r.body = call.body;
    r.set_header("Content-Type", "application/json");
    for (const auto& [name, value] : call.headers) r.set_header(name, value);
    r.response_handler = [this](const httplib::Response& response) {
      std::lock_guard<std::mutex> lock(mu_);
      status_ = response.status;
      content_type_ = response.get_header_value("Content-Type");
      cv_.notify_all();
      return true;
    };
    r.content_receiver = [this, &on_chunk](const char* data, size_t len, uint64_t, uint64_t) {
      std::string chunk(data, len);
      if (on_chunk) on_chunk(chunk);
      std::lock_guard<std::mutex> lock(mu_);
      chunks_.push_back(std::move(chunk));
      cv_.notify_all();
      return !cancel_.load();  // false closes the connection: the upstream aborts the request
    };
    httplib::Response response;
    httplib::Error err = httplib::Error::Success;
    const bool sent = cli.send(r, response, err);
    std::lock_guard<std::mutex> lock(mu_);
    client_ = nullptr;
    if (!sent && status_ == 0) {
      status_ = -1;
      error_ = cancel_ && !stop_reason_.empty() ? stop_reason_
                                                : call.who + " could not be reached: " + httplib::to_string(err);
    } else if (!sent && !cancel_) {
      error_ = call.who + " failed mid-response: " + httplib::to_string(err);
    } else if (!sent && !stop_reason_.empty()) {  // (cancelled: stop() with a reason)
      error_ = stop_reason_;
    }
    ended_ = true;
    cv_.notify_all();
  });
}

int Upstream::wait_status(int timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return status_ != 0; });
  return status_;
}

std::string Upstream::wait_body(int timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return ended_; });
  std::string text;
  for (auto& c : chunks_) text += c;
  return text;
}

std::string Upstream::error() {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

std::string Upstream::content_type() {
  std::lock_guard<std::mutex> lock(mu_);
  return content_type_.empty() ? "application/json" : content_type_;
}

void Upstream::relay(httplib::Response& res, std::shared_ptr<Upstream> up, bool stream,
                     std::function<void(bool success)> on_done) {
  const std::string type = up->content_type();
  res.set_chunked_content_provider(
      type,
      [up, stream](size_t, httplib::DataSink& sink) {
        for (;;) {
          std::string chunk;
          bool ended = false;
          {
            std::unique_lock<std::mutex> lock(up->mu_);
            up->cv_.wait_for(lock, std::chrono::milliseconds(1000), [&] { return !up->chunks_.empty() || up->ended_; });
            if (!up->chunks_.empty()) {
              chunk = std::move(up->chunks_.front());
              up->chunks_.pop_front();
            } else {
              ended = up->ended_;
            }
          }
          if (!chunk.empty() && !sink.write(chunk.data(), chunk.size())) return false;
          if (ended) {
            const std::string error = up->error();
            if (!error.empty()) {
              // Never a silent truncation: the client gets the error.
              const ApiError e = upstream_error(error);
              std::string tail = stream ? sse_event(e.to_json()) + std::string(kSseDone) : dump_body(e.to_json());
              sink.write(tail.data(), tail.size());
            }
            sink.done();
            return true;
          }
        }
      },
      [up, on_done = std::move(on_done)](bool success) {
        if (!success) up->stop();  // the client left: the upstream call ends
        if (on_done) on_done(success);
      });
}

}  // namespace tandem::server
