// An in-process fabric of N ranks for the lockstep simulator: each rank's
// frames go to one ordered channel, and an exchange completes when every
// rank has posted its frame at that position, as on gloo's fixed slot.
//
// A wait that can never complete is reported instead of hanging: when a rank
// waits for one that has left the group, or when no rank is running and no
// wait can complete (the global state a hang would freeze in), each waiting
// rank gets a TransportError naming which ranks arrived and which did not.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "parallel/frame_transport.h"

namespace tandem::parallel {

class SimFabric {
 public:
  explicit SimFabric(int n_ranks);
  ~SimFabric();
  FrameTransport& rank(int r);
  // Rank r posts nothing more (its thread returned or raised).
  void leave(int r);

 private:
  class Endpoint;
  void exchange(int r, const Frame& mine, std::span<Frame> all, const std::function<void(int)>& arrived);

  int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::vector<Frame>> posted_;  // per rank, in the order posted
  std::vector<long> waiting_at_;            // per rank: the position it waits at, -1 running, -2 left
  bool hung_ = false;
  std::vector<std::unique_ptr<Endpoint>> endpoints_;
};

}  // namespace tandem::parallel
