// How deeply a JSON text nests, found by a scan of its brackets (strings
// skipped), before anything parses it. Parsing is iterative, but copying,
// printing and converting a parsed document recurse once per level, so a
// body nested a hundred thousand deep would overflow the stack: servers
// refuse such bodies up front with a 400 instead.
#pragma once

#include <string_view>

namespace tandem {

// The largest number of brackets open at once in `text` (as JSON, ignoring
// brackets inside strings). Stops counting once it passes `stop_after`.
inline int json_nesting_depth(std::string_view text, int stop_after) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character cannot end the string
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > deepest && (deepest = depth) > stop_after) return deepest;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

// Request bodies nest at most this deep (OpenAI's requests need a handful of levels).
constexpr int kMaxRequestJsonDepth = 128;

}  // namespace tandem
