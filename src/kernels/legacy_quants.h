// GGUF's 32-element weight blocks besides q8_0 (q4_0, q4_1, q5_0, q5_1 and
// iq4_nl) that tandem computes with natively, the unpacking every kernel
// variant shares, and tandem's own quantizers for them (make-model, tests).
//
// Each block is one q8_0 activation block long. Its 32 values unpack to
// int8 w (signed for the symmetric types, 0..31 for the types with a min m),
// so the product with an activation block (dx, x) is
//   dx * (d * sum(w x) + m * sum(x)),
// an exact integer sum or two and the same float steps in every variant.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"

namespace tandem::kernels {

// Element j of a block takes nibble j of qs (low nibbles are elements 0..15,
// high nibbles 16..31) and, in the 5-bit types, bit j of qh as its fifth bit.
struct BlockQ4_0 {  // d * (q - 8)
  uint16_t d;
  uint8_t qs[16];
};
struct BlockQ4_1 {  // d * q + m
  uint16_t d, m;
  uint8_t qs[16];
};
struct BlockQ5_0 {  // d * (q - 16)
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[16];
};
struct BlockQ5_1 {  // d * q + m
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[16];
};
struct BlockIQ4_NL {  // d * kIq4NlLevels[q]
  uint16_t d;
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 &&
              sizeof(BlockQ5_1) == 24 && sizeof(BlockIQ4_NL) == 18);

// The 16 non-uniform levels of iq4_nl (and iq4_xs), as in GGUF.
inline constexpr int8_t kIq4NlLevels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// Whether t is one of the types above.
bool is_legacy_quant(DType t);
// Whether values of t carry a min m (q4_1, q5_1).
bool legacy_quant_has_min(DType t);
// Whether t is laid out in the panels below: the types above and q8_0.
bool has_legacy_panels(DType t);

// One block unpacked: w as above, d and m (0 for the symmetric types) as floats.
struct LegacyBlock {
  int8_t w[32];
  float d, m;
};
void unpack_legacy_block(DType t, const uint8_t* block, LegacyBlock* out);

// The panel layout of these types (matmul.h: 16 rows interleaved, for the
// AVX-512 tiles): a group of kLegacyPanelRows rows stores each block index b
// as one "panel block" of the 16 rows' blocks, the same bytes rearranged so
// that one 64-byte load serves all 16 rows:
//   the 16 rows' d (f16), then their m (types with a min), then 64 bytes of
//   fifth bits (5-bit types: 8 masks of 64 bits, bit 4r+i of mask c the
//   fifth bit of row r's element 4c+i, so that one mask register marks
//   the codes of a vector of nibbles), then
//   4 x 64 bytes of nibbles (vector j, byte 4r+i: row r's qs[4j+i], so its
//   low nibbles are elements 4j..4j+3 of each row and its high nibbles
//   elements 16+4j..). q8_0's panel block is the 16 d, then 8 x 64 bytes
//   of its int8 values (vector j, byte 4r+i: row r's qs[4j+i]).
constexpr int kLegacyPanelRows = 16;
struct LegacyPanelLayout {
  int d = 0;        // offset of the 16 scales
  int m = -1;       // of the 16 mins, -1 without
  int qh = -1;      // of the 64 bytes of fifth bits, -1 without
  int qs = 32;      // of the 256 bytes of nibbles (q8_0: 512 bytes of values)
};
// (constexpr, so that the tiles' offsets are constants: as a call, made per
// 16-row decode tile, it took a sixth of a q4_0 decode matmul's perf
// samples, though the matmul, waiting on memory, was no faster without it.)
constexpr LegacyPanelLayout legacy_panel_layout(DType t) {
  LegacyPanelLayout p;
  int at = 32;
  if (t == DType::kQ4_1 || t == DType::kQ5_1) {  // a min
    p.m = at;
    at += 32;
  }
  if (t == DType::kQ5_0 || t == DType::kQ5_1) {  // fifth bits
    p.qh = at;
    at += 64;
  }
  p.qs = at;
  return p;
}
// Packs blocks[0..16) (one block of each row) into one panel block.
void pack_legacy_panel(DType t, const uint8_t* const* blocks, uint8_t* panel);
// Row r's block, as stored in a plain row, out of a panel block.
void unpack_legacy_panel_row(DType t, const uint8_t* panel, int r, uint8_t* block);

// tandem's quantizers (n a multiple of 32): the symmetric types scale the
// value of largest magnitude to the end of their range, as llama.cpp's
// reference does; the types with a min span each block's range; iq4_nl picks
// the nearest level. Not llama.cpp's searches for the least squared error.
void quantize_row_legacy(DType t, const float* x, uint8_t* out, int64_t n);

}  // namespace tandem::kernels
