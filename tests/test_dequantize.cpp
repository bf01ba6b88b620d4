// The reference dequantization of the GGUF quant types against ggml's own.
//
// tests/data/ggml_dequant_reference.bin: for each of Q4_0, Q4_1, Q5_0, Q5_1,
// Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL and IQ4_XS, 16 blocks (legacy
// types and IQ4_NL) or 4 super-blocks (K types, IQ4_XS): the first half
// random bytes with random finite f16 scales (every bit pattern of the
// quants, scales and mins), the second half ggml's own quantization of
// Gaussian floats; then each element as ggml's dequantize_row_* gives it.
// Generated 2026-12-03 by a throwaway C program outside the repository,
// compiled with ggml-quants.c of llama.cpp 1eeb523c3e0c (2025-09-21) the way
// llama.cpp builds libggml-base (gcc -O3, no -march, so no FMA).
// Layout: "TQFX", u32 version 1, u32 count, then per type: u32 ggml type,
// u32 elements, u32 bytes, the blocks, the floats.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gguf/dequantize.h"
#include "util/error.h"
#include "util/fp16.h"

namespace tandem::gguf {
namespace {

struct Reference {
  TensorType type;
  std::vector<uint8_t> blocks;
  std::vector<float> values;
};

std::vector<Reference> load_reference() {
  std::ifstream in(std::string(TANDEM_TEST_DATA_DIR) + "/ggml_dequant_reference.bin", std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string data = ss.str();
  size_t pos = 0;
  auto u32 = [&] {
    uint32_t v = 0;
    if (pos + 4 <= data.size()) std::memcpy(&v, data.data() + pos, 4);
    pos += 4;
    return v;
  };
  std::vector<Reference> refs;
  if (u32() != 0x58465154 || u32() != 1) return refs;
  const uint32_t n = u32();
  for (uint32_t i = 0; i < n && pos < data.size(); ++i) {
    Reference r;
    r.type = static_cast<TensorType>(u32());
    const uint32_t elements = u32(), bytes = u32();
    if (pos + bytes + elements * 4ull > data.size()) return {};
    r.blocks.assign(data.begin() + pos, data.begin() + pos + bytes);
    pos += bytes;
    r.values.resize(elements);
    std::memcpy(r.values.data(), data.data() + pos, elements * 4ull);
    pos += elements * 4ull;
    refs.push_back(std::move(r));
  }
  return refs;
}

TEST(Dequantize, EveryQuantTypeIsBitIdenticalToGgml) {
  const std::vector<Reference> refs = load_reference();
  ASSERT_EQ(refs.size(), 12u) << "the fixture did not load";
  for (const Reference& r : refs) {
    SCOPED_TRACE(type_name(r.type));
    ASSERT_TRUE(can_dequantize(r.type));
    ASSERT_EQ(row_bytes(r.type, r.values.size()), r.blocks.size());
    std::vector<float> got(r.values.size(), -12345.0f);
    dequantize_row(r.type, r.blocks.data(), got.data(), static_cast<int64_t>(got.size()));
    size_t differing = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      uint32_t a, b;
      std::memcpy(&a, &got[i], 4);
      std::memcpy(&b, &r.values[i], 4);
      if (a != b && ++differing <= 3) ADD_FAILURE() << "element " << i << ": " << got[i] << " vs ggml " << r.values[i];
    }
    EXPECT_EQ(differing, 0u);
    // The values are not degenerate: most are non-zero and they vary.
    size_t nonzero = 0;
    for (float v : got) nonzero += v != 0.0f;
    EXPECT_GT(nonzero, got.size() / 2);
  }
}

TEST(Dequantize, HalfToFloatIsExactForEveryHalf) {
  // Against the arithmetic definition of binary16.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const int sign = (h >> 15) ? -1 : 1;
    const int exp = (h >> 10) & 0x1f;
    const int mant = h & 0x3ff;
    const float f = f16_to_f32(static_cast<uint16_t>(h));  // the scale conversion the dequantization uses
    if (exp == 0x1f) {
      EXPECT_TRUE(mant ? std::isnan(f) : std::isinf(f) && (f < 0) == (sign < 0)) << h;
      continue;
    }
    const double want = sign * (exp == 0 ? std::ldexp(mant, -24) : std::ldexp(1024 + mant, exp - 25));
    ASSERT_EQ(static_cast<double>(f), want) << h;
    if (want == 0) {
      EXPECT_EQ(std::signbit(f), sign < 0) << h;
    }
  }
}

TEST(Dequantize, UnsupportedTypesAndPartialBlocksAreErrors) {
  std::vector<uint8_t> block(256);
  float out[256];
  EXPECT_THROW(dequantize_row(TensorType::IQ2_XXS, block.data(), out, 256), Error);
  EXPECT_THROW(dequantize_row(TensorType::Q4_K, block.data(), out, 32), Error);
  EXPECT_FALSE(can_dequantize(TensorType::Q8_K));
}

}  // namespace
}  // namespace tandem::gguf
