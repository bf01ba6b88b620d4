#include "engine/lockstep_experts.h"

#include <cstring>

#include "util/error.h"

namespace tandem {

void LockstepExpertExchange::all_to_all(bool combine, std::span<const float> send, std::span<const int64_t> send_rows,
                                        int64_t row_floats, std::vector<float>& recv, std::vector<int64_t>& recv_rows) {
  TANDEM_ASSERT(group_ != nullptr && group_->size() == size_, "an expert exchange runs on a formed group");
  const int64_t row_bytes = row_floats * static_cast<int64_t>(sizeof(float));
  send_bytes_.resize(send_rows.size());
  for (size_t r = 0; r < send_rows.size(); ++r) send_bytes_[r] = send_rows[r] * row_bytes;
  const std::vector<int64_t> got = group_->op_all_to_all(
      combine ? parallel::OpKind::kExpertCombine : parallel::OpKind::kExpertDispatch, send.data(), send_bytes_, buffer_);
  recv_rows.resize(got.size());
  for (size_t r = 0; r < got.size(); ++r) {
    if (got[r] % row_bytes != 0)
      throw parallel::LockstepError(parallel::LockstepError::Kind::kDivergence, static_cast<int>(r), "data_bytes",
                                    "data-parallel rank " + std::to_string(r) + " sent " + std::to_string(got[r]) +
                                        " bytes, not whole rows of " + std::to_string(row_bytes));
    recv_rows[r] = got[r] / row_bytes;
  }
  recv.resize(buffer_.size() / sizeof(float));
  if (!buffer_.empty()) std::memcpy(recv.data(), buffer_.data(), buffer_.size());
}

}  // namespace tandem
