// Scalar conversions between f32 and the 16-bit float formats (IEEE half and
// bfloat16). Kernels use the vector instructions; these are the reference.
#pragma once

#include <cstdint>
#include <cstring>

namespace tandem {

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline float bf16_to_f32(uint16_t h) { return f32_from_bits(static_cast<uint32_t>(h) << 16); }

// Round to nearest even; NaN stays NaN (quiet).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

inline float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return f32_from_bits(sign);
    // Subnormal half: normalise into an f32.
    int shift = 0;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      ++shift;
    }
    mant &= 0x3ffu;
    return f32_from_bits(sign | static_cast<uint32_t>(127 - 15 + 1 - shift) << 23 | mant << 13);
  }
  if (exp == 31) return f32_from_bits(sign | 0x7f800000u | mant << 13);
  return f32_from_bits(sign | (exp + 127 - 15) << 23 | mant << 13);
}

// Round to nearest even, saturating to infinity like the hardware conversion.
inline uint16_t f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (abs < 0x38800000u) {
    // Result is subnormal or zero: add a magic number so the FPU rounds for us.
    float magic = f32_from_bits(abs) + 0.5f;
    return static_cast<uint16_t>(sign | (f32_bits(magic) - f32_bits(0.5f)));
  }
  uint32_t mant_odd = (abs >> 13) & 1u;
  abs += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round
  return static_cast<uint16_t>(sign | (abs >> 13));
}

}  // namespace tandem
