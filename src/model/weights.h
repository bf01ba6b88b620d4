// Typed views of a GGUF file's tensors, checked against the shapes the model
// expects, for the layer kinds' loaders.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/matmul.h"

namespace tandem {

namespace gguf {
class File;
}

// Throws, naming the tensor and the supported types, if any tensor of the
// file has a type tandem cannot compute with: checked before anything is
// copied, so a file that cannot load fails at once.
void check_tensor_types(const gguf::File& f);

// A [rows x cols] matrix (GGUF dims {cols, rows}) of a type the kernels compute with.
kernels::WeightMatrix weight_matrix(const gguf::File& f, const std::string& name, int64_t cols, int64_t rows);
// The n_expert [rows x cols] matrices of a 3-D expert tensor (GGUF dims
// {cols, rows, n_expert}), each a view of its slice.
std::vector<kernels::WeightMatrix> expert_matrices(const gguf::File& f, const std::string& name, int64_t cols,
                                                   int64_t rows, int64_t n_expert);
// Bytes of a matrix's data.
inline uint64_t matrix_bytes(const kernels::WeightMatrix& w) {
  return static_cast<uint64_t>(w.row_bytes) * static_cast<uint64_t>(w.rows);
}
// Multiply-adds of one row of activations through the matrix.
inline uint64_t matrix_multiply_adds(const kernels::WeightMatrix& w) {
  return static_cast<uint64_t>(w.rows) * static_cast<uint64_t>(w.cols);
}
// A per-matrix figure (matrix_bytes, matrix_multiply_adds), summed over what a token reads.
using MatrixMeasure = uint64_t (*)(const kernels::WeightMatrix&);
// An f32 vector of n elements; null when absent and not required.
const float* weight_vector(const gguf::File& f, const std::string& name, int64_t n, bool required = true);

}  // namespace tandem
