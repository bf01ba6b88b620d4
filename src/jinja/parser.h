// Tokens to a tree, with Jinja2's grammar and operator precedence.
#pragma once

#include <vector>

#include "jinja/ast.h"
#include "jinja/lexer.h"

namespace tandem::jinja {

// Throws TemplateError: kSyntax for what Jinja2 would reject too,
// kUnsupported for tags this interpreter leaves out (include, import,
// extends, block, call): templates are self-contained in the sandbox.
NodePtr parse_template(const std::vector<Token>& tokens);

}  // namespace tandem::jinja
