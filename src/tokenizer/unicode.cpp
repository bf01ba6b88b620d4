#include "tokenizer/unicode.h"

#include <algorithm>
#include <array>

namespace tandem::tok {

std::vector<uint32_t> decode_utf8_lenient(std::string_view text) {
  std::vector<uint32_t> out;
  out.reserve(text.size());
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  auto is_cont = [&](size_t k) { return k < n && (s[k] & 0xC0) == 0x80; };
  while (i < n) {
    const uint8_t b = s[i];
    if (b < 0x80) {
      out.push_back(b);
      i += 1;
    } else if ((b & 0xE0) == 0xC0 && is_cont(i + 1)) {
      out.push_back(((b & 0x1Fu) << 6) | (s[i + 1] & 0x3Fu));
      i += 2;
    } else if ((b & 0xF0) == 0xE0 && is_cont(i + 1) && is_cont(i + 2)) {
      out.push_back(((b & 0x0Fu) << 12) | ((s[i + 1] & 0x3Fu) << 6) | (s[i + 2] & 0x3Fu));
      i += 3;
    } else if ((b & 0xF8) == 0xF0 && is_cont(i + 1) && is_cont(i + 2) && is_cont(i + 3)) {
      const uint32_t cp = ((b & 0x07u) << 18) | ((s[i + 1] & 0x3Fu) << 12) |
                          ((s[i + 2] & 0x3Fu) << 6) | (s[i + 3] & 0x3Fu);
      if (cp <= 0x10FFFF) {
        out.push_back(cp);
        i += 4;
      } else {
        out.push_back(kReplacementChar);
        i += 1;
      }
    } else {
      // A continuation byte in lead position, a 0xF8+ byte, or a truncated
      // sequence: one replacement per byte, then resynchronise on the next byte.
      out.push_back(kReplacementChar);
      i += 1;
    }
  }
  return out;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

int utf8_valid_char_len(std::string_view text) {
  if (text.empty()) return 0;
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const uint8_t b = s[0];
  if (b < 0x80) return 1;
  // Allowed range of the second byte and total length, per the well-formed
  // byte sequence table of the Unicode standard (no overlongs, no surrogates).
  int len = 0;
  uint8_t lo = 0x80, hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) {
    len = 2;
  } else if (b == 0xE0) {
    len = 3, lo = 0xA0;
  } else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) {
    len = 3;
  } else if (b == 0xED) {
    len = 3, hi = 0x9F;
  } else if (b == 0xF0) {
    len = 4, lo = 0x90;
  } else if (b >= 0xF1 && b <= 0xF3) {
    len = 4;
  } else if (b == 0xF4) {
    len = 4, hi = 0x8F;
  } else {
    return -1;
  }
  for (int k = 1; k < len; ++k) {
    if (static_cast<size_t>(k) >= text.size()) return 0;  // well-formed so far, cut short
    const uint8_t c = s[k];
    const uint8_t min = k == 1 ? lo : 0x80;
    const uint8_t max = k == 1 ? hi : 0xBF;
    if (c < min || c > max) return -k;
  }
  return len;
}

namespace {

// The table is about a thousand ranges; ASCII and Latin-1 are looked up
// directly because they dominate typical text.
struct Latin1Classes {
  std::array<CharClass, 256> cls{};
  Latin1Classes() {
    for (uint32_t cp = 0; cp < 256; ++cp) cls[cp] = search(cp);
  }
  static CharClass search(uint32_t cp) {
    const CodepointRange* begin = kCodepointRanges;
    const CodepointRange* end = kCodepointRanges + kNumCodepointRanges;
    const CodepointRange* it = std::upper_bound(
        begin, end, cp, [](uint32_t v, const CodepointRange& r) { return v < r.first; });
    if (it == begin) return kOther;
    --it;
    return cp <= it->last ? it->cls : kOther;
  }
};

const Latin1Classes& latin1_classes() {
  static const Latin1Classes table;
  return table;
}

struct ByteMapping {
  std::array<std::string, 256> to_text;
  std::array<int16_t, 0x144> from_cp{};  // every mapped code point is below U+0144
  ByteMapping() {
    from_cp.fill(-1);
    auto printable = [](int b) {
      return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    uint32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const uint32_t cp = printable(b) ? static_cast<uint32_t>(b) : next++;
      append_utf8(to_text[b], cp);
      from_cp[cp] = static_cast<int16_t>(b);
    }
  }
};

const ByteMapping& byte_mapping() {
  static const ByteMapping mapping;
  return mapping;
}

}  // namespace

CharClass char_class(uint32_t cp) {
  if (cp < 256) return latin1_classes().cls[cp];
  return Latin1Classes::search(cp);
}

const std::string& byte_to_unicode(uint8_t byte) { return byte_mapping().to_text[byte]; }

int unicode_to_byte(uint32_t cp) {
  const auto& m = byte_mapping();
  return cp < m.from_cp.size() ? m.from_cp[cp] : -1;
}

}  // namespace tandem::tok
