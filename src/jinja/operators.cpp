#include "jinja/operators.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "jinja/builtins.h"

namespace tandem::jinja {
namespace {

// A string result past kMaxStringBytes is a limit error, as a list past this many items.
constexpr int64_t kMaxRepeatItems = 1 << 20;

Value checked_string(std::string s, bool markup) {
  if (static_cast<int64_t>(s.size()) > kMaxStringBytes)
    fail(ErrorKind::kLimit, "a string past " + std::to_string(kMaxStringBytes) + " bytes");
  return markup ? Value::markup(std::move(s)) : Value(std::move(s));
}

[[noreturn]] void type_error(const std::string& op, const Value& a, const Value& b) {
  fail(ErrorKind::kRuntime, "unsupported operand type(s) for " + op + ": '" + a.type_name() + "' and '" +
                                b.type_name() + "'");
}

void check_overflow(bool overflow) {
  if (overflow) fail(ErrorKind::kLimit, "integer result exceeds 64 bits");
}

Value repeat(const Value& seq, int64_t times) {
  const size_t size = seq.is_string() ? seq.str().size() : seq.items().size();
  if (times <= 0 || size == 0)
    return seq.is_string() ? Value(std::string()) : seq.kind() == Value::Kind::kTuple ? Value::tuple({}) : Value::list({});
  // Divide rather than multiply, so a huge count cannot wrap the check.
  if (seq.is_string()) {
    if (times > kMaxStringBytes / static_cast<int64_t>(size)) fail(ErrorKind::kLimit, "string repetition past the size limit");
    std::string out;
    out.reserve(size * static_cast<size_t>(times));
    for (int64_t i = 0; i < times; ++i) out += seq.str();
    return Value(std::move(out));
  }
  if (times > kMaxRepeatItems / static_cast<int64_t>(size)) fail(ErrorKind::kLimit, "list repetition too large");
  List out;
  for (int64_t i = 0; i < times; ++i) out.insert(out.end(), seq.items().begin(), seq.items().end());
  return seq.kind() == Value::Kind::kTuple ? Value::tuple(std::move(out)) : Value::list(std::move(out));
}

// CPython's float floor division and modulo.
void float_divmod(double a, double b, double& div, double& mod) {
  mod = std::fmod(a, b);
  div = (a - mod) / b;
  if (mod != 0.0) {
    if ((b < 0) != (mod < 0)) {
      mod += b;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, b);
  }
  if (div != 0.0) {
    const double f = std::floor(div);
    div = (div - f > 0.5) ? f + 1.0 : f;
  } else {
    div = std::copysign(0.0, a / b);
  }
}

}  // namespace

Value py_unary(const std::string& op, const Value& a) {
  if (a.is_undefined()) undefined_error(a);
  if (!a.is_number()) fail(ErrorKind::kRuntime, "bad operand type for unary " + op + ": '" + a.type_name() + "'");
  if (op == "+") return a.kind() == Value::Kind::kFloat ? a : Value(a.as_int());
  if (a.kind() == Value::Kind::kFloat) return Value(-a.as_double());
  if (a.as_int() == INT64_MIN) fail(ErrorKind::kLimit, "integer result exceeds 64 bits");
  return Value(-a.as_int());
}

Value py_binary(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") return checked_string(a.to_str() + b.to_str(), false);
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  const bool ints = a.is_integer() && b.is_integer();
  const bool nums = a.is_number() && b.is_number();
  int64_t r = 0;
  if (op == "+") {
    if (ints) {
      check_overflow(__builtin_add_overflow(a.as_int(), b.as_int(), &r));
      return Value(r);
    }
    if (nums) return Value(a.as_double() + b.as_double());
    if (a.is_string() && b.is_string()) {
      if (a.is_markup() == b.is_markup()) return checked_string(a.str() + b.str(), a.is_markup());
      // Markup + str escapes the str (and str + Markup likewise), as markupsafe does.
      return checked_string(a.is_markup() ? a.str() + html_escape(b.str()) : html_escape(a.str()) + b.str(), true);
    }
    if (a.is_sequence() && a.kind() == b.kind()) {
      if (static_cast<int64_t>(a.items().size() + b.items().size()) > kMaxRepeatItems)
        fail(ErrorKind::kLimit, "a list past " + std::to_string(kMaxRepeatItems) + " items");
      List out = a.items();
      out.insert(out.end(), b.items().begin(), b.items().end());
      return a.kind() == Value::Kind::kTuple ? Value::tuple(std::move(out)) : Value::list(std::move(out));
    }
    if (a.is_string()) fail(ErrorKind::kRuntime, "can only concatenate str (not \"" + b.type_name() + "\") to str");
    type_error(op, a, b);
  }
  if (op == "-") {
    if (ints) {
      check_overflow(__builtin_sub_overflow(a.as_int(), b.as_int(), &r));
      return Value(r);
    }
    if (nums) return Value(a.as_double() - b.as_double());
    type_error(op, a, b);
  }
  if (op == "*") {
    if (ints) {
      check_overflow(__builtin_mul_overflow(a.as_int(), b.as_int(), &r));
      return Value(r);
    }
    if (nums) return Value(a.as_double() * b.as_double());
    if ((a.is_string() || a.is_sequence()) && b.is_integer()) return repeat(a, b.as_int());
    if (a.is_integer() && (b.is_string() || b.is_sequence())) return repeat(b, a.as_int());
    type_error(op, a, b);
  }
  if (op == "/") {
    if (!nums) type_error(op, a, b);
    if (b.as_double() == 0.0) fail(ErrorKind::kRuntime, "division by zero");
    return Value(a.as_double() / b.as_double());
  }
  if (op == "//" || (op == "%" && nums)) {
    if (!nums) type_error(op, a, b);
    if (ints) {
      const int64_t x = a.as_int(), y = b.as_int();
      if (y == 0) fail(ErrorKind::kRuntime, op == "%" ? "integer modulo by zero" : "integer division or modulo by zero");
      if (x == INT64_MIN && y == -1) fail(ErrorKind::kLimit, "integer result exceeds 64 bits");
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {
        q -= 1;
        m += y;
      }
      return Value(op == "%" ? m : q);
    }
    if (b.as_double() == 0.0) fail(ErrorKind::kRuntime, "float division by zero");
    double div = 0, mod = 0;
    float_divmod(a.as_double(), b.as_double(), div, mod);
    return Value(op == "%" ? mod : div);
  }
  if (op == "%") {
    if (a.is_string()) return Value(py_percent_format(a.str(), b));
    type_error(op, a, b);
  }
  if (op == "**") {
    if (!nums) type_error(op, a, b);
    if (ints && b.as_int() >= 0) {
      int64_t base = a.as_int(), e = b.as_int(), acc = 1;
      while (e > 0) {
        if (e & 1) check_overflow(__builtin_mul_overflow(acc, base, &acc));
        e >>= 1;
        if (e > 0) check_overflow(__builtin_mul_overflow(base, base, &base));
      }
      return Value(acc);
    }
    if (a.as_double() == 0.0 && b.as_double() < 0) fail(ErrorKind::kRuntime, "0.0 cannot be raised to a negative power");
    return Value(std::pow(a.as_double(), b.as_double()));
  }
  fail(ErrorKind::kUnsupported, "operator '" + op + "' is not supported");
}

bool py_contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kString:
      if (!item.is_string())
        fail(ErrorKind::kRuntime, "'in <string>' requires string as left operand, not " + item.type_name());
      return container.str().find(item.str()) != std::string::npos;
    case Value::Kind::kList:
    case Value::Kind::kTuple:
    case Value::Kind::kGenerator:
      for (const Value& v : container.items())
        if (py_equal(v, item)) return true;
      return false;
    case Value::Kind::kDict: return container.dict_items().find(item) != nullptr;
    case Value::Kind::kUndefined: return false;  // iterates as empty
    default: fail(ErrorKind::kRuntime, "argument of type '" + container.type_name() + "' is not iterable");
  }
}

