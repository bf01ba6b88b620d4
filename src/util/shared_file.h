// A file mapped MAP_SHARED by several processes (rings, status pages, the
// tensor-parallel KV pool in /dev/shm): created at a size, or an existing
// one of at least that size.
#pragma once

#include <cstddef>
#include <string>

namespace tandem {

// The mapping (read-write), or nullptr with *error saying what failed and why.
void* map_shared_file(const std::string& path, size_t bytes, bool create, std::string* error);

}  // namespace tandem
