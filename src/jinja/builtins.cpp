#include "jinja/builtins.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <optional>
#include <unordered_map>

#include "jinja/operators.h"

namespace tandem::jinja {
namespace {

// ---- argument binding, as Python binds a call to a signature ----

class Args {
 public:
  Args(CallArgs& call, std::string fname, std::vector<std::string> params, bool varargs = false)
      : fname_(std::move(fname)), params_(std::move(params)), slots_(params_.size()) {
    size_t i = 0;
    for (; i < call.positional.size() && i < params_.size(); ++i) slots_[i] = call.positional[i];
    for (; i < call.positional.size(); ++i) {
      if (!varargs)
        fail(ErrorKind::kRuntime, fname_ + "() takes at most " + std::to_string(params_.size()) + " positional argument(s)");
      extra_.push_back(call.positional[i]);
    }
    for (auto& [k, v] : call.keyword) {
      const auto it = std::find(params_.begin(), params_.end(), k);
      if (it == params_.end()) {
        kwextra_.emplace_back(k, v);
        continue;
      }
      auto& slot = slots_[it - params_.begin()];
      if (slot) fail(ErrorKind::kRuntime, fname_ + "() got multiple values for argument '" + k + "'");
      slot = v;
    }
  }
  // Keyword arguments the signature does not name are an error unless the
  // caller takes **kwargs (and reads them with keyword_extra()).
  void no_extra_keywords() const {
    if (!kwextra_.empty()) fail(ErrorKind::kRuntime, fname_ + "() got an unexpected keyword argument '" + kwextra_[0].first + "'");
  }
  bool has(size_t i) const { return slots_[i].has_value(); }
  const Value& get(size_t i, const Value& fallback) const { return slots_[i] ? *slots_[i] : fallback; }
  Value get(size_t i) const { return slots_[i] ? *slots_[i] : Value::none(); }
  const Value& required(size_t i) const {
    if (!slots_[i]) fail(ErrorKind::kRuntime, fname_ + "() missing required argument '" + params_[i] + "'");
    return *slots_[i];
  }
  bool flag(size_t i, bool fallback) const { return slots_[i] ? slots_[i]->truthy() : fallback; }
  const std::vector<Value>& extra() const { return extra_; }
  const std::vector<std::pair<std::string, Value>>& keyword_extra() const { return kwextra_; }

 private:
  std::string fname_;
  std::vector<std::string> params_;
  std::vector<std::optional<Value>> slots_;
  std::vector<Value> extra_;
  std::vector<std::pair<std::string, Value>> kwextra_;
};

CallArgs positional(std::vector<Value> v) {
  CallArgs a;
  a.positional = std::move(v);
  return a;
}

int64_t int_arg(const Value& v, const char* what) {
  if (!v.is_integer()) fail(ErrorKind::kRuntime, std::string(what) + ": an integer is required, not " + v.type_name());
  return v.as_int();
}

const std::string& str_arg(const Value& v, const char* what) {
  if (!v.is_string()) fail(ErrorKind::kRuntime, std::string(what) + ": a str is required, not " + v.type_name());
  return v.str();
}

// ---- text helpers (code points; case mapping is ASCII's) ----

char ascii_upper(char c) { return (c >= 'a' && c <= 'z') ? static_cast<char>(c - 32) : c; }
char ascii_lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c + 32) : c; }
bool ascii_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

std::string upper(std::string s) {
  for (char& c : s) c = ascii_upper(c);
  return s;
}
std::string lower(std::string s) {
  for (char& c : s) c = ascii_lower(c);
  return s;
}
// str.islower / str.isupper: at least one cased character, and all of them in that case.
bool ascii_cased(const std::string& s, bool want_lower) {
  bool cased = false;
  for (char c : s) {
    if (!ascii_alpha(c)) continue;
    cased = true;
    if ((c >= 'a' && c <= 'z') != want_lower) return false;
  }
  return cased;
}
std::string capitalize(const std::string& s) {
  std::string out = lower(s);
  if (!out.empty()) out[0] = ascii_upper(out[0]);
  return out;
}
// str.title: a letter after a non-letter is upper case, others lower.
std::string str_title(const std::string& s) {
  std::string out = s;
  bool prev_cased = false;
  for (char& c : out) {
    if (ascii_alpha(c)) {
      c = prev_cased ? ascii_lower(c) : ascii_upper(c);
      prev_cased = true;
    } else {
      prev_cased = static_cast<unsigned char>(c) >= 0x80 && prev_cased;
    }
  }
  return out;
}
// Jinja's title filter: words begin after runs of "-", whitespace, "(", "{", "[", "<".
std::string filter_title(const std::string& s) {
  const std::vector<uint32_t> cps = utf8_decode(s);
  std::string out;
  bool word_start = true;
  for (uint32_t cp : cps) {
    const bool sep = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || py_isspace(cp);
    if (sep) {
      out += utf8_encode({cp}, 0, 1);
      word_start = true;
      continue;
    }
    const char c = cp < 0x80 ? static_cast<char>(cp) : '\0';
    if (c) {
      out += word_start ? ascii_upper(c) : ascii_lower(c);
    } else {
      out += utf8_encode({cp}, 0, 1);
    }
    word_start = false;
  }
  return out;
}

// Byte offset to code point index.
int64_t cp_index(const std::string& s, size_t byte) {
  int64_t n = 0;
  for (size_t i = 0; i < byte && i < s.size(); ++i)
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) ++n;
  return n;
}

