// The matmul groups of a batch-1 decode step in the order they run, so that
// each group can hand its matmul the one after it (kernels::NextMatmul): a
// thread that has finished its share fetches the start of its next share.
// Built for models whose every layer is full attention and a dense FFN, whole
// on this rank; for the others it stays empty and nothing is fetched ahead
// (what they multiply next depends on routing or waits on a gather).
#pragma once

#include <cstddef>
#include <unordered_map>
#include <vector>

#include "kernels/matmul.h"

namespace tandem {

class DecodeOrder {
 public:
  // Appends a group: its weights in the order of its outputs, and its split.
  void add(std::vector<const kernels::WeightMatrix*> weights, kernels::MatmulSplit split);
  // The group after the one whose first weight is `first` (after the last,
  // the first: the next step's), or null for a matrix not in the order.
  const kernels::NextMatmul* after(const kernels::WeightMatrix* first) const;
  size_t size() const { return groups_.size(); }

 private:
  std::vector<kernels::NextMatmul> groups_;
  std::unordered_map<const kernels::WeightMatrix*, size_t> index_of_first_;
};

}  // namespace tandem
