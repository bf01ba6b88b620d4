#include "jinja/parser.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <initializer_list>

#include "jinja/error.h"

namespace tandem::jinja {
namespace {

constexpr int kMaxNestingDepth = 200;  // bounds the parser's own recursion
// Bounds an expression tree's depth, so evaluating it (and freeing it)
// recurses a bounded amount: left-assoc chains ("1+1+1...") grow it too.
constexpr int kMaxTreeDepth = 512;

NodePtr deepen(NodePtr n) {
  int d = 0;
  for (const auto& c : n->children)
    if (c) d = std::max(d, c->depth);
  for (const auto& [k, c] : n->keyword)
    if (c) d = std::max(d, c->depth);
  n->depth = d + 1;
  if (n->depth > kMaxTreeDepth)
    fail(ErrorKind::kLimit, "an expression nests deeper than " + std::to_string(kMaxTreeDepth), n->line);
  return n;
}

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : toks_(tokens) {}

  NodePtr run() {
    NodePtr body = parse_body({});
    if (cur().type != TokenType::kEnd) fail(ErrorKind::kSyntax, "unexpected '" + cur().text + "'", cur().line);
    return body;
  }

 private:
  const std::vector<Token>& toks_;
  size_t i_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;

  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser) : p(parser) {
      if (++p.depth_ > kMaxNestingDepth)
        fail(ErrorKind::kLimit, "template nests deeper than " + std::to_string(kMaxNestingDepth), p.cur().line);
    }
    ~DepthGuard() { --p.depth_; }
  };

  const Token& cur() const { return toks_[i_]; }
  const Token& peek(size_t ahead = 1) const { return toks_[std::min(i_ + ahead, toks_.size() - 1)]; }
  void next() {
    if (i_ + 1 < toks_.size()) ++i_;
  }
  bool is_op(const char* op) const { return cur().type == TokenType::kOperator && cur().text == op; }
  bool is_name(const char* name) const { return cur().type == TokenType::kName && cur().text == name; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* name) {
    if (!is_name(name)) return false;
    next();
    return true;
  }
  std::string describe(const Token& t) const {
    switch (t.type) {
      case TokenType::kEnd: return "end of template";
      case TokenType::kBlockEnd: return "end of statement block";
      case TokenType::kVarEnd: return "end of print statement";
      case TokenType::kBlockBegin: return "begin of statement block";
      case TokenType::kVarBegin: return "begin of print statement";
      case TokenType::kString: return "string";
      default: return "'" + t.text + "'";
    }
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail(ErrorKind::kSyntax, std::string("expected token '") + op + "', got " + describe(cur()), cur().line);
  }
  void expect(TokenType type, const char* what) {
    if (cur().type != type) fail(ErrorKind::kSyntax, std::string("expected ") + what + ", got " + describe(cur()), cur().line);
    next();
  }
  std::string expect_name() {
    if (cur().type != TokenType::kName) fail(ErrorKind::kSyntax, "expected a name, got " + describe(cur()), cur().line);
    std::string n = cur().text;
    next();
    return n;
  }
  NodePtr node(NodeKind k) { return std::make_unique<Node>(k, cur().line); }

  // ---- statements ----

  // Statements up to a {% tag %} whose name is in `ends` (left unconsumed,
  // the cursor on that name).
  NodePtr parse_body(std::initializer_list<const char*> ends) {
    DepthGuard guard(*this);
    NodePtr body = node(NodeKind::kBody);
    while (cur().type != TokenType::kEnd) {
      if (cur().type == TokenType::kText) {
        NodePtr t = node(NodeKind::kText);
        t->text = cur().text;
        body->children.push_back(std::move(t));
        next();
      } else if (cur().type == TokenType::kVarBegin) {
        next();
        NodePtr p = node(NodeKind::kPrint);
        p->children.push_back(parse_tuple(true, {}));
        expect(TokenType::kVarEnd, "end of print statement");
        body->children.push_back(std::move(p));
      } else if (cur().type == TokenType::kBlockBegin) {
        const Token& name = peek();
        if (name.type == TokenType::kName &&
            std::any_of(ends.begin(), ends.end(), [&](const char* e) { return name.text == e; })) {
          next();
          return body;
        }
        next();
        parse_statement(*body);
      } else {
        fail(ErrorKind::kSyntax, "unexpected " + describe(cur()), cur().line);
      }
    }
    if (ends.size() > 0)
      fail(ErrorKind::kSyntax, std::string("unexpected end of template, expected '") + *ends.begin() + "'", cur().line);
    return body;
  }

  void end_tag() { expect(TokenType::kBlockEnd, "end of statement block"); }
  // At the closing tag's name (parse_body stopped there, having checked it): consume it and "%}".
  void close() {
    expect_name();
    end_tag();
  }

  void parse_statement(Node& body) {
    if (cur().type != TokenType::kName) fail(ErrorKind::kSyntax, "tag name expected", cur().line);
    const std::string tag = cur().text;
    const int line = cur().line;
    if (tag == "if") return body.children.push_back(parse_if());
    if (tag == "for") return body.children.push_back(parse_for());
    if (tag == "set") return body.children.push_back(parse_set());
    if (tag == "macro") return body.children.push_back(parse_macro());
    if (tag == "filter") return body.children.push_back(parse_filter_block());
    if (tag == "with") return body.children.push_back(parse_with());
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) fail(ErrorKind::kSyntax, "'" + tag + "' outside of a loop", line);
      NodePtr n = node(tag == "break" ? NodeKind::kBreak : NodeKind::kContinue);
      next();
      end_tag();
      return body.children.push_back(std::move(n));
    }
    if (tag == "generation") {  // transformers' assistant-mask tag: renders its body
      next();
      end_tag();
      // A call block in transformers: its body has a scope of its own.
      NodePtr scope = std::make_unique<Node>(NodeKind::kWith, line);
      scope->children.push_back(parse_body({"endgeneration"}));
      close();
      return body.children.push_back(std::move(scope));
    }
    if (tag == "include" || tag == "import" || tag == "from" || tag == "extends" || tag == "block" ||
        tag == "call" || tag == "do" || tag == "autoescape" || tag == "trans")
      fail(ErrorKind::kUnsupported, "the '" + tag + "' tag is not supported (templates run self-contained in a sandbox)", line);
    fail(ErrorKind::kSyntax, "encountered unknown tag '" + tag + "'", line);
  }

  NodePtr parse_if() {
    NodePtr n = node(NodeKind::kIf);
    next();  // if
    while (true) {
      n->children.push_back(parse_tuple(false, {}));
      end_tag();
      n->children.push_back(parse_body({"elif", "else", "endif"}));
      const std::string which = cur().text;
      next();
      if (which == "elif") continue;
      if (which == "else") {
        end_tag();
        n->children.push_back(parse_body({"endif"}));
        n->has_else = true;
        next();
      }
      end_tag();
      return n;
    }
  }

  // The variables Jinja2 defines inside a macro that this interpreter does
  // not ("varargs", "kwargs", "caller"), if the body reads one.
  static const char* uses_macro_specials(const Node& n) {
    if (n.kind == NodeKind::kName)
      for (const char* special : {"varargs", "kwargs", "caller"})
        if (n.text == special) return special;
    for (const auto& c : n.children)
      if (c)
        if (const char* s = uses_macro_specials(*c)) return s;
    for (const auto& [k, c] : n.keyword)
      if (c)
        if (const char* s = uses_macro_specials(*c)) return s;
    return nullptr;
  }

  std::vector<std::string> parse_targets(const char* what) {
    std::vector<std::string> names;
    const bool paren = skip_op("(");
    do {
      if (cur().type != TokenType::kName) fail(ErrorKind::kSyntax, std::string("can't assign to ") + what, cur().line);
      names.push_back(expect_name());
    } while (skip_op(","));
    if (paren) expect_op(")");
    return names;
  }

  NodePtr parse_for() {
    NodePtr n = node(NodeKind::kFor);
    next();  // for
    n->names = parse_targets("this for target");
    if (!skip_name("in")) fail(ErrorKind::kSyntax, "expected 'in', got " + describe(cur()), cur().line);
    n->children.push_back(parse_tuple(false, {"recursive"}));
    NodePtr filter;
    if (skip_name("if")) filter = parse_expression(true);
    if (is_name("recursive")) fail(ErrorKind::kUnsupported, "recursive for loops are not supported", cur().line);
    end_tag();
    ++loop_depth_;
    n->children.push_back(parse_body({"endfor", "else"}));
    --loop_depth_;
    if (cur().text == "else") {
      next();
      end_tag();
      n->children.push_back(parse_body({"endfor"}));
    } else {
      n->children.push_back(nullptr);
    }
    close();
    n->children.push_back(std::move(filter));
    return n;
  }

  NodePtr parse_set() {
    const int line = cur().line;
    next();  // set
    if (cur().type == TokenType::kName && peek().type == TokenType::kOperator && peek().text == "." ) {
      NodePtr n = node(NodeKind::kSet);
      n->names.push_back(expect_name());
      next();  // .
      n->attr = expect_name();
      expect_op("=");
      n->children.push_back(parse_tuple(true, {}));
      end_tag();
      return n;
    }
    std::vector<std::string> names = parse_targets("this set target");
    if (skip_op("=")) {
      NodePtr n = std::make_unique<Node>(NodeKind::kSet, line);
      n->names = std::move(names);
      n->children.push_back(parse_tuple(true, {}));
      end_tag();
      return n;
    }
    if (names.size() != 1) fail(ErrorKind::kSyntax, "expected '=' after the set targets", line);
    NodePtr n = std::make_unique<Node>(NodeKind::kSetBlock, line);
    n->names = std::move(names);
    NodePtr filter;
    if (is_op("|")) filter = parse_filters(nullptr);
    end_tag();
    n->children.push_back(parse_body({"endset"}));
    close();
    n->children.push_back(std::move(filter));
    return n;
  }

  NodePtr parse_macro() {
    NodePtr n = node(NodeKind::kMacro);
    next();  // macro
    n->text = expect_name();
    expect_op("(");
    std::vector<NodePtr> defaults;
    while (!is_op(")")) {
      if (!n->names.empty()) expect_op(",");
      if (is_op(")")) break;
      n->names.push_back(expect_name());
      defaults.push_back(skip_op("=") ? parse_expression(true) : nullptr);
    }
    expect_op(")");
    end_tag();
    const int saved_loops = loop_depth_;
    loop_depth_ = 0;
    NodePtr body = parse_body({"endmacro"});
    loop_depth_ = saved_loops;
    close();
    if (const char* special = uses_macro_specials(*body))
      fail(ErrorKind::kUnsupported, std::string("a macro's '") + special + "' is not supported", n->line);
    for (auto& d : defaults) n->children.push_back(std::move(d));
    n->children.push_back(std::move(body));
    return n;
  }

  NodePtr parse_filter_block() {
    NodePtr n = node(NodeKind::kFilterBlock);
    next();  // filter
    // The first filter has no "|" before it.
    NodePtr chain = parse_one_filter(nullptr);
    if (is_op("|")) chain = parse_filters(std::move(chain));
    end_tag();
    n->children.push_back(std::move(chain));
    n->children.push_back(parse_body({"endfilter"}));
    close();
    return n;
  }

  NodePtr parse_with() {
    NodePtr n = node(NodeKind::kWith);
    next();  // with
    while (cur().type != TokenType::kBlockEnd) {
      if (!n->names.empty()) expect_op(",");
      n->names.push_back(expect_name());
      expect_op("=");
      n->children.push_back(parse_expression(true));
    }
    end_tag();
    n->children.push_back(parse_body({"endwith"}));
    close();
    return n;
  }

  // ---- expressions ----

  bool tuple_end(std::initializer_list<const char*> extra) const {
    const Token& t = cur();
    if (t.type == TokenType::kVarEnd || t.type == TokenType::kBlockEnd || t.type == TokenType::kEnd) return true;
    if (t.type == TokenType::kOperator && (t.text == ")" || t.text == "]")) return true;
    if (t.type == TokenType::kName)
      return std::any_of(extra.begin(), extra.end(), [&](const char* e) { return t.text == e; });
    return false;
  }

  NodePtr parse_tuple(bool with_condexpr, std::initializer_list<const char*> extra, bool explicit_parens = false) {
    const int line = cur().line;
    std::vector<NodePtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (tuple_end(extra)) break;
      items.push_back(parse_expression(with_condexpr));
      if (is_op(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) fail(ErrorKind::kSyntax, "expected an expression, got " + describe(cur()), line);
    }
    NodePtr t = std::make_unique<Node>(NodeKind::kTuple, line);
    t->children = std::move(items);
    return deepen(std::move(t));
  }

  NodePtr parse_expression(bool with_condexpr) {
    DepthGuard guard(*this);
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  NodePtr parse_condexpr() {
    DepthGuard guard(*this);  // "a if b else c if d else ..." recurses here
    NodePtr expr = parse_or();
    while (is_name("if")) {
      NodePtr n = node(NodeKind::kCondExpr);
      next();
      NodePtr cond = parse_or();
      NodePtr other = skip_name("else") ? parse_condexpr() : nullptr;
      n->children.push_back(std::move(cond));
      n->children.push_back(std::move(expr));
      n->children.push_back(std::move(other));
      expr = deepen(std::move(n));
    }
    return expr;
  }

  NodePtr binary(const std::string& op, NodePtr l, NodePtr r, int line) {
    NodePtr n = std::make_unique<Node>(NodeKind::kBinary, line);
    n->text = op;
    n->children.push_back(std::move(l));
    n->children.push_back(std::move(r));
    return deepen(std::move(n));
  }

  NodePtr parse_or() {
    NodePtr left = parse_and();
    while (is_name("or")) {
      const int line = cur().line;
      next();
      left = binary("or", std::move(left), parse_and(), line);
    }
    return left;
  }

  NodePtr parse_and() {
    NodePtr left = parse_not();
    while (is_name("and")) {
      const int line = cur().line;
      next();
      left = binary("and", std::move(left), parse_not(), line);
    }
    return left;
  }

  NodePtr parse_not() {
    if (is_name("not")) {
      DepthGuard guard(*this);
      NodePtr n = node(NodeKind::kUnary);
      n->text = "not";
      next();
      n->children.push_back(parse_not());
      return deepen(std::move(n));
    }
    return parse_compare();
  }

  NodePtr parse_compare() {
    const int line = cur().line;
    NodePtr first = parse_math1();
    std::vector<std::string> ops;
    std::vector<NodePtr> operands;
    while (true) {
      const Token& t = cur();
      if (t.type == TokenType::kOperator &&
          (t.text == "==" || t.text == "!=" || t.text == "<" || t.text == ">" || t.text == "<=" || t.text == ">=")) {
        ops.push_back(t.text);
        next();
      } else if (is_name("in")) {
        ops.push_back("in");
        next();
      } else if (is_name("not") && peek().type == TokenType::kName && peek().text == "in") {
        ops.push_back("not in");
        next();
        next();
      } else {
        break;
      }
      operands.push_back(parse_math1());
    }
    if (ops.empty()) return first;
    NodePtr n = std::make_unique<Node>(NodeKind::kCompare, line);
    n->names = std::move(ops);
    n->children.push_back(std::move(first));
    for (auto& o : operands) n->children.push_back(std::move(o));
    return deepen(std::move(n));
  }

  NodePtr parse_math1() {
    NodePtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = cur().text;
      const int line = cur().line;
      next();
      left = binary(op, std::move(left), parse_concat(), line);
    }
    return left;
  }

  NodePtr parse_concat() {
    NodePtr left = parse_math2();
    while (is_op("~")) {
      const int line = cur().line;
      next();
      left = binary("~", std::move(left), parse_math2(), line);
    }
    return left;
  }

  NodePtr parse_math2() {
    NodePtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = cur().text;
      const int line = cur().line;
      next();
      left = binary(op, std::move(left), parse_pow(), line);
    }
    return left;
  }

  NodePtr parse_pow() {
    NodePtr left = parse_unary(true);
    while (is_op("**")) {
      const int line = cur().line;
      next();
      left = binary("**", std::move(left), parse_unary(true), line);
    }
    return left;
  }

  NodePtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    NodePtr n;
    if (is_op("-") || is_op("+")) {
      n = node(NodeKind::kUnary);
      n->text = cur().text;
      next();
      n->children.push_back(parse_unary(false));
      n = deepen(std::move(n));
    } else {
      n = parse_primary();
    }
    n = parse_postfix(std::move(n));
    if (with_filter) n = parse_filter_expr(std::move(n));
    return n;
  }

  NodePtr literal(Value v) {
    NodePtr n = node(NodeKind::kLiteral);
    n->value = std::move(v);
    return n;
  }

  NodePtr parse_primary() {
    const Token& t = cur();
    switch (t.type) {
      case TokenType::kName: {
        if (t.text == "true" || t.text == "True") return next(), literal(Value(true));
        if (t.text == "false" || t.text == "False") return next(), literal(Value(false));
        if (t.text == "none" || t.text == "None") return next(), literal(Value::none());
        NodePtr n = node(NodeKind::kName);
        n->text = t.text;
        next();
        return n;
      }
      case TokenType::kString: {
        std::string s = t.text;
        const int line = t.line;
        next();
        while (cur().type == TokenType::kString) {  // adjacent literals join, as in Python
          s += cur().text;
          next();
        }
        NodePtr n = literal(Value(std::move(s)));
        n->line = line;
        return n;
      }
      case TokenType::kInteger: {
        int64_t v = 0;
        const auto r = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
        if (r.ec != std::errc()) fail(ErrorKind::kUnsupported, "integer literal " + t.text + " is out of range", t.line);
        next();
        return literal(Value(v));
      }
      case TokenType::kFloat: {
        const double v = std::strtod(t.text.c_str(), nullptr);
        next();
        return literal(Value(v));
      }
      case TokenType::kOperator: {
        if (t.text == "(") {
          next();
          NodePtr inner = parse_tuple(true, {}, true);
          expect_op(")");
          return inner;
        }
        if (t.text == "[") {
          NodePtr n = node(NodeKind::kList);
          next();
          while (!is_op("]")) {
            if (!n->children.empty()) expect_op(",");
            if (is_op("]")) break;
            n->children.push_back(parse_expression(true));
          }
          expect_op("]");
          return deepen(std::move(n));
        }
        if (t.text == "{") {
          NodePtr n = node(NodeKind::kDict);
          next();
          while (!is_op("}")) {
            if (!n->children.empty()) expect_op(",");
            if (is_op("}")) break;
            n->children.push_back(parse_expression(true));
            expect_op(":");
            n->children.push_back(parse_expression(true));
          }
          expect_op("}");
          return deepen(std::move(n));
        }
        break;
      }
      default: break;
    }
    fail(ErrorKind::kSyntax, "unexpected " + describe(t), t.line);
  }

  NodePtr parse_postfix(NodePtr n) {
    while (true) {
      if (is_op(".") || is_op("[")) {
        n = parse_subscript(std::move(n));
      } else if (is_op("(")) {
        n = parse_call(std::move(n));
      } else {
        return n;
      }
    }
  }

  NodePtr parse_filter_expr(NodePtr n) {
    while (true) {
      if (is_op("|")) {
        n = parse_filters(std::move(n));
      } else if (is_name("is")) {
        n = parse_test(std::move(n));
      } else if (is_op("(")) {
        n = parse_call(std::move(n));
      } else {
        return n;
      }
    }
  }

  NodePtr parse_subscript(NodePtr obj) {
    const int line = cur().line;
    if (skip_op(".")) {
      if (cur().type == TokenType::kName) {
        NodePtr n = std::make_unique<Node>(NodeKind::kGetAttr, line);
        n->text = expect_name();
        n->children.push_back(std::move(obj));
        return deepen(std::move(n));
      }
      if (cur().type == TokenType::kInteger) {
        NodePtr n = std::make_unique<Node>(NodeKind::kGetItem, line);
        n->children.push_back(std::move(obj));
        n->children.push_back(parse_primary());
        return deepen(std::move(n));
      }
      fail(ErrorKind::kSyntax, "expected name or number", line);
    }
    next();  // [
    NodePtr start, stop, step;
    bool slice = false;
    if (!is_op(":")) start = parse_expression(true);
    if (skip_op(":")) {
      slice = true;
      if (!is_op("]") && !is_op(":")) stop = parse_expression(true);
      if (skip_op(":") && !is_op("]")) step = parse_expression(true);
    }
    expect_op("]");
    if (!slice) {
      NodePtr n = std::make_unique<Node>(NodeKind::kGetItem, line);
      n->children.push_back(std::move(obj));
      n->children.push_back(std::move(start));
      return deepen(std::move(n));
    }
    NodePtr n = std::make_unique<Node>(NodeKind::kSlice, line);
    n->children.push_back(std::move(obj));
    n->children.push_back(std::move(start));
    n->children.push_back(std::move(stop));
    n->children.push_back(std::move(step));
    return deepen(std::move(n));
  }

  // "(" args ")" into n's children (after those already there) and keyword.
  void parse_call_args(Node& n) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) fail(ErrorKind::kUnsupported, "*args and **kwargs in calls are not supported", cur().line);
      if (cur().type == TokenType::kName && peek().type == TokenType::kOperator && peek().text == "=") {
        std::string key = expect_name();
        next();  // =
        n.keyword.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!n.keyword.empty()) fail(ErrorKind::kSyntax, "positional argument follows keyword argument", cur().line);
        n.children.push_back(parse_expression(true));
      }
    }
    expect_op(")");
  }

  NodePtr parse_call(NodePtr callee) {
    NodePtr n = node(NodeKind::kCall);
    n->children.push_back(std::move(callee));
    parse_call_args(*n);
    return deepen(std::move(n));
  }

  std::string dotted_name() {
    std::string name = expect_name();
    while (is_op(".") && peek().type == TokenType::kName) {
      next();
      name += "." + expect_name();
    }
    return name;
  }

  NodePtr parse_one_filter(NodePtr operand) {
    NodePtr n = node(NodeKind::kFilter);
    n->text = dotted_name();
    n->children.push_back(std::move(operand));
    if (is_op("(")) parse_call_args(*n);
    return deepen(std::move(n));
  }

  NodePtr parse_filters(NodePtr operand) {
    while (skip_op("|")) operand = parse_one_filter(std::move(operand));
    return operand;
  }

  NodePtr parse_test(NodePtr operand) {
    NodePtr n = node(NodeKind::kTest);
    next();  // is
    n->negated = skip_name("not");
    n->text = dotted_name();
    n->children.push_back(std::move(operand));
    const Token& t = cur();
    if (is_op("(")) {
      parse_call_args(*n);
    } else if ((t.type == TokenType::kName || t.type == TokenType::kString || t.type == TokenType::kInteger ||
                t.type == TokenType::kFloat || is_op("(") || is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) fail(ErrorKind::kSyntax, "you cannot chain multiple tests with is", t.line);
      n->children.push_back(parse_postfix(parse_primary()));
    }
    return deepen(std::move(n));
  }
};

}  // namespace

NodePtr parse_template(const std::vector<Token>& tokens) { return Parser(tokens).run(); }

}  // namespace tandem::jinja
