#include "kernels/dtype.h"

#include "util/error.h"

namespace tandem::kernels {

std::string dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kQ8_0: return "q8_0";
    case DType::kQ4_K: return "q4_k";
    case DType::kQ6_K: return "q6_k";
  }
  return "?";
}

int64_t dtype_block_elements(DType t) {
  switch (t) {
    case DType::kQ8_0: return 32;
    case DType::kQ4_K:
    case DType::kQ6_K: return 256;
    default: return 1;
  }
}

bool is_float_dtype(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

bool takes_q8_activations(DType t) { return t == DType::kQ8_0 || t == DType::kQ4_K || t == DType::kQ6_K; }

size_t dtype_row_bytes(DType t, int64_t n) {
  const auto un = static_cast<size_t>(n);
  switch (t) {
    case DType::kF32: return 4 * un;
    case DType::kF16:
    case DType::kBF16: return 2 * un;
    case DType::kQ8_0:
      TANDEM_ASSERT(n % 32 == 0, "q8_0 rows hold whole blocks of 32");
      return un / 32 * 34;
    case DType::kQ4_K:
      TANDEM_ASSERT(n % 256 == 0, "q4_k rows hold whole blocks of 256");
      return un / 256 * 144;
    case DType::kQ6_K:
      TANDEM_ASSERT(n % 256 == 0, "q6_k rows hold whole blocks of 256");
      return un / 256 * 210;
  }
  return 0;
}

DType parse_dtype(const std::string& name) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_K, DType::kQ6_K})
    if (name == dtype_name(t)) return t;
  throw Error("unknown data type '" + name + "': expected one of f32, f16, bf16, q8_0, q4_k, q6_k");
}

}  // namespace tandem::kernels
