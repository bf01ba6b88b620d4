// The state behind tandem::Tokenizer, shared by the files that implement it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tokenizer/bpe.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/spm.h"
#include "tokenizer/token_index.h"
#include "tokenizer/tokenizer.h"

namespace tandem {

namespace tok {
// validate_vocab() without the merge check (which needs the BPE model built).
void validate_vocab_fields(const VocabData& v);
}  // namespace tok

struct Tokenizer::Impl {
  explicit Impl(VocabData data);

  // Throws tandem::Error unless 0 <= id < n_vocab.
  void check_id(int32_t id) const;
  // Tokenizes raw text (no special tokens in it) and appends the ids.
  void encode_bpe(std::string_view text, std::vector<int32_t>& out) const;
  void encode_spm(std::string_view text, bool space_prefix, std::vector<int32_t>& out) const;
  // token_to_piece with render_special = true; built once for every token.
  std::string make_piece(int32_t id) const;

  VocabData vocab;
  bool is_spm = false;
  const tok::PreTokenizer* pre = nullptr;  // gpt2 only
  bool clean_spaces = false;
  std::vector<uint32_t> attrs;   // tok::Attr flags per token
  std::vector<uint8_t> eog;      // end-of-generation flag per token
  std::vector<int32_t> specials;  // matched in input, longest text first
  std::vector<std::string> pieces;
  std::unique_ptr<tok::TokenIndex> index;  // points into vocab.tokens
  std::unique_ptr<tok::BpeModel> bpe;
  std::unique_ptr<tok::SpmModel> spm;
};

}  // namespace tandem
