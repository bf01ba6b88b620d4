// The block layouts of GGUF's quantized tensor types and their reference
// dequantization: each element computed with the same float operations, in
// the same order, as ggml's dequantize_row_* (ggml-quants.c, compiled as
// llama.cpp's build compiles libggml-base: no fused multiply-add), so the
// result is bit-identical. tests/test_dequantize.cpp checks it against
// blocks dequantized by ggml itself.
//
// This is the reference the compute kernels of these types are measured
// against; it is not a compute path of its own.
#pragma once

#include <cstdint>

#include "gguf/gguf.h"

namespace tandem::gguf {

// F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
// IQ4_NL and IQ4_XS.
bool can_dequantize(TensorType type);

// Writes the n elements that `src` holds into dst. n must be a multiple of
// the type's block size (type_block_elements) and the type one
// can_dequantize accepts; throws tandem::Error otherwise.
void dequantize_row(TensorType type, const uint8_t* src, float* dst, int64_t n);

}  // namespace tandem::gguf
