// A Jinja2 interpreter for chat templates (no C++ Jinja library is packaged
// for Debian 12). It renders as transformers' apply_chat_template does:
// Jinja2's ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks,
// the loopcontrols extension, transformers' {% generation %} tag, and the
// globals chat templates call (raise_exception, strftime_now, and tojson as
// transformers defines it). The output is byte-identical to CPython's Jinja2
// for the features docs/COMPATIBILITY.md lists; what it leaves out
// (include/import/extends, recursive loops, call blocks, ...) fails with
// kUnsupported naming the feature, never a wrong rendering.
//
// Sandbox: a template reads only the context it is given. There is no file,
// network or environment access to reach, and every render is bounded in
// output size, steps and call depth (RenderLimits).
#pragma once

#include <ctime>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "jinja/error.h"
#include "jinja/value.h"

namespace tandem::jinja {

struct Node;

struct RenderLimits {
  size_t max_output_bytes = 16u << 20;  // any one rendered text, macros' and set blocks' included
  int64_t max_steps = 20'000'000;       // statements, expressions and loop iterations
  int max_call_depth = 64;              // nested macro calls
  int64_t max_range_size = 100'000;     // range() length, as Jinja2's sandbox
};

struct RenderOptions {
  RenderLimits limits;
  // strftime_now's clock, broken down in local time; unset: the system clock.
  std::function<std::tm()> now;
};

class Template {
 public:
  // Throws TemplateError (kSyntax, kUnsupported, kLimit) with the line.
  static Template parse(std::string_view source);

  // The context's keys are the template's variables. Throws TemplateError.
  std::string render(const Dict& context, const RenderOptions& options = {}) const;

 private:
  std::shared_ptr<const Node> root_;
};

}  // namespace tandem::jinja
