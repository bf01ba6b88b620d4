#include "tokenizer/pretokenize.h"

#include <array>

#include "tokenizer/unicode.h"

namespace tandem::tok {

namespace {

constexpr std::array kDefaultPasses = {SplitPass::kPunctRuns, SplitPass::kGpt2,
                                       SplitPass::kNumberRuns, SplitPass::kAsciiDigitTriples};
constexpr std::array kGpt2Passes = {SplitPass::kGpt2};
constexpr std::array kLlama3Passes = {SplitPass::kLlama3};
constexpr std::array kQwen2Passes = {SplitPass::kQwen2};
constexpr std::array kStarcoderPasses = {SplitPass::kSingleNumbers, SplitPass::kGpt2};

// The tokenizer.ggml.pre values llama.cpp maps to one of the pass lists above
// with no other special handling, with its settings for each. Names llama.cpp
// gives extra behaviour we do not implement (add_sep, token attributes, other
// regexes) are left out so that they fail loudly instead of tokenizing wrongly.
constexpr PreTokenizer kPreTokenizers[] = {
    {"default", kDefaultPasses, false, false, true},
    {"gpt-2", kGpt2Passes, false, false, true},
    {"llama-bpe", kLlama3Passes, true, true, true},
    {"llama3", kLlama3Passes, true, true, true},
    {"qwen2", kQwen2Passes, false, false, false},
    {"smollm", kStarcoderPasses, false, false, false},
    // Aliases and relatives, in llama.cpp's grouping.
    {"llama-v3", kLlama3Passes, true, true, true},
    {"falcon3", kLlama3Passes, true, true, true},
    {"falcon-h1", kLlama3Passes, true, true, true},
    {"pixtral", kLlama3Passes, true, true, true},
    {"midm-2.0", kLlama3Passes, true, true, true},
    {"lfm2", kLlama3Passes, true, true, true},
    {"jina-v5-nano", kLlama3Passes, true, true, true},
    {"dbrx", kLlama3Passes, false, false, true},
    {"smaug-bpe", kLlama3Passes, false, false, true},
    {"phi-2", kGpt2Passes, false, false, true},
    {"jina-es", kGpt2Passes, false, false, true},
    {"jina-de", kGpt2Passes, false, false, true},
    {"gigachat", kGpt2Passes, false, false, true},
    {"a.x-4.0", kGpt2Passes, false, false, true},
    {"mellum", kGpt2Passes, false, false, true},
    {"mpt", kGpt2Passes, false, false, true},
    {"olmo", kGpt2Passes, false, false, true},
    {"jais", kGpt2Passes, false, false, true},
    {"exaone4", kGpt2Passes, false, false, true},
    {"trillion", kGpt2Passes, false, false, false},
    {"granite-docling", kGpt2Passes, false, false, false},
    {"deepseek-r1-qwen", kQwen2Passes, false, false, false},
    {"kormo", kQwen2Passes, false, false, false},
    {"f2llmv2", kQwen2Passes, false, false, false},
    {"hunyuan", kQwen2Passes, false, false, false},
    {"solar-open", kQwen2Passes, false, false, false},
    {"grok-2", kQwen2Passes, false, false, false},
    {"stablelm2", kQwen2Passes, false, false, true},
    {"megrez", kQwen2Passes, false, false, true},
    {"starcoder", kStarcoderPasses, false, false, true},
    {"refact", kStarcoderPasses, false, false, true},
    {"codeshell", kStarcoderPasses, false, false, true},
    {"exaone", kStarcoderPasses, false, false, true},
    {"minerva-7b", kStarcoderPasses, false, false, true},
    {"mellum2", kStarcoderPasses, false, false, true},
    {"command-r", kStarcoderPasses, false, false, false},
};

constexpr uint32_t kPastEnd = 0xFFFFFFFF;
constexpr int kNoClass = -1;

// One word of the previous pass, being split further. Reads past its end give
// kPastEnd / kNoClass, which is how the lookaheads of the regexes see the end.
class Fragment {
 public:
  Fragment(const std::vector<uint32_t>& cps, const std::vector<CharClass>& cls, size_t begin,
           size_t end, std::vector<size_t>& ends)
      : cps_(cps), cls_(cls), begin_(begin), end_(end), last_(begin), ends_(ends) {}

