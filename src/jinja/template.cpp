// The evaluator: statements write into an output string, expressions
// compute Values. Scoping follows Jinja2: a for loop's body gets a fresh
// scope each iteration (what it sets does not leak out, hence namespace()),
// macros and with blocks get their own, if blocks share their parent's.
#include "jinja/template.h"

#include <unordered_map>

#include "jinja/ast.h"
#include "jinja/builtins.h"
#include "jinja/lexer.h"
#include "jinja/operators.h"
#include "jinja/parser.h"

namespace tandem::jinja {
namespace {

struct Scope {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Scope> parent;

  const Value* find(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent.get()) {
      const auto it = s->vars.find(name);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};
using ScopePtr = std::shared_ptr<Scope>;

ScopePtr child(const ScopePtr& parent) {
  auto s = std::make_shared<Scope>();
  s->parent = parent;
  return s;
}

enum class Flow { kNormal, kBreak, kContinue };

// Whether v is or holds a namespace or a function (a bound method holds its
// object, a macro its scope): what could close a cycle through a namespace.
bool contains_namespace(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kNamespace:
    case Value::Kind::kFunction: return true;
    case Value::Kind::kList:
    case Value::Kind::kTuple:
    case Value::Kind::kGenerator:
      for (const Value& x : v.items())
        if (contains_namespace(x)) return true;
      return false;
    case Value::Kind::kDict:
      for (const auto& [k, x] : v.dict_items().items)
        if (contains_namespace(x)) return true;
      return false;
    default: return false;
  }
}

class Interpreter {
 public:
  // `root` outlives every render: macros built from it capture node pointers.
  Interpreter(const RenderOptions& options, std::shared_ptr<const Node> root)
      : rt_{options}, root_(std::move(root)) {}

  std::string run(const Dict& context) {
    auto globals = std::make_shared<Scope>();
    for (auto& [k, v] : make_globals(rt_).items) globals->vars[k.str()] = v;
    ScopePtr top = child(globals);
    for (const auto& [k, v] : context.items)
      if (k.is_string()) top->vars[k.str()] = v;
    std::string out;
    exec(*root_, top, out);
    return out;
  }

 private:
  Runtime rt_;
  std::shared_ptr<const Node> root_;

  void append(std::string& out, std::string_view text) {
    if (out.size() + text.size() > rt_.options.limits.max_output_bytes)
      fail(ErrorKind::kLimit, "the rendered text would exceed " + std::to_string(rt_.options.limits.max_output_bytes) + " bytes");
    out += text;
  }

  // Nested exec/eval frames of this render: each limit (tree depth, macro
  // depth, statement nesting) is bounded alone, but they multiply; this
  // bounds the product, so a render never runs out of stack.
  static constexpr int kMaxFrames = 1500;
  struct Frame {
    int& depth;
    explicit Frame(int& d) : depth(d) {
      if (++depth > kMaxFrames) {
        --depth;
        fail(ErrorKind::kLimit, "the template nests calls and expressions deeper than " + std::to_string(kMaxFrames));
      }
    }
    ~Frame() { --depth; }
  };
  int frames_ = 0;

  Flow exec(const Node& n, const ScopePtr& scope, std::string& out) {
    try {
      Frame frame(frames_);
      return exec_inner(n, scope, out);
    } catch (TemplateError& e) {
      e.set_line_if_unknown(n.line);
      throw;
    }
  }

