#include "parallel/sim_fabric.h"

#include <string>

#include "util/error.h"

namespace tandem::parallel {

class SimFabric::Endpoint : public FrameTransport {
 public:
  Endpoint(SimFabric& fabric, int rank) : fabric_(fabric), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return fabric_.n_; }
  void exchange(const Frame& mine, std::span<Frame> all, const std::function<void(int)>& arrived) override {
    fabric_.exchange(rank_, mine, all, arrived);
  }
  // The simulator moves frames only: its ranks' ops carry no data.
  void all_to_all(const void*, std::span<const int64_t> send_bytes, void*, std::span<const int64_t> recv_bytes,
                  int64_t) override {
    for (int64_t b : send_bytes) TANDEM_ASSERT(b == 0, "the simulated fabric moves no data");
    for (int64_t b : recv_bytes) TANDEM_ASSERT(b == 0, "the simulated fabric moves no data");
  }

 private:
  SimFabric& fabric_;
  int rank_;
};

SimFabric::SimFabric(int n_ranks)
    : n_(n_ranks), posted_(static_cast<size_t>(n_ranks)), waiting_at_(static_cast<size_t>(n_ranks), -1) {
  for (int r = 0; r < n_ranks; ++r) endpoints_.push_back(std::make_unique<Endpoint>(*this, r));
}

SimFabric::~SimFabric() = default;

FrameTransport& SimFabric::rank(int r) { return *endpoints_.at(static_cast<size_t>(r)); }

void SimFabric::leave(int r) {
  std::lock_guard<std::mutex> lock(mu_);
  waiting_at_[static_cast<size_t>(r)] = -2;
  cv_.notify_all();
}

void SimFabric::exchange(int r, const Frame& mine, std::span<Frame> all, const std::function<void(int)>& arrived) {
  TANDEM_ASSERT(static_cast<int>(all.size()) == n_, "one frame per rank");
  std::unique_lock<std::mutex> lock(mu_);
  auto& mine_posted = posted_[static_cast<size_t>(r)];
  const size_t at = mine_posted.size();
  mine_posted.push_back(mine);
  waiting_at_[static_cast<size_t>(r)] = static_cast<long>(at);
  cv_.notify_all();
  const auto complete = [&](size_t pos) {
    for (const auto& p : posted_)
      if (p.size() <= pos) return false;
    return true;
  };
  for (;;) {
    if (complete(at)) break;
    bool peer_left = false, any_running = false, any_completable = false;
    for (int q = 0; q < n_; ++q) {
      const long w = waiting_at_[static_cast<size_t>(q)];
      if (w == -2 && posted_[static_cast<size_t>(q)].size() <= at) peer_left = true;
      if (w == -1) any_running = true;
      if (w >= 0 && complete(static_cast<size_t>(w))) any_completable = true;
    }
    if (!peer_left && !any_running && !any_completable) hung_ = true;
    if (peer_left || hung_) {
      std::string left;
      for (int q = 0; q < n_; ++q)
        if (waiting_at_[static_cast<size_t>(q)] == -2 && posted_[static_cast<size_t>(q)].size() <= at)
          left += (left.empty() ? "" : ",") + std::to_string(q);
      waiting_at_[static_cast<size_t>(r)] = -1;
      cv_.notify_all();
      throw TransportError(peer_left ? "rank(s) " + left + " left the group"
                                     : std::string("simulated hang: no rank can proceed"));
    }
    cv_.wait(lock);
  }
  for (int q = 0; q < n_; ++q) all[static_cast<size_t>(q)] = posted_[static_cast<size_t>(q)][at];
  waiting_at_[static_cast<size_t>(r)] = -1;
  cv_.notify_all();
  lock.unlock();
  for (int q = 0; q < n_; ++q)
    if (q != r) arrived(q);
}

}  // namespace tandem::parallel
