#include "gguf/dequantize.h"

#include <cstring>
#include <string>

#include "util/error.h"
#include "util/fp16.h"

namespace tandem::gguf {
namespace {

constexpr int kQK = 32;    // elements per block of the legacy types and IQ4_NL
constexpr int kQK_K = 256;  // elements per super-block of the K types and IQ4_XS

// The 16 non-uniform levels of IQ4_NL and IQ4_XS.
constexpr int8_t kIq4Levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

uint16_t u16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t u32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}
float f16(const uint8_t* p) { return f16_to_f32(u16(p)); }

// Q4_0 {d; qs[16]}, Q4_1 {d; m; qs[16]}: low nibbles are elements 0..15, high 16..31.
void q4(const uint8_t* b, float* y, bool with_min) {
  const float d = f16(b);
  const float m = with_min ? f16(b + 2) : 0.0f;
  const uint8_t* qs = b + (with_min ? 4 : 2);
  for (int j = 0; j < kQK / 2; ++j) {
    const int x0 = (qs[j] & 0x0F) - (with_min ? 0 : 8);
    const int x1 = (qs[j] >> 4) - (with_min ? 0 : 8);
    y[j] = with_min ? x0 * d + m : x0 * d;
    y[j + kQK / 2] = with_min ? x1 * d + m : x1 * d;
  }
}

// Q5_0 {d; qh[4]; qs[16]}, Q5_1 {d; m; qh[4]; qs[16]}: bit j of qh is the
// fifth bit of element j.
void q5(const uint8_t* b, float* y, bool with_min) {
  const float d = f16(b);
  const float m = with_min ? f16(b + 2) : 0.0f;
  const uint32_t qh = u32(b + (with_min ? 4 : 2));
  const uint8_t* qs = b + (with_min ? 8 : 6);
  for (int j = 0; j < kQK / 2; ++j) {
    const int h0 = static_cast<int>(((qh >> j) << 4) & 0x10);
    const int h1 = static_cast<int>((qh >> (j + 12)) & 0x10);
    const int x0 = ((qs[j] & 0x0F) | h0) - (with_min ? 0 : 16);
    const int x1 = ((qs[j] >> 4) | h1) - (with_min ? 0 : 16);
    y[j] = with_min ? x0 * d + m : x0 * d;
    y[j + kQK / 2] = with_min ? x1 * d + m : x1 * d;
  }
}

// Q8_0 {d; qs[32]}
void q8_0(const uint8_t* b, float* y) {
  const float d = f16(b);
  for (int j = 0; j < kQK; ++j) y[j] = static_cast<int8_t>(b[2 + j]) * d;
}

// Q2_K {scales[16]; qs[64]; d; dmin}: 16 groups of 16, each with a 4-bit
// scale and a 4-bit min; 2-bit quants, four planes per 32 bytes.
void q2_k(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* q = b + 16;
  const float d = f16(b + 80);
  const float min = f16(b + 82);
  int is = 0;
  for (int n = 0; n < kQK_K; n += 128) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (int half = 0; half < 2; ++half) {
        const uint8_t sc = scales[is++];
        const float dl = d * (sc & 0xF);
        const float ml = min * (sc >> 4);
        for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<int8_t>((q[l + 16 * half] >> shift) & 3) - ml;
      }
    }
    q += 32;
  }
}

// Q3_K {hmask[32]; qs[64]; scales[12]; d}: 6-bit scales (stored offset by 32)
// packed in 12 bytes; a quant is 2 low bits minus 4 unless its hmask bit is set.
void q3_k(const uint8_t* b, float* y) {
  const uint8_t* hm = b;
  const uint8_t* q = b + 32;
  const float d_all = f16(b + 108);
  uint32_t aux[4];
  std::memcpy(aux, b + 96, 12);
  const uint32_t low4 = 0x0f0f0f0f, low2 = 0x03030303;
  const uint32_t tmp = aux[2];
  aux[2] = ((aux[0] >> 4) & low4) | (((tmp >> 4) & low2) << 4);
  aux[3] = ((aux[1] >> 4) & low4) | (((tmp >> 6) & low2) << 4);
  aux[0] = (aux[0] & low4) | (((tmp >> 0) & low2) << 4);
  aux[1] = (aux[1] & low4) | (((tmp >> 2) & low2) << 4);
  int8_t scales[16];
  std::memcpy(scales, aux, 16);
  int is = 0;
  uint8_t m = 1;
  for (int n = 0; n < kQK_K; n += 128) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (int half = 0; half < 2; ++half) {
        const float dl = d_all * (scales[is++] - 32);
        for (int l = 0; l < 16; ++l) {
          const int i = l + 16 * half;
          *y++ = dl * (static_cast<int8_t>((q[i] >> shift) & 3) - ((hm[i] & m) ? 0 : 4));
        }
      }
      m = static_cast<uint8_t>(m << 1);
    }
    q += 32;
  }
}

