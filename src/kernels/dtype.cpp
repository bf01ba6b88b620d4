#include "kernels/dtype.h"

#include "util/error.h"

namespace tandem::kernels {

std::string dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kQ8_0: return "q8_0";
  }
  return "?";
}

size_t dtype_row_bytes(DType t, int64_t n) {
  const auto un = static_cast<size_t>(n);
  switch (t) {
    case DType::kF32: return 4 * un;
    case DType::kF16:
    case DType::kBF16: return 2 * un;
    case DType::kQ8_0:
      TANDEM_ASSERT(n % 32 == 0, "q8_0 rows hold whole blocks of 32");
      return un / 32 * 34;
  }
  return 0;
}

DType parse_dtype(const std::string& name) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0})
    if (name == dtype_name(t)) return t;
  throw Error("unknown data type '" + name + "': expected one of f32, f16, bf16, q8_0");
}

}  // namespace tandem::kernels
