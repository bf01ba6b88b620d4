// Counters and latency histograms of one engine, read by /metrics.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

namespace tandem {

// A Prometheus-style cumulative histogram with fixed bucket bounds (seconds).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double v) {
    std::lock_guard<std::mutex> lock(mu_);
    size_t i = 0;
    while (i < bounds_.size() && v > bounds_[i]) ++i;
    ++counts_[i];
    sum_ += v;
    ++count_;
  }
  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // per bound, then +Inf
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot snapshot() const {
    std::lock_guard<std::mutex> lock(mu_);
    Snapshot s{bounds_, {}, sum_, count_};
    uint64_t acc = 0;
    for (uint64_t c : counts_) s.cumulative.push_back(acc += c);
    return s;
  }

 private:
  mutable std::mutex mu_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  double sum_ = 0;
  uint64_t count_ = 0;
};

inline std::vector<double> latency_buckets_s() {
  return {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
}

// What a step carried: decode rows only, prompt chunks only (a prompt, or a
// preempted sequence recomputed), or both in one batch (chunked prefill mixed
// with decode). A busy server's step time is split by it, so an operator can
// see whether prefill chunks or decode rows take the time.
enum class StepKind : uint8_t { kDecode = 0, kPrefill = 1, kMixed = 2 };
inline constexpr int kStepKinds = 3;
inline constexpr const char* kStepKindNames[kStepKinds] = {"decode", "prefill", "mixed"};

struct StepKindCounters {
  std::atomic<int64_t> steps{0};
  std::atomic<int64_t> step_time_ns{0};     // the whole step, scheduling and sampling included
  std::atomic<int64_t> forward_time_ns{0};  // the model's forward alone
  std::atomic<int64_t> prefill_tokens{0};   // prompt (or recomputed) positions run
  std::atomic<int64_t> decode_rows{0};      // one-position chunks past the prompt
};

struct EngineMetrics {
  std::atomic<int64_t> running{0};
  std::atomic<int64_t> waiting{0};
  std::atomic<int64_t> waiting_remote_kv{0};      // P/D decode: allocated, KV not yet arrived
  std::atomic<int64_t> transfer_blocks_held{0};   // P/D: block references held for transfers
  std::atomic<int64_t> kv_blocks_total{0};
  std::atomic<int64_t> kv_blocks_used{0};    // owned by sequences
  std::atomic<int64_t> kv_blocks_cached{0};  // evictable prefix-cache blocks
  std::atomic<int64_t> prefix_query_tokens{0};
  std::atomic<int64_t> prefix_hit_tokens{0};
  std::atomic<int64_t> state_slots_total{0};  // hybrid models' recurrent-state slots
  std::atomic<int64_t> state_slots_used{0};
  // Prefix caching was asked for but is off: the model keeps recurrent state.
  std::atomic<bool> prefix_caching_off_for_recurrent_state{false};
  std::atomic<int64_t> prompt_tokens{0};
  std::atomic<int64_t> generation_tokens{0};
  std::atomic<int64_t> preemptions{0};
  std::atomic<int64_t> steps{0};
  std::atomic<int64_t> requests_finished{0};
  std::atomic<int64_t> requests_aborted{0};
  std::atomic<int64_t> nonfinite_logits{0};  // requests failed for NaN or infinite logits
  std::atomic<int64_t> executor_failures{0};  // steps lost by the executor (tensor-parallel workers)
  std::atomic<int64_t> step_time_ns_total{0};
  std::atomic<int64_t> schedule_time_ns_total{0};
  std::array<StepKindCounters, kStepKinds> step_kinds;  // indexed by StepKind
  Histogram ttft_s{latency_buckets_s()};
  Histogram tpot_s{latency_buckets_s()};
  Histogram e2e_s{latency_buckets_s()};
};

}  // namespace tandem