std::string str_replace(const std::string& s, const std::string& old, const std::string& repl, int64_t count) {
  // Each replacement adds at most repl's bytes: bound the result before building it.
  const uint64_t hits = old.empty() ? s.size() + 1 : s.size() / old.size();
  if (s.size() + std::min<uint64_t>(hits, count < 0 ? hits : static_cast<uint64_t>(count)) * repl.size() >
      static_cast<uint64_t>(kMaxStringBytes))
    fail(ErrorKind::kLimit, "replace would build a string past the size limit");
  std::string out;
  if (old.empty()) {
    const std::vector<uint32_t> cps = utf8_decode(s);
    int64_t done = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out += repl;
        ++done;
      }
      if (i < cps.size()) out += utf8_encode(cps, i, i + 1);
    }
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t hit = s.find(old, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out += repl;
    pos = hit + old.size();
    ++done;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

Value str_split(const std::string& s, const Value& sep, int64_t maxsplit, bool from_right) {
  List parts;
  if (sep.is_none() || sep.is_undefined()) {
    const std::vector<uint32_t> cps = utf8_decode(s);
    if (!from_right) {
      size_t i = 0;
      while (true) {
        while (i < cps.size() && py_isspace(cps[i])) ++i;
        if (i >= cps.size()) break;
        if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit) {
          size_t e = cps.size();
          parts.emplace_back(utf8_encode(cps, i, e));
          break;
        }
        size_t j = i;
        while (j < cps.size() && !py_isspace(cps[j])) ++j;
        parts.emplace_back(utf8_encode(cps, i, j));
        i = j;
      }
    } else {
      size_t e = cps.size();
      while (true) {
        while (e > 0 && py_isspace(cps[e - 1])) --e;
        if (e == 0) break;
        if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit) {
          parts.emplace_back(utf8_encode(cps, 0, e));
          break;
        }
        size_t b = e;
        while (b > 0 && !py_isspace(cps[b - 1])) --b;
        parts.emplace_back(utf8_encode(cps, b, e));
        e = b;
      }
      std::reverse(parts.begin(), parts.end());
    }
    return Value::list(std::move(parts));
  }
  const std::string& d = str_arg(sep, "split");
  if (d.empty()) fail(ErrorKind::kRuntime, "empty separator");
  if (!from_right) {
    size_t pos = 0;
    while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
      const size_t hit = s.find(d, pos);
      if (hit == std::string::npos) break;
      parts.emplace_back(s.substr(pos, hit - pos));
      pos = hit + d.size();
    }
    parts.emplace_back(s.substr(pos));
  } else {
    size_t end = s.size();
    while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
      if (end < d.size()) break;
      const size_t hit = s.rfind(d, end - d.size());
      if (hit == std::string::npos) break;
      parts.emplace_back(s.substr(hit + d.size(), end - hit - d.size()));
      end = hit;
    }
    parts.emplace_back(s.substr(0, end));
    std::reverse(parts.begin(), parts.end());
  }
  return Value::list(std::move(parts));
}

bool line_break(uint32_t cp) {
  return cp == '\n' || cp == '\r' || cp == 0x0b || cp == 0x0c || cp == 0x1c || cp == 0x1d || cp == 0x1e ||
         cp == 0x85 || cp == 0x2028 || cp == 0x2029;
}

std::vector<std::string> splitlines(const std::string& s, bool keepends) {
  const std::vector<uint32_t> cps = utf8_decode(s);
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t i = 0; i < cps.size(); ++i) {
    if (!line_break(cps[i])) continue;
    size_t end = i + 1;
    if (cps[i] == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') end = i + 2;
    lines.push_back(utf8_encode(cps, start, keepends ? end : i));
    start = end;
    i = end - 1;
  }
  if (start < cps.size()) lines.push_back(utf8_encode(cps, start, cps.size()));
  return lines;
}

bool affix_match(const std::string& s, const Value& affix, bool prefix) {
  auto one = [&](const Value& a) {
    const std::string& x = str_arg(a, prefix ? "startswith" : "endswith");
    if (x.size() > s.size()) return false;
    return prefix ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (affix.kind() == Value::Kind::kTuple) {
    for (const Value& a : affix.items())
      if (one(a)) return true;
    return false;
  }
  return one(affix);
}

// str.format with "{}", "{0}" and "{name}" fields (no format specs).
std::string str_format(const std::string& fmt, CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if (c == '{' && i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      ++i;
    } else if (c == '}' && i + 1 < fmt.size() && fmt[i + 1] == '}') {
      out += '}';
      ++i;
    } else if (c == '{') {
      const size_t close = fmt.find('}', i);
      if (close == std::string::npos) fail(ErrorKind::kRuntime, "Single '{' encountered in format string");
      const std::string field = fmt.substr(i + 1, close - i - 1);
      if (field.find_first_of(":!.[") != std::string::npos)
        fail(ErrorKind::kUnsupported, "str.format field '{" + field + "}' is not supported (only {}, {0} and {name})");
      const Value* v = nullptr;
      if (field.empty() || std::all_of(field.begin(), field.end(), [](char ch) { return std::isdigit(static_cast<unsigned char>(ch)); })) {
        size_t idx = auto_index;
        if (field.empty()) {
          ++auto_index;
        } else if (std::from_chars(field.data(), field.data() + field.size(), idx).ec != std::errc()) {
          fail(ErrorKind::kRuntime, "Replacement index " + field + " out of range for positional args tuple");
        }
        if (idx >= args.positional.size()) fail(ErrorKind::kRuntime, "Replacement index " + std::to_string(idx) + " out of range for positional args tuple");
        v = &args.positional[idx];
      } else {
        for (auto& [k, kv] : args.keyword)
          if (k == field) v = &kv;
        if (!v) fail(ErrorKind::kRuntime, "KeyError: '" + field + "'");
      }
      out += v->to_str();
      i = close;
    } else if (c == '}') {
      fail(ErrorKind::kRuntime, "Single '}' encountered in format string");
    } else {
      out += c;
    }
  }
  return out;
}

Value bound(const std::string& name, Function f) { return Value::function(name, std::move(f)); }

Value unsafe(const std::string& attr, const Value& obj) {
  const std::string msg = "access to attribute '" + attr + "' of '" + obj.type_name() + "' object is unsafe (the sandbox keeps lists and dicts immutable)";
  return bound(attr, [msg](CallArgs&) -> Value { fail(ErrorKind::kRuntime, msg); });
}

