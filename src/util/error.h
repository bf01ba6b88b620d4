// Errors and invariant checks shared by every tandem library.
#pragma once

#include <stdexcept>
#include <string>

namespace tandem {

// A user-facing error: bad input file, unsupported model, bad argument. The
// message must say what was wrong and, where possible, what to change.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

[[noreturn]] void assert_fail(const char* expr, const char* file, int line, const std::string& detail);

}  // namespace tandem

// Invariant check: on in every build type. A violated invariant is a bug in
// tandem, never a user error, so it aborts with the location instead of throwing.
#define TANDEM_ASSERT(cond, ...)                                                  \
  do {                                                                            \
    if (!(cond)) [[unlikely]]                                                     \
      ::tandem::assert_fail(#cond, __FILE__, __LINE__, ::std::string{__VA_ARGS__}); \
  } while (0)