// The 6-bit scale and min of sub-block j of a Q4_K/Q5_K super-block.
void scale_min_k4(int j, const uint8_t* q, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// Q4_K {d; dmin; scales[12]; qs[128]}, Q5_K {d; dmin; scales[12]; qh[32]; qs[128]}:
// 8 sub-blocks of 32 with 6-bit scales and mins; each 32 bytes of qs hold two
// sub-blocks (low nibbles, then high); Q5_K adds a fifth bit from qh.
void q45_k(const uint8_t* b, float* y, bool five_bits) {
  const float d = f16(b);
  const float min = f16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* ql = b + (five_bits ? 48 : 16);
  uint8_t u1 = 1, u2 = 2;
  for (int is = 0; is < 8; is += 2) {
    uint8_t sc = 0, m = 0;
    scale_min_k4(is, scales, sc, m);
    const float d1 = d * sc, m1 = min * m;
    scale_min_k4(is + 1, scales, sc, m);
    const float d2 = d * sc, m2 = min * m;
    for (int l = 0; l < 32; ++l) {
      const int hi = five_bits && (qh[l] & u1) ? 16 : 0;
      *y++ = d1 * ((ql[l] & 0xF) + hi) - m1;
    }
    for (int l = 0; l < 32; ++l) {
      const int hi = five_bits && (qh[l] & u2) ? 16 : 0;
      *y++ = d2 * ((ql[l] >> 4) + hi) - m2;
    }
    ql += 32;
    u1 = static_cast<uint8_t>(u1 << 2);
    u2 = static_cast<uint8_t>(u2 << 2);
  }
}

// Q6_K {ql[128]; qh[64]; scales[16] (int8); d}: 16 groups of 16 with 8-bit
// scales; 4 low bits from ql, 2 high bits from qh, offset by 32.
void q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = f16(b + 208);
  for (int n = 0; n < kQK_K; n += 128) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int8_t q1 = static_cast<int8_t>(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
      const int8_t q2 = static_cast<int8_t>(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
      const int8_t q3 = static_cast<int8_t>(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
      const int8_t q4 = static_cast<int8_t>(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
      y[l] = d * sc[is] * q1;
      y[l + 32] = d * sc[is + 2] * q2;
      y[l + 64] = d * sc[is + 4] * q3;
      y[l + 96] = d * sc[is + 6] * q4;
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

// IQ4_NL {d; qs[16]}: nibbles index the non-uniform levels.
void iq4_nl(const uint8_t* b, float* y) {
  const float d = f16(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < kQK / 2; ++j) {
    y[j] = d * kIq4Levels[qs[j] & 0xf];
    y[j + kQK / 2] = d * kIq4Levels[qs[j] >> 4];
  }
}

// IQ4_XS {d; scales_h (u16); scales_l[4]; qs[128]}: 8 sub-blocks of 32, each
// with a 6-bit scale (4 low bits in scales_l, 2 high in scales_h) offset by 32.
void iq4_xs(const uint8_t* b, float* y) {
  const float d = f16(b);
  const uint16_t scales_h = u16(b + 2);
  const uint8_t* scales_l = b + 4;
  const uint8_t* qs = b + 8;
  for (int ib = 0; ib < kQK_K / 32; ++ib) {
    const int ls = ((scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf) | (((scales_h >> (2 * ib)) & 3) << 4);
    const float dl = d * (ls - 32);
    for (int j = 0; j < 16; ++j) {
      y[j] = dl * kIq4Levels[qs[j] & 0xf];
      y[j + 16] = dl * kIq4Levels[qs[j] >> 4];
    }
    y += 32;
    qs += 16;
  }
}

}  // namespace

bool can_dequantize(TensorType type) {
  switch (type) {
    case TensorType::F32: case TensorType::F16: case TensorType::BF16: case TensorType::Q4_0:
    case TensorType::Q4_1: case TensorType::Q5_0: case TensorType::Q5_1: case TensorType::Q8_0:
    case TensorType::Q2_K: case TensorType::Q3_K: case TensorType::Q4_K: case TensorType::Q5_K:
    case TensorType::Q6_K: case TensorType::IQ4_NL: case TensorType::IQ4_XS: return true;
    default: return false;
  }
}

void dequantize_row(TensorType type, const uint8_t* src, float* dst, int64_t n) {
  if (!can_dequantize(type)) throw Error("dequantize: tensor type " + type_name(type) + " is not supported");
  const auto block = static_cast<int64_t>(type_block_elements(type));
  const auto bytes = static_cast<int64_t>(type_block_bytes(type));
  if (n < 0 || n % block != 0)
    throw Error("dequantize: " + std::to_string(n) + " elements is not a whole number of " + type_name(type) + " blocks");
  for (int64_t i = 0; i < n / block; ++i) {
    const uint8_t* b = src + i * bytes;
    float* y = dst + i * block;
    switch (type) {
      case TensorType::F32: std::memcpy(y, b, 4); break;
      case TensorType::F16: *y = f16(b); break;
      case TensorType::BF16: *y = bf16_to_f32(u16(b)); break;
      case TensorType::Q4_0: q4(b, y, false); break;
      case TensorType::Q4_1: q4(b, y, true); break;
      case TensorType::Q5_0: q5(b, y, false); break;
      case TensorType::Q5_1: q5(b, y, true); break;
      case TensorType::Q8_0: q8_0(b, y); break;
      case TensorType::Q2_K: q2_k(b, y); break;
      case TensorType::Q3_K: q3_k(b, y); break;
      case TensorType::Q4_K: q45_k(b, y, false); break;
      case TensorType::Q5_K: q45_k(b, y, true); break;
      case TensorType::Q6_K: q6_k(b, y); break;
      case TensorType::IQ4_NL: iq4_nl(b, y); break;
      case TensorType::IQ4_XS: iq4_xs(b, y); break;
      default: break;
    }
  }
}

}  // namespace tandem::gguf
