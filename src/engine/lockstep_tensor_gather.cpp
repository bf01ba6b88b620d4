#include "engine/lockstep_tensor_gather.h"

#include <string>

#include "util/error.h"

namespace tandem {

void LockstepTensorGather::all_gather(float* buf, int64_t n, int64_t ld, std::span<const int64_t> bounds, int root) {
  TANDEM_ASSERT(group_ != nullptr, "a tensor gather runs on a formed group");
  const int rank = group_->rank();
  const int size = group_->size();
  TANDEM_ASSERT(static_cast<int>(bounds.size()) == size + 1, "column bounds for every rank");
  const auto block_floats = [&](int r) { return n * (bounds[static_cast<size_t>(r) + 1] - bounds[static_cast<size_t>(r)]); };
  const auto wanted_by = [&](int r) { return r != rank && (root < 0 || r == root); };
  // My block once per peer that wants it, packed in rank order.
  const int64_t mine = block_floats(rank);
  send_bytes_.assign(static_cast<size_t>(size), 0);
  send_.resize(0);
  for (int r = 0; r < size; ++r) {
    if (!wanted_by(r) || mine == 0) continue;
    const size_t at = send_.size();
    send_.resize(at + static_cast<size_t>(mine));
    pack_columns(buf, n, ld, bounds[static_cast<size_t>(rank)], bounds[static_cast<size_t>(rank) + 1], send_.data() + at);
    send_bytes_[static_cast<size_t>(r)] = mine * static_cast<int64_t>(sizeof(float));
  }
  const std::vector<int64_t> got = group_->op_all_to_all(parallel::OpKind::kTensorGather, send_.data(), send_bytes_, recv_);
  if (root >= 0 && rank != root) return;
  size_t at = 0;
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    if (block_floats(r) == 0 && got[static_cast<size_t>(r)] == 0) continue;
    const int64_t want = block_floats(r) * static_cast<int64_t>(sizeof(float));
    if (got[static_cast<size_t>(r)] != want)
      throw parallel::LockstepError(parallel::LockstepError::Kind::kDivergence, r, "data_bytes",
                                    "tensor-parallel rank " + std::to_string(r) + " sent " +
                                        std::to_string(got[static_cast<size_t>(r)]) + " bytes where its columns are " +
                                        std::to_string(want));
    unpack_columns(reinterpret_cast<const float*>(recv_.data() + at), n, ld, bounds[static_cast<size_t>(r)],
                   bounds[static_cast<size_t>(r) + 1], buf);
    at += static_cast<size_t>(want);
  }
}

}  // namespace tandem
