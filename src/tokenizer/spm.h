// SentencePiece-style BPE ("llama" tokenizer model) as llama.cpp runs it: start
// from UTF-8 characters and keep merging the adjacent pair whose concatenation
// is the best-scoring token; what is left that is not a token falls back to
// <0xXX> byte tokens.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "tokenizer/token_index.h"

namespace tandem::tok {

class SpmModel {
 public:
  // `scores` may be empty (all 0). `unk_id` (or -1) stands in for a byte that
  // has no byte token.
  SpmModel(const std::vector<float>& scores, const TokenIndex& index, int32_t unk_id);

  // Appends the tokens of `text`, whose spaces are already U+2581.
  void encode(std::string_view text, std::vector<int32_t>& out) const;

 private:
  float score(int32_t id) const { return scores_.empty() ? 0.0f : scores_[id]; }

  const std::vector<float>& scores_;
  const TokenIndex& index_;
  std::array<int32_t, 256> byte_tokens_;  // -1 where there is no fallback at all
};

}  // namespace tandem::tok
