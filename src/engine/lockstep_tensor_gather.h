// Tensor parallelism over the lockstep group: every all-gather between split
// matmuls is an op of the step's plan (kTensorGather), so its sizes are
// agreed in checked frames before any column moves, and a rank that fails
// mid-step fails every rank in the same op.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/tensor_parallel.h"
#include "parallel/lockstep_group.h"

namespace tandem {

class LockstepTensorGather : public TensorGather {
 public:
  // The group the gathers run on (null between groups).
  void bind(parallel::LockstepGroup* group) { group_ = group; }
  void all_gather(float* buf, int64_t n, int64_t ld, std::span<const int64_t> bounds, int root) override;

 private:
  parallel::LockstepGroup* group_ = nullptr;
  std::vector<float> send_;
  std::vector<int64_t> send_bytes_;
  std::vector<char> recv_;
};

}  // namespace tandem
