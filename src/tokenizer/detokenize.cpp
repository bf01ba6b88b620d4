// Token ids back to bytes: per-token pieces and whole sequences.

#include <cstdio>
#include <cstdlib>
#include <string>

#include "tokenizer/special_tokens.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace tandem {

namespace {

// Byte-level BPE text back to bytes. A code point outside the byte mapping
// cannot come from a real byte-level vocabulary; llama.cpp then writes a
// marker holding the code point's bytes and the whole token text, and so do we.
std::string byte_level_to_bytes(const std::string& text) {
  std::string out;
  std::string utf8;
  for (uint32_t cp : tok::decode_utf8_lenient(text)) {
    const int byte = tok::unicode_to_byte(cp);
    if (byte >= 0) {
      out.push_back(static_cast<char>(byte));
      continue;
    }
    utf8.clear();
    tok::append_utf8(utf8, cp);
    out += "[UNK_BYTE_0x";
    for (char c : utf8) {
      char hex[3];
      std::snprintf(hex, sizeof hex, "%02x", static_cast<unsigned>(static_cast<uint8_t>(c)));
      out += hex;
    }
    out += text;
    out += "]";
  }
  return out;
}

std::string replace_visible_spaces(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    if (text.compare(i, 3, "\xE2\x96\x81") == 0) {
      out += ' ';
      i += 3;
    } else {
      out += text[i++];
    }
  }
  return out;
}

// The byte of a "<0xXX>" token, read the lenient way llama.cpp reads it.
char byte_token_value(const std::string& text) {
  const std::string hex = text.size() > 3 ? text.substr(3, 2) : std::string();
  return static_cast<char>(std::strtol(hex.c_str(), nullptr, 16));
}

// llama.cpp's clean_up_tokenization_spaces: three passes over the text, each
// reading the previous pass's output.
std::string clean_up_spaces(const std::string& text) {
  auto is_stop = [](char c) { return c == '?' || c == '!' || c == '.' || c == ','; };
  // 1. " ?" " !" " ." " ," lose the space.
  std::string a;
  a.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (i > 0 && text[i - 1] == ' ' && is_stop(text[i])) a.pop_back();
    a += text[i];
  }
  // 2. A lone apostrophe " ' " loses both spaces. The dropped right space is
  // blanked in the input, so "a ' ' b" keeps the space before the second "'".
  std::string b;
  b.reserve(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const char c = a[i];
    if (i > 0 && c == '\'' && i + 1 < a.size() && a[i - 1] == ' ' && a[i + 1] == ' ') {
      b.pop_back();
      a[i + 1] = '\0';
      b += c;
      ++i;
      continue;
    }
    b += c;
  }
  // 3. " 's" " 'm" " 're" " 've" lose the space (not " 't", " 'd", " 'll").
  std::string c;
  c.reserve(b.size());
  for (size_t i = 0; i < b.size(); ++i) {
    const char x = b[i];
    if (i > 0 && b[i - 1] == ' ' && x == '\'' && i + 1 < b.size()) {
      const char x1 = b[i + 1];
      if (x1 == 's' || x1 == 'm') {
        c.pop_back();
      } else if (x1 != 't' && x1 != 'd' && i + 2 < b.size()) {
        const char x2 = b[i + 2];
        if ((x1 == 'r' || x1 == 'v') && x2 == 'e') c.pop_back();
      }
    }
    c += x;
  }
  return c;
}

}  // namespace

std::string Tokenizer::Impl::make_piece(int32_t id) const {
  const uint32_t attr = attrs[id];
  const std::string& text = vocab.tokens[id];
  if (attr & (tok::kAttrUnknown | tok::kAttrControl | tok::kAttrUserDefined)) return text;
  if (attr & tok::kAttrNormal) {
    return is_spm ? replace_visible_spaces(text) : byte_level_to_bytes(text);
  }
  if (attr & tok::kAttrByte) return std::string(1, byte_token_value(text));
  return std::string();  // unused and undefined tokens print nothing
}

std::string Tokenizer::token_to_piece(int32_t id, bool render_special) const {
  const Impl& m = *impl_;
  m.check_id(id);
  if (!render_special && (m.attrs[id] & (tok::kAttrUnknown | tok::kAttrControl))) return {};
  return m.pieces[id];
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool render_special) const {
  const Impl& m = *impl_;
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    std::string piece = token_to_piece(ids[i], render_special);
    // llama_detokenize strips one space from the first piece only, whatever
    // token that is (with BOS first, nothing is stripped).
    if (i == 0 && m.vocab.add_space_prefix && !piece.empty() && piece[0] == ' ') {
      piece.erase(0, 1);
    }
    out += piece;
  }
  return m.clean_spaces ? clean_up_spaces(out) : out;
}

}  // namespace tandem