bool py_compare(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return py_equal(a, b);
  if (op == "!=") return !py_equal(a, b);
  if (op == "in") return py_contains(b, a);
  if (op == "not in") return !py_contains(b, a);
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  if (a.is_number() && b.is_number() && !(a.is_integer() && b.is_integer())) {
    const double x = a.as_double(), y = b.as_double();  // NaN compares false both ways
    if (op == "<") return x < y;
    if (op == ">") return x > y;
    if (op == "<=") return x <= y;
    return x >= y;
  }
  if (op == "<") return py_less(a, b);
  if (op == ">") return py_less(b, a);
  if (op == "<=") return !py_less(b, a);
  return !py_less(a, b);
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

bool py_parse_float(const std::string& text, double& out) {
  std::string t;
  for (char c : py_strip(text, "", false, true, true))
    if (c != '_') t += c;
  if (t.empty()) return false;
  char* end = nullptr;
  out = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size()) return false;
  // strtod also reads hex floats and "infinity"/"nan(...)" forms Python refuses: only decimal text and inf/nan.
  for (char c : t)
    if (c == 'x' || c == 'X' || c == '(') return false;
  return true;
}

bool py_parse_int(const std::string& text, int base, int64_t& out) {
  const std::string t = py_strip(text, "", false, true, true);
  if (t.empty() || base < 2 || base > 36) return false;
  size_t i = 0;
  bool neg = false;
  if (t[i] == '+' || t[i] == '-') neg = t[i++] == '-';
  // A prefix that names the base ("0x1A" in base 16) is allowed, as int() allows it.
  if (i + 1 < t.size() && t[i] == '0') {
    const char p = static_cast<char>(std::tolower(t[i + 1]));
    if ((p == 'x' && base == 16) || (p == 'o' && base == 8) || (p == 'b' && base == 2)) {
      i += 2;
      if (i < t.size() && t[i] == '_') ++i;
    }
  }
  if (i >= t.size() || t[i] == '_') return false;
  __int128 v = 0;
  bool prev_digit = false;
  for (; i < t.size(); ++i) {
    const char c = t[i];
    if (c == '_') {
      if (!prev_digit) return false;
      prev_digit = false;
      continue;
    }
    const int d = std::isdigit(static_cast<unsigned char>(c)) ? c - '0'
                  : std::isalpha(static_cast<unsigned char>(c)) ? std::tolower(c) - 'a' + 10 : 99;
    if (d >= base) return false;
    v = v * base + d;
    if (v > static_cast<__int128>(INT64_MAX) + 1) fail(ErrorKind::kLimit, "integer exceeds 64 bits");
    prev_digit = true;
  }
  if (!prev_digit) return false;
  if (neg) v = -v;
  if (v > INT64_MAX) fail(ErrorKind::kLimit, "integer exceeds 64 bits");
  out = static_cast<int64_t>(v);
  return true;
}

