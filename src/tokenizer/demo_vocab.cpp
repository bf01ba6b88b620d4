#include "tokenizer/demo_vocab.h"

#include <deque>
#include <map>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "tokenizer/pretokenize.h"
#include "tokenizer/unicode.h"
#include "util/error.h"

namespace tandem {

namespace {

constexpr const char* kSpecialTexts[3] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};

// The vocabulary being built: token texts with a reverse index, and merges.
class Builder {
 public:
  Builder() {
    for (int b = 0; b < 256; ++b) add_token(tok::byte_to_unicode(static_cast<uint8_t>(b)));
  }

  int32_t size() const { return static_cast<int32_t>(tokens_.size()); }
  const std::string& text(int32_t id) const { return tokens_[id]; }
  bool has(const std::string& text) const { return ids_.count(text) != 0; }

  int32_t add_token(const std::string& text) {
    const int32_t id = size();
    tokens_.push_back(text);
    ids_.emplace(text, id);
    return id;
  }
  // Adds the token left+right and its merge; the text must be new.
  int32_t add_merge(int32_t left, int32_t right) {
    merges_.push_back(tokens_[left] + " " + tokens_[right]);
    return add_token(tokens_[left] + tokens_[right]);
  }

  std::vector<std::string>& tokens() { return tokens_; }
  std::vector<std::string>& merges() { return merges_; }

 private:
  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int32_t> ids_;
  std::vector<std::string> merges_;
};

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(left) << 32) | static_cast<uint32_t>(right);
}

// Classic BPE training: repeatedly merge the most frequent adjacent pair of
// the corpus words (ties: smallest ids), keeping pair counts up to date
// incrementally. A pair whose concatenation is already a token is skipped so
// that every merge adds a new token.
void learn_merges(Builder& vb, const tok::PreTokenizer& pre, int32_t target) {
  // Distinct words with their counts, in a fixed order.
  std::map<std::string, int64_t> counts;
  const std::vector<uint32_t> cps = tok::decode_utf8_lenient(demo_corpus());
  size_t begin = 0;
  std::string utf8;
  for (size_t end : tok::pretokenize(pre, cps)) {
    utf8.clear();
    for (size_t i = begin; i < end; ++i) tok::append_utf8(utf8, cps[i]);
    ++counts[utf8];
    begin = end;
  }
  struct Word {
    std::vector<int32_t> syms;
    int64_t count;
  };
  std::vector<Word> words;
  for (const auto& [w, count] : counts) {
    Word word{{}, count};
    for (char c : w) word.syms.push_back(static_cast<uint8_t>(c));  // byte id = byte value
    words.push_back(std::move(word));
  }

  std::unordered_map<uint64_t, int64_t> pair_count;
  std::unordered_map<uint64_t, std::vector<int32_t>> pair_words;  // may hold repeats
  auto count_word = [&](int32_t w, int64_t sign) {
    const Word& word = words[w];
    for (size_t i = 0; i + 1 < word.syms.size(); ++i) {
      const uint64_t key = pair_key(word.syms[i], word.syms[i + 1]);
      pair_count[key] += sign * word.count;
      if (sign > 0) pair_words[key].push_back(w);
    }
  };
  for (int32_t w = 0; w < static_cast<int32_t>(words.size()); ++w) count_word(w, +1);

  std::unordered_set<uint64_t> banned;  // concatenation already a token
  std::vector<int32_t> stamp(words.size(), -1);
  while (vb.size() < target) {
    uint64_t best = 0;
    int64_t best_count = 1;  // a pair must occur at least twice
    for (const auto& [key, count] : pair_count) {
      if (count > best_count || (count == best_count && count > 1 && key < best)) {
        if (banned.count(key)) continue;
        best = key;
        best_count = count;
      }
    }
    if (best_count < 2) return;
    const auto left = static_cast<int32_t>(best >> 32);
    const auto right = static_cast<int32_t>(best & 0xFFFFFFFF);
    if (vb.has(vb.text(left) + vb.text(right))) {
      banned.insert(best);
      continue;
    }
    const int32_t merged = vb.add_merge(left, right);

    const std::vector<int32_t> affected = std::move(pair_words[best]);
    pair_words.erase(best);
    for (int32_t w : affected) {
      if (stamp[w] == merged) continue;  // listed more than once
      stamp[w] = merged;
      count_word(w, -1);
      std::vector<int32_t>& syms = words[w].syms;
      std::vector<int32_t> out;
      out.reserve(syms.size());
      for (size_t i = 0; i < syms.size(); ++i) {
        if (i + 1 < syms.size() && syms[i] == left && syms[i + 1] == right) {
          out.push_back(merged);
          ++i;
        } else {
          out.push_back(syms[i]);
        }
      }
      syms.swap(out);
      count_word(w, +1);
    }
    // Drop pairs that no longer occur so the scan above stays short.
    for (auto it = pair_count.begin(); it != pair_count.end();) {
      it = it->second == 0 ? pair_count.erase(it) : std::next(it);
    }
  }
}

