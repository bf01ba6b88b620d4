// The two ceilings of a decode step that carries one new token for each of
// n sequences: memory (the step reads every weight once, however many rows
// it carries, plus each sequence's KV) and compute (every row multiplies
// through every matrix). Small batches sit under the first, large ones under
// the second; `tandem bench model` reports both and where each size sits.
#pragma once

#include <algorithm>
#include <cstdint>

namespace tandem {

struct DecodeLimits {
  double memory_tps = 0;   // tokens/s if the step took only its reads at read_bps
  double compute_tps = 0;  // tokens/s if it took only its multiply-adds at the peak rate
  bool compute_bound() const { return compute_tps < memory_tps; }
  double bound_tps() const { return std::min(memory_tps, compute_tps); }
};

inline DecodeLimits decode_limits(int64_t n_seq, double weight_bytes_per_step, double kv_bytes_per_sequence,
                                  double multiply_adds_per_token, double read_bps, double multiply_adds_per_s) {
  const double n = static_cast<double>(n_seq);
  return {n * read_bps / (weight_bytes_per_step + n * kv_bytes_per_sequence), multiply_adds_per_s / multiply_adds_per_token};
}

// The batch size at which the two ceilings meet, counting the weights' reads
// only (the KV of a short context is a small share).
inline double limits_crossover_batch(double weight_bytes_per_step, double multiply_adds_per_token, double read_bps,
                                     double multiply_adds_per_s) {
  return multiply_adds_per_s * weight_bytes_per_step / (read_bps * multiply_adds_per_token);
}

}  // namespace tandem
