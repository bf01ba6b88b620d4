#include "kernels/k_quants.h"

#include "kernels/legacy_quants.h"
#include "kernels/panel_masks.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <span>

#include "util/error.h"
#include "util/fp16.h"

namespace tandem::kernels {

void q4_k_values(const BlockQ4_K& b, uint8_t* q) {
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) {
      q[64 * c + l] = b.qs[32 * c + l] & 0x0F;
      q[64 * c + 32 + l] = b.qs[32 * c + l] >> 4;
    }
}

void q5_k_values(const BlockQ5_K& b, uint8_t* q) {
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) {
      const int lo = 2 * c, hi = 2 * c + 1;  // the two sub-blocks of qs[32 c ..]
      q[64 * c + l] = static_cast<uint8_t>((b.qs[32 * c + l] & 0x0F) | (((b.qh[l] >> lo) & 1) << 4));
      q[64 * c + 32 + l] = static_cast<uint8_t>((b.qs[32 * c + l] >> 4) | (((b.qh[l] >> hi) & 1) << 4));
    }
}

void q6_k_values(const BlockQ6_K& b, uint8_t* q) {
  for (int h = 0; h < 2; ++h) {
    const uint8_t* ql = b.ql + 64 * h;
    const uint8_t* qh = b.qh + 32 * h;
    uint8_t* y = q + 128 * h;
    for (int l = 0; l < 32; ++l) {
      y[l] = static_cast<uint8_t>((ql[l] & 0x0F) | ((qh[l] & 3) << 4));
      y[l + 32] = static_cast<uint8_t>((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4));
      y[l + 64] = static_cast<uint8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
      y[l + 96] = static_cast<uint8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
    }
  }
}

void q6_k_set_values(const uint8_t* q, BlockQ6_K& b) {
  for (int h = 0; h < 2; ++h) {
    const uint8_t* y = q + 128 * h;
    for (int l = 0; l < 32; ++l) {
      b.ql[64 * h + l] = static_cast<uint8_t>((y[l] & 0x0F) | ((y[l + 64] & 0x0F) << 4));
      b.ql[64 * h + l + 32] = static_cast<uint8_t>((y[l + 32] & 0x0F) | ((y[l + 96] & 0x0F) << 4));
      b.qh[32 * h + l] =
          static_cast<uint8_t>((y[l] >> 4) | ((y[l + 32] >> 4) << 2) | ((y[l + 64] >> 4) << 4) | ((y[l + 96] >> 4) << 6));
    }
  }
}

void q3_k_scales(const BlockQ3_K& b, int8_t* scales) {
  for (int i = 0; i < 16; ++i) scales[i] = static_cast<int8_t>(q3_k_scale(b, i));
}

namespace {

// Element 128 c + 32 j + l of a 2-bit plane (see BlockQ2_K).
template <typename Code>
void two_bit_plane(const uint8_t* qs, uint8_t* q, Code code) {
  for (int c = 0; c < 2; ++c)
    for (int j = 0; j < 4; ++j)
      for (int l = 0; l < 32; ++l) q[128 * c + 32 * j + l] = code(c, j, l, (qs[32 * c + l] >> (2 * j)) & 3);
}

}  // namespace

void q2_k_values(const BlockQ2_K& b, uint8_t* q) {
  two_bit_plane(b.qs, q, [](int, int, int, int v) { return static_cast<uint8_t>(v); });
}

void q3_k_values(const BlockQ3_K& b, uint8_t* q) {
  two_bit_plane(b.qs, q, [&b](int c, int j, int l, int v) {
    return static_cast<uint8_t>(v | (((b.hmask[l] >> (4 * c + j)) & 1) << 2));
  });
}

void iq4_xs_values(const BlockIQ4_XS& b, uint8_t* q) {
  for (int j = 0; j < 8; ++j)
    for (int i = 0; i < 16; ++i) {
      q[32 * j + i] = b.qs[16 * j + i] & 0x0F;
      q[32 * j + 16 + i] = b.qs[16 * j + i] >> 4;
    }
}

