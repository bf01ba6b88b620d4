// Tensor-type table, metadata value helpers and tensor-info helpers.

#include <string>
#include <utility>

#include "gguf/gguf.h"
#include "util/error.h"

namespace tandem::gguf {

namespace {

struct TypeTraits {
  const char* name;
  uint64_t block_elements;
  uint64_t block_bytes;
};

// Block geometry per ggml type, from the block layouts in ggml-common.h.
// Returns nullptr for ids that are not (or no longer) valid ggml types.
const TypeTraits* traits(TensorType type) {
  static constexpr TypeTraits kF32{"f32", 1, 4};
  static constexpr TypeTraits kF16{"f16", 1, 2};
  static constexpr TypeTraits kQ4_0{"q4_0", 32, 18};
  static constexpr TypeTraits kQ4_1{"q4_1", 32, 20};
  static constexpr TypeTraits kQ5_0{"q5_0", 32, 22};
  static constexpr TypeTraits kQ5_1{"q5_1", 32, 24};
  static constexpr TypeTraits kQ8_0{"q8_0", 32, 34};
  static constexpr TypeTraits kQ8_1{"q8_1", 32, 36};
  static constexpr TypeTraits kQ2_K{"q2_K", 256, 84};
  static constexpr TypeTraits kQ3_K{"q3_K", 256, 110};
  static constexpr TypeTraits kQ4_K{"q4_K", 256, 144};
  static constexpr TypeTraits kQ5_K{"q5_K", 256, 176};
  static constexpr TypeTraits kQ6_K{"q6_K", 256, 210};
  static constexpr TypeTraits kQ8_K{"q8_K", 256, 292};
  static constexpr TypeTraits kIQ2_XXS{"iq2_xxs", 256, 66};
  static constexpr TypeTraits kIQ2_XS{"iq2_xs", 256, 74};
  static constexpr TypeTraits kIQ3_XXS{"iq3_xxs", 256, 98};
  static constexpr TypeTraits kIQ1_S{"iq1_s", 256, 50};
  static constexpr TypeTraits kIQ4_NL{"iq4_nl", 32, 18};
  static constexpr TypeTraits kIQ3_S{"iq3_s", 256, 110};
  static constexpr TypeTraits kIQ2_S{"iq2_s", 256, 82};
  static constexpr TypeTraits kIQ4_XS{"iq4_xs", 256, 136};
  static constexpr TypeTraits kI8{"i8", 1, 1};
  static constexpr TypeTraits kI16{"i16", 1, 2};
  static constexpr TypeTraits kI32{"i32", 1, 4};
  static constexpr TypeTraits kI64{"i64", 1, 8};
  static constexpr TypeTraits kF64{"f64", 1, 8};
  static constexpr TypeTraits kIQ1_M{"iq1_m", 256, 56};
  static constexpr TypeTraits kBF16{"bf16", 1, 2};
  static constexpr TypeTraits kTQ1_0{"tq1_0", 256, 54};
  static constexpr TypeTraits kTQ2_0{"tq2_0", 256, 66};
  static constexpr TypeTraits kMXFP4{"mxfp4", 32, 17};

  // A switch rather than an array indexed by the id: the id comes from the
  // file and may be anything.
  switch (type) {
    case TensorType::F32: return &kF32;
    case TensorType::F16: return &kF16;
    case TensorType::Q4_0: return &kQ4_0;
    case TensorType::Q4_1: return &kQ4_1;
    case TensorType::Q5_0: return &kQ5_0;
    case TensorType::Q5_1: return &kQ5_1;
    case TensorType::Q8_0: return &kQ8_0;
    case TensorType::Q8_1: return &kQ8_1;
    case TensorType::Q2_K: return &kQ2_K;
    case TensorType::Q3_K: return &kQ3_K;
    case TensorType::Q4_K: return &kQ4_K;
    case TensorType::Q5_K: return &kQ5_K;
    case TensorType::Q6_K: return &kQ6_K;
    case TensorType::Q8_K: return &kQ8_K;
    case TensorType::IQ2_XXS: return &kIQ2_XXS;
    case TensorType::IQ2_XS: return &kIQ2_XS;
    case TensorType::IQ3_XXS: return &kIQ3_XXS;
    case TensorType::IQ1_S: return &kIQ1_S;
    case TensorType::IQ4_NL: return &kIQ4_NL;
    case TensorType::IQ3_S: return &kIQ3_S;
    case TensorType::IQ2_S: return &kIQ2_S;
    case TensorType::IQ4_XS: return &kIQ4_XS;
    case TensorType::I8: return &kI8;
    case TensorType::I16: return &kI16;
    case TensorType::I32: return &kI32;
    case TensorType::I64: return &kI64;
    case TensorType::F64: return &kF64;
    case TensorType::IQ1_M: return &kIQ1_M;
    case TensorType::BF16: return &kBF16;
    case TensorType::TQ1_0: return &kTQ1_0;
    case TensorType::TQ2_0: return &kTQ2_0;
    case TensorType::MXFP4: return &kMXFP4;
  }
  return nullptr;
}

Value make_integer(ValueType type, int64_t v) {
  Value out;
  out.type = type;
  out.i64 = v;
  out.u64 = static_cast<uint64_t>(v);
  return out;
}

Value make_unsigned(ValueType type, uint64_t v) {
  Value out;
  out.type = type;
  out.u64 = v;
  out.i64 = static_cast<int64_t>(v);
  return out;
}

Value make_float(ValueType type, double v) {
  Value out;
  out.type = type;
  out.f64 = v;
  return out;
}

}  // namespace

std::string type_name(TensorType type) {
  if (const TypeTraits* t = traits(type)) return t->name;
  return "type" + std::to_string(static_cast<uint32_t>(type));
}

bool type_is_known(TensorType type) { return traits(type) != nullptr; }

uint64_t type_block_elements(TensorType type) {
  const TypeTraits* t = traits(type);
  return t ? t->block_elements : 0;
}

uint64_t type_block_bytes(TensorType type) {
  const TypeTraits* t = traits(type);
  return t ? t->block_bytes : 0;
}

uint64_t row_bytes(TensorType type, uint64_t n) {
  const TypeTraits* t = traits(type);
  if (t == nullptr || n % t->block_elements != 0) return 0;
  uint64_t blocks = n / t->block_elements;
  uint64_t bytes = 0;
  // An unrepresentable size is reported like an invalid one: callers treat 0
  // for a non-empty row as "no valid size".
  if (__builtin_mul_overflow(blocks, t->block_bytes, &bytes)) return 0;
  return bytes;
}

std::string value_type_name(ValueType type) {
  switch (type) {
    case ValueType::UINT8: return "u8";
    case ValueType::INT8: return "i8";
    case ValueType::UINT16: return "u16";
    case ValueType::INT16: return "i16";
    case ValueType::UINT32: return "u32";
    case ValueType::INT32: return "i32";
    case ValueType::FLOAT32: return "f32";
    case ValueType::BOOL: return "bool";
    case ValueType::STRING: return "string";
    case ValueType::ARRAY: return "array";
    case ValueType::UINT64: return "u64";
    case ValueType::INT64: return "i64";
    case ValueType::FLOAT64: return "f64";
  }
  return "type" + std::to_string(static_cast<uint32_t>(type));
}

Value Value::make_u8(uint8_t v) { return make_unsigned(ValueType::UINT8, v); }
Value Value::make_i8(int8_t v) { return make_integer(ValueType::INT8, v); }
Value Value::make_u16(uint16_t v) { return make_unsigned(ValueType::UINT16, v); }
Value Value::make_i16(int16_t v) { return make_integer(ValueType::INT16, v); }
Value Value::make_u32(uint32_t v) { return make_unsigned(ValueType::UINT32, v); }
Value Value::make_i32(int32_t v) { return make_integer(ValueType::INT32, v); }
Value Value::make_u64(uint64_t v) { return make_unsigned(ValueType::UINT64, v); }
Value Value::make_i64(int64_t v) { return make_integer(ValueType::INT64, v); }
Value Value::make_f32(float v) { return make_float(ValueType::FLOAT32, v); }
Value Value::make_f64(double v) { return make_float(ValueType::FLOAT64, v); }
Value Value::make_bool(bool v) { return make_unsigned(ValueType::BOOL, v ? 1 : 0); }

Value Value::make_string(std::string v) {
  Value out;
  out.type = ValueType::STRING;
  out.str = std::move(v);
  return out;
}

Value Value::make_string_array(const std::vector<std::string>& v) {
  std::vector<Value> items;
  items.reserve(v.size());
  for (const std::string& s : v) items.push_back(make_string(s));
  return make_array(ValueType::STRING, std::move(items));
}

Value Value::make_f32_array(const std::vector<float>& v) {
  std::vector<Value> items;
  items.reserve(v.size());
  for (float f : v) items.push_back(make_f32(f));
  return make_array(ValueType::FLOAT32, std::move(items));
}

Value Value::make_i32_array(const std::vector<int32_t>& v) {
  std::vector<Value> items;
  items.reserve(v.size());
  for (int32_t i : v) items.push_back(make_i32(i));
  return make_array(ValueType::INT32, std::move(items));
}

Value Value::make_array(ValueType elem, std::vector<Value> items) {
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].type != elem) {
      throw Error("GGUF array of " + value_type_name(elem) + ": item " + std::to_string(i) +
                  " has type " + value_type_name(items[i].type));
    }
  }
  Value out;
  out.type = ValueType::ARRAY;
  out.elem_type = elem;
  out.items = std::move(items);
  return out;
}

bool Value::is_integer() const {
  switch (type) {
    case ValueType::UINT8:
    case ValueType::INT8:
    case ValueType::UINT16:
    case ValueType::INT16:
    case ValueType::UINT32:
    case ValueType::INT32:
    case ValueType::UINT64:
    case ValueType::INT64: return true;
    default: return false;
  }
}

bool Value::is_float() const { return type == ValueType::FLOAT32 || type == ValueType::FLOAT64; }

uint64_t TensorInfo::n_elements() const {
  uint64_t n = 1;
  // The reader rejects shapes whose product overflows; a TensorInfo built by
  // hand with such a shape is a bug in the caller.
  for (uint64_t d : dims) TANDEM_ASSERT(!__builtin_mul_overflow(n, d, &n), "tensor " + name);
  return n;
}

std::string TensorInfo::shape_string() const {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(dims[i]);
  }
  return out + "]";
}

}  // namespace tandem::gguf