Value string_method(const Value& obj, const std::string& name) {
  const std::string s = obj.str();
  auto strip = [s](bool l, bool r, const char* fname) {
    return [s, l, r, fname](CallArgs& a) {
      Args args(a, fname, {"chars"});
      args.no_extra_keywords();
      const Value chars = args.get(0);
      if (chars.is_none()) return Value(py_strip(s, "", false, l, r));
      return Value(py_strip(s, str_arg(chars, fname), true, l, r));
    };
  };
  if (name == "strip") return bound(name, strip(true, true, "strip"));
  if (name == "lstrip") return bound(name, strip(true, false, "lstrip"));
  if (name == "rstrip") return bound(name, strip(false, true, "rstrip"));
  if (name == "split" || name == "rsplit") {
    const bool right = name == "rsplit";
    return bound(name, [s, right](CallArgs& a) {
      Args args(a, right ? "rsplit" : "split", {"sep", "maxsplit"});
      args.no_extra_keywords();
      return str_split(s, args.get(0), int_arg(args.get(1, Value(int64_t{-1})), "maxsplit"), right);
    });
  }
  if (name == "splitlines")
    return bound(name, [s](CallArgs& a) {
      Args args(a, "splitlines", {"keepends"});
      args.no_extra_keywords();
      List out;
      for (auto& l : splitlines(s, args.flag(0, false))) out.emplace_back(std::move(l));
      return Value::list(std::move(out));
    });
  if (name == "startswith" || name == "endswith") {
    const bool prefix = name == "startswith";
    return bound(name, [s, prefix](CallArgs& a) {
      Args args(a, prefix ? "startswith" : "endswith", {"prefix"});
      args.no_extra_keywords();
      return Value(affix_match(s, args.required(0), prefix));
    });
  }
  auto simple = [&](std::function<Value()> f) { return bound(name, [f, name](CallArgs& a) {
                                                  Args args(a, name, {});
                                                  args.no_extra_keywords();
                                                  return f();
                                                }); };
  if (name == "upper") return simple([s] { return Value(upper(s)); });
  if (name == "lower") return simple([s] { return Value(lower(s)); });
  if (name == "title") return simple([s] { return Value(str_title(s)); });
  if (name == "capitalize") return simple([s] { return Value(capitalize(s)); });
  auto all_of = [s](auto pred) {
    if (s.empty()) return Value(false);
    return Value(std::all_of(s.begin(), s.end(), [&](char c) { return pred(static_cast<unsigned char>(c)); }));
  };
  if (name == "isdigit" || name == "isnumeric" || name == "isdecimal")
    return simple([all_of] { return all_of([](unsigned char c) { return std::isdigit(c) != 0; }); });
  if (name == "isalpha") return simple([all_of] { return all_of([](unsigned char c) { return std::isalpha(c) != 0 || c >= 0x80; }); });
  if (name == "isalnum") return simple([all_of] { return all_of([](unsigned char c) { return std::isalnum(c) != 0 || c >= 0x80; }); });
  if (name == "isspace")
    return simple([s] {
      const auto cps = utf8_decode(s);
      return Value(!cps.empty() && std::all_of(cps.begin(), cps.end(), py_isspace));
    });
  if (name == "islower" || name == "isupper") {
    const bool want_lower = name == "islower";
    return simple([s, want_lower] { return Value(ascii_cased(s, want_lower)); });
  }
  if (name == "replace")
    return bound(name, [s](CallArgs& a) {
      Args args(a, "replace", {"old", "new", "count"});
      args.no_extra_keywords();
      return Value(str_replace(s, str_arg(args.required(0), "replace"), str_arg(args.required(1), "replace"),
                               int_arg(args.get(2, Value(int64_t{-1})), "count")));
    });
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    return bound(name, [s, name](CallArgs& a) {
      Args args(a, name, {"sub"});
      args.no_extra_keywords();
      const std::string& sub = str_arg(args.required(0), name.c_str());
      if (name == "count") {
        if (sub.empty()) return Value(cp_index(s, s.size()) + 1);
        int64_t n = 0;
        for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
        return Value(n);
      }
      const size_t hit = (name == "find" || name == "index") ? s.find(sub) : s.rfind(sub);
      if (hit == std::string::npos) {
        if (name == "index" || name == "rindex") fail(ErrorKind::kRuntime, "substring not found");
        return Value(int64_t{-1});
      }
      return Value(cp_index(s, hit));
    });
  }
  if (name == "join")
    return bound(name, [s](CallArgs& a) {
      Args args(a, "join", {"iterable"});
      args.no_extra_keywords();
      std::string out;
      bool first = true;
      for (const Value& v : iterate(args.required(0))) {
        if (!v.is_string()) fail(ErrorKind::kRuntime, "sequence item: expected str instance, " + v.type_name() + " found");
        if (!first) out += s;
        first = false;
        out += v.str();
      }
      return Value(std::move(out));
    });
  if (name == "removeprefix" || name == "removesuffix") {
    const bool prefix = name == "removeprefix";
    return bound(name, [s, prefix](CallArgs& a) {
      Args args(a, prefix ? "removeprefix" : "removesuffix", {"affix"});
      args.no_extra_keywords();
      const std::string& x = str_arg(args.required(0), "removeprefix");
      if (x.size() <= s.size()) {
        if (prefix && s.compare(0, x.size(), x) == 0) return Value(s.substr(x.size()));
        if (!prefix && s.compare(s.size() - x.size(), x.size(), x) == 0) return Value(s.substr(0, s.size() - x.size()));
      }
      return Value(s);
    });
  }
  if (name == "format") return bound(name, [s](CallArgs& a) { return Value(str_format(s, a)); });
  return Value::undefined("'str object' has no attribute '" + name + "'");
}

Value dict_method(const Value& obj, const std::string& name) {
  if (name == "items" || name == "keys" || name == "values") {
    return bound(name, [obj, name](CallArgs& a) {
      Args args(a, name, {});
      args.no_extra_keywords();
      List out;
      for (const auto& [k, v] : obj.dict_items().items) {
        if (name == "items") out.push_back(Value::tuple({k, v}));
        else out.push_back(name == "keys" ? k : v);
      }
      return Value::list(std::move(out));
    });
  }
  if (name == "get")
    return bound(name, [obj](CallArgs& a) {
      Args args(a, "get", {"key", "default"});
      args.no_extra_keywords();
      const Value* v = obj.dict_items().find(args.required(0));
      return v ? *v : args.get(1);
    });
  if (name == "copy") return bound(name, [obj](CallArgs&) { return obj; });
  if (name == "clear" || name == "pop" || name == "popitem" || name == "setdefault" || name == "update")
    return unsafe(name, obj);
  return Value();  // not a method
}

Value list_method(const Value& obj, const std::string& name) {
  if (name == "index" || name == "count") {
    return bound(name, [obj, name](CallArgs& a) {
      Args args(a, name, {"value"});
      args.no_extra_keywords();
      const Value& x = args.required(0);
      int64_t n = 0;
      for (size_t i = 0; i < obj.items().size(); ++i) {
        if (!py_equal(obj.items()[i], x)) continue;
        if (name == "index") return Value(static_cast<int64_t>(i));
        ++n;
      }
      if (name == "index") fail(ErrorKind::kRuntime, x.repr() + " is not in list");
      return Value(n);
    });
  }
  if (name == "append" || name == "extend" || name == "insert" || name == "pop" || name == "remove" ||
      name == "reverse" || name == "sort" || name == "clear")
    return unsafe(name, obj);
  return Value();
}

// Python's object name in Jinja's messages: "'dict object' has no attribute ...".
std::string no_attribute(const Value& obj, const std::string& name) {
  return "'" + obj.type_name() + " object' has no attribute '" + name + "'";
}

}  // namespace

[[noreturn]] void undefined_error(const Value& v) {
  fail(ErrorKind::kRuntime, v.undefined_hint().empty() ? "undefined value" : v.undefined_hint());
}

