// What a template can fail with. Everything a template does wrong (bad
// syntax, raise_exception, a type error, a limit) is one of these, so the
// server answers 400 with the reason and never crashes.
#pragma once

#include <stdexcept>
#include <string>

namespace tandem::jinja {

enum class ErrorKind {
  kSyntax,       // the template does not parse
  kRaised,       // the template called raise_exception(message)
  kUnsupported,  // a Jinja feature this interpreter does not implement
  kLimit,        // a sandbox limit: output size, steps, recursion
  kRuntime,      // what CPython would raise: TypeError, UndefinedError, ...
};

const char* error_kind_name(ErrorKind kind);

class TemplateError : public std::runtime_error {
 public:
  TemplateError(ErrorKind kind, const std::string& message, int line = 0)
      : std::runtime_error(message), kind_(kind), line_(line) {}
  ErrorKind kind() const { return kind_; }
  int line() const { return line_; }  // 1-based; 0 when unknown
  void set_line_if_unknown(int line) {
    if (line_ == 0) line_ = line;
  }
  // "message (line N)" or the message alone.
  std::string describe() const;

 private:
  ErrorKind kind_;
  int line_;
};

[[noreturn]] inline void fail(ErrorKind kind, const std::string& message, int line = 0) {
  throw TemplateError(kind, message, line);
}

}  // namespace tandem::jinja
