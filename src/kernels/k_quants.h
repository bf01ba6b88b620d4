// GGUF's weight blocks of 256 elements (q2_K, q3_K, q4_K, q5_K, q6_K and
// iq4_xs), the unpacking every kernel variant shares, and tandem's own
// quantizers for them (make-model, tests).
//
// They multiply activations quantized to q8_0 blocks of 32 (float scale,
// BlockQ8_0Act), as q8_0 weights do: a q4_K, q5_K or iq4_xs sub-block of 32
// is one activation block; the 16-element sub-blocks of q2_K, q3_K and q6_K
// pair up over one. The
// product per activation block is an exact integer sum, so every variant
// computes the same integers and differs only in its float steps.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"

namespace tandem::kernels {

constexpr int64_t kSuperBlock = 256;

// d * scale_j * q - dmin * min_j for the 32 elements of sub-block j, q in
// [0, 15]: qs[32 c + l] holds element 64 c + l in its low nibble and element
// 64 c + 32 + l in its high nibble; scales packs 8 6-bit scales and 8 6-bit
// mins (scale_min below).
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qs[128];
};
static_assert(sizeof(BlockQ4_K) == 144);

// q4_K with a fifth bit: element 32 j + l of sub-block j takes bit j of
// qh[l] as its bit 4, so q lies in [0, 31].
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};
static_assert(sizeof(BlockQ5_K) == 176);

// d * scales[i / 16] * (q - 32), q in [0, 63]: the low 4 bits in ql, the high
// 2 in qh (see q6_k_values for the element order).
struct BlockQ6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};
static_assert(sizeof(BlockQ6_K) == 210);

// q2_K, q3_K and q6_K share an element order in each half of 128: byte
// 32 c + l of a 2-bit plane holds, at bits 2 j, element 128 c + 32 j + l
// (l < 32), whose 16-element sub-block is 8 c + 2 j + l / 16.
//
// q2_K: d * (scales[i] & 15) * q - dmin * (scales[i] >> 4), q in [0, 3].
struct BlockQ2_K {
  uint8_t scales[16];
  uint8_t qs[64];
  uint16_t d;
  uint16_t dmin;
};
static_assert(sizeof(BlockQ2_K) == 84);

// q3_K: d * (s_i - 32) * q, q in [-4, 3]: the 2 low bits in qs, and q - 4
// unless bit 4 c + j of hmask[l] is set; the 16 6-bit scales s packed in 12
// bytes (q3_k_scales).
struct BlockQ3_K {
  uint8_t hmask[32];
  uint8_t qs[64];
  uint8_t scales[12];
  uint16_t d;
};
static_assert(sizeof(BlockQ3_K) == 110);

// iq4_xs: 8 iq4_nl blocks of 32 (qs[16 j ..], low nibbles the first 16
// elements) under one d, each with a 6-bit scale ls_j (iq4_xs_scale):
// d * (ls_j - 32) * kIq4NlLevels[q].
struct BlockIQ4_XS {
  uint16_t d;
  uint16_t scales_h;
  uint8_t scales_l[4];
  uint8_t qs[128];
};
static_assert(sizeof(BlockIQ4_XS) == 136);

// Scale i (s_i - 32) of a q3_K block, and all 16.
inline int q3_k_scale(const BlockQ3_K& b, int i) {
  const int low = (b.scales[i % 8] >> (4 * (i / 8))) & 0x0F;
  const int high = (b.scales[8 + i % 4] >> (2 * (i / 4))) & 3;
  return (low | (high << 4)) - 32;
}
void q3_k_scales(const BlockQ3_K& b, int8_t* scales);
// ls_j - 32 of iq4_xs sub-block j.
inline int iq4_xs_scale(const BlockIQ4_XS& b, int j) {
  return (((b.scales_l[j / 2] >> (4 * (j % 2))) & 0x0F) | (((b.scales_h >> (2 * j)) & 3) << 4)) - 32;
}