Value get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) undefined_error(obj);
  if (!name.empty() && name[0] == '_') return Value::undefined("access to attribute '" + name + "' is unsafe");
  switch (obj.kind()) {
    case Value::Kind::kDict: {
      Value m = dict_method(obj, name);
      if (!m.is_undefined()) return m;
      if (const Value* v = obj.dict_items().find(Value(name))) return *v;
      return Value::undefined(no_attribute(obj, name));
    }
    case Value::Kind::kNamespace:
      if (const Value* v = obj.namespace_attrs().find(Value(name))) return *v;
      return Value::undefined(no_attribute(obj, name));
    case Value::Kind::kString: return string_method(obj, name);
    case Value::Kind::kList:
    case Value::Kind::kTuple: {
      Value m = list_method(obj, name);
      if (!m.is_undefined()) return m;
      return Value::undefined(no_attribute(obj, name));
    }
    default: return Value::undefined(no_attribute(obj, name));
  }
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) undefined_error(obj);
  switch (obj.kind()) {
    case Value::Kind::kDict:
      if (const Value* v = obj.dict_items().find(key)) return *v;
      break;
    case Value::Kind::kList:
    case Value::Kind::kTuple:
    case Value::Kind::kString:
      if (key.is_integer()) {
        int64_t i = key.as_int();
        if (obj.is_string()) {
          const std::vector<uint32_t> cps = utf8_decode(obj.str());
          const auto n = static_cast<int64_t>(cps.size());
          if (i < 0) i += n;
          if (i < 0 || i >= n) return Value::undefined("string index out of range");
          return Value(utf8_encode(cps, i, i + 1));
        }
        const auto n = static_cast<int64_t>(obj.items().size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) return Value::undefined(obj.type_name() + " index out of range");
        return obj.items()[i];
      }
      break;
    default: break;
  }
  if (key.is_string()) return get_attr(obj, key.str());
  return Value::undefined(no_attribute(obj, key.to_str()));
}

Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (obj.is_undefined()) undefined_error(obj);
  auto opt = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_none() || v.is_undefined()) return std::nullopt;
    return int_arg(v, what);
  };
  const std::optional<int64_t> st = opt(step, "slice step");
  const int64_t k = st.value_or(1);
  if (k == 0) fail(ErrorKind::kRuntime, "slice step cannot be zero");
  std::vector<uint32_t> cps;
  int64_t n = 0;
  if (obj.is_string()) {
    cps = utf8_decode(obj.str());
    n = static_cast<int64_t>(cps.size());
  } else if (obj.is_sequence()) {
    n = static_cast<int64_t>(obj.items().size());
  } else {
    fail(ErrorKind::kRuntime, "'" + obj.type_name() + "' object is not subscriptable");
  }
  auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t x = *v;
    if (x < 0) x += n;
    if (k > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  const int64_t b = clamp(opt(start, "slice start"), k > 0 ? 0 : n - 1);
  const int64_t e = clamp(opt(stop, "slice stop"), k > 0 ? n : -1);
  // The count first (in 128 bits: a step near INT64_MAX must not wrap the index).
  const __int128 span = k > 0 ? static_cast<__int128>(e) - b : static_cast<__int128>(b) - e;
  const __int128 stride = k > 0 ? static_cast<__int128>(k) : -static_cast<__int128>(k);
  const int64_t count = span <= 0 ? 0 : static_cast<int64_t>((span + stride - 1) / stride);
  std::vector<int64_t> idx;
  for (int64_t j = 0; j < count; ++j) idx.push_back(static_cast<int64_t>(b + j * static_cast<__int128>(k)));
  if (obj.is_string()) {
    std::string out;
    for (int64_t i : idx) out += utf8_encode(cps, i, i + 1);
    return Value(std::move(out));
  }
  List out;
  for (int64_t i : idx) out.push_back(obj.items()[i]);
  return obj.kind() == Value::Kind::kTuple ? Value::tuple(std::move(out)) : Value::list(std::move(out));
}

List iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return {};
    case Value::Kind::kList:
    case Value::Kind::kTuple:
    case Value::Kind::kGenerator: return v.items();
    case Value::Kind::kDict: {
      List keys;
      for (const auto& [k, x] : v.dict_items().items) keys.push_back(k);
      return keys;
    }
    case Value::Kind::kString: {
      const std::vector<uint32_t> cps = utf8_decode(v.str());
      List chars;
      for (size_t i = 0; i < cps.size(); ++i) chars.emplace_back(utf8_encode(cps, i, i + 1));
      return chars;
    }
    default: fail(ErrorKind::kRuntime, "'" + v.type_name() + "' object is not iterable");
  }
}

int64_t py_len(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return 0;
    case Value::Kind::kString: return cp_index(v.str(), v.str().size());
    case Value::Kind::kList:
    case Value::Kind::kTuple: return static_cast<int64_t>(v.items().size());
    case Value::Kind::kDict: return static_cast<int64_t>(v.dict_items().items.size());
    default: fail(ErrorKind::kRuntime, "object of type '" + v.type_name() + "' has no len()");
  }
}

namespace {

// ---- filters ----

// Jinja's attribute paths ("a.b", "0"): each part an item lookup.
Value attribute_path(const Value& item, const std::string& path) {
  Value v = item;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
    int64_t index = 0;
    const bool is_index = digits && std::from_chars(part.data(), part.data() + part.size(), index).ec == std::errc();
    if (digits && !is_index) fail(ErrorKind::kRuntime, "attribute index " + part + " is out of range");
    v = get_item(v, is_index ? Value(index) : Value(part));
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

Value ignore_case(const Value& v, bool case_sensitive) {
  return (!case_sensitive && v.is_string()) ? Value(lower(v.str())) : v;
}

std::function<Value(const Value&)> key_getter(const Value& attribute, bool case_sensitive) {
  if (attribute.is_none() || attribute.is_undefined())
    return [case_sensitive](const Value& v) { return ignore_case(v, case_sensitive); };
  if (attribute.is_integer()) {
    const Value idx = attribute;
    return [idx, case_sensitive](const Value& v) { return ignore_case(get_item(v, idx), case_sensitive); };
  }
  const std::string path = str_arg(attribute, "attribute");
  if (path.find(',') != std::string::npos) {  // several attributes: a tuple key
    std::vector<std::string> paths;
    size_t s = 0;
    for (size_t c = path.find(','); ; c = path.find(',', s)) {
      paths.push_back(path.substr(s, c == std::string::npos ? std::string::npos : c - s));
      if (c == std::string::npos) break;
      s = c + 1;
    }
    return [paths, case_sensitive](const Value& v) {
      List parts;
      for (const auto& p : paths) parts.push_back(ignore_case(attribute_path(v, p), case_sensitive));
      return Value::list(std::move(parts));
    };
  }
  return [path, case_sensitive](const Value& v) { return ignore_case(attribute_path(v, path), case_sensitive); };
}

List sorted(List items, const std::function<Value(const Value&)>& key, bool reverse) {
  std::vector<std::pair<Value, size_t>> keyed;
  for (size_t i = 0; i < items.size(); ++i) keyed.emplace_back(key(items[i]), i);
  std::stable_sort(keyed.begin(), keyed.end(), [reverse](const auto& a, const auto& b) {
    return reverse ? py_less(b.first, a.first) : py_less(a.first, b.first);
  });
  List out;
  for (const auto& [k, i] : keyed) out.push_back(items[i]);
  return out;
}

Value min_max(const Value& seq, Args& args, bool want_max) {
  const auto key = key_getter(args.get(1), args.flag(0, false));
  const List items = iterate(seq);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  Value best_key = key(items[0]);
  for (size_t i = 1; i < items.size(); ++i) {
    Value k = key(items[i]);
    if (want_max ? py_less(best_key, k) : py_less(k, best_key)) {
      best = i;
      best_key = std::move(k);
    }
  }
  return items[best];
}

std::string indent(std::string s, const Value& width, bool first, bool blank) {
  const int64_t n = width.is_string() ? 0 : int_arg(width, "indent");
  if (n > kMaxStringBytes) fail(ErrorKind::kLimit, "indent width past the string size limit");
  const std::string pad = width.is_string() ? width.str() : std::string(std::max<int64_t>(0, n), ' ');
  s += "\n";  // Jinja's own quirk, so that splitlines keeps a trailing empty line
  const std::vector<std::string> lines = splitlines(s, false);
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) rv += (i ? "\n" + pad : "") + lines[i];
  } else if (!lines.empty()) {
    rv = lines[0];
    for (size_t i = 1; i < lines.size(); ++i) rv += "\n" + (lines[i].empty() ? "" : pad + lines[i]);
  }
  if (first) rv = pad + rv;
  return rv;
}


