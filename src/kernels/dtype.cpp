#include "kernels/dtype.h"

#include "gguf/gguf.h"
#include "util/error.h"

namespace tandem::kernels {

namespace {

using gguf::TensorType;

struct DTypeTraits {
  const char* name;
  int64_t block_elements;
  size_t block_bytes;
  TensorType gguf;
};

// Indexed by DType; the block layouts are GGUF's (gguf_types.cpp).
constexpr DTypeTraits kTraits[kDTypeCount] = {
    {"f32", 1, 4, TensorType::F32},         {"f16", 1, 2, TensorType::F16},
    {"bf16", 1, 2, TensorType::BF16},       {"q8_0", 32, 34, TensorType::Q8_0},
    {"q4_k", 256, 144, TensorType::Q4_K},   {"q6_k", 256, 210, TensorType::Q6_K},
    {"q4_0", 32, 18, TensorType::Q4_0},     {"q4_1", 32, 20, TensorType::Q4_1},
    {"q5_0", 32, 22, TensorType::Q5_0},     {"q5_1", 32, 24, TensorType::Q5_1},
    {"iq4_nl", 32, 18, TensorType::IQ4_NL}, {"q5_k", 256, 176, TensorType::Q5_K},
    {"q2_k", 256, 84, TensorType::Q2_K},    {"q3_k", 256, 110, TensorType::Q3_K},
    {"iq4_xs", 256, 136, TensorType::IQ4_XS},
};

const DTypeTraits& traits(DType t) { return kTraits[static_cast<int>(t)]; }

}  // namespace

std::string dtype_name(DType t) { return traits(t).name; }

int64_t dtype_block_elements(DType t) { return traits(t).block_elements; }

size_t dtype_block_bytes(DType t) { return traits(t).block_bytes; }

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
