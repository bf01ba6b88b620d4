// The hand-off of one request's outputs from the engine thread to the HTTP
// thread serving it. The engine side never blocks (push is a short critical
// section); the HTTP side waits with a deadline, so a wedged engine turns into
// a timeout error for the client, not a hung connection.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>

#include "engine/request.h"

namespace tandem::server {

class RequestChannel {
 public:
  void push(RequestOutput&& out) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(out));
    }
    cv_.notify_one();
  }

  // Whether the request's last output (finished) is queued, waiting up to
  // `timeout` for it; nothing is taken.
  bool wait_finished(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return !queue_.empty() && queue_.back().finished; });
  }

  // The next output, or nullopt when none arrived within `timeout`.
  std::optional<RequestOutput> pop(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return !queue_.empty(); })) return std::nullopt;
    RequestOutput out = std::move(queue_.front());
    queue_.pop_front();
    return out;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<RequestOutput> queue_;
};

}  // namespace tandem::server
