// VocabData from a GGUF file's tokenizer.ggml.* metadata, with the defaults
// llama.cpp (llama_vocab::impl::load) applies when a key is missing.

#include <cctype>
#include <string>

#include "gguf/gguf.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"
#include "util/error.h"

namespace tandem {

namespace {

constexpr const char* kModelKey = "tokenizer.ggml.model";
constexpr const char* kPreKey = "tokenizer.ggml.pre";

// A special token id key: used if present and in range; otherwise the default
// stays, as in llama.cpp (which only warns about an out-of-range id).
void read_id(const gguf::File& file, const char* key, int32_t n_tokens, int32_t& id) {
  if (id >= n_tokens) id = -1;  // a default that does not fit this vocabulary
  if (file.find(key) == nullptr) return;
  const int64_t v = file.get_i64_or(key, -1);
  if (v >= 0 && v < n_tokens) id = static_cast<int32_t>(v);
}

TokenType type_from_gguf(int32_t v) {
  // Values outside the known range are "undefined", as in llama.cpp.
  return v >= 0 && v <= static_cast<int32_t>(TokenType::BYTE) ? static_cast<TokenType>(v)
                                                               : TokenType::UNDEFINED;
}

}  // namespace

VocabData vocab_from_gguf(const gguf::File& file) {
  VocabData v;
  v.model = file.get_string(kModelKey);
  v.pre = file.get_string_or(kPreKey, "");
  if (v.model != "gpt2" && v.model != "llama") {
    throw Error("unsupported tokenizer model \"" + v.model + "\" (" + kModelKey + ") in " +
                file.path() + "; supported: gpt2 (byte-level BPE), llama (SentencePiece BPE)");
  }
  const tok::PreTokenizer* pre = nullptr;
  if (v.model == "gpt2") {
    pre = tok::find_pre_tokenizer(v.pre);
    if (pre == nullptr) {
      throw Error("unsupported pre-tokenizer \"" + v.pre + "\" (" + kPreKey + ") in " +
                  file.path() + "; supported: " + tok::supported_pre_tokenizers());
    }
  }

  v.tokens = file.get_string_array("tokenizer.ggml.tokens");
  v.scores = file.get_f32_array_or_empty("tokenizer.ggml.scores");
  for (int32_t t : file.get_i32_array_or_empty("tokenizer.ggml.token_type")) {
    v.token_types.push_back(type_from_gguf(t));
  }
  if (v.model == "gpt2") {
    if (file.find("tokenizer.ggml.merges") == nullptr) {
      throw Error("tokenizer.ggml.merges is missing in " + file.path() +
                  "; a gpt2 (byte-level BPE) tokenizer needs its merges");
    }
    v.merges = file.get_string_array("tokenizer.ggml.merges");
  }

  // llama.cpp's defaults per model.
  if (v.model == "llama") {
    v.bos_id = 1;
    v.eos_id = 2;
    v.unk_id = 0;
    v.add_bos = true;
    v.add_space_prefix = true;
  } else {
    v.bos_id = 11;
    v.eos_id = 11;
    v.add_bos = pre->default_add_bos;
    v.add_space_prefix = false;
  }
  v.add_eos = false;

  if (v.tokens.size() > static_cast<size_t>(INT32_MAX)) {
    throw Error("tokenizer.ggml.tokens in " + file.path() + " has more tokens than 32-bit ids "
                "can number");
  }
  const auto n = static_cast<int32_t>(v.tokens.size());
  read_id(file, "tokenizer.ggml.bos_token_id", n, v.bos_id);
  read_id(file, "tokenizer.ggml.eos_token_id", n, v.eos_id);
  read_id(file, "tokenizer.ggml.eot_token_id", n, v.eot_id);
  read_id(file, "tokenizer.ggml.eom_token_id", n, v.eom_id);
  read_id(file, "tokenizer.ggml.unknown_token_id", n, v.unk_id);
  read_id(file, "tokenizer.ggml.padding_token_id", n, v.pad_id);
  read_id(file, "tokenizer.ggml.fim_pre_token_id", n, v.fim_pre_id);
  read_id(file, "tokenizer.ggml.fim_suf_token_id", n, v.fim_suf_id);
  read_id(file, "tokenizer.ggml.fim_mid_token_id", n, v.fim_mid_id);
  read_id(file, "tokenizer.ggml.fim_pad_token_id", n, v.fim_pad_id);
  read_id(file, "tokenizer.ggml.fim_rep_token_id", n, v.fim_rep_id);
  read_id(file, "tokenizer.ggml.fim_sep_token_id", n, v.fim_sep_id);
  // Older converters wrote the FIM ids under these names.
  read_id(file, "tokenizer.ggml.prefix_token_id", n, v.fim_pre_id);
  read_id(file, "tokenizer.ggml.suffix_token_id", n, v.fim_suf_id);
  read_id(file, "tokenizer.ggml.middle_token_id", n, v.fim_mid_id);

  v.add_space_prefix = file.get_bool_or("tokenizer.ggml.add_space_prefix", v.add_space_prefix);
  std::string name = file.get_string_or("general.name", "");
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  v.special_rstrip =
      name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos;
  v.add_bos = file.get_bool_or("tokenizer.ggml.add_bos_token", v.add_bos);
  v.add_eos = file.get_bool_or("tokenizer.ggml.add_eos_token", v.add_eos);

  // The checks that need no tokenizer; the rest (unique texts, merges) run
  // when a Tokenizer is made from the data.
  try {
    tok::validate_vocab_fields(v);
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + " (in " + file.path() + ")");
  }
  return v;
}

}  // namespace tandem