namespace {

int nearest(float v) { return static_cast<int>(std::lround(v)); }

// The signed value of largest magnitude among x[0..n).
float extreme_of(const float* x, int n) {
  float e = 0.0f;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > std::fabs(e)) e = x[i];
  return e;
}

// Packs codes q[256] (2 bits, and for q3_K a third) into a 2-bit plane.
void pack_two_bit_plane(const uint8_t* q, uint8_t* qs) {
  std::memset(qs, 0, 64);
  for (int c = 0; c < 2; ++c)
    for (int j = 0; j < 4; ++j)
      for (int l = 0; l < 32; ++l) qs[32 * c + l] = static_cast<uint8_t>(qs[32 * c + l] | ((q[128 * c + 32 * j + l] & 3) << (2 * j)));
}

void quantize_block_q2_k(const float* x, BlockQ2_K& b) {
  float scale[16], min[16];
  for (int i = 0; i < 16; ++i) {
    const float* s = x + 16 * i;
    const float lo = std::min(0.0f, *std::min_element(s, s + 16));
    scale[i] = (*std::max_element(s, s + 16) - lo) / 3.0f;
    min[i] = -lo;
  }
  b.d = f32_to_f16(*std::max_element(scale, scale + 16) / 15.0f);
  b.dmin = f32_to_f16(*std::max_element(min, min + 16) / 15.0f);
  const float dq = f16_to_f32(b.d), dminq = f16_to_f32(b.dmin);
  uint8_t q[256];
  for (int i = 0; i < 16; ++i) {
    const int sc = dq > 0 ? std::clamp(nearest(scale[i] / dq), 0, 15) : 0;
    const int mn = dminq > 0 ? std::clamp(nearest(min[i] / dminq), 0, 15) : 0;
    b.scales[i] = static_cast<uint8_t>(sc | (mn << 4));
    const float step = dq * sc, offset = dminq * mn;
    for (int l = 0; l < 16; ++l)
      q[16 * i + l] = static_cast<uint8_t>(step > 0 ? std::clamp(nearest((x[16 * i + l] + offset) / step), 0, 3) : 0);
  }
  pack_two_bit_plane(q, b.qs);
}

void quantize_block_q3_k(const float* x, BlockQ3_K& b) {
  // Per 16 values the extreme maps to -4 (the end of [-4, 3] with more
  // room), and the extreme scale to -32.
  float scale[16];
  for (int i = 0; i < 16; ++i) scale[i] = extreme_of(x + 16 * i, 16) / -4.0f;
  b.d = f32_to_f16(extreme_of(scale, 16) / -32.0f);
  const float dq = f16_to_f32(b.d);
  uint8_t q[256];
  int s[16];
  for (int i = 0; i < 16; ++i) {
    s[i] = dq != 0 ? std::clamp(nearest(scale[i] / dq), -32, 31) : 0;
    const float step = dq * static_cast<float>(s[i]);
    for (int l = 0; l < 16; ++l)
      q[16 * i + l] = static_cast<uint8_t>((step != 0 ? std::clamp(nearest(x[16 * i + l] / step), -4, 3) : 0) + 4);
  }
  std::memset(b.scales, 0, sizeof b.scales);
  for (int i = 0; i < 16; ++i) {
    const int u = s[i] + 32;
    b.scales[i % 8] = static_cast<uint8_t>(b.scales[i % 8] | ((u & 0x0F) << (4 * (i / 8))));
    b.scales[8 + i % 4] = static_cast<uint8_t>(b.scales[8 + i % 4] | ((u >> 4) << (2 * (i / 4))));
  }
  pack_two_bit_plane(q, b.qs);
  std::memset(b.hmask, 0, sizeof b.hmask);
  for (int c = 0; c < 2; ++c)
    for (int j = 0; j < 4; ++j)
      for (int l = 0; l < 32; ++l)
        b.hmask[l] = static_cast<uint8_t>(b.hmask[l] | (((q[128 * c + 32 * j + l] >> 2) & 1) << (4 * c + j)));
}

