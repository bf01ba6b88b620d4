#include "kernels/legacy_quants.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/panel_masks.h"
#include "util/error.h"
#include "util/fp16.h"

namespace tandem::kernels {

bool is_legacy_quant(DType t) {
  return t == DType::kQ4_0 || t == DType::kQ4_1 || t == DType::kQ5_0 || t == DType::kQ5_1 || t == DType::kIQ4_NL;
}

bool legacy_quant_has_min(DType t) { return t == DType::kQ4_1 || t == DType::kQ5_1; }

bool has_legacy_panels(DType t) { return is_legacy_quant(t) || t == DType::kQ8_0; }

namespace {

float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// Where a type's fields lie in its block.
struct Layout {
  int qh = -1;  // offset of the 4 bytes of fifth bits, -1 without
  int qs = 2;   // offset of the 16 bytes of nibbles (q8_0: of its 32 values)
  int bits = 4;
  int offset = 0;  // subtracted from q (symmetric types)
  int qs_bytes = 16;
};

Layout layout(DType t) {
  switch (t) {
    case DType::kQ4_0: return {-1, 2, 4, 8};
    case DType::kQ4_1: return {-1, 4, 4, 0};
    case DType::kQ5_0: return {2, 6, 5, 16};
    case DType::kQ5_1: return {4, 8, 5, 0};
    case DType::kQ8_0: return {-1, 2, 8, 0, 32};
    default: return {-1, 2, 4, 0};  // iq4_nl: nibbles index the levels
  }
}

}  // namespace

// The panel block is the type's 16 blocks, rearranged at the same size.
static_assert([] {
  for (DType t : {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kIQ4_NL, DType::kQ8_0}) {
    const int values = t == DType::kQ8_0 ? 512 : 256;
    const size_t block = t == DType::kQ8_0   ? 2 + 32  // (q8_0: d and its 32 values)
                         : t == DType::kQ4_1 ? sizeof(BlockQ4_1)
                         : t == DType::kQ5_0 ? sizeof(BlockQ5_0)
                         : t == DType::kQ5_1 ? sizeof(BlockQ5_1)
                                             : sizeof(BlockQ4_0);  // (iq4_nl's is the same size)
    if (static_cast<size_t>(legacy_panel_layout(t).qs + values) != kLegacyPanelRows * block) return false;
  }
  return true;
}());

namespace {

// Moves one row's block between its plain bytes and a panel block (kPack:
// plain to panel; otherwise back).
template <bool kPack, typename Panel>
void move_panel_row(DType t, Panel* panel, int r, uint8_t* block) {
  TANDEM_ASSERT(has_legacy_panels(t));
  const Layout l = layout(t);
  const LegacyPanelLayout p = legacy_panel_layout(t);
  auto move = [&](int panel_at, int block_at, int n) {
    if constexpr (kPack) {
      std::memcpy(panel + panel_at, block + block_at, static_cast<size_t>(n));
    } else {
      std::memcpy(block + block_at, panel + panel_at, static_cast<size_t>(n));
    }
  };
  move(p.d + 2 * r, 0, 2);
  if (p.m >= 0) move(p.m + 2 * r, 2, 2);
  for (int j = 0; j < l.qs_bytes / 4; ++j) move(p.qs + 64 * j + 4 * r, l.qs + 4 * j, 4);
  if (p.qh < 0) return;
  // Element 4c + i's fifth bit: bit n = 4r + i of mask c.
  uint32_t qh = 0;
  if constexpr (kPack) std::memcpy(&qh, block + l.qh, 4);
  for (int c = 0; c < 8; ++c)
    for (int i = 0; i < 4; ++i) {
      Panel* mask = panel + p.qh + 8 * c;
      if constexpr (kPack) {
        set_panel_mask_bit(mask, 4 * r + i, static_cast<int>((qh >> (4 * c + i)) & 1u));
      } else {
        qh |= static_cast<uint32_t>(panel_mask_bit(mask, 4 * r + i)) << (4 * c + i);
      }
    }
  if constexpr (!kPack) std::memcpy(block + l.qh, &qh, 4);
}

}  // namespace

void pack_legacy_panel(DType t, const uint8_t* const* blocks, uint8_t* panel) {
  uint8_t block[34];  // (q8_0's, the largest)
  const size_t bytes = dtype_block_bytes(t);
  TANDEM_ASSERT(bytes <= sizeof block);
  for (int r = 0; r < kLegacyPanelRows; ++r) {
    std::memcpy(block, blocks[r], bytes);
    move_panel_row<true>(t, panel, r, block);
  }
}

void unpack_legacy_panel_row(DType t, const uint8_t* panel, int r, uint8_t* block) {
  move_panel_row<false>(t, panel, r, block);
}

namespace {

int nearest(float v) { return static_cast<int>(std::lround(v)); }

// The largest magnitude of x[0..32), with its sign.
float extreme(const float* x) {
  float e = 0.0f;
  for (int i = 0; i < 32; ++i)
    if (std::fabs(x[i]) > std::fabs(e)) e = x[i];
  return e;
}

void put_f16(uint8_t* p, float v) {
  const uint16_t h = f32_to_f16(v);
  std::memcpy(p, &h, 2);
}

void quantize_block(DType t, const float* x, uint8_t* b) {
  const Layout l = layout(t);
  const int levels = 1 << l.bits;
  int q[32];
  if (t == DType::kIQ4_NL) {
    // The extreme value maps to the outermost level, -127.
    const float d = extreme(x) / static_cast<float>(kIq4NlLevels[0]);
    put_f16(b, d);
    const float dq = f16_at(b);
    for (int i = 0; i < 32; ++i) {
      int best = 0;
      for (int k = 1; k < 16; ++k)
        if (std::fabs(dq * kIq4NlLevels[k] - x[i]) < std::fabs(dq * kIq4NlLevels[best] - x[i])) best = k;
      q[i] = best;
    }
  } else if (legacy_quant_has_min(t)) {
    const float lo = *std::min_element(x, x + 32), hi = *std::max_element(x, x + 32);
    put_f16(b, (hi - lo) / static_cast<float>(levels - 1));
    put_f16(b + 2, lo);
    const float dq = f16_at(b), mq = f16_at(b + 2);
    for (int i = 0; i < 32; ++i) q[i] = dq > 0 ? std::clamp(nearest((x[i] - mq) / dq), 0, levels - 1) : 0;
  } else {
    // The extreme value maps to -offset, the end of the range with more room.
    put_f16(b, extreme(x) / static_cast<float>(-l.offset));
    const float dq = f16_at(b);
    for (int i = 0; i < 32; ++i)
      q[i] = dq != 0 ? std::clamp(nearest(x[i] / dq) + l.offset, 0, levels - 1) : l.offset;
  }
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    b[l.qs + j] = static_cast<uint8_t>((q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4));
    qh |= static_cast<uint32_t>(q[j] >> 4) << j;
    qh |= static_cast<uint32_t>(q[j + 16] >> 4) << (j + 16);
  }
  if (l.qh >= 0) std::memcpy(b + l.qh, &qh, 4);
}

}  // namespace

void unpack_legacy_block(DType t, const uint8_t* block, LegacyBlock* out) {
  TANDEM_ASSERT(is_legacy_quant(t));
  const Layout l = layout(t);
  uint32_t qh = 0;
  if (l.qh >= 0) std::memcpy(&qh, block + l.qh, 4);
  for (int j = 0; j < 32; ++j) {
    const uint8_t byte = block[l.qs + j % 16];
    const int q = (j < 16 ? byte & 0x0F : byte >> 4) | static_cast<int>(((qh >> j) & 1) << 4);
    out->w[j] = static_cast<int8_t>(t == DType::kIQ4_NL ? kIq4NlLevels[q] : q - l.offset);
  }
  out->d = f16_at(block);
  out->m = legacy_quant_has_min(t) ? f16_at(block + 2) : 0.0f;
}

void quantize_row_legacy(DType t, const float* x, uint8_t* out, int64_t n) {
  TANDEM_ASSERT(is_legacy_quant(t) && n % 32 == 0);
  const size_t bytes = dtype_block_bytes(t);
  for (int64_t i = 0; i < n / 32; ++i) quantize_block(t, x + 32 * i, out + static_cast<size_t>(i) * bytes);
}

}  // namespace tandem::kernels
