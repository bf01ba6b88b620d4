#include "server/bounded_task_queue.h"

namespace tandem::server {

namespace {
thread_local bool tls_rejecting = false;
constexpr int kOverflowThreads = 2;
}  // namespace

std::string render_queue_metrics(const QueueStats& s) {
  std::string m;
  auto gauge = [&](const char* name, const char* help, int64_t v) {
    m += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " gauge\n" + name + " " +
         std::to_string(v) + "\n";
  };
  gauge("tandem_http_connections_running", "HTTP connections being served", s.running.load());
  gauge("tandem_http_connections_queued", "HTTP connections waiting for a worker", s.queued.load());
  gauge("tandem_http_connections_rejected", "HTTP connections answered 503 beyond the queue", s.rejected.load());
  return m;
}

BoundedTaskQueue::BoundedTaskQueue(int workers, int max_queued, QueueStats* stats)
    : capacity_(static_cast<size_t>(workers) + static_cast<size_t>(max_queued)), stats_(stats) {
  for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { work(false); });
  for (int i = 0; i < kOverflowThreads; ++i) threads_.emplace_back([this] { work(true); });
}

BoundedTaskQueue::~BoundedTaskQueue() { shutdown(); }

bool BoundedTaskQueue::rejecting() { return tls_rejecting; }

void BoundedTaskQueue::enqueue(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Admitted while fewer than workers + max_queued connections are being
    // served or waiting (counted under the lock, so a burst that arrives
    // before any worker wakes is judged by the same bound).
    if (admitted_ < capacity_) {
      ++admitted_;
      queue_.push_back(std::move(fn));
      ++stats_->queued;
    } else {
      ++stats_->rejected;
      overflow_.push_back(std::move(fn));
    }
  }
  cv_.notify_all();
}

void BoundedTaskQueue::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
}

void BoundedTaskQueue::work(bool overflow) {
  tls_rejecting = overflow;
  for (;;) {
    std::function<void()> fn;
    {
      std::unique_lock<std::mutex> lock(mu_);
      auto& q = overflow ? overflow_ : queue_;
      cv_.wait(lock, [&] { return stopping_ || !q.empty(); });
      // Drain what was accepted before stopping: every socket gets closed.
      if (q.empty()) return;
      fn = std::move(q.front());
      q.pop_front();
      if (!overflow) {
        --stats_->queued;
        ++stats_->running;
      }
    }
    fn();
    if (!overflow) {
      --stats_->running;
      std::lock_guard<std::mutex> lock(mu_);
      --admitted_;
    }
  }
}

}  // namespace tandem::server
