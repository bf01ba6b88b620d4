// Special tokens: llama.cpp's token attributes, the by-text recognition of
// end-of-generation / FIM tokens, and the splitting of input text around
// occurrences of special token texts.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/token_index.h"
#include "tokenizer/tokenizer.h"

namespace tandem::tok {

// llama.cpp's token attributes. They are bit flags because llama.cpp adds
// CONTROL to tokens it recognises by their text, on top of their type.
enum Attr : uint32_t {
  kAttrUnknown = 1u << 0,
  kAttrUnused = 1u << 1,
  kAttrNormal = 1u << 2,
  kAttrControl = 1u << 3,
  kAttrUserDefined = 1u << 4,
  kAttrByte = 1u << 5,
  kAttrRstrip = 1u << 8,  // whitespace after this token in the input is dropped
};

uint32_t attr_from_type(TokenType type);
TokenType type_from_attr(uint32_t attr);

// Does what llama.cpp does after reading the vocabulary: fills the eot, eom
// and FIM ids that are -1 from well-known token texts, marks recognised tokens
// CONTROL (a few USER_DEFINED or NORMAL), and returns one end-of-generation
// flag per token.
std::vector<uint8_t> resolve_special_tokens(VocabData& vocab, const TokenIndex& index,
                                            std::vector<uint32_t>& attrs);

// The ids whose text is matched in input (control, user-defined, unknown),
// longest text first.
std::vector<int32_t> special_match_order(const std::vector<std::string>& tokens,
                                         const std::vector<uint32_t>& attrs);

// llama.cpp's Phi-3 rule (VocabData::special_rstrip): every special token in
// `specials` and "</s>" drop the whitespace after them, except "<unk>", "<s>"
// and "<|endoftext|>".
void apply_special_rstrip(const std::vector<int32_t>& specials, const TokenIndex& index,
                          std::vector<uint32_t>& attrs);

// A stretch of input: one special token, or raw text [begin, end).
struct Segment {
  int32_t token;  // -1 for raw text
  size_t begin, end;
};

// Splits `text` around special token texts, as llama.cpp's
// tokenizer_st_partition does: each token in `order` in turn claims all its
// (non-overlapping, leftmost-first) occurrences in the raw text that is left.
// Without parse_special only user-defined tokens are matched. Whitespace after
// a match of a kAttrRstrip token is dropped.
std::vector<Segment> split_on_specials(std::string_view text, const std::vector<int32_t>& order,
                                       const std::vector<std::string>& tokens,
                                       const std::vector<uint32_t>& attrs, bool parse_special);

}  // namespace tandem::tok
