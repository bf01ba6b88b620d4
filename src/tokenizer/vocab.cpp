// Checks that a VocabData can make a tokenizer, with errors that say what is
// wrong and what would work instead.

#include <string>

#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"
#include "util/error.h"

namespace tandem {

namespace {

void check_id(const VocabData& v, int32_t id, const char* what) {
  const auto n = static_cast<int64_t>(v.tokens.size());
  if (id < -1 || id >= n) {
    throw Error(std::string("tokenizer ") + what + " id " + std::to_string(id) +
                " is out of range: the vocabulary has " + std::to_string(n) +
                " tokens (ids 0.." + std::to_string(n - 1) + "; -1 means none)");
  }
}

}  // namespace

void tok::validate_vocab_fields(const VocabData& v) {
  if (v.model != "gpt2" && v.model != "llama") {
    throw Error("unsupported tokenizer model \"" + v.model +
                "\" (tokenizer.ggml.model); supported: gpt2 (byte-level BPE), llama "
                "(SentencePiece BPE)");
  }
  if (v.model == "gpt2" && tok::find_pre_tokenizer(v.pre) == nullptr) {
    throw Error("unsupported pre-tokenizer \"" + v.pre +
                "\" (tokenizer.ggml.pre) for the gpt2 tokenizer; supported: " +
                tok::supported_pre_tokenizers());
  }
  if (v.tokens.empty()) throw Error("the tokenizer vocabulary (tokenizer.ggml.tokens) is empty");
  if (v.tokens.size() > static_cast<size_t>(INT32_MAX)) {
    throw Error("the tokenizer vocabulary has more tokens than 32-bit ids can number");
  }
  if (!v.scores.empty() && v.scores.size() != v.tokens.size()) {
    throw Error("tokenizer.ggml.scores has " + std::to_string(v.scores.size()) +
                " entries but tokenizer.ggml.tokens has " + std::to_string(v.tokens.size()) +
                "; they must have one entry per token");
  }
  if (!v.token_types.empty() && v.token_types.size() != v.tokens.size()) {
    throw Error("tokenizer.ggml.token_type has " + std::to_string(v.token_types.size()) +
                " entries but tokenizer.ggml.tokens has " + std::to_string(v.tokens.size()) +
                "; they must have one entry per token");
  }
  check_id(v, v.bos_id, "BOS");
  check_id(v, v.eos_id, "EOS");
  check_id(v, v.eot_id, "EOT");
  check_id(v, v.unk_id, "unknown-token");
  check_id(v, v.pad_id, "padding");
  check_id(v, v.eom_id, "EOM");
  check_id(v, v.fim_pre_id, "FIM prefix");
  check_id(v, v.fim_suf_id, "FIM suffix");
  check_id(v, v.fim_mid_id, "FIM middle");
  check_id(v, v.fim_pad_id, "FIM pad");
  check_id(v, v.fim_rep_id, "FIM repo");
  check_id(v, v.fim_sep_id, "FIM separator");
  if (v.add_bos && v.bos_id < 0) {
    throw Error("the tokenizer asks for a BOS token (tokenizer.ggml.add_bos_token) but has "
                "none; set tokenizer.ggml.bos_token_id or turn add_bos_token off");
  }
  if (v.add_eos && v.eos_id < 0) {
    throw Error("the tokenizer asks for an EOS token (tokenizer.ggml.add_eos_token) but has "
                "none; set tokenizer.ggml.eos_token_id or turn add_eos_token off");
  }
}

}  // namespace tandem
