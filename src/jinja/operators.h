// Python's operators on values, as CPython evaluates them in a template:
// int/float promotion, floor division and modulo toward minus infinity,
// str/list concatenation and repetition, "in", and printf-style "%".
#pragma once

#include <string>

#include "jinja/value.h"

namespace tandem::jinja {

// op: + - * / // % ** ~. Throws TemplateError (kRuntime) where CPython
// raises (TypeError, ZeroDivisionError), kLimit for an int overflowing 64
// bits or a repetition past 16 MiB.
Value py_binary(const std::string& op, const Value& a, const Value& b);
// "-" or "+" in front of a number.
Value py_unary(const std::string& op, const Value& a);
// op: == != < > <= >= in "not in".
bool py_compare(const std::string& op, const Value& a, const Value& b);
// `item in container`.
bool py_contains(const Value& container, const Value& item);
// fmt % args (args a tuple for several values), as the format filter and
// the "%" operator on a string use it: %s %r %d %i %f %x %% with flags,
// width and precision.
std::string py_percent_format(const std::string& fmt, const Value& args);
// Python's float(x) parse of text ("1.5", " 2 ", "inf", "1_000"); false when it is not a number.
bool py_parse_float(const std::string& text, double& out);
bool py_parse_int(const std::string& text, int base, int64_t& out);
// markupsafe's escape: & < > " ' as entities.
std::string html_escape(const std::string& s);

}  // namespace tandem::jinja
