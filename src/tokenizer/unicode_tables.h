// Code point classes for the pre-tokenizers, generated from Unicode data by
// scripts/gen_unicode_tables.py into unicode_tables.cpp.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tandem::tok {

// One class per code point. kSpace is the White_Space property (\s); the others
// are the general categories L*, N* and P*. No White_Space code point is in
// L, N or P, so one class is enough.
enum CharClass : uint8_t { kOther = 0, kLetter, kNumber, kPunct, kSpace };

struct CodepointRange {
  uint32_t first;
  uint32_t last;
  CharClass cls;
};

extern const char kUnicodeVersion[];
extern const CodepointRange kCodepointRanges[];
extern const size_t kNumCodepointRanges;

}  // namespace tandem::tok
