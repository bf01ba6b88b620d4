// UTF-8 and code point helpers shared by the tokenizers.
//
// Two UTF-8 decoders live here on purpose: the tokenizers must read malformed
// input exactly as llama.cpp does (lenient: overlong forms and surrogates pass,
// each bad byte becomes U+FFFD), while the detokenizer must only ever emit
// well-formed UTF-8 (strict, RFC 3629).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/unicode_tables.h"

namespace tandem::tok {

inline constexpr uint32_t kReplacementChar = 0xFFFD;

// Byte length of the UTF-8 sequence that `lead` starts, judged by its top four
// bits only (continuation bytes count as 1). Used to cut text into "characters"
// without validating them, as llama.cpp's SPM and BPE symbol splitting do.
inline size_t utf8_len_from_lead(uint8_t lead) {
  if (lead < 0xC0) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

// Lenient decoder: checks only the lead byte's form and that the continuation
// bytes are 10xxxxxx; each byte that cannot start a sequence becomes U+FFFD.
// Sequences that would decode above U+10FFFF are also treated as bad bytes
// (llama.cpp fails on them later; we must not).
std::vector<uint32_t> decode_utf8_lenient(std::string_view text);

// Appends the UTF-8 form of `cp` (cp <= 0x10FFFF; surrogates are encoded as is).
void append_utf8(std::string& out, uint32_t cp);

// Strict validation of the character at the start of `text`: its length if it
// is well-formed; 0 if the text ends inside a character that is well-formed so
// far; -k if it is ill-formed, k >= 1 being the length of the maximal
// well-formed prefix (the bytes one U+FFFD should replace, as the Unicode
// standard recommends).
int utf8_valid_char_len(std::string_view text);

CharClass char_class(uint32_t cp);

// GPT-2's reversible byte <-> printable-code-point mapping (bytes_to_unicode):
// printable Latin-1 bytes map to themselves, the other 68 bytes to U+0100 on.
const std::string& byte_to_unicode(uint8_t byte);
// The byte a code point stands for, or -1 if it is not in the mapping.
int unicode_to_byte(uint32_t cp);

}  // namespace tandem::tok