void quantize_block_iq4_xs(const float* x, BlockIQ4_XS& b) {
  float scale[8];
  for (int j = 0; j < 8; ++j) scale[j] = extreme_of(x + 32 * j, 32) / static_cast<float>(kIq4NlLevels[0]);
  b.d = f32_to_f16(extreme_of(scale, 8) / -32.0f);
  const float dq = f16_to_f32(b.d);
  b.scales_h = 0;
  std::memset(b.scales_l, 0, sizeof b.scales_l);
  for (int j = 0; j < 8; ++j) {
    const int ls = (dq != 0 ? std::clamp(nearest(scale[j] / dq), -32, 31) : 0) + 32;
    b.scales_l[j / 2] = static_cast<uint8_t>(b.scales_l[j / 2] | ((ls & 0x0F) << (4 * (j % 2))));
    b.scales_h = static_cast<uint16_t>(b.scales_h | ((ls >> 4) << (2 * j)));
    const float step = dq * static_cast<float>(ls - 32);
    for (int i = 0; i < 16; ++i) {
      int code[2];
      for (int h = 0; h < 2; ++h) {
        const float v = x[32 * j + 16 * h + i];
        int best = 0;
        for (int k = 1; k < 16; ++k)
          if (std::fabs(step * kIq4NlLevels[k] - v) < std::fabs(step * kIq4NlLevels[best] - v)) best = k;
        code[h] = best;
      }
      b.qs[16 * j + i] = static_cast<uint8_t>(code[0] | (code[1] << 4));
    }
  }
}

// The scales, mins and values q of a q4_K or q5_K block with `levels` levels.
template <typename Block>
void quantize_scaled_min_block(const float* x, Block& b, int levels, uint8_t* q) {
  float scale[8], min[8];  // min >= 0: the value subtracted
  for (int j = 0; j < 8; ++j) {
    const float* s = x + 32 * j;
    const float lo = std::min(0.0f, *std::min_element(s, s + 32));
    const float hi = *std::max_element(s, s + 32);
    scale[j] = (hi - lo) / static_cast<float>(levels - 1);
    min[j] = -lo;
  }
  const float max_scale = *std::max_element(scale, scale + 8);
  const float max_min = *std::max_element(min, min + 8);
  const float d = max_scale / 63.0f, dmin = max_min / 63.0f;
  b.d = f32_to_f16(d);
  b.dmin = f32_to_f16(dmin);
  const float dq = f16_to_f32(b.d), dminq = f16_to_f32(b.dmin);
  uint8_t sc[8], mn[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = static_cast<uint8_t>(dq > 0 ? std::clamp(nearest(scale[j] / dq), 0, 63) : 0);
    mn[j] = static_cast<uint8_t>(dminq > 0 ? std::clamp(nearest(min[j] / dminq), 0, 63) : 0);
  }
  std::memset(b.scales, 0, sizeof b.scales);
  for (int j = 0; j < 4; ++j) {
    b.scales[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    b.scales[j + 4] = static_cast<uint8_t>(mn[j] | ((mn[j + 4] >> 4) << 6));
    b.scales[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0x0F) | ((mn[j + 4] & 0x0F) << 4));
  }
  for (int j = 0; j < 8; ++j) {
    const float step = dq * sc[j], offset = dminq * mn[j];
    for (int l = 0; l < 32; ++l)
      q[32 * j + l] =
          static_cast<uint8_t>(step > 0 ? std::clamp(nearest((x[32 * j + l] + offset) / step), 0, levels - 1) : 0);
  }
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l)
      b.qs[32 * c + l] = static_cast<uint8_t>((q[64 * c + l] & 0x0F) | ((q[64 * c + 32 + l] & 0x0F) << 4));
}

void quantize_block_q4_k(const float* x, BlockQ4_K& b) {
  uint8_t q[256];
  quantize_scaled_min_block(x, b, 16, q);
}

