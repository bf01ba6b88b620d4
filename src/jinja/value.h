// Values of the Jinja interpreter, with Python's semantics: what a chat
// template computes with is what the reference implementation (Jinja2 on
// CPython) would compute, down to how a float or a list prints.
//
// Lists and dicts are immutable once built (the templates run as in
// Jinja2's ImmutableSandboxedEnvironment, which refuses append/update/...),
// so values share them; only a namespace() object is mutable.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "jinja/error.h"

namespace tandem::jinja {

class Value;
using List = std::vector<Value>;

// Values nest at most this deep (lists in lists, JSON from a request), so
// printing, comparing and freeing them recurses a bounded amount.
constexpr int kMaxValueDepth = 512;
// A string a template builds (by +, ~, *, replace, indent) is at most this long.
constexpr int64_t kMaxStringBytes = 16 << 20;
// Insertion-ordered, Python-equality keys; a handful of keys per dict in
// chat templates, so a linear scan is the fast choice.
struct Dict {
  std::vector<std::pair<Value, Value>> items;
  const Value* find(const Value& key) const;
  void set(Value key, Value value);
};

// Arguments of a call: positional, then keyword, in the order written.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};
using Function = std::function<Value(CallArgs&)>;

class Value {
 public:
  // kGenerator: what Jinja2's map/select/reject/unique/reverse/items return.
  // It iterates like a list but has no len(), no indexing and no JSON form,
  // and is always true, so a template that relies on more fails as in Jinja2.
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kTuple, kDict, kNamespace, kFunction, kGenerator };

  Value() = default;  // undefined
  static Value undefined(std::string hint = {});
  static Value none();
  Value(bool b);
  Value(int64_t i);
  Value(int i) : Value(static_cast<int64_t>(i)) {}
  Value(double f);
  Value(std::string s);
  Value(const char* s) : Value(std::string(s)) {}
  static Value list(List items);
  static Value tuple(List items);
  static Value generator(List items);
  // A str marked safe (markupsafe's Markup: what |safe and |escape return);
  // adding a plain str to it HTML-escapes that str, as in Jinja2.
  static Value markup(std::string s);
  static Value dict(Dict d);
  static Value make_namespace(Dict attrs);
  static Value function(std::string name, Function f);
  // Throws TemplateError(kLimit) past kMaxValueDepth.
  static Value from_json(const nlohmann::ordered_json& j, int depth = 1);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_markup() const { return kind_ == Kind::kString && markup_; }
  // int or bool (Python's bool is an int)
  bool is_integer() const { return kind_ == Kind::kInt || kind_ == Kind::kBool; }
  bool is_number() const { return is_integer() || kind_ == Kind::kFloat; }
  bool is_sequence() const { return kind_ == Kind::kList || kind_ == Kind::kTuple; }
  bool is_dict() const { return kind_ == Kind::kDict; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return kind_ == Kind::kBool ? (b_ ? 1 : 0) : i_; }
  double as_double() const { return kind_ == Kind::kFloat ? f_ : static_cast<double>(as_int()); }
  const std::string& str() const { return s_; }
  const List& items() const;        // list, tuple or generator
  const Dict& dict_items() const;   // dict
  Dict& namespace_attrs() const;    // namespace (mutable through any copy)
  const Function& func() const { return *fn_; }
  // For an undefined value: what was looked up, for the error message.
  const std::string& undefined_hint() const { return s_; }
  // 1 for a scalar, 1 + the deepest item for a container.
  int depth() const { return depth_; }

  bool truthy() const;
  // Python's str() and repr().
  std::string to_str() const;
  std::string repr() const;
  // Python's type name ("str", "list", "NoneType", ...), for messages.
  std::string type_name() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  bool markup_ = false;
  int depth_ = 1;
  int64_t i_ = 0;
  double f_ = 0.0;
  std::string s_;
  std::shared_ptr<const List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<const Function> fn_;
};

// Python's ==, and < for sortable pairs (throws TemplateError kRuntime for
// types Python cannot order, as CPython raises TypeError).
bool py_equal(const Value& a, const Value& b);
bool py_less(const Value& a, const Value& b);

// json.dumps(v, ensure_ascii=False, indent=indent, separators=..., sort_keys=...)
// as transformers' tojson filter calls it. indent < 0: none.
struct JsonOptions {
  bool ensure_ascii = false;  // \uXXXX for every non-ASCII character
  int indent = -1;
  std::string indent_text;  // when indent is given as a string
  bool indent_is_text = false;
  std::string item_separator;  // empty: Python's default for the indent
  std::string key_separator = ": ";
  bool separators_given = false;
  bool sort_keys = false;
};
std::string to_json(const Value& v, const JsonOptions& options);

// Python's float repr: the shortest text that reads back to the same double.
std::string python_float_repr(double d);

// Unicode-aware helpers on UTF-8 text, as Python's str methods see it.
std::vector<uint32_t> utf8_decode(std::string_view s);
std::string utf8_encode(const std::vector<uint32_t>& cps, size_t begin, size_t end);
bool py_isspace(uint32_t cp);
// str.strip/lstrip/rstrip: chars empty and !chars_given means whitespace.
std::string py_strip(std::string_view s, std::string_view chars, bool chars_given, bool left, bool right);

}  // namespace tandem::jinja