// "Ġ?[a-z]*" in byte-level form (U+0120 is the space byte's stand-in); such a
// token stays inside one word for every supported pre-tokenizer.
bool is_word_shape(const std::string& text) {
  size_t i = text.rfind("\xC4\xA0", 0) == 0 ? 2 : 0;
  for (; i < text.size(); ++i) {
    if (text[i] < 'a' || text[i] > 'z') return false;
  }
  return true;
}

// Extends word-shaped tokens by one letter, breadth first from the lowest
// ids, until the vocabulary has `target` tokens. Each step is a hash lookup,
// so large vocabularies build in linear time.
void add_synthetic_merges(Builder& vb, int32_t target) {
  static constexpr char kLetters[] = "etaoinshrdlucmfwypvbgkjqxz";
  std::deque<int32_t> queue;
  for (int32_t id = 0; id < vb.size(); ++id) {
    if (!vb.text(id).empty() && is_word_shape(vb.text(id))) queue.push_back(id);
  }
  while (vb.size() < target && !queue.empty()) {
    const int32_t base = queue.front();
    queue.pop_front();
    for (const char* c = kLetters; *c != '\0' && vb.size() < target; ++c) {
      const int32_t letter = static_cast<uint8_t>(*c);
      if (vb.has(vb.text(base) + *c)) continue;
      queue.push_back(vb.add_merge(base, letter));
    }
  }
  TANDEM_ASSERT(vb.size() == target, "the synthetic merges ran out");
}

}  // namespace

VocabData make_demo_vocab(int32_t n_vocab, const std::string& pre) {
  const tok::PreTokenizer* p = tok::find_pre_tokenizer(pre);
  if (p == nullptr) {
    throw Error("make_demo_vocab: unsupported pre-tokenizer \"" + pre +
                "\"; supported: " + tok::supported_pre_tokenizers());
  }
  if (n_vocab < kMinDemoVocab) {
    throw Error("make_demo_vocab: n_vocab " + std::to_string(n_vocab) + " is too small; it " +
                "must be at least " + std::to_string(kMinDemoVocab) +
                " (256 byte tokens, a few merges and 3 special tokens)");
  }
  const int32_t n_normal = n_vocab - 3;
  Builder vb;
  learn_merges(vb, *p, n_normal);
  add_synthetic_merges(vb, n_normal);
  for (const char* s : kSpecialTexts) {
    TANDEM_ASSERT(!vb.has(s), "special token text learned as a merge");
    vb.add_token(s);
  }

  VocabData v;
  v.model = "gpt2";
  v.pre = pre;
  v.tokens = std::move(vb.tokens());
  v.merges = std::move(vb.merges());
  v.token_types.assign(v.tokens.size(), TokenType::NORMAL);
  for (int32_t id = n_vocab - 3; id < n_vocab; ++id) v.token_types[id] = TokenType::CONTROL;
  v.bos_id = n_vocab - 3;
  v.eos_id = n_vocab - 3;
  v.eot_id = n_vocab - 1;
  v.add_bos = false;
  v.add_eos = false;
  v.add_space_prefix = false;
  return v;
}

std::string demo_chat_template() {
  // Jinja; '\\n' below is the two characters \ and n, which Jinja reads as a newline.
  return "{% for message in messages %}"
         "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
         "{% endfor %}"
         "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
}

}  // namespace tandem
