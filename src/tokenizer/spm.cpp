#include "tokenizer/spm.h"

#include <algorithm>
#include <cstdio>
#include <queue>

#include "tokenizer/unicode.h"

namespace tandem::tok {

SpmModel::SpmModel(const std::vector<float>& scores, const TokenIndex& index, int32_t unk_id)
    : scores_(scores), index_(index) {
  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "<0x%02X>", b);
    int32_t id = index.find(hex);
    // Vocabularies without <0xXX> tokens may still hold the raw byte as a token.
    const char raw = static_cast<char>(b);
    if (id < 0) id = index.find(std::string_view(&raw, 1));
    byte_tokens_[b] = id >= 0 ? id : unk_id;
  }
}

void SpmModel::encode(std::string_view text, std::vector<int32_t>& out) const {
  struct Symbol {
    uint32_t start, len;
    int32_t prev, next;
  };
  std::vector<Symbol> syms;
  for (size_t pos = 0; pos < text.size();) {
    // Characters are cut by their lead byte alone, without validation, so that
    // malformed input splits exactly as it does in llama.cpp.
    const size_t len =
        std::min(utf8_len_from_lead(static_cast<uint8_t>(text[pos])), text.size() - pos);
    const auto i = static_cast<int32_t>(syms.size());
    syms.push_back({static_cast<uint32_t>(pos), static_cast<uint32_t>(len), i - 1, -1});
    if (i > 0) syms[i - 1].next = i;
    pos += len;
  }

  // Best first: highest score, then leftmost. Symbols only grow, so a pair
  // whose total length changed is stale.
  struct Candidate {
    float score;
    int32_t left;
    uint32_t len;
    bool operator<(const Candidate& o) const {
      return score < o.score || (score == o.score && left > o.left);
    }
  };
  std::priority_queue<Candidate> queue;
  auto consider = [&](int32_t left) {
    if (left < 0 || syms[left].next < 0) return;
    const Symbol& l = syms[left];
    const uint32_t len = l.len + syms[l.next].len;
    const int32_t id = index_.find(text.substr(l.start, len));
    if (id >= 0) queue.push({score(id), left, len});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) consider(i);

  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& left = syms[c.left];
    if (left.len == 0 || left.next < 0) continue;
    Symbol& right = syms[left.next];
    if (left.len + right.len != c.len) continue;
    left.len += right.len;
    right.len = 0;
    left.next = right.next;
    if (left.next >= 0) syms[left.next].prev = c.left;
    consider(left.prev);
    consider(c.left);
  }

  for (const Symbol& s : syms) {
    if (s.len == 0) continue;
    const int32_t id = index_.find(text.substr(s.start, s.len));
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    for (uint32_t k = 0; k < s.len; ++k) {
      const int32_t b = byte_tokens_[static_cast<uint8_t>(text[s.start + k])];
      if (b >= 0) out.push_back(b);
    }
  }
}

}  // namespace tandem::tok