  Flow exec_body(const Node& body, const ScopePtr& scope, std::string& out) {
    for (const auto& s : body.children) {
      const Flow f = exec(*s, scope, out);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  void assign(const ScopePtr& scope, const std::vector<std::string>& names, const Value& v) {
    if (names.size() == 1) {
      scope->vars[names[0]] = v;
      return;
    }
    const List items = iterate(v);
    if (items.size() != names.size())
      fail(ErrorKind::kRuntime, items.size() < names.size()
                                     ? "not enough values to unpack (expected " + std::to_string(names.size()) + ", got " + std::to_string(items.size()) + ")"
                                     : "too many values to unpack (expected " + std::to_string(names.size()) + ")");
    for (size_t i = 0; i < names.size(); ++i) scope->vars[names[i]] = items[i];
  }

  Flow exec_inner(const Node& n, const ScopePtr& scope, std::string& out) {
    rt_.step();
    switch (n.kind) {
      case NodeKind::kBody: return exec_body(n, scope, out);
      case NodeKind::kText: append(out, n.text); return Flow::kNormal;
      case NodeKind::kPrint: append(out, eval(*n.children[0], scope).to_str()); return Flow::kNormal;
      case NodeKind::kIf: {
        for (size_t i = 0; i + 1 < n.children.size(); i += 2)
          if (eval(*n.children[i], scope).truthy()) return exec(*n.children[i + 1], scope, out);
        if (n.has_else) return exec(*n.children.back(), scope, out);
        return Flow::kNormal;
      }
      case NodeKind::kFor: return exec_for(n, scope, out);
      case NodeKind::kSet: {
        const Value v = eval(*n.children[0], scope);
        if (!n.attr.empty()) {
          const Value* ns = scope->find(n.names[0]);
          if (!ns || ns->kind() != Value::Kind::kNamespace)
            fail(ErrorKind::kRuntime, "cannot assign attribute on non-namespace object");
          // Namespaces are the only mutable values: keeping them out of each
          // other keeps every value a tree (no cycles, a bounded depth).
          if (contains_namespace(v))
            fail(ErrorKind::kUnsupported, "a namespace or function stored in a namespace attribute is not supported");
          ns->namespace_attrs().set(Value(n.attr), v);
        } else {
          assign(scope, n.names, v);
        }
        return Flow::kNormal;
      }
      case NodeKind::kSetBlock: {
        std::string captured;
        exec(*n.children[0], child(scope), captured);  // the body's sets stay inside, as in Jinja2
        Value v(std::move(captured));
        if (n.children[1]) v = apply_filters(*n.children[1], std::move(v), scope);
        scope->vars[n.names[0]] = std::move(v);
        return Flow::kNormal;
      }
      case NodeKind::kMacro: scope->vars[n.text] = make_macro(n, scope); return Flow::kNormal;
      case NodeKind::kBreak: return Flow::kBreak;
      case NodeKind::kContinue: return Flow::kContinue;
      case NodeKind::kFilterBlock: {
        std::string captured;
        exec(*n.children[1], child(scope), captured);
        append(out, apply_filters(*n.children[0], Value(std::move(captured)), scope).to_str());
        return Flow::kNormal;
      }
      case NodeKind::kWith: {
        ScopePtr inner = child(scope);
        for (size_t i = 0; i + 1 < n.children.size(); ++i) inner->vars[n.names[i]] = eval(*n.children[i], scope);
        return exec(*n.children.back(), inner, out);
      }
      default: fail(ErrorKind::kSyntax, "an expression where a statement belongs");
    }
  }

  Flow exec_for(const Node& n, const ScopePtr& scope, std::string& out) {
    const Value iterable = eval(*n.children[0], scope);
    List items = iterate(iterable);
    if (const Node* filter = n.children[3].get()) {  // "for x in xs if cond" filters before loop.* counts
      List kept;
      for (const Value& item : items) {
        ScopePtr s = child(scope);
        assign(s, n.names, item);
        if (eval(*filter, s).truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      // The else body runs outside this loop: a break there is an enclosing loop's.
      if (n.children[2]) return exec(*n.children[2], child(scope), out);
      return Flow::kNormal;
    }
    const auto len = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < len; ++i) {
      rt_.step();
      ScopePtr s = child(scope);
      assign(s, n.names, items[i]);
      Dict loop;
      loop.set(Value("index"), Value(i + 1));
      loop.set(Value("index0"), Value(i));
      loop.set(Value("revindex"), Value(len - i));
      loop.set(Value("revindex0"), Value(len - i - 1));
      loop.set(Value("first"), Value(i == 0));
      loop.set(Value("last"), Value(i == len - 1));
      loop.set(Value("length"), Value(len));
      loop.set(Value("depth"), Value(int64_t{1}));
      loop.set(Value("depth0"), Value(int64_t{0}));
      if (i > 0) loop.set(Value("previtem"), items[i - 1]);
      if (i + 1 < len) loop.set(Value("nextitem"), items[i + 1]);
      loop.set(Value("cycle"), Value::function("cycle", [i](CallArgs& a) {
                 if (a.positional.empty()) fail(ErrorKind::kRuntime, "no items for cycling given");
                 return a.positional[static_cast<size_t>(i) % a.positional.size()];
               }));
      s->vars["loop"] = Value::dict(std::move(loop));
      if (exec(*n.children[1], s, out) == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  Value make_macro(const Node& n, const ScopePtr& defining) {
    const Node* node = &n;
    // A weak reference: the macro lives in the scope it would otherwise keep alive.
    std::weak_ptr<Scope> weak = defining;
    return Value::function(n.text, [this, node, weak](CallArgs& args) {
      ScopePtr parent = weak.lock();
      if (!parent) fail(ErrorKind::kRuntime, "macro '" + node->text + "' called outside the scope that defined it");
      if (++rt_.call_depth > rt_.options.limits.max_call_depth) {
        --rt_.call_depth;
        fail(ErrorKind::kLimit, "macro calls nest deeper than " + std::to_string(rt_.options.limits.max_call_depth));
      }
      struct Depth {
        int& d;
        ~Depth() { --d; }
      } depth{rt_.call_depth};
      const size_t n_params = node->names.size();
      if (args.positional.size() > n_params)
        fail(ErrorKind::kRuntime, "macro '" + node->text + "' takes not more than " + std::to_string(n_params) + " argument(s)");
      ScopePtr s = child(parent);
      std::vector<bool> bound(n_params, false);
      for (size_t i = 0; i < args.positional.size(); ++i) {
        s->vars[node->names[i]] = args.positional[i];
        bound[i] = true;
      }
      for (auto& [k, v] : args.keyword) {
        size_t i = 0;
        while (i < n_params && node->names[i] != k) ++i;
        if (i == n_params) fail(ErrorKind::kRuntime, "macro '" + node->text + "' takes no keyword argument '" + k + "'");
        if (bound[i]) fail(ErrorKind::kRuntime, "macro '" + node->text + "' got multiple values for argument '" + k + "'");
        s->vars[k] = v;
        bound[i] = true;
      }
      for (size_t i = 0; i < n_params; ++i) {
        if (bound[i]) continue;
        const Node* dflt = node->children[i].get();
        s->vars[node->names[i]] = dflt ? eval(*dflt, s) : Value::undefined("parameter '" + node->names[i] + "' was not provided");
      }
      std::string out;
      exec(*node->children.back(), s, out);
      return Value(std::move(out));
    });
  }

  CallArgs eval_args(const Node& n, size_t first, const ScopePtr& scope) {
    CallArgs a;
    for (size_t i = first; i < n.children.size(); ++i) a.positional.push_back(eval(*n.children[i], scope));
    for (const auto& [k, v] : n.keyword) a.keyword.emplace_back(k, eval(*v, scope));
    return a;
  }

  // A filter node; in a filter block or set block the chain's innermost
  // operand is null and `block_input` (the block's text) goes there.
  Value eval_filter(const Node& n, const Value* block_input, const ScopePtr& scope) {
    Value input;
    if (!n.children[0]) {
      input = *block_input;
    } else if (block_input && n.children[0]->kind == NodeKind::kFilter) {
      input = eval_filter(*n.children[0], block_input, scope);
    } else {
      input = eval(*n.children[0], scope);
    }
    CallArgs a = eval_args(n, 1, scope);
    return call_filter(rt_, n.text, input, a);
  }
  Value apply_filters(const Node& chain, const Value& block_input, const ScopePtr& scope) {
    return eval_filter(chain, &block_input, scope);
  }

  Value eval(const Node& n, const ScopePtr& scope) {
    try {
      Frame frame(frames_);
      return eval_inner(n, scope);
    } catch (TemplateError& e) {
      e.set_line_if_unknown(n.line);
      throw;
    }
  }

  Value eval_inner(const Node& n, const ScopePtr& scope) {
    rt_.step();
    switch (n.kind) {
      case NodeKind::kLiteral: return n.value;
      case NodeKind::kName: {
        if (const Value* v = scope->find(n.text)) return *v;
        return Value::undefined("'" + n.text + "' is undefined");
      }
      case NodeKind::kList:
      case NodeKind::kTuple: {
        List items;
        for (const auto& c : n.children) items.push_back(eval(*c, scope));
        return n.kind == NodeKind::kList ? Value::list(std::move(items)) : Value::tuple(std::move(items));
      }
      case NodeKind::kDict: {
        Dict d;
        for (size_t i = 0; i + 1 < n.children.size(); i += 2) {
          Value k = eval(*n.children[i], scope);
          if (k.is_sequence() && k.kind() == Value::Kind::kList) fail(ErrorKind::kRuntime, "unhashable type: 'list'");
          if (k.is_dict()) fail(ErrorKind::kRuntime, "unhashable type: 'dict'");
          d.set(std::move(k), eval(*n.children[i + 1], scope));
        }
        return Value::dict(std::move(d));
      }
      case NodeKind::kGetAttr: return get_attr(eval(*n.children[0], scope), n.text);
      case NodeKind::kGetItem: return get_item(eval(*n.children[0], scope), eval(*n.children[1], scope));
      case NodeKind::kSlice: {
        auto part = [&](size_t i) { return n.children[i] ? eval(*n.children[i], scope) : Value::none(); };
        return get_slice(eval(*n.children[0], scope), part(1), part(2), part(3));
      }
      case NodeKind::kCall: {
        const Value callee = eval(*n.children[0], scope);
        CallArgs a = eval_args(n, 1, scope);
        if (callee.kind() == Value::Kind::kFunction) return callee.func()(a);
        if (callee.is_undefined()) undefined_error(callee);
        fail(ErrorKind::kRuntime, "'" + callee.type_name() + "' object is not callable");
      }
      case NodeKind::kFilter: return eval_filter(n, nullptr, scope);
      case NodeKind::kTest: {
        const Value v = eval(*n.children[0], scope);
        CallArgs a = eval_args(n, 1, scope);
        return Value(call_test(rt_, n.text, v, a) != n.negated);
      }
      case NodeKind::kUnary: {
        const Value v = eval(*n.children[0], scope);
        if (n.text == "not") return Value(!v.truthy());
        return py_unary(n.text, v);
      }
      case NodeKind::kBinary: {
        if (n.text == "and" || n.text == "or") {
          Value left = eval(*n.children[0], scope);
          if (left.truthy() == (n.text == "or")) return left;
          return eval(*n.children[1], scope);
        }
        return py_binary(n.text, eval(*n.children[0], scope), eval(*n.children[1], scope));
      }
      case NodeKind::kCompare: {
        Value left = eval(*n.children[0], scope);
        for (size_t i = 0; i < n.names.size(); ++i) {
          Value right = eval(*n.children[i + 1], scope);
          if (!py_compare(n.names[i], left, right)) return Value(false);
          left = std::move(right);
        }
        return Value(true);
      }
      case NodeKind::kCondExpr: {
        if (eval(*n.children[0], scope).truthy()) return eval(*n.children[1], scope);
        if (n.children[2]) return eval(*n.children[2], scope);
        return Value::undefined("the inline if-expression on line " + std::to_string(n.line) +
                                " evaluated to false and no else section was defined.");
      }
      default: fail(ErrorKind::kSyntax, "a statement where an expression belongs");
    }
  }
};

}  // namespace

Template Template::parse(std::string_view source) {
  Template t;
  t.root_ = std::shared_ptr<const Node>(parse_template(tokenize(source)).release());
  return t;
}

std::string Template::render(const Dict& context, const RenderOptions& options) const {
  if (!root_) fail(ErrorKind::kRuntime, "render of an empty Template");
  return Interpreter(options, root_).run(context);
}

}  // namespace tandem::jinja