void quantize_block_q5_k(const float* x, BlockQ5_K& b) {
  uint8_t q[256];
  quantize_scaled_min_block(x, b, 32, q);
  std::memset(b.qh, 0, sizeof b.qh);
  for (int j = 0; j < 8; ++j)
    for (int l = 0; l < 32; ++l) b.qh[l] = static_cast<uint8_t>(b.qh[l] | ((q[32 * j + l] >> 4) << j));
}

void quantize_block_q6_k(const float* x, BlockQ6_K& b) {
  // Per 16 values the signed value of largest magnitude maps to -32, so the
  // range [-32, 31] is used asymmetrically the way llama.cpp's is.
  float scale[16];
  for (int j = 0; j < 16; ++j) {
    float extreme = 0.0f;
    for (int l = 0; l < 16; ++l)
      if (std::fabs(x[16 * j + l]) > std::fabs(extreme)) extreme = x[16 * j + l];
    scale[j] = extreme / -32.0f;
  }
  float extreme = 0.0f;
  for (float s : scale)
    if (std::fabs(s) > std::fabs(extreme)) extreme = s;
  const float d = extreme / -128.0f;
  b.d = f32_to_f16(d);
  const float dq = f16_to_f32(b.d);
  uint8_t q[256];
  for (int j = 0; j < 16; ++j) {
    b.scales[j] = static_cast<int8_t>(dq != 0 ? std::clamp(nearest(scale[j] / dq), -128, 127) : 0);
    const float step = dq * b.scales[j];
    for (int l = 0; l < 16; ++l)
      q[16 * j + l] = static_cast<uint8_t>(step != 0 ? std::clamp(nearest(x[16 * j + l] / step), -32, 31) + 32 : 32);
  }
  q6_k_set_values(q, b);
}

template <typename Block, void (*Quantize)(const float*, Block&)>
void quantize_row(const float* x, uint8_t* out, int64_t n) {
  TANDEM_ASSERT(n % kSuperBlock == 0, "K-quant rows hold whole blocks of 256");
  for (int64_t i = 0; i < n / kSuperBlock; ++i) {
    Block b;
    Quantize(x + i * kSuperBlock, b);
    std::memcpy(out + static_cast<size_t>(i) * sizeof(Block), &b, sizeof b);
  }
}

}  // namespace

void quantize_row_q4_k(const float* x, uint8_t* out, int64_t n) { quantize_row<BlockQ4_K, quantize_block_q4_k>(x, out, n); }
void quantize_row_q5_k(const float* x, uint8_t* out, int64_t n) { quantize_row<BlockQ5_K, quantize_block_q5_k>(x, out, n); }
void quantize_row_q6_k(const float* x, uint8_t* out, int64_t n) { quantize_row<BlockQ6_K, quantize_block_q6_k>(x, out, n); }
void quantize_row_q2_k(const float* x, uint8_t* out, int64_t n) { quantize_row<BlockQ2_K, quantize_block_q2_k>(x, out, n); }
void quantize_row_q3_k(const float* x, uint8_t* out, int64_t n) { quantize_row<BlockQ3_K, quantize_block_q3_k>(x, out, n); }
void quantize_row_iq4_xs(const float* x, uint8_t* out, int64_t n) {
  quantize_row<BlockIQ4_XS, quantize_block_iq4_xs>(x, out, n);
}

