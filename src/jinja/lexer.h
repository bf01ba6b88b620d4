// Splits template source into text and the tokens inside {{ }}, {% %},
// applying whitespace control as Jinja2 does with trim_blocks and
// lstrip_blocks on (how transformers and vLLM configure it): the newline
// after a block tag goes, spaces before a block tag on its own line go,
// "-" strips all whitespace on that side and "+" keeps it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tandem::jinja {

enum class TokenType {
  kText,
  kVarBegin,
  kVarEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,
  kInteger,
  kFloat,
  kOperator,
  kEnd,
};

struct Token {
  TokenType type;
  std::string text;  // text, name, operator, or the decoded string literal
  int line;
};

// Throws TemplateError(kSyntax) for an unterminated tag, comment or string,
// or a character no token starts with.
std::vector<Token> tokenize(std::string_view source);

}  // namespace tandem::jinja
