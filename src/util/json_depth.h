// The shape of a JSON text, found by one scan of its brackets (strings
// skipped) before anything parses it. Parsing is iterative, but copying,
// printing and converting a parsed document recurse once per level, and an
// insertion-ordered object looks its keys up one by one, so a body nested a
// hundred thousand deep would overflow the stack and one with a million keys
// in an object would take minutes to parse: servers refuse both up front
// with a 400.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace tandem {

struct JsonShape {
  int depth = 0;                 // the most brackets open at once
  int64_t widest_object = 0;     // the most keys of one object
};

// Stops scanning once depth passes `stop_depth`.
inline JsonShape json_shape(std::string_view text, int stop_depth) {
  JsonShape shape;
  std::vector<int64_t> keys;  // per open bracket: keys so far (objects), -1 for arrays
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
      keys.push_back(c == '{' ? 0 : -1);
      if (static_cast<int>(keys.size()) > shape.depth && (shape.depth = static_cast<int>(keys.size())) > stop_depth)
        return shape;
    } else if (c == ']' || c == '}') {
      if (!keys.empty()) keys.pop_back();
    } else if (c == ':' && !keys.empty() && keys.back() >= 0) {
      if (++keys.back() > shape.widest_object) shape.widest_object = keys.back();
    }
  }
  return shape;
}

// Request bodies nest at most this deep and hold at most this many keys in
// one object (OpenAI's requests need a handful of levels; logit_bias, the
// widest object, takes up to 300 keys).
constexpr int kMaxRequestJsonDepth = 128;
constexpr int64_t kMaxRequestObjectKeys = 1024;

// Empty when `text` is within both limits, else what is wrong, for a 400.
inline std::string_view json_shape_problem(std::string_view text) {
  const JsonShape s = json_shape(text, kMaxRequestJsonDepth);
  if (s.depth > kMaxRequestJsonDepth) return "it nests deeper than 128 levels";
  if (s.widest_object > kMaxRequestObjectKeys) return "an object in it has more than 1024 keys";
  return {};
}

}  // namespace tandem