  size_t begin() const { return begin_; }
  size_t end() const { return end_; }
  uint32_t cp(size_t i) const { return i < end_ ? cps_[i] : kPastEnd; }
  int cls(size_t i) const { return i < end_ ? cls_[i] : kNoClass; }
  // Closes the current word at `end` (nothing if that would be empty).
  void emit(size_t end) {
    if (end > last_) {
      ends_.push_back(end);
      last_ = end;
    }
  }

 private:
  const std::vector<uint32_t>& cps_;
  const std::vector<CharClass>& cls_;
  size_t begin_, end_, last_;
  std::vector<size_t>& ends_;
};

uint32_t ascii_lower(uint32_t cp) { return cp >= 'A' && cp <= 'Z' ? cp + 32 : cp; }

// Length of the contraction ('s 't 're 've 'm 'll 'd) at pos, or 0.
size_t contraction_len(const Fragment& f, size_t pos, bool ignore_case) {
  if (f.cp(pos) != '\'' || pos + 1 >= f.end()) return 0;
  // No code point outside ASCII lower-cases to one of these letters, so
  // ASCII case folding is the whole of (?i:...) here.
  auto fold = [&](uint32_t cp) { return ignore_case ? ascii_lower(cp) : cp; };
  const uint32_t a = fold(f.cp(pos + 1));
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (pos + 2 >= f.end()) return 0;
  const uint32_t b = fold(f.cp(pos + 2));
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// [^\s\p{L}\p{N}] inside the fragment.
bool is_symbol_like(int cls) { return cls == kOther || cls == kPunct; }

// Shared tail of the GPT-2 and Llama-3 patterns, starting at a whitespace run.
// `newline_rule` adds Llama-3's \s*[\r\n]+ alternative. Returns the new position.
size_t match_whitespace(Fragment& f, size_t pos, bool newline_rule) {
  size_t n = 0;
  size_t after_last_newline = 0;
  while (f.cls(pos + n) == kSpace) {
    const uint32_t cp = f.cp(pos + n);
    if (cp == '\r' || cp == '\n') after_last_newline = pos + n + 1;
    ++n;
  }
  if (newline_rule && after_last_newline > 0) return after_last_newline;  // \s*[\r\n]+
  // \s+(?!\S): leave the last space to prefix the next word, unless the run
  // reaches the end of the fragment.
  if (n > 1 && pos + n < f.end()) return pos + n - 1;
  if (n > 0) return pos + n;  // \s+
  return pos + 1;             // no alternative matches: the character stands alone
}

void split_gpt2(Fragment& f) {
  size_t pos = f.begin();
  while (pos < f.end()) {
    if (size_t n = contraction_len(f, pos, /*ignore_case=*/false)) {
      pos += n;
    } else {
      const size_t start = f.cp(pos) == ' ' ? pos + 1 : pos;  // the optional leading space
      const int cls = f.cls(start);
      if (cls == kLetter || cls == kNumber) {
        pos = start;
        while (f.cls(pos) == cls) ++pos;
      } else if (is_symbol_like(cls)) {
        pos = start;
        while (is_symbol_like(f.cls(pos))) ++pos;
      } else {
        pos = match_whitespace(f, pos, /*newline_rule=*/false);
      }
    }
    f.emit(pos);
  }
}

void split_llama3(Fragment& f, size_t max_digits) {
  size_t pos = f.begin();
  while (pos < f.end()) {
    const uint32_t cp = f.cp(pos);
    const int cls = f.cls(pos);
    if (size_t n = contraction_len(f, pos, /*ignore_case=*/true)) {
      pos += n;
    } else if (cp != '\r' && cp != '\n' && cls != kNumber &&
               (cls == kLetter || f.cls(pos + 1) == kLetter)) {
      // [^\r\n\p{L}\p{N}]?\p{L}+ : one optional non-letter, then the letters.
      ++pos;
      while (f.cls(pos) == kLetter) ++pos;
    } else if (cls == kNumber) {
      const size_t start = pos;
      while (f.cls(pos) == kNumber && pos - start < max_digits) ++pos;
    } else {
      const size_t start = cp == ' ' ? pos + 1 : pos;
      const int next = f.cls(start);
      // " ?[^\s\p{L}\p{N}]+[\r\n]*". A lone space at the end of the fragment
      // also lands here and becomes its own word, as with \s+.
      if (next != kSpace && next != kLetter && next != kNumber) {
        pos = start;
        while (is_symbol_like(f.cls(pos))) ++pos;
        while (f.cp(pos) == '\r' || f.cp(pos) == '\n') ++pos;
      } else {
        pos = match_whitespace(f, pos, /*newline_rule=*/true);
      }
    }
    f.emit(pos);
  }
}

// Regex-style isolation: each match is a word, and so is each stretch of text
// between matches. `match_len(pos)` is the length of the match at pos, or 0.
template <typename MatchLen>
void isolate(Fragment& f, MatchLen match_len) {
  size_t pos = f.begin();
  while (pos < f.end()) {
    const size_t n = match_len(pos);
    if (n == 0) {
      ++pos;
      continue;
    }
    f.emit(pos);
    pos += n;
    f.emit(pos);
  }
  f.emit(f.end());
}

bool is_ascii_digit(uint32_t cp) { return cp >= '0' && cp <= '9'; }

void run_pass(SplitPass pass, Fragment& f) {
  switch (pass) {
    case SplitPass::kGpt2:
      split_gpt2(f);
      return;
    case SplitPass::kLlama3:
      split_llama3(f, 3);
      return;
    case SplitPass::kQwen2:
      split_llama3(f, 1);
      return;
    case SplitPass::kPunctRuns:
      isolate(f, [&](size_t pos) {
        auto in_class = [&](size_t i) {
          const uint32_t cp = f.cp(i);
          return f.cls(i) == kPunct || cp == '$' || cp == '+' || cp == '<' || cp == '=' ||
                 cp == '>' || cp == '^' || cp == '~' || cp == '|';
        };
        size_t i = pos;
        while (in_class(i)) ++i;
        return i - pos;
      });
      return;
    case SplitPass::kNumberRuns:
      isolate(f, [&](size_t pos) {
        size_t i = pos;
        while (f.cls(i) == kNumber) ++i;
        return i - pos;
      });
      return;
    case SplitPass::kAsciiDigitTriples:
      isolate(f, [&](size_t pos) -> size_t {
        const bool triple = is_ascii_digit(f.cp(pos)) && is_ascii_digit(f.cp(pos + 1)) &&
                            is_ascii_digit(f.cp(pos + 2));
        return triple ? 3 : 0;
      });
      return;
    case SplitPass::kSingleNumbers:
      isolate(f, [&](size_t pos) -> size_t { return f.cls(pos) == kNumber ? 1 : 0; });
      return;
  }
}

}  // namespace

const PreTokenizer* find_pre_tokenizer(std::string_view name) {
  if (name.empty()) name = "default";
  for (const PreTokenizer& p : kPreTokenizers) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

std::string supported_pre_tokenizers() {
  std::string out;
  for (const PreTokenizer& p : kPreTokenizers) {
    if (!out.empty()) out += ", ";
    out += p.name;
  }
  return out;
}

std::vector<size_t> pretokenize(const PreTokenizer& pre, const std::vector<uint32_t>& cps) {
  std::vector<CharClass> cls(cps.size());
  for (size_t i = 0; i < cps.size(); ++i) cls[i] = char_class(cps[i]);

  std::vector<size_t> ends;
  if (!cps.empty()) ends.push_back(cps.size());
  std::vector<size_t> next;
  for (SplitPass pass : pre.passes) {
    next.clear();
    size_t begin = 0;
    for (size_t end : ends) {
      Fragment f(cps, cls, begin, end, next);
      run_pass(pass, f);
      begin = end;
    }
    ends.swap(next);
  }
  return ends;
}

}  // namespace tandem::tok
