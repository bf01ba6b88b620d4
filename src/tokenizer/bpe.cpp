#include "tokenizer/bpe.h"

#include <queue>

#include "tokenizer/unicode.h"
#include "util/error.h"

namespace tandem::tok {

BpeModel::BpeModel(const std::vector<std::string>& merges, const TokenIndex& index)
    : index_(index) {
  merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const std::string& m = merges[rank];
    // The separator is the first space after the first character, so that a
    // left side starting with a space would still parse (as llama.cpp reads it).
    const size_t sep = m.find(' ', 1);
    if (sep == std::string::npos) {
      throw Error("tokenizer merge " + std::to_string(rank) + " \"" + m +
                  "\" is not of the form \"<left> <right>\"; the tokenizer.ggml.merges array "
                  "of this file is malformed");
    }
    const std::string_view left = std::string_view(m).substr(0, sep);
    const std::string_view right = std::string_view(m).substr(sep + 1);
    const int32_t l = index.find(left);
    const int32_t r = index.find(right);
    if (l < 0 || r < 0) {
      throw Error("tokenizer merge " + std::to_string(rank) + " \"" + m + "\" uses \"" +
                  std::string(l < 0 ? left : right) +
                  "\", which is not in tokenizer.ggml.tokens; the vocabulary and merges of "
                  "this file do not belong together");
    }
    const int32_t result = index.find(std::string(left) + std::string(right));
    // A repeated pair keeps its first (best) rank.
    merges_.try_emplace(key(l, r), Merge{static_cast<int32_t>(rank), result});
  }
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  // Symbols are byte ranges of `word`, linked into a list; a merge grows the
  // left symbol over the right one and empties the right one.
  struct Symbol {
    uint32_t start, len;
    int32_t id;  // -1 if the text is not a token
    int32_t prev, next;
  };
  std::vector<Symbol> syms;
  for (size_t pos = 0; pos < word.size();) {
    const size_t len =
        std::min(utf8_len_from_lead(static_cast<uint8_t>(word[pos])), word.size() - pos);
    const auto i = static_cast<int32_t>(syms.size());
    syms.push_back({static_cast<uint32_t>(pos), static_cast<uint32_t>(len),
                    index_.find(word.substr(pos, len)), i - 1, -1});
    if (i > 0) syms[i - 1].next = i;
    pos += len;
  }

  // Candidate merges, best first: lowest rank, then leftmost. An entry is
  // stale once either symbol has changed; since symbols only ever grow, the
  // unchanged total length identifies a live pair.
  struct Candidate {
    int32_t rank;
    int32_t left;
    uint32_t len;
    bool operator<(const Candidate& o) const {  // "less urgent than", for the max-heap
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  std::priority_queue<Candidate> queue;
  auto consider = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = syms[left].next;
    if (right < 0 || syms[left].id < 0 || syms[right].id < 0) return;
    auto it = merges_.find(key(syms[left].id, syms[right].id));
    if (it == merges_.end()) return;
    queue.push({it->second.rank, left, syms[left].len + syms[right].len});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) consider(i);

  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& left = syms[c.left];
    if (left.len == 0 || left.next < 0) continue;
    Symbol& right = syms[left.next];
    if (left.len + right.len != c.len) continue;
    left.id = merges_.at(key(left.id, right.id)).result;
    left.len += right.len;
    right.len = 0;
    left.next = right.next;
    if (left.next >= 0) syms[left.next].prev = c.left;
    consider(left.prev);
    consider(c.left);
  }

  for (const Symbol& s : syms) {
    if (s.len == 0) continue;
    if (s.id >= 0) {
      out.push_back(s.id);
      continue;
    }
    // Not a token (a byte missing from the vocabulary, or a merge whose result
    // is not a token): fall back to single-byte tokens where they exist.
    for (uint32_t k = 0; k < s.len; ++k) {
      const int32_t id = index_.find(word.substr(s.start + k, 1));
      if (id >= 0) out.push_back(id);
    }
  }
}

}  // namespace tandem::tok
