// Element types the kernels compute with, for weights and for the KV cache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tandem::kernels {

// Q8_0 is a weight type only; the KV cache is f32, f16 or bf16.
// kQ4_K and kQ6_K: GGUF's K-quant blocks of 256 elements (k_quants.h).
enum class DType { kF32, kF16, kBF16, kQ8_0, kQ4_K, kQ6_K };

std::string dtype_name(DType t);
// Elements of one block of the type (1 for the float types).
int64_t dtype_block_elements(DType t);
// Bytes of a row of n elements (n a multiple of dtype_block_elements).
size_t dtype_row_bytes(DType t, int64_t n);
// f32, f16 or bf16 (the types a KV cache can hold).
bool is_float_dtype(DType t);
// Whether matrices of the type multiply activations quantized to q8_0 blocks
// (MatmulInput::xq) rather than floats.
bool takes_q8_activations(DType t);
// Parses "f32", "f16", "bf16", "q8_0", "q4_k", "q6_k"; throws tandem::Error otherwise.
DType parse_dtype(const std::string& name);

}  // namespace tandem::kernels
