#include "util/anonymous_memory.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "util/error.h"

namespace tandem {

AnonymousMemory::AnonymousMemory(size_t size_bytes) : size_(size_bytes) {
  if (size_bytes == 0) return;
  void* p = ::mmap(nullptr, size_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    throw Error("cannot map " + std::to_string(size_bytes) + " bytes of memory: " + std::strerror(errno));
  // Advice only: without transparent huge pages the mapping still works.
  (void)::madvise(p, size_bytes, MADV_HUGEPAGE);
  data_ = static_cast<uint8_t*>(p);
}

AnonymousMemory::AnonymousMemory(AnonymousMemory&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}

AnonymousMemory& AnonymousMemory::operator=(AnonymousMemory&& o) noexcept {
  if (this != &o) {
    if (data_ != nullptr) ::munmap(data_, size_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

AnonymousMemory::~AnonymousMemory() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

}  // namespace tandem
