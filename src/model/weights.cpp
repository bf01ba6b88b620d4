#include "model/weights.h"

#include <initializer_list>

#include "gguf/gguf.h"
#include "util/error.h"

namespace tandem {

namespace {

using kernels::DType;
using kernels::WeightMatrix;

DType compute_dtype(const gguf::File& f, const gguf::TensorInfo& t) {
  if (const auto native = kernels::dtype_for(t.type)) return *native;
  std::string supported;
  for (int i = 0; i < kernels::kDTypeCount; ++i)
    supported += (i ? ", " : "") + gguf::type_name(kernels::gguf_tensor_type(static_cast<DType>(i)));
  throw Error(f.path() + ": tensor '" + t.name + "' has type " + gguf::type_name(t.type) +
              ", which tandem cannot compute with (supported: " + supported + "); re-quantize the model to one of those");
}

std::string shape_text(std::initializer_list<int64_t> dims) {
  std::string s = "[";
  for (int64_t d : dims) s += (s.size() > 1 ? ", " : "") + std::to_string(d);
  return s + "]";
}

}  // namespace

void check_tensor_types(const gguf::File& f) {
  for (const gguf::TensorInfo& t : f.tensors()) (void)compute_dtype(f, t);
}

namespace {

WeightMatrix matrix_view(const gguf::File& f, const gguf::TensorInfo& t, int64_t cols, int64_t rows,
                         const uint8_t* data) {
  WeightMatrix w;
  w.type = compute_dtype(f, t);
  if (cols % kernels::dtype_block_elements(w.type) != 0)
    throw Error(f.path() + ": " + kernels::dtype_name(w.type) + " tensor '" + t.name + "' has rows not made of whole blocks");
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
  return matrix_view(f, t, cols, rows, t.data);
}

std::vector<WeightMatrix> expert_matrices(const gguf::File& f, const std::string& name, int64_t cols, int64_t rows,
                                          int64_t n_expert) {
  const gguf::TensorInfo& t = f.tensor(name);
  if (t.dims.size() != 3 || static_cast<int64_t>(t.dims[0]) != cols || static_cast<int64_t>(t.dims[1]) != rows ||
      static_cast<int64_t>(t.dims[2]) != n_expert)
    throw Error(f.path() + ": tensor '" + name + "' has shape " + t.shape_string() + ", expected " +
                shape_text({cols, rows, n_expert}));
  std::vector<WeightMatrix> experts;
  // Slices of the file's bytes.
  const size_t slice_bytes = gguf::row_bytes(t.type, static_cast<uint64_t>(cols)) * static_cast<size_t>(rows);
  TANDEM_ASSERT(slice_bytes * static_cast<size_t>(n_expert) == t.n_bytes);
  for (int64_t e = 0; e < n_expert; ++e)
    experts.push_back(matrix_view(f, t, cols, rows, t.data + static_cast<size_t>(e) * slice_bytes));
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