Value round_value(const Value& v, int64_t precision, const std::string& method) {
  if (!v.is_number()) fail(ErrorKind::kRuntime, "type " + v.type_name() + " doesn't define __round__ method");
  if (method != "common" && method != "ceil" && method != "floor")
    fail(ErrorKind::kRuntime, "method must be common, ceil or floor");
  if (method == "common") {
    if (v.is_integer()) return Value(v.as_int());  // round(int, n) stays an int
    if (precision == 0) return Value(std::nearbyint(v.as_double()));
    char buf[512];
    std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(std::clamp<int64_t>(precision, 0, 300)), v.as_double());
    return Value(std::strtod(buf, nullptr));
  }
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double x = v.as_double() * scale;
  return Value((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
}

Value to_json_filter(const Value& v, Args& args) {
  JsonOptions o;
  o.ensure_ascii = args.flag(0, false);
  const Value indent_v = args.get(1);
  if (indent_v.is_string()) {
    o.indent_is_text = true;
    o.indent_text = indent_v.str();
  } else if (!indent_v.is_none()) {
    o.indent = static_cast<int>(std::clamp<int64_t>(int_arg(indent_v, "indent"), 0, 4096));
    if (int_arg(indent_v, "indent") > 4096) fail(ErrorKind::kLimit, "tojson indent past 4096");
  }
  const Value seps = args.get(2);
  if (!seps.is_none()) {
    if (!seps.is_sequence() || seps.items().size() != 2) fail(ErrorKind::kRuntime, "separators must be a pair of strings");
    o.separators_given = true;
    o.item_separator = str_arg(seps.items()[0], "separators");
    o.key_separator = str_arg(seps.items()[1], "separators");
  }
  o.sort_keys = args.flag(3, false);
  return Value(to_json(v, o));
}

// The test a select/reject/selectattr/rejectattr call names, with its arguments.
std::function<bool(const Value&)> test_func(Runtime& rt, const std::vector<Value>& extra, size_t from) {
  if (extra.size() <= from) return [](const Value& v) { return v.truthy(); };
  const std::string name = str_arg(extra[from], "test name");
  std::vector<Value> targs(extra.begin() + from + 1, extra.end());
  return [&rt, name, targs](const Value& v) {
    CallArgs a = positional(targs);
    return call_test(rt, name, v, a);
  };
}

Value select_filter(Runtime& rt, const Value& seq, CallArgs& call, bool attr, bool keep) {
  Args args(call, attr ? (keep ? "selectattr" : "rejectattr") : (keep ? "select" : "reject"), {}, true);
  args.no_extra_keywords();
  const std::vector<Value>& extra = args.extra();
  std::function<Value(const Value&)> get = [](const Value& v) { return v; };
  if (attr) {
    if (extra.empty()) fail(ErrorKind::kRuntime, "Missing parameter for attribute name");
    get = key_getter(extra[0], true);
  }
  const auto test = test_func(rt, extra, attr ? 1 : 0);
  List out;
  if (seq.truthy()) {  // Jinja2 yields nothing for a false value, none included
    for (const Value& v : iterate(seq)) {
      rt.step();
      if (test(get(v)) == keep) out.push_back(v);
    }
  }
  return Value::generator(std::move(out));
}

Value map_filter(Runtime& rt, const Value& seq, CallArgs& call) {
  Args args(call, "map", {}, true);
  const List items = seq.truthy() ? iterate(seq) : List{};  // nothing for a false value, as Jinja2
  List out;
  if (args.extra().empty()) {
    Value attribute, dflt;
    bool has_default = false;
    for (const auto& [k, v] : args.keyword_extra()) {
      if (k == "attribute") attribute = v;
      else if (k == "default") dflt = v, has_default = true;
      else fail(ErrorKind::kRuntime, "Unexpected keyword argument '" + k + "'");
    }
    if (attribute.is_undefined()) fail(ErrorKind::kRuntime, "map requires a filter name or attribute=");
    const auto get = key_getter(attribute, true);
    for (const Value& v : items) {
      Value x = get(v);
      out.push_back(x.is_undefined() && has_default ? dflt : x);
    }
    return Value::generator(std::move(out));
  }
  const std::string name = str_arg(args.extra()[0], "filter name");
  for (const Value& v : items) {
    rt.step();
    CallArgs a;
    a.positional.assign(args.extra().begin() + 1, args.extra().end());
    a.keyword = args.keyword_extra();
    out.push_back(call_filter(rt, name, v, a));
  }
  return Value::generator(std::move(out));
}

using FilterFn = Value (*)(Runtime&, const Value&, CallArgs&);

const std::unordered_map<std::string, FilterFn>& filters() {
  static const std::unordered_map<std::string, FilterFn> table = [] {
    std::unordered_map<std::string, FilterFn> t;
    t["abs"] = [](Runtime&, const Value& v, CallArgs& a) {
      Args(a, "abs", {}).no_extra_keywords();
      if (v.kind() == Value::Kind::kFloat) return Value(std::fabs(v.as_double()));
      if (!v.is_integer()) fail(ErrorKind::kRuntime, "bad operand type for abs(): '" + v.type_name() + "'");
      return Value(v.as_int() < 0 ? py_unary("-", v) : Value(v.as_int()));
    };
    t["attr"] = [](Runtime&, const Value& v, CallArgs& a) {
      Args args(a, "attr", {"name"});
      args.no_extra_keywords();
      return get_attr(v, str_arg(args.required(0), "attr"));
    };
    t["capitalize"] = [](Runtime&, const Value& v, CallArgs& a) {
      Args(a, "capitalize", {}).no_extra_keywords();
      return Value(capitalize(v.to_str()));
    };
    t["length"] = t["count"] = [](Runtime&, const Value& v, CallArgs& a) {
      Args(a, "length", {}).no_extra_keywords();
      return Value(py_len(v));
    };
    t["default"] = t["d"] = [](Runtime&, const Value& v, CallArgs& a) {
      Args args(a, "default", {"default_value", "boolean"});
      args.no_extra_keywords();
      const bool use_default = v.is_undefined() || (args.flag(1, false) && !v.truthy());
      return use_default ? args.get(0, Value(std::string())) : v;
    };
    t["dictsort"] = [](Runtime&, const Value& v, CallArgs& a) {
      Args args(a, "dictsort", {"case_sensitive", "by", "reverse"});
      args.no_extra_keywords();
      if (!v.is_dict()) fail(ErrorKind::kRuntime, "dictsort: a mapping is required, not " + v.type_name());
      const std::string by = str_arg(args.get(1, Value("key")), "by");
      if (by != "key" && by != "value") fail(ErrorKind::kRuntime, "You can only sort by either \"key\" or \"value\"");
      const bool cs = args.flag(0, false);
      List pairs;
      for (const auto& [k, x] : v.dict_items().items) pairs.push_back(Value::tuple({k, x}));
      const size_t pos = by == "key" ? 0 : 1;
      return Value::list(sorted(pairs, [pos, cs](const Value& p) { return ignore_case(p.items()[pos], cs); }, args.flag(2, false)));
    };
    t["escape"] = t["e"] = [](Runtime&, const Value& v, CallArgs& a) {
      Args(a, "escape", {}).no_extra_keywords();
      return v.is_markup() ? v : Value::markup(html_escape(v.to_str()));
    };
    t["first"] = [](Runtime&, const Value& v, CallArgs& a) {
      Args(a, "first", {}).no_extra_keywords();
      const List items = iterate(v);
      return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
    };
    t["last"] = [](Runtime&, const Value& v, CallArgs& a) {
      Args(a, "last", {}).no_extra_keywords();
      if (v.kind() == Value::Kind::kGenerator) fail(ErrorKind::kRuntime, "'generator' object is not reversible");
      const List items = iterate(v);
      return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
    };
    t["float"] = [](Runtime&, const Value& v, CallArgs& a) {
      Args args(a, "float", {"default"});
      args.no_extra_keywords();
      if (v.is_undefined()) undefined_error(v);
      if (v.is_number()) return Value(v.as_double());
      double d = 0;
      if (v.is_string() && py_parse_float(v.str(), d)) return Value(d);
      return args.get(0, Value(0.0));
    };
    t["int"] = [](Runtime&, const Value& v, CallArgs& a) {
      Args args(a, "int", {"default", "base"});
      args.no_extra_keywords();
      if (v.is_undefined()) undefined_error(v);
      if (v.is_integer()) return Value(v.as_int());
      if (v.kind() == Value::Kind::kFloat) {
        if (!std::isfinite(v.as_double()) || std::fabs(v.as_double()) >= 9.2e18) return args.get(0, Value(int64_t{0}));
        return Value(static_cast<int64_t>(v.as_double()));
      }
      if (v.is_string()) {
        int64_t i = 0;
        if (py_parse_int(v.str(), static_cast<int>(int_arg(args.get(1, Value(int64_t{10})), "base")), i)) return Value(i);
        double d = 0;
        if (py_parse_float(v.str(), d) && std::isfinite(d) && std::fabs(d) < 9.2e18) return Value(static_cast<int64_t>(d));
      }
      return args.get(0, Value(int64_t{0}));
    };
    t["format"] = [](Runtime&, const Value& v, CallArgs& a) {
      Args args(a, "format", {}, true);
      if (!args.keyword_extra().empty()) fail(ErrorKind::kUnsupported, "format with keyword arguments is not supported");
      return Value(py_percent_format(v.to_str(), Value::tuple(args.extra())));
    };
    t["indent"] = [](Runtime&, const Value& v, CallArgs& a) {
      Args args(a, "indent", {"width", "first", "blank"});
      args.no_extra_keywords();
      return Value(indent(v.to_str(), args.get(0, Value(int64_t{4})), args.flag(1, false), args.flag(2, false)));
    };
    t["items"] = [](Runtime&, const Value& v, CallArgs& a) {
      Args(a, "items", {}).no_extra_keywords();
      if (v.is_undefined()) return Value::generator({});
      if (!v.is_dict()) fail(ErrorKind::kRuntime, "Can only get item pairs from a mapping.");
      List out;
      for (const auto& [k, x] : v.dict_items().items) out.push_back(Value::tuple({k, x}));
      return Value::generator(std::move(out));
    };
    t["join"] = [](Runtime&, const Value& v, CallArgs& a) {
      Args args(a, "join", {"d", "attribute"});
      args.no_extra_keywords();
      const std::string sep = args.get(0, Value(std::string())).to_str();
      const bool by_attr = !args.get(1).is_none();
      const auto get = by_attr ? key_getter(args.get(1), true) : [](const Value& x) { return x; };
      std::string out;
      bool first = true;
      for (const Value& x : iterate(v)) {
        if (!first) out += sep;
        first = false;
        out += get(x).to_str();
      }
      return Value(std::move(out));
    };
    t["list"] = [](Runtime&, const Value& v, CallArgs& a) {
      Args(a, "list", {}).no_extra_keywords();
      return Value::list(iterate(v));
    };
    t["lower"] = [](Runtime&, const Value& v, CallArgs& a) {
      Args(a, "lower", {}).no_extra_keywords();
      return Value(lower(v.to_str()));
    };
    t["upper"] = [](Runtime&, const Value& v, CallArgs& a) {
      Args(a, "upper", {}).no_extra_keywords();
      return Value(upper(v.to_str()));
    };
    t["map"] = [](Runtime& rt, const Value& v, CallArgs& a) { return map_filter(rt, v, a); };
    t["max"] = [](Runtime&, const Value& v, CallArgs& a) {
      Args args(a, "max", {"case_sensitive", "attribute"});
      args.no_extra_keywords();
      return min_max(v, args, true);
    };
    t["min"] = [](Runtime&, const Value& v, CallArgs& a) {
      Args args(a, "min", {"case_sensitive", "attribute"});
      args.no_extra_keywords();
      return min_max(v, args, false);
    };
    t["replace"] = [](Runtime&, const Value& v, CallArgs& a) {
      Args args(a, "replace", {"old", "new", "count"});
      args.no_extra_keywords();
      const Value count = args.get(2);
      return Value(str_replace(v.to_str(), args.required(0).to_str(), args.required(1).to_str(),
                               count.is_none() ? -1 : int_arg(count, "count")));
    };
    t["select"] = [](Runtime& rt, const Value& v, CallArgs& a) { return select_filter(rt, v, a, false, true); };
    t["reject"] = [](Runtime& rt, const Value& v, CallArgs& a) { return select_filter(rt, v, a, false, false); };
    t["selectattr"] = [](Runtime& rt, const Value& v, CallArgs& a) { return select_filter(rt, v, a, true, true); };
    t["rejectattr"] = [](Runtime& rt, const Value& v, CallArgs& a) { return select_filter(rt, v, a, true, false); };
    t["reverse"] = [](Runtime&, const Value& v, CallArgs& a) {
      Args(a, "reverse", {}).no_extra_keywords();
      if (v.is_string()) return get_slice(v, Value::none(), Value::none(), Value(int64_t{-1}));
      List items = iterate(v);
      std::reverse(items.begin(), items.end());
      // A reverse iterator in Jinja2, except for what reversed() refuses
      // (a generator), which it reverses into a list.
      if (v.kind() == Value::Kind::kGenerator) return Value::list(std::move(items));
      return Value::generator(std::move(items));
    };
    t["round"] = [](Runtime&, const Value& v, CallArgs& a) {
      Args args(a, "round", {"precision", "method"});
      args.no_extra_keywords();
      return round_value(v, int_arg(args.get(0, Value(int64_t{0})), "precision"), str_arg(args.get(1, Value("common")), "method"));
    };
    t["safe"] = [](Runtime&, const Value& v, CallArgs& a) {
      Args(a, "safe", {}).no_extra_keywords();
      return Value::markup(v.to_str());
    };
    t["sort"] = [](Runtime&, const Value& v, CallArgs& a) {
      Args args(a, "sort", {"reverse", "case_sensitive", "attribute"});
      args.no_extra_keywords();
      return Value::list(sorted(iterate(v), key_getter(args.get(2), args.flag(1, false)), args.flag(0, false)));
    };
    t["string"] = [](Runtime&, const Value& v, CallArgs& a) {
      Args(a, "string", {}).no_extra_keywords();
      return Value(v.to_str());
    };
    t["sum"] = [](Runtime&, const Value& v, CallArgs& a) {
      Args args(a, "sum", {"attribute", "start"});
      args.no_extra_keywords();
      const bool by_attr = !args.get(0).is_none();
      const auto get = by_attr ? key_getter(args.get(0), true) : [](const Value& x) { return x; };
      Value total = args.get(1, Value(int64_t{0}));
      for (const Value& x : iterate(v)) total = py_binary("+", total, get(x));
      return total;
    };
    t["title"] = [](Runtime&, const Value& v, CallArgs& a) {
      Args(a, "title", {}).no_extra_keywords();
      return Value(filter_title(v.to_str()));
    };
    t["tojson"] = [](Runtime&, const Value& v, CallArgs& a) {
      Args args(a, "tojson", {"ensure_ascii", "indent", "separators", "sort_keys"});
      args.no_extra_keywords();
      return to_json_filter(v, args);
    };
    t["trim"] = [](Runtime&, const Value& v, CallArgs& a) {
      Args args(a, "trim", {"chars"});
      args.no_extra_keywords();
      const Value chars = args.get(0);
      if (chars.is_none()) return Value(py_strip(v.to_str(), "", false, true, true));
      return Value(py_strip(v.to_str(), str_arg(chars, "trim"), true, true, true));
    };
    t["unique"] = [](Runtime&, const Value& v, CallArgs& a) {
      Args args(a, "unique", {"case_sensitive", "attribute"});
      args.no_extra_keywords();
      const auto key = key_getter(args.get(1), args.flag(0, false));
      List out, seen;
      for (const Value& x : iterate(v)) {
        Value k = key(x);
        if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return py_equal(s, k); })) continue;
        seen.push_back(std::move(k));
        out.push_back(x);
      }
      return Value::generator(std::move(out));
    };
    return t;
  }();
  return table;
}

