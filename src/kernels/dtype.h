// Element types the kernels compute with, for weights and for the KV cache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tandem::kernels {

// Q8_0 is a weight type only; the KV cache is f32, f16 or bf16.
enum class DType { kF32, kF16, kBF16, kQ8_0 };

std::string dtype_name(DType t);
// Bytes of a row of n elements (n a multiple of 32 for Q8_0).
size_t dtype_row_bytes(DType t, int64_t n);
// Parses "f32", "f16", "bf16", "q8_0"; throws tandem::Error otherwise.
DType parse_dtype(const std::string& name);

}  // namespace tandem::kernels
