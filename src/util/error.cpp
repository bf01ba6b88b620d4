#include "util/error.h"

#include <cstdio>
#include <cstdlib>

namespace tandem {

void assert_fail(const char* expr, const char* file, int line, const std::string& detail) {
  std::fprintf(stderr, "tandem: invariant violated: %s at %s:%d%s%s\n", expr, file, line,
               detail.empty() ? "" : ": ", detail.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace tandem
