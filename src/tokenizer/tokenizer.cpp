// Tokenizer construction and encoding; decoding is in detokenize.cpp.

#include <string>
#include <utility>

#include "gguf/gguf.h"
#include "tokenizer/special_tokens.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"
#include "util/error.h"

namespace tandem {

Tokenizer::Impl::Impl(VocabData data) : vocab(std::move(data)) {
  tok::validate_vocab_fields(vocab);
  is_spm = vocab.model == "llama";
  if (!is_spm) {
    pre = tok::find_pre_tokenizer(vocab.pre);
    clean_spaces = pre->clean_spaces;
  }

  const size_t n = vocab.tokens.size();
  // llama.cpp cannot hold an empty text in its text -> id map and renames them.
  for (size_t i = 0; i < n; ++i) {
    if (vocab.tokens[i].empty()) vocab.tokens[i] = "[EMPTY_" + std::to_string(i) + "]";
  }
  attrs.assign(n, tok::kAttrNormal);
  if (!vocab.token_types.empty()) {
    for (size_t i = 0; i < n; ++i) attrs[i] = tok::attr_from_type(vocab.token_types[i]);
  }

  // vocab.tokens is not modified after this point: the index views its strings.
  index = std::make_unique<tok::TokenIndex>(vocab.tokens);
  if (index->size() != n) {
    // llama.cpp refuses such a vocabulary (an assertion), so no real file has one.
    for (size_t i = 0; i < n; ++i) {
      const int32_t other = index->find(vocab.tokens[i]);
      if (other != static_cast<int32_t>(i)) {
        throw Error("tokens " + std::to_string(i) + " and " + std::to_string(other) +
                    " of the vocabulary have the same text \"" + vocab.tokens[i] +
                    "\"; every token text must be unique");
      }
    }
  }
  if (is_spm) {
    spm = std::make_unique<tok::SpmModel>(vocab.scores, *index, vocab.unk_id);
  } else {
    bpe = std::make_unique<tok::BpeModel>(vocab.merges, *index);
  }

  eog = tok::resolve_special_tokens(vocab, *index, attrs);
  // Report the types as llama.cpp now treats the tokens.
  vocab.token_types.resize(n);
  for (size_t i = 0; i < n; ++i) vocab.token_types[i] = tok::type_from_attr(attrs[i]);

  specials = tok::special_match_order(vocab.tokens, attrs);
  if (vocab.special_rstrip) tok::apply_special_rstrip(specials, *index, attrs);
  pieces.resize(n);
  for (size_t i = 0; i < n; ++i) pieces[i] = make_piece(static_cast<int32_t>(i));
}

void Tokenizer::Impl::check_id(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= vocab.tokens.size()) {
    throw Error("token id " + std::to_string(id) + " is out of range for a vocabulary of " +
                std::to_string(vocab.tokens.size()) + " tokens");
  }
}

void Tokenizer::Impl::encode_bpe(std::string_view text, std::vector<int32_t>& out) const {
  // Words are cut from code points (bad bytes read as U+FFFD, as in llama.cpp)
  // and re-encoded, then each byte is spelled with its printable stand-in.
  const std::vector<uint32_t> cps = tok::decode_utf8_lenient(text);
  const std::vector<size_t> ends = tok::pretokenize(*pre, cps);
  std::string utf8;
  std::string word;
  size_t begin = 0;
  for (size_t end : ends) {
    utf8.clear();
    for (size_t i = begin; i < end; ++i) tok::append_utf8(utf8, cps[i]);
    word.clear();
    for (char c : utf8) word += tok::byte_to_unicode(static_cast<uint8_t>(c));
    begin = end;
    if (pre->ignore_merges) {
      if (const int32_t id = index->find(word); id >= 0) {
        out.push_back(id);
        continue;
      }
    }
    bpe->encode_word(word, out);
  }
}

void Tokenizer::Impl::encode_spm(std::string_view text, bool space_prefix,
                                 std::vector<int32_t>& out) const {
  std::string escaped;
  escaped.reserve(text.size() + 8);
  if (space_prefix) escaped += "\xE2\x96\x81";
  for (char c : text) {
    if (c == ' ') {
      escaped += "\xE2\x96\x81";  // U+2581, SentencePiece's visible space
    } else {
      escaped += c;
    }
  }
  spm->encode(escaped, out);
}

Tokenizer::Tokenizer(VocabData vocab) : impl_(std::make_unique<Impl>(std::move(vocab))) {}

Tokenizer Tokenizer::from_gguf(const gguf::File& file) {
  VocabData vocab = vocab_from_gguf(file);
  try {
    return Tokenizer(std::move(vocab));
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + " (in " + file.path() + ")");
  }
}

void validate_vocab(const VocabData& vocab) { Tokenizer check(vocab); }
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special,
                                       bool parse_special) const {
  const Impl& m = *impl_;
  const std::vector<tok::Segment> segments =
      tok::split_on_specials(text, m.specials, m.vocab.tokens, m.attrs, parse_special);
  std::vector<int32_t> out;
  if (add_special && m.vocab.add_bos) out.push_back(m.vocab.bos_id);
  // SentencePiece prefixes a space to the text at the start and after every
  // special token (llama.cpp counts the start as "after a special token").
  bool after_special = true;
  for (const tok::Segment& seg : segments) {
    if (seg.token >= 0) {
      out.push_back(seg.token);
      after_special = true;
      continue;
    }
    const std::string_view raw = text.substr(seg.begin, seg.end - seg.begin);
    if (m.is_spm) {
      m.encode_spm(raw, m.vocab.add_space_prefix && after_special, out);
    } else {
      m.encode_bpe(raw, out);
    }
    after_special = false;
  }
  if (add_special && m.vocab.add_eos) out.push_back(m.vocab.eos_id);
  return out;
}

int32_t Tokenizer::n_vocab() const { return static_cast<int32_t>(impl_->vocab.tokens.size()); }
int32_t Tokenizer::bos_id() const { return impl_->vocab.bos_id; }
int32_t Tokenizer::eos_id() const { return impl_->vocab.eos_id; }
int32_t Tokenizer::eot_id() const { return impl_->vocab.eot_id; }
bool Tokenizer::add_bos() const { return impl_->vocab.add_bos; }
bool Tokenizer::add_eos() const { return impl_->vocab.add_eos; }

bool Tokenizer::is_end_of_generation(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->eog.size() && impl_->eog[id] != 0;
}

TokenType Tokenizer::token_type(int32_t id) const {
  impl_->check_id(id);
  return impl_->vocab.token_types[id];
}

const std::string& Tokenizer::token_text(int32_t id) const {
  impl_->check_id(id);
  return impl_->vocab.tokens[id];
}

const VocabData& Tokenizer::vocab() const { return impl_->vocab; }

}  // namespace tandem
