// Element types the kernels compute with, for weights and for the KV cache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace tandem::gguf {
enum class TensorType : uint32_t;
}

namespace tandem::kernels {

// The float types serve weights and the KV cache; the rest are GGUF's weight
// block types: q8_0 and the 32-element types of legacy_quants.h (q4_0, q4_1,
// q5_0, q5_1, iq4_nl), and the 256-element types of k_quants.h (q2_K ...
// q6_K, iq4_xs): every type GGUF files of the supported models use.
enum class DType { kF32, kF16, kBF16, kQ8_0, kQ4_K, kQ6_K, kQ4_0, kQ4_1, kQ5_0, kQ5_1, kIQ4_NL, kQ5_K, kQ2_K, kQ3_K, kIQ4_XS };
constexpr int kDTypeCount = static_cast<int>(DType::kIQ4_XS) + 1;

std::string dtype_name(DType t);
// Elements of one block of the type (1 for the float types).
int64_t dtype_block_elements(DType t);
// Bytes of one block (of one element for the float types).
size_t dtype_block_bytes(DType t);
// Bytes of a row of n elements (n a multiple of dtype_block_elements).
size_t dtype_row_bytes(DType t, int64_t n);
// f32, f16 or bf16 (the types a KV cache can hold).
bool is_float_dtype(DType t);
// Whether matrices of the type multiply activations quantized to q8_0 blocks
// (MatmulInput::xq) rather than floats: every block type.
bool takes_q8_activations(DType t);
// The name of every type, comma-separated (for messages and --help).
std::string dtype_names();
// The GGUF tensor type of t, and the type tandem computes a GGUF type as
// stored (none for the types it converts at load or cannot read).
gguf::TensorType gguf_tensor_type(DType t);
std::optional<DType> dtype_for(gguf::TensorType t);
// Parses a name of dtype_name; throws tandem::Error otherwise.
DType parse_dtype(const std::string& name);

}  // namespace tandem::kernels