// ---- tests ----

using TestFn = bool (*)(const Value&, Args&);

const std::unordered_map<std::string, std::pair<TestFn, std::vector<std::string>>>& tests() {
  using K = Value::Kind;
  static const std::unordered_map<std::string, std::pair<TestFn, std::vector<std::string>>> table = [] {
    std::unordered_map<std::string, std::pair<TestFn, std::vector<std::string>>> t;
    t["defined"] = {[](const Value& v, Args&) { return !v.is_undefined(); }, {}};
    t["undefined"] = {[](const Value& v, Args&) { return v.is_undefined(); }, {}};
    t["none"] = {[](const Value& v, Args&) { return v.is_none(); }, {}};
    t["boolean"] = {[](const Value& v, Args&) { return v.kind() == K::kBool; }, {}};
    t["true"] = {[](const Value& v, Args&) { return v.kind() == K::kBool && v.as_bool(); }, {}};
    t["false"] = {[](const Value& v, Args&) { return v.kind() == K::kBool && !v.as_bool(); }, {}};
    t["integer"] = {[](const Value& v, Args&) { return v.kind() == K::kInt; }, {}};
    t["float"] = {[](const Value& v, Args&) { return v.kind() == K::kFloat; }, {}};
    t["number"] = {[](const Value& v, Args&) { return v.is_number(); }, {}};
    t["string"] = {[](const Value& v, Args&) { return v.is_string(); }, {}};
    t["mapping"] = {[](const Value& v, Args&) { return v.is_dict(); }, {}};
    t["iterable"] = {[](const Value& v, Args&) {
                       return v.is_string() || v.is_sequence() || v.is_dict() || v.is_undefined() ||
                              v.kind() == K::kGenerator;
                     }, {}};
    t["sequence"] = {[](const Value& v, Args&) { return v.is_string() || v.is_sequence() || v.is_dict(); }, {}};
    t["callable"] = {[](const Value& v, Args&) { return v.kind() == K::kFunction; }, {}};
    t["escaped"] = {[](const Value&, Args&) { return false; }, {}};
    t["sameas"] = {[](const Value& v, Args& a) {
                     const Value& o = a.required(0);
                     if (v.kind() != o.kind()) return false;
                     switch (v.kind()) {
                       case K::kNone:
                       case K::kUndefined: return true;
                       case K::kBool: return v.as_bool() == o.as_bool();
                       case K::kInt: return v.as_int() == o.as_int() && v.as_int() >= -5 && v.as_int() <= 256;
                       case K::kList:
                       case K::kTuple: return &v.items() == &o.items();
                       case K::kDict:
                       case K::kNamespace: return &v.dict_items() == &o.dict_items();
                       default: return false;
                     }
                   }, {"other"}};
    t["in"] = {[](const Value& v, Args& a) { return py_contains(a.required(0), v); }, {"seq"}};
    for (const char* n : {"eq", "equalto", "=="})
      t[n] = {[](const Value& v, Args& a) { return py_equal(v, a.required(0)); }, {"other"}};
    for (const char* n : {"ne", "!="})
      t[n] = {[](const Value& v, Args& a) { return !py_equal(v, a.required(0)); }, {"other"}};
    for (const char* n : {"lt", "lessthan", "<"})
      t[n] = {[](const Value& v, Args& a) { return py_compare("<", v, a.required(0)); }, {"other"}};
    for (const char* n : {"le", "<="})
      t[n] = {[](const Value& v, Args& a) { return py_compare("<=", v, a.required(0)); }, {"other"}};
    for (const char* n : {"gt", "greaterthan", ">"})
      t[n] = {[](const Value& v, Args& a) { return py_compare(">", v, a.required(0)); }, {"other"}};
    for (const char* n : {"ge", ">="})
      t[n] = {[](const Value& v, Args& a) { return py_compare(">=", v, a.required(0)); }, {"other"}};
    t["odd"] = {[](const Value& v, Args&) { return py_equal(py_binary("%", v, Value(int64_t{2})), Value(int64_t{1})); }, {}};
    t["even"] = {[](const Value& v, Args&) { return py_equal(py_binary("%", v, Value(int64_t{2})), Value(int64_t{0})); }, {}};
    t["divisibleby"] = {[](const Value& v, Args& a) {
                          return py_binary("%", v, a.required(0)).as_double() == 0.0;
                        }, {"num"}};
    t["lower"] = {[](const Value& v, Args&) { return ascii_cased(v.to_str(), true); }, {}};
    t["upper"] = {[](const Value& v, Args&) { return ascii_cased(v.to_str(), false); }, {}};
    t["filter"] = {[](const Value& v, Args&) { return v.is_string() && filters().count(v.str()) > 0; }, {}};
    t["test"] = {[](const Value& v, Args&) { return v.is_string() && v.str() != "test" && v.str() != "filter"; }, {}};
    return t;
  }();
  return table;
}

}  // namespace

