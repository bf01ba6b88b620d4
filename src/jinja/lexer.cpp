#include "jinja/lexer.h"

#include <algorithm>
#include <cctype>

#include "jinja/error.h"
#include "jinja/value.h"

namespace tandem::jinja {
namespace {

// Jinja joins the source's lines with "\n" and, without
// keep_trailing_newline, drops one newline at the very end.
std::string normalize_newlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

bool all_space(std::string_view s) {
  for (uint32_t cp : utf8_decode(s))
    if (!py_isspace(cp)) return false;
  return true;
}

// Python's \s at byte offset i (ASCII fast path, else the code point there).
size_t space_len(const std::string& s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return py_isspace(c) ? 1 : 0;
  const size_t len = (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
  if (i + len > s.size()) return 0;
  const std::vector<uint32_t> cp = utf8_decode(std::string_view(s).substr(i, len));
  return cp.size() == 1 && py_isspace(cp[0]) ? len : 0;
}

class Lexer {
 public:
  explicit Lexer(std::string_view source) : src_(normalize_newlines(source)) {}

  std::vector<Token> run() {
    while (pos_ < src_.size()) {
      const size_t start = next_tag(pos_);
      if (start == std::string::npos) {
        emit_text(src_.substr(pos_));
        pos_ = src_.size();
        break;
      }
      std::string text = src_.substr(pos_, start - pos_);
      const char kind = src_[start + 1];
      const char mod = start + 2 < src_.size() ? src_[start + 2] : '\0';
      if (mod == '-') {
        text = py_strip(text, "", false, false, true);
      } else if (mod != '+' && kind != '{') {
        const size_t l_pos = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if ((l_pos > 0 || line_starting_) && all_space(std::string_view(text).substr(l_pos)))
          text.resize(l_pos);
      }
      const int text_line = line_;
      count_lines(pos_, start);
      emit_text(std::move(text), text_line);
      pos_ = start + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
      if (kind == '#') {
        comment();
      } else if (kind == '%' && raw_block()) {
        // emitted as text
      } else {
        tag(kind == '%');
      }
    }
    tokens_.push_back({TokenType::kEnd, "", line_});
    return std::move(tokens_);
  }

 private:
  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> tokens_;

  size_t next_tag(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    }
    return std::string::npos;
  }

  void count_lines(size_t from, size_t to) { line_ += static_cast<int>(std::count(src_.begin() + from, src_.begin() + to, '\n')); }

  void emit_text(std::string text, int line = 0) {
    if (text.empty()) return;
    tokens_.push_back({TokenType::kText, std::move(text), line ? line : line_});
  }

  // After a tag's end: "\s*" when it was "-", one "\n" when trim applies.
  void after_end(bool strip_all, bool trim_newline) {
    if (strip_all) {
      while (pos_ < src_.size()) {
        const size_t n = space_len(src_, pos_);
        if (n == 0) break;
        if (src_[pos_] == '\n') ++line_;
        pos_ += n;
      }
    } else if (trim_newline && pos_ < src_.size() && src_[pos_] == '\n') {
      ++line_;
      ++pos_;
    }
    line_starting_ = pos_ > 0 && src_[pos_ - 1] == '\n';
  }

  void comment() {
    const size_t body = pos_;
    const size_t end = src_.find("#}", body);
    if (end == std::string::npos) fail(ErrorKind::kSyntax, "missing end of comment tag", line_);
    const char before = end > body ? src_[end - 1] : '\0';
    count_lines(pos_, end);
    pos_ = end + 2;
    after_end(before == '-', before != '+' && before != '-');
  }

  // {% raw %} ... {% endraw %}: the text between, untouched.
  bool raw_block() {
    size_t p = pos_;
    while (p < src_.size() && space_len(src_, p)) p += space_len(src_, p);
    if (src_.compare(p, 3, "raw") != 0 || (p + 3 < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[p + 3])) || src_[p + 3] == '_')))
      return false;
    p += 3;
    while (p < src_.size() && space_len(src_, p)) p += space_len(src_, p);
    bool strip = false;
    if (src_.compare(p, 3, "-%}") == 0) {
      strip = true;
      p += 3;
    } else if (src_.compare(p, 2, "%}") == 0) {
      p += 2;
    } else {
      return false;
    }
    count_lines(pos_, p);
    pos_ = p;
    after_end(strip, false);
    // Find "{%" [-+]? \s* "endraw" \s* ("+%}" | "-%}" \s* | "%}" "\n"?).
    for (size_t q = src_.find("{%", pos_); q != std::string::npos; q = src_.find("{%", q + 1)) {
      size_t r = q + 2;
      const char mod = r < src_.size() ? src_[r] : '\0';
      if (mod == '-' || mod == '+') ++r;
      while (r < src_.size() && space_len(src_, r)) r += space_len(src_, r);
      if (src_.compare(r, 6, "endraw") != 0) continue;
      r += 6;
      while (r < src_.size() && space_len(src_, r)) r += space_len(src_, r);
      char end_mod = '\0';
      if (r < src_.size() && (src_[r] == '-' || src_[r] == '+')) end_mod = src_[r++];
      if (src_.compare(r, 2, "%}") != 0) continue;
      std::string text = src_.substr(pos_, q - pos_);
      if (mod == '-') text = py_strip(text, "", false, false, true);
      const int text_line = line_;
      count_lines(pos_, r + 2);
      emit_text(std::move(text), text_line);
      pos_ = r + 2;
      after_end(end_mod == '-', end_mod == '\0');
      return true;
    }
    fail(ErrorKind::kSyntax, "missing end of raw directive", line_);
  }

  void tag(bool block) {
    tokens_.push_back({block ? TokenType::kBlockBegin : TokenType::kVarBegin, "", line_});
    std::vector<char> brackets;
    while (true) {
      while (pos_ < src_.size() && space_len(src_, pos_)) {
        if (src_[pos_] == '\n') ++line_;
        pos_ += space_len(src_, pos_);
      }
      if (pos_ >= src_.size()) fail(ErrorKind::kSyntax, block ? "unexpected end of template, expected '%}'" : "unexpected end of template, expected '}}'", line_);
      if (brackets.empty() && end_of_tag(block)) return;
      const char c = src_[pos_];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = pos_;
        while (e < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        tokens_.push_back({TokenType::kName, src_.substr(pos_, e - pos_), line_});
        pos_ = e;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        number();
      } else if (c == '\'' || c == '"') {
        string_literal(c);
      } else {
        op(brackets);
      }
    }
  }

  bool end_of_tag(bool block) {
    const char* close = block ? "%}" : "}}";
    if (src_[pos_] == '-' && src_.compare(pos_ + 1, 2, close) == 0) {
      pos_ += 3;
      tokens_.push_back({block ? TokenType::kBlockEnd : TokenType::kVarEnd, "", line_});
      after_end(true, false);
      return true;
    }
    if (block && src_[pos_] == '+' && src_.compare(pos_ + 1, 2, close) == 0) {
      pos_ += 3;
      tokens_.push_back({TokenType::kBlockEnd, "", line_});
      after_end(false, false);
      return true;
    }
    if (src_.compare(pos_, 2, close) == 0) {
      pos_ += 2;
      tokens_.push_back({block ? TokenType::kBlockEnd : TokenType::kVarEnd, "", line_});
      after_end(false, block);  // trim_blocks: only block tags eat the newline
      return true;
    }
    return false;
  }

  void number() {
    auto digits = [&](size_t p) {  // (\d+_)*\d+ from p; returns the end (p when none)
      size_t e = p;
      while (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) {
        ++e;
        if (e + 1 < src_.size() && src_[e] == '_' && std::isdigit(static_cast<unsigned char>(src_[e + 1]))) ++e;
      }
      return e;
    };
    size_t e = digits(pos_);
    bool is_float = false;
    if (e + 1 < src_.size() && src_[e] == '.' && std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
      e = digits(e + 1);
      is_float = true;
    }
    if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t x = e + 1;
      if (x < src_.size() && (src_[x] == '+' || src_[x] == '-')) ++x;
      const size_t xe = digits(x);
      if (xe > x) {
        e = xe;
        is_float = true;
      }
    }
    std::string text;
    for (size_t i = pos_; i < e; ++i)
      if (src_[i] != '_') text += src_[i];
    tokens_.push_back({is_float ? TokenType::kFloat : TokenType::kInteger, text, line_});
    pos_ = e;
  }

  void string_literal(char quote) {
    const int start_line = line_;
    std::string out;
    size_t p = pos_ + 1;
    while (true) {
      if (p >= src_.size()) fail(ErrorKind::kSyntax, "unexpected end of string", start_line);
      const char c = src_[p];
      if (c == quote) break;
      if (c == '\n') ++line_;
      if (c != '\\') {
        out += c;
        ++p;
        continue;
      }
      if (p + 1 >= src_.size()) fail(ErrorKind::kSyntax, "unexpected end of string", start_line);
      p = escape(p + 1, out);
    }
    tokens_.push_back({TokenType::kString, std::move(out), start_line});
    pos_ = p + 1;
  }

  // Python's unicode-escape decoding of one escape; p is just past the backslash.
  size_t escape(size_t p, std::string& out) {
    const char e = src_[p];
    auto hex = [&](size_t from, int n) -> long {
      if (from + n > src_.size()) return -1;
      long v = 0;
      for (int i = 0; i < n; ++i) {
        const char h = src_[from + i];
        if (!std::isxdigit(static_cast<unsigned char>(h))) return -1;
        v = v * 16 + (std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
      }
      return v;
    };
    auto put = [&](uint32_t cp) { out += utf8_encode({cp}, 0, 1); };
    switch (e) {
      case '\n': ++line_; return p + 1;  // line continuation
      case '\\': out += '\\'; return p + 1;
      case '\'': out += '\''; return p + 1;
      case '"': out += '"'; return p + 1;
      case 'a': out += '\a'; return p + 1;
      case 'b': out += '\b'; return p + 1;
      case 'f': out += '\f'; return p + 1;
      case 'n': out += '\n'; return p + 1;
      case 'r': out += '\r'; return p + 1;
      case 't': out += '\t'; return p + 1;
      case 'v': out += '\v'; return p + 1;
      case 'x':
      case 'u':
      case 'U': {
        const int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        const long v = hex(p + 1, n);
        if (v < 0 || v > 0x10FFFF) fail(ErrorKind::kSyntax, std::string("truncated \\") + e + " escape in a string", line_);
        put(static_cast<uint32_t>(v));
        return p + 1 + n;
      }
      default:
        if (e >= '0' && e <= '7') {
          uint32_t v = 0;
          size_t q = p;
          while (q < p + 3 && q < src_.size() && src_[q] >= '0' && src_[q] <= '7') v = v * 8 + (src_[q++] - '0');
          put(v);
          return q;
        }
        out += '\\';  // unknown escapes stay as written
        return p;
    }
  }

  void op(std::vector<char>& brackets) {
    static const char* kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
    for (const char* t : kTwo) {
      if (src_.compare(pos_, 2, t) == 0) {
        tokens_.push_back({TokenType::kOperator, t, line_});
        pos_ += 2;
        return;
      }
    }
    const char c = src_[pos_];
    static const std::string kOne = "+-/*%~<>=.,:|()[]{}";
    if (kOne.find(c) == std::string::npos)
      fail(ErrorKind::kSyntax, std::string("unexpected char '") + c + "'", line_);
    if (c == '(' || c == '[' || c == '{') brackets.push_back(c);
    if (c == ')' || c == ']' || c == '}') {
      const char open = c == ')' ? '(' : c == ']' ? '[' : '{';
      if (brackets.empty() || brackets.back() != open)
        fail(ErrorKind::kSyntax, std::string("unexpected '") + c + "'", line_);
      brackets.pop_back();
    }
    tokens_.push_back({TokenType::kOperator, std::string(1, c), line_});
    ++pos_;
  }
};

}  // namespace

std::vector<Token> tokenize(std::string_view source) { return Lexer(source).run(); }

}  // namespace tandem::jinja
