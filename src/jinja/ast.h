// The parsed template: one node type for statements and expressions, its
// fields used as the kind says (see the comment on each kind).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "jinja/value.h"

namespace tandem::jinja {

enum class NodeKind {
  // statements
  kBody,         // children: statements in order
  kText,         // text
  kPrint,        // children[0]: expression
  kIf,           // children: cond, body, cond, body, ...; then else body when has_else
  kFor,          // names: loop targets; children: iterable, body, else body|null, filter|null
  kSet,          // names: targets (or names[0] with attr for "ns.attr"); children[0]: value
  kSetBlock,     // names[0]: target; children: body, filter chain (operand null)|null
  kMacro,        // text: name; names: parameters; children: defaults (null: none)..., body last
  kBreak,
  kContinue,
  kFilterBlock,  // children: filter chain (innermost operand null), body
  kWith,         // names: targets; children: values..., body last
  // expressions
  kLiteral,      // value
  kName,         // text
  kList,         // children: items
  kTuple,        // children: items
  kDict,         // children: key, value, key, value, ...
  kGetAttr,      // children[0]: object; text: attribute
  kGetItem,      // children: object, index
  kSlice,        // children: object, start|null, stop|null, step|null
  kCall,         // children[0]: callee, then positional args; keyword: keyword args
  kFilter,       // text: filter name; children[0]: operand (null in a filter block), then args; keyword
  kTest,         // text: test name; negated; children[0]: operand, then args
  kUnary,        // text: "-", "+" or "not"; children[0]
  kBinary,       // text: operator ("+", "~", "and", "in", "not in", ...); children: left, right
  kCompare,      // names: operators; children: first operand, then one per operator
  kCondExpr,     // children: condition, then-value, else-value|null
};

struct Node;
using NodePtr = std::unique_ptr<Node>;

struct Node {
  NodeKind kind;
  int line = 0;
  std::string text;
  std::string attr;  // kSet to a namespace attribute
  std::vector<std::string> names;
  std::vector<NodePtr> children;
  std::vector<std::pair<std::string, NodePtr>> keyword;
  Value value;
  bool has_else = false;
  bool negated = false;
  int depth = 1;  // of the expression tree below, bounded by the parser

  Node(NodeKind k, int l) : kind(k), line(l) {}
};

}  // namespace tandem::jinja
