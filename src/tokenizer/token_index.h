// Text -> id lookup over a vocabulary's token strings, without copying them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tandem::tok {

class TokenIndex {
 public:
  // `tokens` must outlive the index and must not be modified. When a text
  // occurs more than once the highest id wins, as in llama.cpp.
  explicit TokenIndex(const std::vector<std::string>& tokens) {
    // Filled exactly as llama.cpp fills its std::unordered_map<std::string, ...>
    // (same hash of the bytes, ids in order, no reserve()), so that with the
    // same standard library for_each() visits tokens in llama.cpp's order.
    for (size_t i = 0; i < tokens.size(); ++i) map_[tokens[i]] = static_cast<int32_t>(i);
  }
  // -1 if `text` is not a token.
  int32_t find(std::string_view text) const {
    auto it = map_.find(text);
    return it == map_.end() ? -1 : it->second;
  }
  size_t size() const { return map_.size(); }
  // Calls fn(text, id) once per distinct text, in the map's iteration order.
  // llama.cpp recognises special tokens by walking its map; where several
  // tokens qualify, the first visited wins, so we walk in the same order.
  template <typename Fn>
  void for_each(Fn&& fn) const {
    for (const auto& [text, id] : map_) fn(text, id);
  }

 private:
  std::unordered_map<std::string_view, int32_t> map_;
};

}  // namespace tandem::tok
