// Constants of the GGUF on-disk format shared by the reader and the writer, so
// that the writer can never produce a file the reader would refuse.
#pragma once

#include <cstdint>
#include <string_view>

namespace tandem::gguf::format {

inline constexpr char kMagic[4] = {'G', 'G', 'U', 'F'};
inline constexpr uint32_t kWriteVersion = 3;
inline constexpr uint32_t kMinReadVersion = 2;  // v1 used 32-bit counts; llama.cpp dropped it too
inline constexpr uint32_t kMaxReadVersion = 3;

inline constexpr uint64_t kDefaultAlignment = 32;
inline constexpr std::string_view kAlignmentKey = "general.alignment";

inline constexpr uint32_t kMaxDims = 4;
// Arrays may hold arrays; a cap keeps the recursive reader's stack bounded.
// llama.cpp itself reads no nesting at all.
inline constexpr int kMaxArrayDepth = 8;
// llama.cpp stores tensor names in a char[64] and rejects longer ones.
inline constexpr uint64_t kMaxTensorNameBytes = 63;

inline constexpr uint32_t kValueTypeCount = 13;  // ValueType::UINT8 .. FLOAT64

inline bool is_power_of_two(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

// `v` rounded up to a multiple of `alignment` (a power of two). The caller
// guarantees no overflow (v is bounded by a file size).
inline uint64_t align_up(uint64_t v, uint64_t alignment) {
  return (v + alignment - 1) & ~(alignment - 1);
}

}  // namespace tandem::gguf::format