Value call_filter(Runtime& rt, const std::string& name, const Value& operand, CallArgs& args) {
  const auto it = filters().find(name);
  if (it == filters().end()) fail(ErrorKind::kUnsupported, "no filter named '" + name + "'");
  rt.step();
  return it->second(rt, operand, args);
}

bool call_test(Runtime& rt, const std::string& name, const Value& operand, CallArgs& args) {
  const auto it = tests().find(name);
  if (it == tests().end()) fail(ErrorKind::kUnsupported, "no test named '" + name + "'");
  rt.step();
  Args a(args, name, it->second.second);
  a.no_extra_keywords();
  if (name == "test") return operand.is_string() && tests().count(operand.str()) > 0;
  return it->second.first(operand, a);
}

Dict make_globals(Runtime& rt) {
  Dict g;
  g.set(Value("range"), Value::function("range", [&rt](CallArgs& a) {
          Args args(a, "range", {"start", "stop", "step"});
          args.no_extra_keywords();
          int64_t start = 0, stop = 0, step = 1;
          if (!args.has(1)) {
            stop = int_arg(args.required(0), "range");
          } else {
            start = int_arg(args.required(0), "range");
            stop = int_arg(args.required(1), "range");
            if (args.has(2)) step = int_arg(args.get(2), "range");
          }
          if (step == 0) fail(ErrorKind::kRuntime, "range() arg 3 must not be zero");
          if (step == INT64_MIN) fail(ErrorKind::kLimit, "range() step out of range");
          const __int128 span = step > 0 ? static_cast<__int128>(stop) - start : static_cast<__int128>(start) - stop;
          const __int128 n = span <= 0 ? 0 : (span + (step > 0 ? step : -step) - 1) / (step > 0 ? step : -step);
          if (n > rt.options.limits.max_range_size)
            fail(ErrorKind::kLimit, "range too big: the sandbox allows ranges of at most " + std::to_string(rt.options.limits.max_range_size));
          List out;
          for (int64_t i = 0; i < static_cast<int64_t>(n); ++i) out.emplace_back(start + i * step);
          return Value::list(std::move(out));
        }));
  auto dict_of = [](CallArgs& a, const char* fname) {
    Args args(a, fname, {"mapping"});
    Dict d;
    if (args.has(0)) {
      const Value& m = args.get(0);
      if (!m.is_dict()) fail(ErrorKind::kRuntime, std::string(fname) + "(): a mapping is required");
      d = m.dict_items();
    }
    for (const auto& [k, v] : args.keyword_extra()) d.set(Value(k), v);
    return d;
  };
  g.set(Value("dict"), Value::function("dict", [dict_of](CallArgs& a) { return Value::dict(dict_of(a, "dict")); }));
  g.set(Value("namespace"), Value::function("namespace", [dict_of](CallArgs& a) {
          return Value::make_namespace(dict_of(a, "namespace"));
        }));
  g.set(Value("raise_exception"), Value::function("raise_exception", [](CallArgs& a) -> Value {
          Args args(a, "raise_exception", {"message"});
          args.no_extra_keywords();
          fail(ErrorKind::kRaised, args.get(0, Value(std::string())).to_str());
        }));
  g.set(Value("strftime_now"), Value::function("strftime_now", [&rt](CallArgs& a) {
          Args args(a, "strftime_now", {"format"});
          args.no_extra_keywords();
          const std::string& fmt = str_arg(args.required(0), "strftime_now");
          std::tm tm{};
          if (rt.options.now) {
            tm = rt.options.now();
          } else {
            const std::time_t t = std::time(nullptr);
            localtime_r(&t, &tm);
          }
          if (fmt.empty()) return Value(std::string());
          std::string buf(256 + fmt.size() * 16, '\0');
          const size_t n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm);
          buf.resize(n);
          return Value(std::move(buf));
        }));
  return g;
}

}  // namespace tandem::jinja