namespace {

// A field of a panel block: `count` pieces of `bytes` from block offset
// block_at, piece i of row r at panel_at + 64 i + bytes * r.
struct PanelField {
  int panel_at, block_at, bytes, count;
};

constexpr PanelField kQ4KPanel[] = {
    {0, offsetof(BlockQ4_K, d), 2, 1},
    {32, offsetof(BlockQ4_K, dmin), 2, 1},
    {kQ4KPanelScales, offsetof(BlockQ4_K, scales), 4, 3},
    {kQ4KPanelQs, offsetof(BlockQ4_K, qs), 4, 32},
};
constexpr PanelField kQ5KPanel[] = {
    {0, offsetof(BlockQ5_K, d), 2, 1},
    {32, offsetof(BlockQ5_K, dmin), 2, 1},
    {kQ4KPanelScales, offsetof(BlockQ5_K, scales), 4, 3},
    {kQ5KPanelQh, offsetof(BlockQ5_K, qh), 4, 8},
    {kQ5KPanelQs, offsetof(BlockQ5_K, qs), 4, 32},
};
constexpr PanelField kQ2KPanel[] = {
    {0, offsetof(BlockQ2_K, qs), 4, 16},
    {kQ2KPanelScales, offsetof(BlockQ2_K, scales), 4, 4},
    {kQ2KPanelD, offsetof(BlockQ2_K, d), 2, 1},
    {kQ2KPanelDmin, offsetof(BlockQ2_K, dmin), 2, 1},
};
constexpr PanelField kQ3KPanel[] = {
    {0, offsetof(BlockQ3_K, qs), 4, 16},
    {kQ3KPanelScales, offsetof(BlockQ3_K, scales), 4, 3},
    {kQ3KPanelD, offsetof(BlockQ3_K, d), 2, 1},
};
constexpr PanelField kIQ4XSPanel[] = {
    {0, offsetof(BlockIQ4_XS, qs), 4, 32},
    {kIQ4XSPanelScalesL, offsetof(BlockIQ4_XS, scales_l), 4, 1},
    {kIQ4XSPanelScalesH, offsetof(BlockIQ4_XS, scales_h), 2, 1},
    {kIQ4XSPanelD, offsetof(BlockIQ4_XS, d), 2, 1},
};
// (q3_K's hmask is moved by move_q3_k_high_bits, q6_K's values by move_q6_k_codes.)
constexpr PanelField kQ6KPanel[] = {
    {kQ6KPanelScales, offsetof(BlockQ6_K, scales), 4, 4},
    {kQ6KPanelD, offsetof(BlockQ6_K, d), 2, 1},
};
static_assert(kQ4KPanelQs + 64 * 32 == 16 * sizeof(BlockQ4_K));
static_assert(kQ2KPanelScales == 64 * 16 && kQ2KPanelD == kQ2KPanelScales + 64 * 4 && kQ2KPanelDmin == kQ2KPanelD + 32 &&
              kQ2KPanelDmin + 32 == 16 * sizeof(BlockQ2_K));
static_assert(kIQ4XSPanelScalesL == 64 * 32 && kIQ4XSPanelScalesH == kIQ4XSPanelScalesL + 64 &&
              kIQ4XSPanelD == kIQ4XSPanelScalesH + 32 && kIQ4XSPanelD + 32 == 16 * sizeof(BlockIQ4_XS));
static_assert(kQ3KPanelHmask == 64 * 16 && kQ3KPanelScales == kQ3KPanelHmask + 64 * 8 &&
              kQ3KPanelD == kQ3KPanelScales + 64 * 3 && kQ3KPanelD + 32 == 16 * sizeof(BlockQ3_K));
static_assert(kQ5KPanelQh == kQ4KPanelQs && kQ5KPanelQs == kQ5KPanelQh + 64 * 8 &&
              kQ5KPanelQs + 64 * 32 == 16 * sizeof(BlockQ5_K));
static_assert(kQ6KPanelScales == 64 * 3 * 16 && kQ6KPanelD + 32 == 16 * sizeof(BlockQ6_K));

std::span<const PanelField> panel_fields(DType t) {
  TANDEM_ASSERT(has_k_quant_panels(t));
  if (t == DType::kQ4_K) return kQ4KPanel;
  if (t == DType::kQ5_K) return kQ5KPanel;
  if (t == DType::kQ2_K) return kQ2KPanel;
  if (t == DType::kQ3_K) return kQ3KPanel;
  if (t == DType::kIQ4_XS) return kIQ4XSPanel;
  return kQ6KPanel;
}

// Moves row r's q6_K values between its block and the panel's code vectors
// (k_quants.h): byte 4r + b of the vectors of half h, column c holds element
// 4c + b of blocks 4h..4h+3.
template <bool kPack, typename Panel>
void move_q6_k_codes(Panel* panel, int r, uint8_t* block) {
  BlockQ6_K b;
  std::memcpy(&b, block, sizeof b);
  uint8_t q[256];
  if constexpr (kPack) q6_k_values(b, q);
  for (int h = 0; h < 2; ++h)
    for (int c = 0; c < 8; ++c)
      for (int e = 0; e < 4; ++e) {
        Panel* v = panel + 64 * 3 * (8 * h + c) + 4 * r + e;
        uint8_t* y = q + 128 * h + 4 * c + e;  // element 4c + e of block 4h; + 32 i: of block 4h + i
        if constexpr (kPack) {
          for (int i = 0; i < 3; ++i) v[64 * i] = static_cast<uint8_t>(y[32 * i] | (((y[96] >> (2 * i)) & 3) << 6));
        } else {
          y[96] = 0;
          for (int i = 0; i < 3; ++i) {
            y[32 * i] = v[64 * i] & 0x3F;
            y[96] = static_cast<uint8_t>(y[96] | ((v[64 * i] >> 6) << (2 * i)));
          }
        }
      }
  if constexpr (!kPack) {
    q6_k_set_values(q, b);
    std::memcpy(block, &b, sizeof b);
  }
}

// Moves row r's q3_K high bits between its hmask and the panel's masks
// (k_quants.h): bit 4r + i of mask 8 (4c + j) + 4h + v is bit 4c + j of
// hmask[16h + 4v + i].
template <bool kPack, typename Panel>
void move_q3_k_high_bits(Panel* panel, int r, uint8_t* block) {
  uint8_t* hmask = block + offsetof(BlockQ3_K, hmask);
  if constexpr (!kPack) std::memset(hmask, 0, 32);
  for (int bit = 0; bit < 8; ++bit)  // (4c + j)
    for (int l = 0; l < 32; ++l) {   // (16h + 4v + i)
      Panel* mask = panel + kQ3KPanelHmask + 8 * (8 * bit + l / 4);
      const int n = 4 * r + l % 4;
      if constexpr (kPack) {
        set_panel_mask_bit(mask, n, (hmask[l] >> bit) & 1);
      } else {
        hmask[l] = static_cast<uint8_t>(hmask[l] | (panel_mask_bit(mask, n) << bit));
      }
    }
}

// Moves row r's block between its plain bytes and a panel block (kPack:
// plain to panel; otherwise back).
template <bool kPack, typename Panel>
void move_panel_row(DType t, Panel* panel, int r, uint8_t* block) {
  if (t == DType::kQ6_K) move_q6_k_codes<kPack>(panel, r, block);
  if (t == DType::kQ3_K) move_q3_k_high_bits<kPack>(panel, r, block);
  for (const PanelField& f : panel_fields(t)) {
    for (int i = 0; i < f.count; ++i) {
      Panel* at = panel + f.panel_at + 64 * i + f.bytes * r;
      uint8_t* plain = block + f.block_at + f.bytes * i;
      if constexpr (kPack) {
        std::memcpy(at, plain, static_cast<size_t>(f.bytes));
      } else {
        std::memcpy(plain, at, static_cast<size_t>(f.bytes));
      }
    }
  }
}

}  // namespace

bool has_k_quant_panels(DType t) {
  return t == DType::kQ2_K || t == DType::kQ3_K || t == DType::kQ4_K || t == DType::kQ5_K || t == DType::kQ6_K ||
         t == DType::kIQ4_XS;
}

void pack_k_quant_panel(DType t, const uint8_t* const* blocks, uint8_t* panel) {
  uint8_t block[sizeof(BlockQ6_K)];
  const size_t bytes = dtype_block_bytes(t);
  TANDEM_ASSERT(bytes <= sizeof block);
  for (int r = 0; r < 16; ++r) {
    std::memcpy(block, blocks[r], bytes);
    move_panel_row<true>(t, panel, r, block);
  }
}

void unpack_k_quant_panel_row(DType t, const uint8_t* panel, int r, uint8_t* block) {
  move_panel_row<false>(t, panel, r, block);
}

}  // namespace tandem::kernels
