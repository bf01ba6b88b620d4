// Expert parallelism: the experts of every MoE layer are split over the
// ranks of a data-parallel group in contiguous blocks; each rank computes its
// own experts for the rows every rank sends them. The exchange is the
// group's all-to-all (engine/lockstep_experts.h implements it over the
// lockstep group); the model only packs, computes and unpacks rows.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace tandem {

class ExpertExchange {
 public:
  virtual ~ExpertExchange() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // One all-to-all of rows of `row_floats` floats: `send` holds
  // send_rows[r] rows for each rank r, in rank order; on return `recv` holds
  // recv_rows[r] rows from each rank r, in rank order. `combine`: the
  // layer's second exchange (outputs back), else its first (inputs out).
  virtual void all_to_all(bool combine, std::span<const float> send, std::span<const int64_t> send_rows,
                          int64_t row_floats, std::vector<float>& recv, std::vector<int64_t>& recv_rows) = 0;
};

// The rank holding expert `e` of `n_expert` split over `n_ranks`.
inline int expert_owner(int64_t e, int64_t n_expert, int n_ranks) {
  return static_cast<int>(e * n_ranks / n_expert);
}
// The first expert rank `r` holds (the next rank's first ends its block).
inline int64_t first_expert_of(int r, int64_t n_expert, int n_ranks) {
  return (static_cast<int64_t>(r) * n_expert + n_ranks - 1) / n_ranks;
}

}  // namespace tandem
