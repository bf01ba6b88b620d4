// Pre-tokenizers of the byte-level BPE ("gpt2") tokenizer: they cut text into
// words so that no merge crosses a word boundary. Each is a hand-written
// matcher equivalent to the regular expressions llama.cpp applies for the same
// tokenizer.ggml.pre value (no regex library involved).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::tok {

// One regex pass. Passes run in sequence, each splitting the words of the last.
enum class SplitPass {
  // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kGpt2,
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}
  //   | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  kLlama3,
  // As kLlama3 with \p{N} instead of \p{N}{1,3}.
  kQwen2,
  // [\p{P}\$\+<=>\^~\|]+   (match and the text between are both kept as words)
  kPunctRuns,
  // \p{N}+
  kNumberRuns,
  // [0-9][0-9][0-9]
  kAsciiDigitTriples,
  // \p{N}
  kSingleNumbers,
};

struct PreTokenizer {
  std::string_view name;
  std::span<const SplitPass> passes;
  // llama.cpp's per-pre-tokenizer settings: whole words found in the vocabulary
  // skip the merges; the default of add_bos when the GGUF does not say; and
  // whether decode() cleans up spaces before punctuation.
  bool ignore_merges;
  bool default_add_bos;
  bool clean_spaces;
};

// nullptr if `name` is not supported. The empty name is llama.cpp's "default".
const PreTokenizer* find_pre_tokenizer(std::string_view name);
// "default, gpt-2, llama-bpe, ..." for error messages.
std::string supported_pre_tokenizers();

// Splits code points into words; returns the end offset of each word (the
// words tile the input; none is empty).
std::vector<size_t> pretokenize(const PreTokenizer& pre, const std::vector<uint32_t>& cps);

}  // namespace tandem::tok
