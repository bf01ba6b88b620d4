// One HTTP call to an upstream server whose response is read on its own
// thread and relayed, as it arrives, to a client's connection: the router's
// decode leg, and a data-parallel front's hand-over to another rank.
//
// Every wait is bounded; a call that fails mid-response ends with an error
// the client sees (an SSE error event or a JSON error body), never a silent
// truncation; a client that leaves stops the call at once.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace httplib {
class Client;
struct Response;
}  // namespace httplib

namespace tandem::server {

struct ApiError;
// 502: the upstream failed (`what` says which and how).
ApiError upstream_error(const std::string& what);

struct UpstreamCall {
  std::string host;
  int port = 0;
  std::string path;
  std::string body;  // JSON, POSTed
  std::string who;   // names the upstream in errors, e.g. "data-parallel rank 1"
  std::vector<std::pair<std::string, std::string>> headers;  // besides Content-Type
  int connect_timeout_ms = 2000;
  int read_timeout_s = 300;
};

class Upstream {
 public:
  ~Upstream();
  // Starts the call on the reader thread. `on_chunk` (optional) sees each
  // chunk of the body as it arrives, on that thread.
  void start(UpstreamCall call, std::function<void(const std::string&)> on_chunk = {});
  // The response status once it arrived within `timeout_ms`: 0 while not
  // yet, -1 when the call failed (error() says why).
  int wait_status(int timeout_ms);
  // Waits up to `timeout_ms` for the whole body; returns it.
  std::string wait_body(int timeout_ms);
  std::string error();
  std::string content_type();
  // Ends the call at once: the reader's socket is shut down (the one thing
  // cpp-httplib allows from another thread), so a reader blocked on a silent
  // upstream returns now, not at its read timeout. With `why`, the call ends
  // with that error, which a relay passes on to its client (without, as when
  // the client has left, it ends quietly).
  void stop(const std::string& why = {});

  // Relays the response to the client: the chunks as they come, then the
  // call's error if it failed (as an SSE event when `stream`). `on_done`
  // gets whether the client received the whole response.
  static void relay(httplib::Response& res, std::shared_ptr<Upstream> up, bool stream,
                    std::function<void(bool success)> on_done);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int status_ = 0;
  std::string content_type_ = "application/json";
  std::deque<std::string> chunks_;
  bool ended_ = false;
  std::string error_;
  std::atomic<bool> cancel_{false};
  std::string stop_reason_;  // stop()'s `why`
  httplib::Client* client_ = nullptr;  // the reader's, while its call is under way
  std::thread reader_;
};

}  // namespace tandem::server
