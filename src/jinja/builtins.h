// Jinja2's filters, tests and globals, and Python's attribute and item
// access on values (str, list and dict methods), with the sandbox's rules.
#pragma once

#include <string>

#include "jinja/template.h"
#include "jinja/value.h"

namespace tandem::jinja {

// What one render carries: its limits, clock and step count.
struct Runtime {
  const RenderOptions& options;
  int64_t steps = 0;
  int call_depth = 0;
  void step() {
    if (++steps > options.limits.max_steps)
      fail(ErrorKind::kLimit, "the template ran more than " + std::to_string(options.limits.max_steps) + " steps");
  }
};

// Throws kUnsupported for a filter or test this interpreter does not have.
Value call_filter(Runtime& rt, const std::string& name, const Value& operand, CallArgs& args);
bool call_test(Runtime& rt, const std::string& name, const Value& operand, CallArgs& args);

// Jinja's obj.name (attribute first, then item) and obj[key] (item first).
Value get_attr(const Value& obj, const std::string& name);
Value get_item(const Value& obj, const Value& key);
Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step);

// Python's iter() and len(); TypeError (kRuntime) where Python raises it.
List iterate(const Value& v);
int64_t py_len(const Value& v);
// The error an undefined value raises when it is used.
[[noreturn]] void undefined_error(const Value& v);

// range, dict, namespace, raise_exception, strftime_now.
Dict make_globals(Runtime& rt);

}  // namespace tandem::jinja
