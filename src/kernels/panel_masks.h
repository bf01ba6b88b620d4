// The 64-bit masks some panel layouts keep a bit of every code in (q3_K's
// high bits, q5_0's and q5_1's fifth bits; k_quants.h, legacy_quants.h):
// bit n = 4r + i of a mask belongs to byte 4r + i of the vector of codes it
// marks, so one mask register loads a vector's bits.
#pragma once

#include <cstdint>

namespace tandem::kernels {

inline int panel_mask_bit(const uint8_t* mask, int n) { return (mask[n / 8] >> (n % 8)) & 1; }

inline void set_panel_mask_bit(uint8_t* mask, int n, int value) {
  mask[n / 8] = static_cast<uint8_t>((mask[n / 8] & ~(1 << (n % 8))) | (value << (n % 8)));
}

}  // namespace tandem::kernels
