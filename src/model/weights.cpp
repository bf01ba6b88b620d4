#include "model/weights.h"

#include <cstdio>
#include <initializer_list>
#include <optional>

#include "gguf/dequantize.h"
#include "gguf/gguf.h"
#include "kernels/ops.h"
#include "util/error.h"

namespace tandem {

namespace {

using kernels::DType;
using kernels::WeightMatrix;

thread_local ConvertedWeights* t_conversion = nullptr;

// The file types computed as they are.
std::optional<DType> native_dtype(gguf::TensorType t) { return kernels::dtype_for(t); }

// Whether tensor t is read by converting it to q8_0 (a type with no kernels yet).
bool converted(const gguf::TensorInfo& t) { return gguf::can_dequantize(t.type) && !native_dtype(t.type); }

DType compute_dtype(const gguf::File& f, const gguf::TensorInfo& t) {
  if (const auto native = native_dtype(t.type)) return *native;
  if (converted(t) && t_conversion != nullptr) return DType::kQ8_0;
  std::string native_types, converted_types;
  for (int i = 0; i < kernels::kDTypeCount; ++i)
    native_types += (i ? ", " : "") + gguf::type_name(kernels::gguf_tensor_type(static_cast<DType>(i)));
  for (uint32_t i = 0; i <= static_cast<uint32_t>(gguf::TensorType::MXFP4); ++i) {
    const auto type = static_cast<gguf::TensorType>(i);
    if (gguf::type_is_known(type) && gguf::can_dequantize(type) && !native_dtype(type))
      converted_types += (converted_types.empty() ? "" : ", ") + gguf::type_name(type);
  }
  throw Error(f.path() + ": tensor '" + t.name + "' has type " + gguf::type_name(t.type) +
              ", which tandem cannot compute with (supported: " + native_types + "; converted to q8_0 at load: " +
              converted_types + "); re-quantize the model to one of those");
}

// rows x cols of tensor t's bytes at `src`, as q8_0 rows in a buffer `into` keeps.
const uint8_t* convert_to_q8_0(const gguf::TensorInfo& t, const uint8_t* src, int64_t cols, int64_t rows,
                               ConvertedWeights& into) {
  const size_t src_row = gguf::row_bytes(t.type, static_cast<uint64_t>(cols));
  const size_t dst_row = kernels::dtype_row_bytes(DType::kQ8_0, cols);
  auto buf = std::make_unique<uint8_t[]>(dst_row * static_cast<size_t>(rows));
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    gguf::dequantize_row(t.type, src + static_cast<size_t>(r) * src_row, row.data(), cols);
    kernels::quantize_row_q8_0_weights(row.data(), buf.get() + static_cast<size_t>(r) * dst_row, cols);
  }
  into.bytes += dst_row * static_cast<size_t>(rows);
  into.sources.push_back(src);
  const uint8_t* data = buf.get();
  into.buffers.push_back(std::move(buf));
  return data;
}

std::string shape_text(std::initializer_list<int64_t> dims) {
  std::string s = "[";
  for (int64_t d : dims) s += (s.size() > 1 ? ", " : "") + std::to_string(d);
  return s + "]";
}

}  // namespace

void check_tensor_types(const gguf::File& f) {
  ConvertedWeights none;
  const WeightConversionScope scope(none);  // convertible types pass
  for (const gguf::TensorInfo& t : f.tensors()) (void)compute_dtype(f, t);
}

WeightConversionScope::WeightConversionScope(ConvertedWeights& into) : previous_(t_conversion) { t_conversion = &into; }
WeightConversionScope::~WeightConversionScope() { t_conversion = previous_; }

