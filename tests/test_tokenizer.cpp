// Tokenizers: hand-derived token ids on tiny vocabularies, pre-tokenizer
// splits derived by hand from each regex, special tokens, BOS/EOS, decoding
// and its llama.cpp quirks, streaming detokenization, GGUF metadata defaults
// and errors, and the demo vocabulary. Round trips run over every supported
// pre-tokenizer and a SentencePiece vocabulary with byte fallback.

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_set>
#include <vector>

#include "gguf/gguf.h"
#include "tokenizer/demo_vocab.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"
#include "util/error.h"

namespace tandem {
namespace {

using Ids = std::vector<int32_t>;
using Words = std::vector<std::string>;

// ---------------------------------------------------------------------------
// Helpers

// Independent of the code under test: well-formed UTF-8 per RFC 3629.
bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<uint8_t>(s[i]);
    size_t n = 0;
    uint32_t cp = 0;
    if (b < 0x80) {
      n = 1, cp = b;
    } else if ((b & 0xE0) == 0xC0) {
      n = 2, cp = b & 0x1F;
    } else if ((b & 0xF0) == 0xE0) {
      n = 3, cp = b & 0x0F;
    } else if ((b & 0xF8) == 0xF0) {
      n = 4, cp = b & 0x07;
    } else {
      return false;
    }
    if (i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      const auto c = static_cast<uint8_t>(s[i + k]);
      if ((c & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (c & 0x3F);
    }
    const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

std::string concat_pieces(const Tokenizer& tk, const Ids& ids, bool render_special = false) {
  std::string out;
  for (int32_t id : ids) out += tk.token_to_piece(id, render_special);
  return out;
}

// Raw bytes in GPT-2's byte-level spelling ("Ġ" for a space, ...).
std::string byte_level(std::string_view raw) {
  std::string out;
  for (char c : raw) out += tok::byte_to_unicode(static_cast<uint8_t>(c));
  return out;
}
std::string byte_level(int byte) { return byte_level(std::string(1, static_cast<char>(byte))); }

// A byte-level BPE vocabulary: ids 0..255 are the bytes (id = byte value),
// then one token per merge, id 256 + rank. Merges are given in raw bytes.
VocabData tiny_bpe(const std::vector<std::pair<std::string, std::string>>& merges,
                   const std::string& pre = "gpt-2") {
  VocabData v;
  v.model = "gpt2";
  v.pre = pre;
  v.add_space_prefix = false;
  for (int b = 0; b < 256; ++b) v.tokens.push_back(byte_level(b));
  for (const auto& [l, r] : merges) {
    v.merges.push_back(byte_level(l) + " " + byte_level(r));
    v.tokens.push_back(byte_level(l + r));
  }
  return v;
}

// SentencePiece vocabulary with byte fallback: <unk> <s> </s>, the 256
// <0xXX> byte tokens (id 3 + byte), then scored pieces.
constexpr int32_t kUnk = 0, kBos = 1, kEos = 2;
int32_t byte_id(uint8_t b) { return 3 + b; }
enum : int32_t {
  kSpace = 259, kH, kE, kL, kO, kW, kR, kD,          // single characters
  kSpH, kHe, kLl, kSpHe, kLlo, kSpHello,             // "▁hello"
  kSpW, kOr, kSpWor, kLd, kSpWorld,                  // "▁world"
  kAb, kBc, kA, kB, kC,                              // ties
  kTool,                                             // user-defined
  kSpmSize
};
VocabData tiny_spm() {
  VocabData v;
  v.model = "llama";
  v.tokens = {"<unk>", "<s>", "</s>"};
  v.token_types = {TokenType::UNKNOWN, TokenType::CONTROL, TokenType::CONTROL};
  v.scores = {0, 0, 0};
  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "<0x%02X>", b);
    v.tokens.push_back(hex);
    v.token_types.push_back(TokenType::BYTE);
    v.scores.push_back(0);
  }
  const std::pair<const char*, float> pieces[] = {
      {"\xE2\x96\x81", -10}, {"h", -10}, {"e", -10}, {"l", -10}, {"o", -10}, {"w", -10},
      {"r", -10}, {"d", -10},
      {"\xE2\x96\x81h", -6}, {"he", -5}, {"ll", -4}, {"\xE2\x96\x81he", -3}, {"llo", -2},
      {"\xE2\x96\x81hello", -1},
      {"\xE2\x96\x81w", -6}, {"or", -5}, {"\xE2\x96\x81wor", -4}, {"ld", -5},
      {"\xE2\x96\x81world", -1},
      {"ab", -1}, {"bc", -1}, {"a", -10}, {"b", -10}, {"c", -10},
  };
  for (const auto& [text, score] : pieces) {
    v.tokens.push_back(text);
    v.token_types.push_back(TokenType::NORMAL);
    v.scores.push_back(score);
  }
  v.tokens.push_back("<tool>");
  v.token_types.push_back(TokenType::USER_DEFINED);
  v.scores.push_back(0);
  v.bos_id = kBos;
  v.eos_id = kEos;
  v.unk_id = kUnk;
  v.add_bos = true;
  v.add_space_prefix = true;
  return v;
}

// Words of `text` as the named pre-tokenizer cuts them.
std::vector<std::string> split(const std::string& pre, std::string_view text) {
  const tok::PreTokenizer* p = tok::find_pre_tokenizer(pre);
  EXPECT_NE(p, nullptr) << pre;
  if (p == nullptr) return {};
  const std::vector<uint32_t> cps = tok::decode_utf8_lenient(text);
  std::vector<std::string> words;
  size_t begin = 0;
  for (size_t end : tok::pretokenize(*p, cps)) {
    std::string w;
    for (size_t i = begin; i < end; ++i) tok::append_utf8(w, cps[i]);
    words.push_back(w);
    begin = end;
  }
  return words;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

const Tokenizer& demo_tokenizer(const std::string& pre) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto& slot = cache[pre];
  if (!slot) slot = std::make_unique<Tokenizer>(make_demo_vocab(4096, pre));
  return *slot;
}

const std::vector<std::string> kPreTokenizers = {"gpt-2", "llama-bpe", "qwen2", "default",
                                                 "smollm"};

// Valid UTF-8 inputs that every tokenizer must reproduce byte for byte.
const std::vector<std::string> kRoundTrip = {
    "",
    "Hello, world! This is a plain ASCII sentence.",
    // café naïve résumé Ångström Ωμέγα
    "caf\xC3\xA9 na\xC3\xAFve r\xC3\xA9sum\xC3\xA9 \xC3\x85ngstr\xC3\xB6m "
    "\xCE\xA9\xCE\xBC\xCE\xAD\xCE\xB3\xCE\xB1",
    // 你好，世界 こんにちは
    "\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C "
    "\xE3\x81\x93\xE3\x82\x93\xE3\x81\xAB\xE3\x81\xA1\xE3\x81\xAF",
    // emoji, a skin tone modifier, and a ZWJ family sequence
    "\xF0\x9F\x99\x82 \xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD "
    "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7",
    "spaces   and\ttabs\t\tand\nnewlines\n\n\nand\r\nCRLF\r\n",
    "   leading and trailing   ",
    "0 12 345 6789 3.14159 1,000,000 -42 +7 \xD9\xA1\xD9\xA2\xD9\xA3",
    "!@#$%^&*()_+-=[]{}|;:\",<.>/?`~\\",
    "def f(x):\n    return x * 2  # twice\n",
    "\xE2\x96\x81 looks like a SentencePiece space, \xC4\xA0 like a GPT-2 one",
};

// ---------------------------------------------------------------------------
// Unicode helpers

TEST(TokenizerUnicode, ByteLevelMappingIsGpt2s) {
  EXPECT_EQ(tok::byte_to_unicode('a'), "a");
  EXPECT_EQ(tok::byte_to_unicode('!'), "!");
  EXPECT_EQ(tok::byte_to_unicode(' '), "\xC4\xA0");   // U+0120 "Ġ"
  EXPECT_EQ(tok::byte_to_unicode('\n'), "\xC4\x8A");  // U+010A "Ċ"
  EXPECT_EQ(tok::byte_to_unicode(0x00), "\xC4\x80");  // U+0100
  EXPECT_EQ(tok::byte_to_unicode(0xAD), "\xC5\x83");  // soft hyphen: the last remapped byte, U+0143
  EXPECT_EQ(tok::byte_to_unicode(0xE9), "\xC3\xA9");  // printable Latin-1 maps to itself
  std::set<std::string> seen;
  for (int b = 0; b < 256; ++b) {
    const std::string& s = tok::byte_to_unicode(static_cast<uint8_t>(b));
    const std::vector<uint32_t> cps = tok::decode_utf8_lenient(s);
    ASSERT_EQ(cps.size(), 1u);
    EXPECT_EQ(tok::unicode_to_byte(cps[0]), b);
    seen.insert(s);
  }
  EXPECT_EQ(seen.size(), 256u);
  EXPECT_EQ(tok::unicode_to_byte(0x20), -1);  // a raw space is not in the mapping
  EXPECT_EQ(tok::unicode_to_byte(0x4E2D), -1);
}

TEST(TokenizerUnicode, CharacterClasses) {
  EXPECT_EQ(tok::char_class('a'), tok::kLetter);
  EXPECT_EQ(tok::char_class(0xE9), tok::kLetter);    // é
  EXPECT_EQ(tok::char_class(0x4E2D), tok::kLetter);  // 中
  EXPECT_EQ(tok::char_class('7'), tok::kNumber);
  EXPECT_EQ(tok::char_class(0x0661), tok::kNumber);  // Arabic-Indic one
  EXPECT_EQ(tok::char_class(0x00BD), tok::kNumber);  // ½ (No)
  EXPECT_EQ(tok::char_class('!'), tok::kPunct);
  EXPECT_EQ(tok::char_class('\''), tok::kPunct);
  EXPECT_EQ(tok::char_class(0x3002), tok::kPunct);  // 。
  EXPECT_EQ(tok::char_class('$'), tok::kOther);     // Sc, a symbol
  EXPECT_EQ(tok::char_class('+'), tok::kOther);     // Sm
  EXPECT_EQ(tok::char_class(0x1F642), tok::kOther);  // emoji (So)
  EXPECT_EQ(tok::char_class(0x0378), tok::kOther);   // unassigned
  for (uint32_t ws : {0x09u, 0x0Au, 0x0Bu, 0x0Cu, 0x0Du, 0x20u, 0x85u, 0xA0u, 0x1680u, 0x2000u,
                      0x200Au, 0x2028u, 0x2029u, 0x202Fu, 0x205Fu, 0x3000u}) {
    EXPECT_EQ(tok::char_class(ws), tok::kSpace) << std::hex << ws;
  }
  // Python's isspace() says yes to these; the White_Space property (and llama.cpp) says no.
  for (uint32_t cp : {0x1Cu, 0x1Du, 0x1Eu, 0x1Fu}) EXPECT_EQ(tok::char_class(cp), tok::kOther);
  EXPECT_EQ(tok::char_class(0x200B), tok::kOther);  // zero width space is Cf, not White_Space
  EXPECT_EQ(tok::char_class(0x110000), tok::kOther);
}

TEST(TokenizerUnicode, LenientDecoderReadsBadBytesAsLlamaCppDoes) {
  using V = std::vector<uint32_t>;
  EXPECT_EQ(tok::decode_utf8_lenient("a\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x99\x82"),
            (V{'a', 0xE9, 0x4E2D, 0x1F642}));
  EXPECT_EQ(tok::decode_utf8_lenient("\x80"), (V{0xFFFD}));
  EXPECT_EQ(tok::decode_utf8_lenient("\xE2\x82"), (V{0xFFFD, 0xFFFD}));  // truncated
  EXPECT_EQ(tok::decode_utf8_lenient("\xC3("), (V{0xFFFD, '('}));
  EXPECT_EQ(tok::decode_utf8_lenient("\xFF"), (V{0xFFFD}));
  // Overlong forms and surrogates pass, as in llama.cpp's decoder.
  EXPECT_EQ(tok::decode_utf8_lenient("\xC0\x80"), (V{0}));
  EXPECT_EQ(tok::decode_utf8_lenient("\xED\xA0\x80"), (V{0xD800}));
  // Above U+10FFFF: llama.cpp would fail later; we read four bad bytes.
  EXPECT_EQ(tok::decode_utf8_lenient("\xF5\x80\x80\x80"), (V{0xFFFD, 0xFFFD, 0xFFFD, 0xFFFD}));
}

TEST(TokenizerUnicode, StrictCharacterLength) {
  EXPECT_EQ(tok::utf8_valid_char_len("a"), 1);
  EXPECT_EQ(tok::utf8_valid_char_len("\xC3\xA9x"), 2);
  EXPECT_EQ(tok::utf8_valid_char_len("\xF0\x9F\x99\x82"), 4);
  EXPECT_EQ(tok::utf8_valid_char_len("\xF0\x9F\x99"), 0);  // incomplete, may still complete
  EXPECT_EQ(tok::utf8_valid_char_len("\xE2"), 0);
  EXPECT_EQ(tok::utf8_valid_char_len("\x80"), -1);
  EXPECT_EQ(tok::utf8_valid_char_len("\xC0\x80"), -1);      // overlong
  EXPECT_EQ(tok::utf8_valid_char_len("\xED\xA0\x80"), -1);  // surrogate
  EXPECT_EQ(tok::utf8_valid_char_len("\xE2\x82("), -2);     // maximal subpart is 2 bytes
  EXPECT_EQ(tok::utf8_valid_char_len("\xF4\x90\x80\x80"), -1);  // above U+10FFFF
}

// ---------------------------------------------------------------------------
// Pre-tokenizers: splits derived by hand from each regex.

const char* const kTricky = "Hello world's  123456 !!\n\n  x";

TEST(TokenizerPretokenize, Gpt2Pattern) {
  // 's | ?\p{L}+ | ?\p{N}+ | ?[^\s\p{L}\p{N}]+ | \s+(?!\S) | \s+: of two
  // spaces before a word only the first stands alone; the second prefixes it.
  EXPECT_EQ(split("gpt-2", kTricky),
            (Words{"Hello", " world", "'s", " ", " 123456", " !!", "\n\n ", " x"}));
  // Contractions are case-sensitive here.
  EXPECT_EQ(split("gpt-2", "I'M we'll"), (Words{"I", "'", "M", " we", "'ll"}));
  // \s+(?!\S) leaves the last whitespace character to the next word, even a newline.
  EXPECT_EQ(split("gpt-2", "a\r\n\r\nb"), (Words{"a", "\r\n\r", "\n", "b"}));
  EXPECT_EQ(split("gpt-2", "x   "), (Words{"x", "   "}));
  EXPECT_EQ(split("gpt-2", "caf\xC3\xA9 \xE4\xBD\xA0\xE5\xA5\xBD!?"),
            (Words{"caf\xC3\xA9", " \xE4\xBD\xA0\xE5\xA5\xBD", "!?"}));
  EXPECT_EQ(split("gpt-2", "\ttab"), (Words{"\t", "tab"}));
  EXPECT_EQ(split("gpt-2", ""), (Words{}));
}

TEST(TokenizerPretokenize, Llama3Pattern) {
  // [^\r\n\p{L}\p{N}]?\p{L}+ | \p{N}{1,3} | ?[^\s\p{L}\p{N}]+[\r\n]* | \s*[\r\n]+ | ...
  EXPECT_EQ(split("llama-bpe", kTricky),
            (Words{"Hello", " world", "'s", " ", " ", "123", "456", " !!\n\n", " ", " x"}));
  // Case-insensitive contractions.
  EXPECT_EQ(split("llama-bpe", "I'M we'LL"), (Words{"I", "'M", " we", "'LL"}));
  // \s*[\r\n]+ keeps a newline run together.
  EXPECT_EQ(split("llama-bpe", "a\r\n\r\nb"), (Words{"a", "\r\n\r\n", "b"}));
  EXPECT_EQ(split("llama-bpe", "a \n b"), (Words{"a", " \n", " b"}));
  // Any single non-letter, non-number may lead a letter run, but only one.
  EXPECT_EQ(split("llama-bpe", "\ttab $x"), (Words{"\ttab", " $", "x"}));
  EXPECT_EQ(split("llama-bpe", "a+b"), (Words{"a", "+b"}));
  EXPECT_EQ(split("llama-bpe", "1234567"), (Words{"123", "456", "7"}));
  EXPECT_EQ(split("llama3", "\xD9\xA1\xD9\xA2\xD9\xA3\xD9\xA4"),
            (Words{"\xD9\xA1\xD9\xA2\xD9\xA3", "\xD9\xA4"}));
}

TEST(TokenizerPretokenize, Qwen2Pattern) {
  // As Llama-3, but one digit per word.
  EXPECT_EQ(split("qwen2", kTricky),
            (Words{"Hello", " world", "'s", " ", " ", "1", "2", "3", "4", "5", "6", " !!\n\n", " ",
                   " x"}));
  EXPECT_EQ(split("qwen2", "v1.2"), (Words{"v", "1", ".", "2"}));
}

TEST(TokenizerPretokenize, LlamaCppDefaultPattern) {
  // llama.cpp's "default" runs four regexes in turn: [\p{P}$+<=>^~|]+ isolates
  // punctuation runs, then the GPT-2 pattern, then \p{N}+, then [0-9]{3}.
  EXPECT_EQ(split("default", kTricky),
            (Words{"Hello", " world", "'", "s", " ", " ", "123", "456", " ", "!!", "\n\n ",
                   " x"}));
  EXPECT_EQ(split("", "a+b=c"), (Words{"a", "+", "b", "=", "c"}));
  EXPECT_EQ(split("default", "12345"), (Words{"123", "45"}));
}

TEST(TokenizerPretokenize, StarcoderStylePattern) {
  // \p{N} first (each digit alone), then the GPT-2 pattern on what is left.
  EXPECT_EQ(split("smollm", kTricky),
            (Words{"Hello", " world", "'s", "  ", "1", "2", "3", "4", "5", "6", " !!", "\n\n ",
                   " x"}));
}

TEST(TokenizerPretokenize, WordsTileTheInputForEveryPreTokenizer) {
  const std::string text =
      std::string(kTricky) + " \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9 a'b\r\n";
  for (const std::string& pre : kPreTokenizers) {
    std::string joined;
    for (const std::string& w : split(pre, text)) {
      EXPECT_FALSE(w.empty()) << pre;
      joined += w;
    }
    EXPECT_EQ(joined, text) << pre;
  }
}

// ---------------------------------------------------------------------------
// Byte-level BPE on hand-built vocabularies

TEST(TokenizerBpe, MergesLowestRankFirst) {
  const Tokenizer tk(tiny_bpe({{"h", "e"},       // 256 "he"
                               {"l", "l"},       // 257 "ll"
                               {"he", "ll"},     // 258 "hell"
                               {"hell", "o"},    // 259 "hello"
                               {" ", "w"},       // 260 " w"
                               {"o", "r"},       // 261 "or"
                               {" w", "or"},     // 262 " wor"
                               {"l", "d"},       // 263 "ld"
                               {" wor", "ld"}}));  // 264 " world"
  EXPECT_EQ(tk.encode("hello world", false, false), (Ids{259, 264}));
  EXPECT_EQ(tk.encode("hellohello", false, false), (Ids{259, 259}));
  EXPECT_EQ(tk.encode("help", false, false), (Ids{256, 'l', 'p'}));
  EXPECT_EQ(tk.encode("lll", false, false), (Ids{257, 'l'}));  // ties: leftmost first
  EXPECT_EQ(tk.encode("Hello", false, false), (Ids{'H', 'e', 257, 'o'}));
  EXPECT_EQ(tk.encode("", true, true), (Ids{}));
  EXPECT_EQ(tk.decode(Ids{259, 264}), "hello world");
  EXPECT_EQ(tk.token_to_piece(260), " w");
  EXPECT_EQ(tk.token_text(260), "\xC4\xA0w");
}

TEST(TokenizerBpe, RankNotPositionDecides) {
  // "e l" is listed after "l l": in "ell" the right pair merges first, and
  // the result "e"+"ll" has no merge.
  const Tokenizer tk(tiny_bpe({{"l", "l"}, {"e", "l"}}));
  EXPECT_EQ(tk.encode("ell", false, false), (Ids{'e', 256}));
  EXPECT_EQ(tk.encode("elo", false, false), (Ids{257, 'o'}));
}

TEST(TokenizerBpe, MergesNeverCrossWords) {
  const Tokenizer tk(tiny_bpe({{"o", " "}, {" ", "w"}}));  // "oĠ" could only span two words
  EXPECT_EQ(tk.encode("o w", false, false), (Ids{'o', 257}));
}

TEST(TokenizerBpe, Llama3TakesWholeWordsThatAreTokens) {
  // llama-bpe ignores merges for a word that is itself a token; dbrx has the
  // same pattern without that rule.
  VocabData v = tiny_bpe({{" ", "w"}}, "llama-bpe");
  v.tokens.push_back(byte_level(" world"));  // 257, reachable by no merge
  const Tokenizer llama3(v);
  EXPECT_EQ(llama3.encode(" world", false, false), (Ids{257}));
  v.pre = "dbrx";
  const Tokenizer dbrx(v);
  EXPECT_EQ(dbrx.encode(" world", false, false), (Ids{256, 'o', 'r', 'l', 'd'}));
}

TEST(TokenizerBpe, InvalidUtf8BecomesReplacementCharacters) {
  // As in llama.cpp, each byte that starts no character is read as U+FFFD.
  const Tokenizer tk(tiny_bpe({}));
  const Ids ids = tk.encode("a\xFF" "b", false, false);
  EXPECT_EQ(ids, (Ids{'a', 0xEF, 0xBF, 0xBD, 'b'}));
  EXPECT_EQ(tk.decode(ids), "a\xEF\xBF\xBD" "b");
}

TEST(TokenizerBpe, CleansUpSpacesOnDecodeLikeLlamaCpp) {
  VocabData v = tiny_bpe({});
  const Tokenizer gpt2(v);
  const std::string text = "a , b . c 's d 've e 't f ' g";
  // " ," and " ." lose the space, " ' " loses both, " 's" and " 've" lose it, " 't" keeps it.
  EXPECT_EQ(gpt2.decode(gpt2.encode(text, false, false)), "a, b. c's d've e 't f'g");
  // The concatenated pieces are untouched.
  EXPECT_EQ(concat_pieces(gpt2, gpt2.encode(text, false, false)), text);
  v.pre = "qwen2";  // no clean-up for qwen2
  const Tokenizer qwen(v);
  EXPECT_EQ(qwen.decode(qwen.encode(text, false, false)), text);
}

// ---------------------------------------------------------------------------
// SentencePiece (llama) on a hand-built vocabulary

TEST(TokenizerSpm, MergesBestScoreFirst) {
  const Tokenizer tk(tiny_spm());
  // "▁hello": ll(-4), then llo(-2), he(-5), ▁he(-3), ▁hello(-1).
  EXPECT_EQ(tk.encode("hello", false, false), (Ids{kSpHello}));
  // or and ld tie at -5: the leftmost merges first; the result is the same word.
  EXPECT_EQ(tk.encode("hello world", false, false), (Ids{kSpHello, kSpWorld}));
  EXPECT_EQ(tk.encode("abc", false, false), (Ids{kSpace, kAb, kC}));  // ab and bc tie: leftmost
  EXPECT_EQ(tk.encode("hello", true, false), (Ids{kBos, kSpHello}));
  EXPECT_EQ(tk.encode("", true, false), (Ids{kBos}));
  EXPECT_EQ(tk.encode("", false, false), (Ids{}));
}

TEST(TokenizerSpm, ByteFallbackForUnknownCharacters) {
  const Tokenizer tk(tiny_spm());
  EXPECT_EQ(tk.encode("h\xC3\xA9", false, false), (Ids{kSpH, byte_id(0xC3), byte_id(0xA9)}));
  EXPECT_EQ(tk.decode(Ids{kSpH, byte_id(0xC3), byte_id(0xA9)}), "h\xC3\xA9");
  EXPECT_EQ(tk.token_to_piece(byte_id(0xC3)), "\xC3");
  // Bad bytes go through unchanged (the characters are cut by lead byte only).
  EXPECT_EQ(tk.encode("\xFF", false, false), (Ids{kSpace, byte_id(0xFF)}));
}

TEST(TokenizerSpm, UnknownTokenWhenThereAreNoByteTokens) {
  VocabData v;
  v.model = "llama";
  v.tokens = {"<unk>", "<s>", "</s>", "\xE2\x96\x81", "a"};
  v.token_types = {TokenType::UNKNOWN, TokenType::CONTROL, TokenType::CONTROL, TokenType::NORMAL,
                   TokenType::NORMAL};
  v.unk_id = 0;
  const Tokenizer tk(v);
  EXPECT_EQ(tk.encode("ab", false, false), (Ids{3, 4, 0}));
}

TEST(TokenizerSpm, SpacePrefixAndSpecialTokens) {
  const Tokenizer tk(tiny_spm());
  // A space is put before text at the start and after every special token.
  EXPECT_EQ(tk.encode("<s>hello", false, true), (Ids{kBos, kSpHello}));
  EXPECT_EQ(tk.encode("hello<s>hello", false, true), (Ids{kSpHello, kBos, kSpHello}));
  // Without parse_special, "<s>" is text: "▁<s>hello" with <, s, > as bytes.
  EXPECT_EQ(tk.encode("<s>hello", false, false),
            (Ids{kSpace, byte_id('<'), byte_id('s'), byte_id('>'), kHe, kLlo}));
  // User-defined tokens are matched either way.
  const Ids tool = {kSpace, kA, kTool, kSpace, kB};
  EXPECT_EQ(tk.encode("a<tool>b", false, false), tool);
  EXPECT_EQ(tk.encode("a<tool>b", false, true), tool);
  // <unk> is special text only with parse_special.
  EXPECT_EQ(tk.encode("<unk>", false, true), (Ids{kUnk}));
  EXPECT_NE(tk.encode("<unk>", false, false), (Ids{kUnk}));
  // Without a space prefix nothing is added.
  VocabData v = tiny_spm();
  v.add_space_prefix = false;
  EXPECT_EQ(Tokenizer(v).encode("hello", false, false), (Ids{kHe, kLlo}));
}

TEST(TokenizerSpm, Phi3DropsWhitespaceAfterSpecialTokens) {
  VocabData v = tiny_spm();
  EXPECT_EQ(Tokenizer(v).encode("</s> hello", false, true), (Ids{kEos, kSpace, kSpHello}));
  v.special_rstrip = true;
  const Tokenizer tk(v);
  EXPECT_EQ(tk.encode("</s> hello", false, true), (Ids{kEos, kSpHello}));
  EXPECT_EQ(tk.encode("</s>\n\t hello", false, true), (Ids{kEos, kSpHello}));
  EXPECT_EQ(tk.encode("<s> hello", false, true), (Ids{kBos, kSpace, kSpHello}));  // not after <s>
}

TEST(TokenizerSpm, DecodeDropsTheFirstLeadingSpace) {
  const Tokenizer tk(tiny_spm());
  EXPECT_EQ(tk.token_to_piece(kSpHello), " hello");
  EXPECT_EQ(tk.decode(Ids{kSpHello, kSpWorld}), "hello world");
  // As llama_detokenize: only the first piece is stripped, and with BOS first
  // that is the BOS piece, so the space stays.
  EXPECT_EQ(tk.decode(Ids{kBos, kSpHello}), " hello");
  EXPECT_EQ(tk.decode(Ids{kBos, kSpHello}, /*render_special=*/true), "<s> hello");
  EXPECT_EQ(tk.token_to_piece(kBos), "");
  EXPECT_EQ(tk.token_to_piece(kBos, true), "<s>");
  EXPECT_EQ(tk.token_to_piece(kUnk), "");
  EXPECT_EQ(tk.token_to_piece(kTool), "<tool>");  // user-defined: always its text
}

// ---------------------------------------------------------------------------
// Round trips

TEST(TokenizerRoundTrip, DemoVocabEveryPreTokenizer) {
  for (const std::string& pre : kPreTokenizers) {
    const Tokenizer& tk = demo_tokenizer(pre);
    for (const std::string& text : kRoundTrip) {
      for (bool parse_special : {false, true}) {
        const Ids ids = tk.encode(text, false, parse_special);
        EXPECT_EQ(concat_pieces(tk, ids), text) << pre << ": " << text;
        // No clean-up trigger (" ," " ." " '" ...) in these texts, no space prefix.
        EXPECT_EQ(tk.decode(ids), text) << pre << ": " << text;
        for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < tk.n_vocab());
      }
    }
  }
}

TEST(TokenizerRoundTrip, DemoVocabCompressesText) {
  // Learned merges must actually apply: ordinary English needs far fewer
  // tokens than bytes.
  const std::string text = "The kettle clicked off just as the rain started, so I poured the tea.";
  for (const std::string& pre : kPreTokenizers) {
    const Ids ids = demo_tokenizer(pre).encode(text, false, false);
    EXPECT_LT(ids.size(), text.size() / 2) << pre;
  }
}

TEST(TokenizerRoundTrip, SentencePieceWithByteFallback) {
  const Tokenizer tk(tiny_spm());
  for (const std::string& text : kRoundTrip) {
    // A literal U+2581 in the input is a space to SentencePiece; see below.
    if (text.find("\xE2\x96\x81") != std::string::npos) continue;
    for (bool add_special : {false, true}) {
      Ids ids = tk.encode(text, add_special, false);
      if (add_special) {
        ASSERT_FALSE(ids.empty());
        EXPECT_EQ(ids.front(), kBos);
        ids.erase(ids.begin());
      }
      EXPECT_EQ(tk.decode(ids), text) << text;
    }
  }
  EXPECT_EQ(tk.decode(tk.encode("a\xE2\x96\x81" "b", false, false)), "a b");
}

TEST(TokenizerRoundTrip, InvalidUtf8NeverCrashes) {
  const std::string fffd = "\xEF\xBF\xBD";
  struct Bad {
    std::string bytes;
    // What byte-level BPE gives back: llama.cpp reads each byte that starts
    // no character as U+FFFD, and lets overlong forms and surrogates through.
    std::string byte_level;
    // SentencePiece cuts characters by their lead byte alone, so a lead byte
    // that promises more bytes than follow swallows bytes of the "▁" after
    // it, which then come back as U+2581 rather than a space (llama.cpp does
    // the same). Other bad bytes come back exactly.
    bool spm_exact;
  };
  const std::vector<Bad> bad = {
      {"\x80", fffd, true},
      {"\xBF\xBF", fffd + fffd, true},
      {"\xC3(", fffd + "(", true},
      {"\xED\xA0\x80", "\xED\xA0\x80", true},
      {std::string("\xC0\x80", 2), std::string(1, '\0'), true},
      {"\xF5\x80\x80\x80", fffd + fffd + fffd + fffd, true},
      {"\xFF\xFE", fffd + fffd, false},
      {"\xC3", fffd, false},
      {"\xE2\x82", fffd + fffd, false},
      {"\xF0\x9F\x98", fffd + fffd + fffd, false},
      {"x\xE4\xBD y \xF4\x90\x80\x80 z",
       "x" + fffd + fffd + " y " + fffd + fffd + fffd + fffd + " z", false},
  };
  const Tokenizer spm(tiny_spm());
  for (const Bad& b : bad) {
    const std::string text = "pre " + b.bytes + " post";
    for (const std::string& pre : kPreTokenizers) {
      const Tokenizer& tk = demo_tokenizer(pre);
      EXPECT_EQ(tk.decode(tk.encode(text, true, true)), "pre " + b.byte_level + " post") << pre;
    }
    const std::string out = spm.decode(spm.encode(text, true, true));
    if (b.spm_exact) {
      EXPECT_EQ(out, " " + text);  // BOS first: the prefix space is not dropped
    } else {
      EXPECT_EQ(out.substr(0, 5), " pre ");
    }
  }
}

// ---------------------------------------------------------------------------
// Special tokens, BOS/EOS, end of generation

TEST(TokenizerSpecial, DemoVocabChatMarkup) {
  const Tokenizer& tk = demo_tokenizer("qwen2");
  const int32_t n = tk.n_vocab();
  const int32_t endoftext = n - 3, im_start = n - 2, im_end = n - 1;
  const std::string chat = "<|im_start|>user\nhi<|im_end|>\n";
  const Ids parsed = tk.encode(chat, false, true);
  ASSERT_GE(parsed.size(), 4u);
  EXPECT_EQ(parsed.front(), im_start);
  EXPECT_EQ(std::count(parsed.begin(), parsed.end(), im_end), 1);
  EXPECT_EQ(tk.decode(parsed), "user\nhi\n");  // control tokens print nothing...
  EXPECT_EQ(tk.decode(parsed, true), chat);    // ...unless asked to
  const Ids plain = tk.encode(chat, false, false);
  for (int32_t id : plain) EXPECT_LT(id, endoftext);
  EXPECT_EQ(tk.decode(plain), chat);
  EXPECT_EQ(tk.encode("<|endoftext|><|im_end|>", false, true), (Ids{endoftext, im_end}));
}

TEST(TokenizerSpecial, LongestTextWins) {
  VocabData v = tiny_bpe({});
  v.tokens.push_back("<|x|>");    // 256
  v.tokens.push_back("<|x|>yy");  // 257
  v.token_types.assign(v.tokens.size(), TokenType::NORMAL);
  v.token_types[256] = v.token_types[257] = TokenType::USER_DEFINED;
  const Tokenizer tk(v);
  EXPECT_EQ(tk.encode("<|x|>yy<|x|>y", false, false), (Ids{257, 256, 'y'}));
  EXPECT_EQ(tk.decode(Ids{257, 256}), "<|x|>yy<|x|>");
}

TEST(TokenizerSpecial, BosAndEos) {
  VocabData v = tiny_spm();
  v.add_eos = true;
  const Tokenizer tk(v);
  EXPECT_EQ(tk.encode("hello", true, false), (Ids{kBos, kSpHello, kEos}));
  EXPECT_EQ(tk.encode("hello", false, false), (Ids{kSpHello}));
  EXPECT_TRUE(tk.add_bos());
  EXPECT_TRUE(tk.add_eos());
  VocabData g = tiny_bpe({});
  g.tokens.push_back("<|endoftext|>");
  g.token_types.assign(g.tokens.size(), TokenType::NORMAL);
  g.token_types.back() = TokenType::CONTROL;
  g.bos_id = g.eos_id = 256;
  g.add_bos = true;
  const Tokenizer bpe(g);
  EXPECT_EQ(bpe.encode("a", true, false), (Ids{256, 'a'}));
  EXPECT_EQ(bpe.encode("a", false, false), (Ids{'a'}));
}

TEST(TokenizerSpecial, EndOfGeneration) {
  const Tokenizer& tk = demo_tokenizer("llama-bpe");
  const int32_t n = tk.n_vocab();
  EXPECT_TRUE(tk.is_end_of_generation(n - 3));   // <|endoftext|>, EOS
  EXPECT_TRUE(tk.is_end_of_generation(n - 1));   // <|im_end|>, EOT
  EXPECT_FALSE(tk.is_end_of_generation(n - 2));  // <|im_start|>
  EXPECT_FALSE(tk.is_end_of_generation('a'));
  EXPECT_FALSE(tk.is_end_of_generation(-1));
  EXPECT_FALSE(tk.is_end_of_generation(n));
  EXPECT_EQ(tk.eos_id(), n - 3);
  EXPECT_EQ(tk.eot_id(), n - 1);
}

TEST(TokenizerSpecial, EndOfGenerationFoundByText) {
  // No EOT id given: llama.cpp finds "<|eot_id|>" by its text, makes it a
  // control token and ends generation on it and on the other known texts.
  VocabData v = tiny_bpe({});
  for (const char* t : {"<|eot_id|>", "<|im_end|>", "<|fim_pad|>", "<|im_start|>", "<|channel|>"}) {
    v.tokens.push_back(t);
  }
  const Tokenizer tk(v);
  EXPECT_TRUE(tk.eot_id() == 256 || tk.eot_id() == 257);
  EXPECT_TRUE(tk.is_end_of_generation(256));
  EXPECT_TRUE(tk.is_end_of_generation(257));
  EXPECT_TRUE(tk.is_end_of_generation(258));  // FIM pad
  EXPECT_FALSE(tk.is_end_of_generation(259));
  EXPECT_EQ(tk.token_type(256), TokenType::CONTROL);  // was NORMAL in the data
  EXPECT_EQ(tk.token_type(258), TokenType::CONTROL);
  EXPECT_EQ(tk.token_type(259), TokenType::NORMAL);
  EXPECT_EQ(tk.token_type(260), TokenType::USER_DEFINED);  // gpt-oss markup is always printed
  EXPECT_EQ(tk.token_to_piece(256), "");
  EXPECT_EQ(tk.token_to_piece(260), "<|channel|>");
  EXPECT_EQ(tk.encode("<|eot_id|>", false, true), (Ids{256}));
}

// ---------------------------------------------------------------------------
// Streaming detokenization

TEST(TokenizerStream, HoldsIncompleteCharacters) {
  const Tokenizer tk(tiny_spm());
  IncrementalDetokenizer d(tk);
  // 你 (E4 BD A0) arrives as three byte tokens.
  EXPECT_EQ(d.push(kSpH), " h");
  EXPECT_EQ(d.push(byte_id(0xE4)), "");
  EXPECT_EQ(d.push(byte_id(0xBD)), "");
  EXPECT_EQ(d.push(byte_id(0xA0)), "\xE4\xBD\xA0");
  EXPECT_EQ(d.flush(), "");
  // An unfinished character at the end becomes one U+FFFD.
  EXPECT_EQ(d.push(byte_id(0xF0)), "");
  EXPECT_EQ(d.push(byte_id(0x9F)), "");
  EXPECT_EQ(d.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(d.flush(), "");
  // A byte that can never be part of a character is replaced at once.
  EXPECT_EQ(d.push(byte_id(0x80)), "\xEF\xBF\xBD");
  EXPECT_EQ(d.push(byte_id(0xE2)), "");
  EXPECT_EQ(d.push(kA), "\xEF\xBF\xBD" "a");  // E2 cut short by "a"
}

TEST(TokenizerStream, TotalEqualsDecodeAndNothingBrokenIsEmitted) {
  // The demo vocabulary spells multi-byte characters with byte tokens, so
  // characters are split across tokens; qwen2 does no clean-up and there is no
  // space prefix, so the stream must add up to decode() exactly.
  const Tokenizer& tk = demo_tokenizer("qwen2");
  for (const std::string& text : kRoundTrip) {
    const Ids ids = tk.encode(text, false, true);
    IncrementalDetokenizer d(tk);
    std::string total;
    size_t held_back = 0;
    for (int32_t id : ids) {
      const std::string out = d.push(id);
      EXPECT_TRUE(is_valid_utf8(out));
      if (out.empty() && !tk.token_to_piece(id).empty()) ++held_back;
      total += out;
    }
    total += d.flush();
    EXPECT_EQ(total, tk.decode(ids));
    EXPECT_EQ(total, text);
    if (text.find("\xE4\xBD\xA0") != std::string::npos) {
      EXPECT_GT(held_back, 0u);  // 你 is spelled with byte tokens here
    }
  }
}

TEST(TokenizerStream, RenderSpecial) {
  const Tokenizer& tk = demo_tokenizer("qwen2");
  const Ids ids = tk.encode("<|im_start|>a", false, true);
  IncrementalDetokenizer plain(tk), special(tk, /*render_special=*/true);
  std::string p, s;
  for (int32_t id : ids) {
    p += plain.push(id);
    s += special.push(id);
  }
  EXPECT_EQ(p, "a");
  EXPECT_EQ(s, "<|im_start|>a");
}

// ---------------------------------------------------------------------------
// Errors

TEST(TokenizerErrors, BadVocabularies) {
  VocabData v = tiny_bpe({{"a", "b"}});
  v.model = "bert";
  std::string e = error_of([&] { Tokenizer t(v); });
  EXPECT_NE(e.find("\"bert\""), std::string::npos) << e;
  EXPECT_NE(e.find("gpt2"), std::string::npos) << e;
  EXPECT_NE(e.find("llama"), std::string::npos) << e;

  v = tiny_bpe({});
  v.pre = "falcon";
  e = error_of([&] { Tokenizer t(v); });
  EXPECT_NE(e.find("\"falcon\""), std::string::npos) << e;
  EXPECT_NE(e.find("qwen2"), std::string::npos) << e;
  EXPECT_NE(e.find("llama-bpe"), std::string::npos) << e;

  v = tiny_bpe({});
  v.scores = {1.0f};
  e = error_of([&] { Tokenizer t(v); });
  EXPECT_NE(e.find("scores"), std::string::npos) << e;

  v = tiny_bpe({});
  v.token_types.assign(3, TokenType::NORMAL);
  e = error_of([&] { Tokenizer t(v); });
  EXPECT_NE(e.find("token_type"), std::string::npos) << e;

  v = tiny_bpe({});
  v.eos_id = 999;
  e = error_of([&] { Tokenizer t(v); });
  EXPECT_NE(e.find("EOS id 999"), std::string::npos) << e;

  v = tiny_bpe({});
  v.merges.push_back(byte_level("a") + " " + "nonexistent");
  e = error_of([&] { Tokenizer t(v); });
  EXPECT_NE(e.find("nonexistent"), std::string::npos) << e;

  v = tiny_bpe({});
  v.merges.push_back("nospace");
  e = error_of([&] { Tokenizer t(v); });
  EXPECT_NE(e.find("nospace"), std::string::npos) << e;

  v = tiny_bpe({});
  v.tokens.push_back("a");  // same text as byte token 97
  e = error_of([&] { Tokenizer t(v); });
  EXPECT_NE(e.find("97"), std::string::npos) << e;
  EXPECT_NE(e.find("same text"), std::string::npos) << e;

  v = tiny_bpe({});
  v.add_bos = true;
  e = error_of([&] { Tokenizer t(v); });
  EXPECT_NE(e.find("BOS"), std::string::npos) << e;

  v = tiny_bpe({});
  v.tokens.clear();
  v.merges.clear();
  e = error_of([&] { Tokenizer t(v); });
  EXPECT_NE(e.find("empty"), std::string::npos) << e;

  EXPECT_EQ(error_of([] { validate_vocab(tiny_spm()); }), "<no error>");
  EXPECT_NE(error_of([] {
              VocabData bad = tiny_spm();
              bad.unk_id = -5;
              validate_vocab(bad);
            }),
            "<no error>");
}

TEST(TokenizerErrors, TokenIdsOutOfRange) {
  const Tokenizer tk(tiny_spm());
  EXPECT_NE(error_of([&] { tk.token_to_piece(kSpmSize); }).find("out of range"), std::string::npos);
  EXPECT_NE(error_of([&] { tk.token_to_piece(-1); }), "<no error>");
  EXPECT_NE(error_of([&] { tk.decode(Ids{kA, 1 << 30}); }), "<no error>");
  EXPECT_NE(error_of([&] { tk.token_text(kSpmSize); }), "<no error>");
}

// ---------------------------------------------------------------------------
// GGUF metadata

gguf::File file_from(const gguf::Writer& w) { return gguf::File::parse(w.to_bytes(), "test.gguf"); }

gguf::Writer spm_writer() {
  const VocabData v = tiny_spm();
  gguf::Writer w;
  w.set("general.architecture", gguf::Value::make_string("llama"));
  w.set("tokenizer.ggml.model", gguf::Value::make_string("llama"));
  w.set("tokenizer.ggml.tokens", gguf::Value::make_string_array(v.tokens));
  w.set("tokenizer.ggml.scores", gguf::Value::make_f32_array(v.scores));
  std::vector<int32_t> types;
  for (TokenType t : v.token_types) types.push_back(static_cast<int32_t>(t));
  w.set("tokenizer.ggml.token_type", gguf::Value::make_i32_array(types));
  return w;
}

gguf::Writer bpe_writer(const VocabData& v) {
  gguf::Writer w;
  w.set("general.architecture", gguf::Value::make_string("qwen2"));
  w.set("tokenizer.ggml.model", gguf::Value::make_string("gpt2"));
  w.set("tokenizer.ggml.tokens", gguf::Value::make_string_array(v.tokens));
  w.set("tokenizer.ggml.merges", gguf::Value::make_string_array(v.merges));
  return w;
}

TEST(TokenizerGguf, LlamaDefaults) {
  const VocabData v = vocab_from_gguf(file_from(spm_writer()));
  EXPECT_EQ(v.model, "llama");
  EXPECT_EQ(v.tokens.size(), static_cast<size_t>(kSpmSize));
  EXPECT_EQ(v.bos_id, 1);
  EXPECT_EQ(v.eos_id, 2);
  EXPECT_EQ(v.unk_id, 0);
  EXPECT_EQ(v.eot_id, -1);
  EXPECT_TRUE(v.add_bos);
  EXPECT_FALSE(v.add_eos);
  EXPECT_TRUE(v.add_space_prefix);
  EXPECT_FALSE(v.special_rstrip);
  EXPECT_EQ(v.token_types[kTool], TokenType::USER_DEFINED);
  EXPECT_FLOAT_EQ(v.scores[kSpHello], -1.0f);
  const Tokenizer tk = Tokenizer::from_gguf(file_from(spm_writer()));
  EXPECT_EQ(tk.encode("hello", true, false), (Ids{kBos, kSpHello}));
}

TEST(TokenizerGguf, KeysOverrideDefaults) {
  gguf::Writer w = spm_writer();
  w.set("tokenizer.ggml.bos_token_id", gguf::Value::make_u32(kEos));
  w.set("tokenizer.ggml.eos_token_id", gguf::Value::make_u32(100000));  // out of range: ignored
  w.set("tokenizer.ggml.eot_token_id", gguf::Value::make_u32(kTool));
  w.set("tokenizer.ggml.add_bos_token", gguf::Value::make_bool(false));
  w.set("tokenizer.ggml.add_eos_token", gguf::Value::make_bool(true));
  w.set("tokenizer.ggml.add_space_prefix", gguf::Value::make_bool(false));
  w.set("general.name", gguf::Value::make_string("Phi-3 Mini"));
  const VocabData v = vocab_from_gguf(file_from(w));
  EXPECT_EQ(v.bos_id, kEos);
  EXPECT_EQ(v.eos_id, 2);  // llama.cpp keeps the default
  EXPECT_EQ(v.eot_id, kTool);
  EXPECT_FALSE(v.add_bos);
  EXPECT_TRUE(v.add_eos);
  EXPECT_FALSE(v.add_space_prefix);
  EXPECT_TRUE(v.special_rstrip);
}

TEST(TokenizerGguf, Gpt2Defaults) {
  const VocabData demo = make_demo_vocab(kMinDemoVocab, "qwen2");
  VocabData v = vocab_from_gguf(file_from(bpe_writer(demo)));
  EXPECT_EQ(v.pre, "");  // llama.cpp's "default"
  EXPECT_EQ(v.bos_id, 11);
  EXPECT_EQ(v.eos_id, 11);
  EXPECT_EQ(v.unk_id, -1);
  EXPECT_FALSE(v.add_bos);
  EXPECT_FALSE(v.add_space_prefix);
  EXPECT_TRUE(v.token_types.empty());
  EXPECT_TRUE(v.scores.empty());

  gguf::Writer w = bpe_writer(demo);
  w.set("tokenizer.ggml.pre", gguf::Value::make_string("llama-bpe"));
  v = vocab_from_gguf(file_from(w));
  EXPECT_TRUE(v.add_bos);  // llama.cpp's default for Llama 3
  w.set("tokenizer.ggml.add_bos_token", gguf::Value::make_bool(false));
  EXPECT_FALSE(vocab_from_gguf(file_from(w)).add_bos);
}

TEST(TokenizerGguf, Errors) {
  gguf::Writer w = spm_writer();
  w.set("tokenizer.ggml.model", gguf::Value::make_string("t5"));
  std::string e = error_of([&] { vocab_from_gguf(file_from(w)); });
  EXPECT_NE(e.find("\"t5\""), std::string::npos) << e;
  EXPECT_NE(e.find("tokenizer.ggml.model"), std::string::npos) << e;
  EXPECT_NE(e.find("test.gguf"), std::string::npos) << e;

  const VocabData demo = make_demo_vocab(kMinDemoVocab, "qwen2");
  w = bpe_writer(demo);
  w.set("tokenizer.ggml.pre", gguf::Value::make_string("deepseek-llm"));
  e = error_of([&] { vocab_from_gguf(file_from(w)); });
  EXPECT_NE(e.find("\"deepseek-llm\""), std::string::npos) << e;
  EXPECT_NE(e.find("tokenizer.ggml.pre"), std::string::npos) << e;
  EXPECT_NE(e.find("qwen2"), std::string::npos) << e;

  gguf::Writer no_merges;
  no_merges.set("tokenizer.ggml.model", gguf::Value::make_string("gpt2"));
  no_merges.set("tokenizer.ggml.tokens", gguf::Value::make_string_array(demo.tokens));
  e = error_of([&] { vocab_from_gguf(file_from(no_merges)); });
  EXPECT_NE(e.find("tokenizer.ggml.merges"), std::string::npos) << e;

  w = spm_writer();
  w.set("tokenizer.ggml.scores", gguf::Value::make_f32_array({1.0f, 2.0f}));
  e = error_of([&] { vocab_from_gguf(file_from(w)); });
  EXPECT_NE(e.find("scores"), std::string::npos) << e;

  gguf::Writer missing;
  missing.set("tokenizer.ggml.model", gguf::Value::make_string("llama"));
  e = error_of([&] { vocab_from_gguf(file_from(missing)); });
  EXPECT_NE(e.find("tokenizer.ggml.tokens"), std::string::npos) << e;

  std::vector<std::string> bad_merges = demo.merges;
  bad_merges.push_back("x nope");
  w = bpe_writer(demo);
  w.set("tokenizer.ggml.merges", gguf::Value::make_string_array(bad_merges));
  e = error_of([&] { Tokenizer::from_gguf(file_from(w)); });
  EXPECT_NE(e.find("nope"), std::string::npos) << e;
  EXPECT_NE(e.find("test.gguf"), std::string::npos) << e;
}

// ---------------------------------------------------------------------------
// The demo vocabulary

TEST(TokenizerDemoVocab, ShapeAndSpecialTokens) {
  for (int32_t n : {kMinDemoVocab, 1024, 32000}) {
    const VocabData v = make_demo_vocab(n, "qwen2");
    ASSERT_EQ(v.tokens.size(), static_cast<size_t>(n));
    EXPECT_EQ(v.model, "gpt2");
    EXPECT_EQ(v.pre, "qwen2");
    EXPECT_EQ(v.merges.size(), static_cast<size_t>(n - 256 - 3));  // one new token per merge
    for (int b = 0; b < 256; ++b) EXPECT_EQ(v.tokens[b], byte_level(b));
    EXPECT_EQ(v.tokens[n - 3], "<|endoftext|>");
    EXPECT_EQ(v.tokens[n - 2], "<|im_start|>");
    EXPECT_EQ(v.tokens[n - 1], "<|im_end|>");
    for (int32_t id = 0; id < n; ++id) {
      EXPECT_EQ(v.token_types[id], id >= n - 3 ? TokenType::CONTROL : TokenType::NORMAL);
    }
    EXPECT_EQ(v.bos_id, n - 3);
    EXPECT_EQ(v.eos_id, n - 3);
    EXPECT_EQ(v.eot_id, n - 1);
    EXPECT_FALSE(v.add_bos);
    EXPECT_FALSE(v.add_eos);
    const std::unordered_set<std::string> unique(v.tokens.begin(), v.tokens.end());
    EXPECT_EQ(unique.size(), v.tokens.size());
    // Merge k makes token 256 + k.
    for (size_t k = 0; k < v.merges.size(); ++k) {
      const std::string& m = v.merges[k];
      const size_t sep = m.find(' ');
      ASSERT_NE(sep, std::string::npos);
      EXPECT_EQ(m.substr(0, sep) + m.substr(sep + 1), v.tokens[256 + k]);
    }
  }
}

TEST(TokenizerDemoVocab, LearnedMergesComeFirst) {
  // The most frequent pairs of the corpus: the first merges are common English
  // pieces, such as " t" + "h" in " the".
  const VocabData v = make_demo_vocab(1024, "gpt-2");
  const auto first = std::find(v.tokens.begin() + 256, v.tokens.end(), byte_level(" the"));
  ASSERT_NE(first, v.tokens.end());
  EXPECT_LT(first - v.tokens.begin(), 300);
}

TEST(TokenizerDemoVocab, DeterministicAndFast) {
  for (const std::string& pre : {std::string("qwen2"), std::string("llama-bpe")}) {
    const VocabData a = make_demo_vocab(2000, pre);
    const VocabData b = make_demo_vocab(2000, pre);
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_EQ(a.merges, b.merges);
  }
  // A smaller vocabulary is a prefix of a larger one (same learning order).
  const VocabData small = make_demo_vocab(1024, "qwen2");
  const VocabData big = make_demo_vocab(151936, "qwen2");
  EXPECT_TRUE(std::equal(small.merges.begin(), small.merges.end(), big.merges.begin()));

  const auto t0 = std::chrono::steady_clock::now();
  const VocabData v = make_demo_vocab(151936, "qwen2");
  const Tokenizer tk(v);
  const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(tk.n_vocab(), 151936);
  EXPECT_EQ(v.merges.size(), 151936u - 259u);
  // Generous, for sanitizer builds; an O(n^2) step would take minutes.
  EXPECT_LT(seconds.count(), 10.0);
  EXPECT_EQ(tk.decode(tk.encode(kRoundTrip[2], false, false)), kRoundTrip[2]);
  EXPECT_EQ(v.tokens, big.tokens);
}

TEST(TokenizerDemoVocab, Errors) {
  std::string e = error_of([] { make_demo_vocab(kMinDemoVocab - 1, "qwen2"); });
  EXPECT_NE(e.find(std::to_string(kMinDemoVocab)), std::string::npos) << e;
  e = error_of([] { make_demo_vocab(1024, "nope"); });
  EXPECT_NE(e.find("\"nope\""), std::string::npos) << e;
  EXPECT_NE(e.find("qwen2"), std::string::npos) << e;
}

TEST(TokenizerDemoVocab, ChatTemplateIsChatMl) {
  const std::string t = demo_chat_template();
  EXPECT_NE(t.find("<|im_start|>"), std::string::npos);
  EXPECT_NE(t.find("<|im_end|>"), std::string::npos);
  EXPECT_NE(t.find("message['role']"), std::string::npos);
  EXPECT_NE(t.find("message['content']"), std::string::npos);
  EXPECT_NE(t.find("add_generation_prompt"), std::string::npos);
  EXPECT_NE(t.find("<|im_start|>assistant\\n"), std::string::npos);
}

}  // namespace
}  // namespace tandem
