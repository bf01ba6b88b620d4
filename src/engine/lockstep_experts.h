// Expert parallelism over the lockstep group: each MoE layer's two
// all-to-alls are ops of the step's plan (kExpertDispatch, kExpertCombine),
// so their sizes are agreed in checked frames before any row moves.
#pragma once

#include <vector>

#include "model/expert_exchange.h"
#include "parallel/lockstep_group.h"

namespace tandem {

class LockstepExpertExchange : public ExpertExchange {
 public:
  LockstepExpertExchange(int rank, int size) : rank_(rank), size_(size) {}
  // The group the exchanges run on (null between groups).
  void bind(parallel::LockstepGroup* group) { group_ = group; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_to_all(bool combine, std::span<const float> send, std::span<const int64_t> send_rows, int64_t row_floats,
                  std::vector<float>& recv, std::vector<int64_t>& recv_rows) override;

 private:
  int rank_, size_;
  parallel::LockstepGroup* group_ = nullptr;
  std::vector<int64_t> send_bytes_;
  std::vector<char> buffer_;
};

}  // namespace tandem
