#include "model/decode_order.h"

#include <utility>

#include "util/error.h"

namespace tandem {

void DecodeOrder::add(std::vector<const kernels::WeightMatrix*> weights, kernels::MatmulSplit split) {
  TANDEM_ASSERT(!weights.empty(), "a matmul group has a weight");
  const bool inserted = index_of_first_.emplace(weights.front(), groups_.size()).second;
  TANDEM_ASSERT(inserted, "a matrix starts one group of the order");
  groups_.push_back({std::move(weights), split});
}

const kernels::NextMatmul* DecodeOrder::after(const kernels::WeightMatrix* first) const {
  const auto it = index_of_first_.find(first);
  if (it == index_of_first_.end()) return nullptr;
  return &groups_[(it->second + 1) % groups_.size()];
}

}  // namespace tandem
