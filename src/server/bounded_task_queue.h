// The HTTP server's connection queue, bounded and visible.
//
// cpp-httplib hands each accepted connection to a task queue; its own pool
// queues without limit, so connections beyond the worker threads waited
// unseen (300 concurrent streams: the last first bytes came after 30 s, and
// no metric showed it). This queue runs at most `workers` connections at once
// and lets at most `max_queued` wait; a connection beyond that is served by a
// small overflow pool whose handler answers at once with 503 and an OpenAI
// error (rejecting(), read by the server's pre-routing handler), so a client
// learns to back off instead of hanging.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>

namespace tandem::server {

struct QueueStats {
  std::atomic<int64_t> running{0};
  std::atomic<int64_t> queued{0};
  std::atomic<int64_t> rejected{0};
};

// The three numbers as Prometheus gauges (tandem_http_connections_*).
std::string render_queue_metrics(const QueueStats& stats);

class BoundedTaskQueue : public httplib::TaskQueue {
 public:
  BoundedTaskQueue(int workers, int max_queued, QueueStats* stats);
  ~BoundedTaskQueue() override;
  void enqueue(std::function<void()> fn) override;
  void shutdown() override;
  // True on a thread serving a connection that was over the bound.
  static bool rejecting();

 private:
  void work(bool overflow);
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_, overflow_;
  size_t capacity_;       // workers + max_queued
  size_t admitted_ = 0;   // being served or waiting
  bool stopping_ = false;
  QueueStats* stats_;
  std::vector<std::thread> threads_;
};

}  // namespace tandem::server
