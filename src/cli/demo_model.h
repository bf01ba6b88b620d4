// The embedded default model: a generated demo GGUF kept in the user's cache
// directory, created on first use, so `tandem generate` works with no file.
#pragma once

#include <string>

namespace tandem::cli {

// Returns the path of the demo model, generating it if it does not exist yet.
std::string ensure_demo_model();

}  // namespace tandem::cli
