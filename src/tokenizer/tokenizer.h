// Tokenizers built from GGUF metadata, as llama.cpp reads them:
//  - tokenizer.ggml.model = "gpt2": byte-level BPE with ranked merges and a
//    pre-tokenizer chosen by tokenizer.ggml.pre (gpt-2, llama-bpe (Llama 3),
//    qwen2, llama.cpp's "default" when the key is missing, ...);
//  - tokenizer.ggml.model = "llama": SentencePiece-style BPE driven by token
//    scores, with "\u2581" for spaces and <0xXX> byte fallback.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::gguf {
class File;
}

namespace tandem {

// Token attribute, numbered as tokenizer.ggml.token_type in GGUF.
enum class TokenType : int32_t {
  UNDEFINED = 0, NORMAL = 1, UNKNOWN = 2, CONTROL = 3, USER_DEFINED = 4, UNUSED = 5, BYTE = 6,
};

// Everything a tokenizer needs, as stored in GGUF metadata.
struct VocabData {
  std::string model;  // "gpt2" or "llama"
  std::string pre;    // tokenizer.ggml.pre; empty means the model's default
  std::vector<std::string> tokens;
  std::vector<float> scores;           // empty when absent
  std::vector<TokenType> token_types;  // empty when absent (all NORMAL)
  std::vector<std::string> merges;     // "left right", rank = index (gpt2 only)
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  int32_t eot_id = -1;  // -1: found by text ("<|eot_id|>", "<|im_end|>", ...) as llama.cpp does
  int32_t unk_id = -1;
  int32_t pad_id = -1;
  int32_t eom_id = -1;  // -1: found by text ("<|eom_id|>")
  // Fill-in-the-middle tokens (-1: found by text, e.g. "<|fim_prefix|>"). Only
  // their effect on token attributes and end of generation is used: llama.cpp
  // treats the pad, repo and file-separator tokens as end of generation.
  int32_t fim_pre_id = -1;
  int32_t fim_suf_id = -1;
  int32_t fim_mid_id = -1;
  int32_t fim_pad_id = -1;
  int32_t fim_rep_id = -1;
  int32_t fim_sep_id = -1;
  bool add_bos = false;
  bool add_eos = false;
  // "llama": encode puts a space before text that starts the input or follows
  // a special token. Either model: decode() drops one leading space of the
  // first piece. llama.cpp's default is true for "llama", false for "gpt2".
  bool add_space_prefix = true;
  // Whitespace that follows a special token in the input is dropped, except
  // after <unk>, <s> and <|endoftext|> (and it is dropped after </s>).
  // llama.cpp does this for models whose general.name contains "phi-3" or
  // "phi3"; vocab_from_gguf sets it the same way.
  bool special_rstrip = false;
};

// Reads tokenizer.ggml.* keys, filling in llama.cpp's defaults for missing
// ones (an out-of-range special token id is ignored, as llama.cpp does). Throws
// tandem::Error naming the key or the unsupported model / pre-tokenizer, or
// when array sizes disagree; merges and duplicate texts are checked when a
// Tokenizer is made from the result.
VocabData vocab_from_gguf(const gguf::File& file);

// Throws tandem::Error if the data cannot make a tokenizer: model or
// pre-tokenizer not supported, array sizes that disagree, ids out of range,
// two tokens with the same text, merges that name unknown tokens,
// add_bos/add_eos without the token. (It builds one, so it costs as much.)
void validate_vocab(const VocabData& vocab);

// Matches llama.cpp's tokenizer (llama-vocab.cpp) token for token on the same
// vocabulary: encode() is llama_tokenize, token_to_piece() is
// llama_token_to_piece with lstrip 0, decode() is llama_detokenize with
// remove_special = false (what common_detokenize does).
class Tokenizer {
 public:
  // Throws tandem::Error as validate_vocab() does.
  explicit Tokenizer(VocabData vocab);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // Tokenizer(vocab_from_gguf(file)); errors name the file.
  static Tokenizer from_gguf(const gguf::File& file);

  // add_special: prepend BOS (and append EOS) when the metadata asks for it.
  // parse_special: text of control/unknown tokens (e.g. "<|im_start|>") is
  // matched as those tokens; otherwise it is tokenized as plain text.
  // User-defined tokens are matched either way, as in llama.cpp.
  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const;

  // Bytes of one token. Control and unknown tokens give "" unless
  // render_special. Throws tandem::Error for an id out of range.
  std::string token_to_piece(int32_t id, bool render_special = false) const;
  // Bytes of a token sequence (may end in an incomplete UTF-8 sequence). Drops
  // one leading space of the first piece when add_space_prefix, and applies
  // llama.cpp's clean-up of spaces before punctuation for the pre-tokenizers
  // that ask for it (gpt-2, llama-bpe, default, ...; not qwen2).
  std::string decode(std::span<const int32_t> ids, bool render_special = false) const;

  int32_t n_vocab() const;
  int32_t bos_id() const;
  int32_t eos_id() const;
  int32_t eot_id() const;  // after the by-text search; -1 if none
  bool add_bos() const;
  bool add_eos() const;
  // End of generation: EOS, EOT, or any other token the vocabulary marks so.
  bool is_end_of_generation(int32_t id) const;
  // The type as llama.cpp ends up treating it: tokens it recognises as end of
  // generation or FIM by their text are CONTROL even if the file says otherwise.
  TokenType token_type(int32_t id) const;
  // As stored in the vocabulary (an empty text reads "[EMPTY_<id>]", as in llama.cpp).
  const std::string& token_text(int32_t id) const;
  // The data the tokenizer was built from, with eot/eom/fim ids resolved.
  const VocabData& vocab() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Turns a stream of tokens into text that never contains a broken UTF-8
// sequence: bytes of an incomplete character are held back until the
// character completes (or flush() is called), and bytes that can never form a
// character become U+FFFD. The text is the concatenation of the tokens'
// pieces, which is what llama-server streams for generated tokens; unlike
// decode() it neither drops a leading space nor cleans up spaces, so for
// well-formed UTF-8 it equals decode() exactly when those do not apply.
class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, bool render_special = false)
      : tokenizer_(&tokenizer), render_special_(render_special) {}
  // Returns the newly completed text (possibly empty); always valid UTF-8.
  std::string push(int32_t id);
  // Returns whatever is held back, an incomplete character becoming U+FFFD,
  // and resets the stream.
  std::string flush();

 private:
  const Tokenizer* tokenizer_;
  bool render_special_;
  std::string pending_;
};

}  // namespace tandem