std::string ConvertedWeights::summary() const {
  if (tensors_by_type.empty()) return {};
  int64_t n = 0;
  std::string types;
  for (const auto& [type, count] : tensors_by_type) {
    n += count;
    types += (types.empty() ? "" : ", ") + type + ": " + std::to_string(count);
  }
  char mib[32];
  std::snprintf(mib, sizeof mib, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return std::to_string(n) + " tensors (" + types + ") converted to q8_0 (" + mib + ")";
}

void ConvertedWeights::release(const uint8_t* data) {
  for (auto& b : buffers)
    if (b && b.get() == data) b.reset();
}

namespace {

WeightMatrix matrix_view(const gguf::File& f, const gguf::TensorInfo& t, int64_t cols, int64_t rows,
                         const uint8_t* data) {
  WeightMatrix w;
  w.type = compute_dtype(f, t);
  if (cols % kernels::dtype_block_elements(w.type) != 0)
    throw Error(f.path() + ": " + kernels::dtype_name(w.type) + " tensor '" + t.name + "' has rows not made of whole blocks");
  if (converted(t)) {
    if (gguf::row_bytes(t.type, static_cast<uint64_t>(cols)) == 0)
      throw Error(f.path() + ": " + gguf::type_name(t.type) + " tensor '" + t.name + "' has rows not made of whole blocks");
    data = convert_to_q8_0(t, data, cols, rows, *t_conversion);
  }
  w.data = data;
  w.rows = rows;
  w.cols = cols;
  w.row_bytes = kernels::dtype_row_bytes(w.type, cols);
  return w;
}

}  // namespace

WeightMatrix weight_matrix(const gguf::File& f, const std::string& name, int64_t cols, int64_t rows) {
  const gguf::TensorInfo& t = f.tensor(name);
  // A one-row matrix may be stored as a vector (qwen3next's shared-expert gate).
  const bool vector_row = rows == 1 && t.dims.size() == 1 && static_cast<int64_t>(t.dims[0]) == cols;
  if (!vector_row &&
      (t.dims.size() != 2 || static_cast<int64_t>(t.dims[0]) != cols || static_cast<int64_t>(t.dims[1]) != rows))
    throw Error(f.path() + ": tensor '" + name + "' has shape " + t.shape_string() + ", expected " +
                shape_text({cols, rows}));
  TANDEM_ASSERT(gguf::row_bytes(t.type, static_cast<uint64_t>(cols)) * static_cast<uint64_t>(rows) == t.n_bytes);
  const WeightMatrix w = matrix_view(f, t, cols, rows, t.data);
  if (converted(t)) t_conversion->tensors_by_type[gguf::type_name(t.type)] += 1;
  return w;
}

std::vector<WeightMatrix> expert_matrices(const gguf::File& f, const std::string& name, int64_t cols, int64_t rows,
                                          int64_t n_expert) {
  const gguf::TensorInfo& t = f.tensor(name);
  if (t.dims.size() != 3 || static_cast<int64_t>(t.dims[0]) != cols || static_cast<int64_t>(t.dims[1]) != rows ||
      static_cast<int64_t>(t.dims[2]) != n_expert)
    throw Error(f.path() + ": tensor '" + name + "' has shape " + t.shape_string() + ", expected " +
                shape_text({cols, rows, n_expert}));
  std::vector<WeightMatrix> experts;
  // Slices of the file's bytes (in the file's type, whatever the matrices are computed in).
  const size_t slice_bytes = gguf::row_bytes(t.type, static_cast<uint64_t>(cols)) * static_cast<size_t>(rows);
  TANDEM_ASSERT(slice_bytes * static_cast<size_t>(n_expert) == t.n_bytes);
  for (int64_t e = 0; e < n_expert; ++e)
    experts.push_back(matrix_view(f, t, cols, rows, t.data + static_cast<size_t>(e) * slice_bytes));
  if (converted(t)) t_conversion->tensors_by_type[gguf::type_name(t.type)] += 1;
  return experts;
}

const float* weight_vector(const gguf::File& f, const std::string& name, int64_t n, bool required) {
  const gguf::TensorInfo* t = f.find_tensor(name);
  if (t == nullptr) {
    if (required) f.tensor(name);  // throws the standard "missing tensor" error
    return nullptr;
  }
  if (t->type != gguf::TensorType::F32)
    throw Error(f.path() + ": tensor '" + name + "' must be f32 (it is " + gguf::type_name(t->type) + ")");
  if (t->n_elements() != static_cast<uint64_t>(n))
    throw Error(f.path() + ": tensor '" + name + "' has shape " + t->shape_string() + ", expected [" +
                std::to_string(n) + "]");
  // GGUF data is aligned (32 bytes by default), so an f32 view is aligned.
  TANDEM_ASSERT(reinterpret_cast<uintptr_t>(t->data) % alignof(float) == 0);
  return reinterpret_cast<const float*>(t->data);
}

}  // namespace tandem