// The 6-bit scale and min of q4_K sub-block j (0..7).
inline void q4_k_scale_min(const uint8_t* scales, int j, uint8_t* scale, uint8_t* min) {
  if (j < 4) {
    *scale = scales[j] & 63;
    *min = scales[j + 4] & 63;
  } else {
    *scale = static_cast<uint8_t>((scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4));
    *min = static_cast<uint8_t>((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
  }
}

// The 256 values q of a q4_K (q5_K) block in element order.
void q4_k_values(const BlockQ4_K& b, uint8_t* q);
void q5_k_values(const BlockQ5_K& b, uint8_t* q);
// The 256 values q (0..63, before the - 32) of a q6_K block in element order.
void q6_k_values(const BlockQ6_K& b, uint8_t* q);
// The inverse: q (element order) into the block's ql and qh.
void q6_k_set_values(const uint8_t* q, BlockQ6_K& b);
// The 256 codes of a q2_K (q 0..3), q3_K (q + 4, 0..7) or iq4_xs (the level
// index, 0..15) block in element order.
void q2_k_values(const BlockQ2_K& b, uint8_t* q);
void q3_k_values(const BlockQ3_K& b, uint8_t* q);
void iq4_xs_values(const BlockIQ4_XS& b, uint8_t* q);

// tandem's quantizers (n a multiple of 256): per sub-block the scale (and,
// for q4_K and q5_K, the min) that spans its values, then the block's scales quantized
// against the largest. Not llama.cpp's search for the least squared error:
// files tandem writes are valid GGUF of these types, a little less accurate.
// The panel layouts of the types above (matmul.h: 16 rows interleaved, for
// the AVX-512 tiles). A group of 16 rows stores each 256-element block index
// as one panel block of the 16 rows' blocks, the same bytes rearranged in
// vectors of 64 bytes: vector v of a field holds, at bytes 4r..4r+3 (2r,
// 2r+1 for the f16 scales), row r's bytes 4v..4v+3 of that field.
//  - q4_K: the 16 d, the 16 dmin, 3 vectors of scales, then 32 of qs (the
//    low nibbles of vector 8i + c are column c, elements 4c..4c+3, of
//    sub-block 2i, the high ones of 2i + 1);
//  - q5_K: as q4_K, with 8 vectors of qh between the scales and qs (bit j
//    of byte 4r + i of vector c: bit 4 of row r's element 4c + i of
//    sub-block j);
//  - q6_K: the 6-bit values of each 128-element half h and column c (elements
//    4c..4c+3 of the half's four activation blocks 4h + i) in three vectors
//    A, B, C at 3 (8h + c): the low 6 bits of A, B and C hold blocks 4h,
//    4h + 1 and 4h + 2, and their top 2 bits block 4h + 3's bits 0-1, 2-3
//    and 4-5 (the same bytes as ql and qh, in the order the tiles take
//    them: a code in one instruction, the fourth in six); then 4 vectors of
//    scales and the 16 d (the codes first, so that they start on a cache
//    line in every other block);
//  - q2_K and q3_K: first 16 vectors of qs (vector 8c + 4h + v holds column
//    v of 16-element half h of elements 128c..128c+127, in the four bit
//    pairs of its bytes, one per 32 elements); then q2_K: 4 vectors of
//    scales, the 16 d, the 16 dmin; q3_K: 64 masks of 8 bytes (mask 8k +
//    4h + v, k = 4c + j, holds at bit 4r + i the high bit of the code at
//    byte 4r + i, bit pair j of qs vector 8c + 4h + v, so that one mask
//    register takes a vector of codes' high bits), 3 vectors of scales, the
//    16 d;
//  - iq4_xs: first 32 vectors of qs (vector 4j + v: column v of sub-block
//    j in the low nibbles, column 4 + v in the high ones), then scales_l,
//    the 16 scales_h, the 16 d.
constexpr int kQ4KPanelScales = 64;
constexpr int kQ4KPanelQs = 256;
constexpr int kQ5KPanelQh = 256;
constexpr int kQ5KPanelQs = 768;
constexpr int kQ6KPanelScales = 3072;
constexpr int kQ6KPanelD = 3328;
constexpr int kQ2KPanelScales = 1024;
constexpr int kQ2KPanelD = 1280;
constexpr int kQ2KPanelDmin = 1312;
constexpr int kQ3KPanelHmask = 1024;
constexpr int kQ3KPanelScales = 1536;
constexpr int kQ3KPanelD = 1728;
constexpr int kIQ4XSPanelScalesL = 2048;
constexpr int kIQ4XSPanelScalesH = 2112;
constexpr int kIQ4XSPanelD = 2144;
// Whether type t (a 256-element type) has a panel layout.
bool has_k_quant_panels(DType t);
// Packs blocks[0..16) (one block of each row) into one panel block.
void pack_k_quant_panel(DType t, const uint8_t* const* blocks, uint8_t* panel);
// Row r's block, as stored in a plain row, out of a panel block.
void unpack_k_quant_panel_row(DType t, const uint8_t* panel, int r, uint8_t* block);

void quantize_row_q4_k(const float* x, uint8_t* out, int64_t n);
void quantize_row_q5_k(const float* x, uint8_t* out, int64_t n);
void quantize_row_q6_k(const float* x, uint8_t* out, int64_t n);
void quantize_row_q2_k(const float* x, uint8_t* out, int64_t n);
void quantize_row_q3_k(const float* x, uint8_t* out, int64_t n);
void quantize_row_iq4_xs(const float* x, uint8_t* out, int64_t n);

}  // namespace tandem::kernels
