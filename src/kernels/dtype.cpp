#include "kernels/dtype.h"

#include "gguf/gguf.h"
#include "util/error.h"

namespace tandem::kernels {

namespace {

using gguf::TensorType;

// Indexed by DType. The block geometry is GGUF's own table (gguf_types.cpp).
struct DTypeTraits {
  const char* name;
  TensorType gguf;
};

constexpr DTypeTraits kTraits[kDTypeCount] = {
    {"f32", TensorType::F32},   {"f16", TensorType::F16},   {"bf16", TensorType::BF16},     {"q8_0", TensorType::Q8_0},
    {"q4_k", TensorType::Q4_K}, {"q6_k", TensorType::Q6_K}, {"q4_0", TensorType::Q4_0},     {"q4_1", TensorType::Q4_1},
    {"q5_0", TensorType::Q5_0}, {"q5_1", TensorType::Q5_1}, {"iq4_nl", TensorType::IQ4_NL}, {"q5_k", TensorType::Q5_K},
    {"q2_k", TensorType::Q2_K}, {"q3_k", TensorType::Q3_K}, {"iq4_xs", TensorType::IQ4_XS},
};

const DTypeTraits& traits(DType t) { return kTraits[static_cast<int>(t)]; }

}  // namespace

std::string dtype_name(DType t) { return traits(t).name; }

int64_t dtype_block_elements(DType t) { return static_cast<int64_t>(gguf::type_block_elements(traits(t).gguf)); }

size_t dtype_block_bytes(DType t) { return static_cast<size_t>(gguf::type_block_bytes(traits(t).gguf)); }

bool is_float_dtype(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

bool takes_q8_activations(DType t) { return !is_float_dtype(t); }

size_t dtype_row_bytes(DType t, int64_t n) {
  const int64_t block = dtype_block_elements(t);
  TANDEM_ASSERT(n % block == 0, "rows of a block type hold whole blocks");
  return static_cast<size_t>(n / block) * dtype_block_bytes(t);
}

TensorType gguf_tensor_type(DType t) { return traits(t).gguf; }

std::optional<DType> dtype_for(TensorType t) {
  for (int i = 0; i < kDTypeCount; ++i)
    if (kTraits[i].gguf == t) return static_cast<DType>(i);
  return std::nullopt;
}

std::string dtype_names() {
  std::string out;
  for (const DTypeTraits& t : kTraits) out += (out.empty() ? "" : ", ") + std::string(t.name);
  return out;
}

DType parse_dtype(const std::string& name) {
  for (int i = 0; i < kDTypeCount; ++i)
    if (name == kTraits[i].name) return static_cast<DType>(i);
  throw Error("unknown data type '" + name + "': expected one of " + dtype_names());
}

}  // namespace tandem::kernels
