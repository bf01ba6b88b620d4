// Byte-level BPE ("gpt2" tokenizer model): merges ranked by their position in
// tokenizer.ggml.merges, applied lowest rank first within each word.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/token_index.h"

namespace tandem::tok {

class BpeModel {
 public:
  // Throws tandem::Error naming the first merge that is not "<left> <right>"
  // with both sides in the vocabulary.
  BpeModel(const std::vector<std::string>& merges, const TokenIndex& index);

  // Appends the tokens of one word that is already in byte-encoded form.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

 private:
  struct Merge {
    int32_t rank;
    int32_t result;  // id of left+right, or -1 if that text is not a token
  };
  static uint64_t key(int32_t left, int32_t right) {
    return (uint64_t{static_cast<uint32_t>(left)} << 32) | static_cast<uint32_t>(right);
  }

  const TokenIndex& index_;
  std::unordered_map<uint64_t, Merge> merges_;
};

}  // namespace tandem::tok