std::string py_percent_format(const std::string& fmt, const Value& args) {
  const List single{args};
  const List& values = args.kind() == Value::Kind::kTuple ? args.items() : single;
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) fail(ErrorKind::kRuntime, "incomplete format");
    std::string spec = "%";
    bool alt_or_zero = false;
    while (i < fmt.size() && std::string("-+ #0").find(fmt[i]) != std::string::npos) {
      alt_or_zero = alt_or_zero || fmt[i] == '#' || fmt[i] == '0';
      spec += fmt[i++];
    }
    // Width and precision stay small so the fixed buffer below always holds the result.
    auto digits = [&] {
      std::string d;
      while (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i]))) d += fmt[i++];
      if (d.size() > 2) fail(ErrorKind::kUnsupported, "a format width or precision above 99 is not supported");
      return d;
    };
    spec += digits();
    if (i < fmt.size() && fmt[i] == '.') {
      spec += fmt[i++];
      spec += digits();
    }
    if (i >= fmt.size()) fail(ErrorKind::kRuntime, "incomplete format");
    const char conv = fmt[i];
    if (conv == '%') {
      out += '%';
      continue;
    }
    if (next >= values.size()) fail(ErrorKind::kRuntime, "not enough arguments for format string");
    const Value& v = values[next++];
    char buf[512];
    if (conv == 's' || conv == 'r') {
      const std::string s = conv == 's' ? v.to_str() : v.repr();
      if (alt_or_zero) fail(ErrorKind::kUnsupported, "the # and 0 flags with %s are not supported");
      if (spec == "%" || s.size() > 256) {
        if (spec != "%") fail(ErrorKind::kUnsupported, "a padded %s of a long string is not supported");
        out += s;
        continue;
      }
      std::snprintf(buf, sizeof buf, (spec + "s").c_str(), s.c_str());
    } else if (conv == 'd' || conv == 'i' || conv == 'x' || conv == 'X' || conv == 'o') {
      if (!v.is_number()) fail(ErrorKind::kRuntime, "%" + std::string(1, conv) + " format: a real number is required, not " + v.type_name());
      if (!v.is_integer() && !(std::fabs(v.as_double()) < 9.2e18))
        fail(ErrorKind::kUnsupported, "%" + std::string(1, conv) + " of a float this large is not supported");
      const long long n = v.is_integer() ? v.as_int() : static_cast<long long>(v.as_double());
      if (n < 0 && conv != 'd' && conv != 'i')
        fail(ErrorKind::kUnsupported, "%" + std::string(1, conv) + " of a negative number is not supported");
      std::snprintf(buf, sizeof buf, (spec + "ll" + (conv == 'i' ? 'd' : conv)).c_str(), n);
    } else if (conv == 'f' || conv == 'F' || conv == 'e' || conv == 'E' || conv == 'g' || conv == 'G') {
      if (!v.is_number()) fail(ErrorKind::kRuntime, "must be real number, not " + v.type_name());
      std::snprintf(buf, sizeof buf, (spec + conv).c_str(), v.as_double());
    } else {
      fail(ErrorKind::kUnsupported, std::string("format character '") + conv + "' is not supported");
    }
    out += buf;
  }
  if (next < values.size() && args.kind() == Value::Kind::kTuple)
    fail(ErrorKind::kRuntime, "not all arguments converted during string formatting");
  return out;
}

}  // namespace tandem::jinja
