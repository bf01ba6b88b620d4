// A page-aligned anonymous mapping, asked to use transparent huge pages (a
// 600 MB weight stream walks fewer TLB entries). Freed on destruction.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tandem {

class AnonymousMemory {
 public:
  AnonymousMemory() = default;
  // Maps size_bytes of zero pages; throws tandem::Error if the kernel refuses.
  explicit AnonymousMemory(size_t size_bytes);
  AnonymousMemory(AnonymousMemory&& o) noexcept;
  AnonymousMemory& operator=(AnonymousMemory&& o) noexcept;
  AnonymousMemory(const AnonymousMemory&) = delete;
  AnonymousMemory& operator=(const AnonymousMemory&) = delete;
  ~AnonymousMemory();

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace tandem
