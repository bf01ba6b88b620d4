// Typed views of a GGUF file's tensors, checked against the shapes the model
// expects, for the layer kinds' loaders.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/matmul.h"

namespace tandem {

namespace gguf {
class File;
}

// Matrices of a type that has no kernels yet (the quant types
// gguf/dequantize reads: q4_0 ... q6_K, iq4_nl, iq4_xs) are converted to
// q8_0 while a model loads, into memory this holds; Model::load keeps one
// and opens a WeightConversionScope on it. Without a scope, such a type is
// an error naming it, as any type tandem cannot read.
struct ConvertedWeights {
  std::vector<std::unique_ptr<uint8_t[]>> buffers;
  std::vector<const uint8_t*> sources;  // the file bytes each came from (not paged in again)
  uint64_t bytes = 0;                   // of the q8_0 copies
  std::map<std::string, int64_t> tensors_by_type;  // e.g. "q6_K" -> 1
  // "2 tensors (q4_K: 1, q6_K: 1) converted to q8_0 (3.4 MiB)", empty when none.
  std::string summary() const;
  // Frees the buffer holding `data` (after the matrix was copied elsewhere).
  void release(const uint8_t* data);
};

// While alive, weight_matrix and expert_matrices on this thread convert into `into`.
class WeightConversionScope {
 public:
  explicit WeightConversionScope(ConvertedWeights& into);
  ~WeightConversionScope();
  WeightConversionScope(const WeightConversionScope&) = delete;
  WeightConversionScope& operator=(const WeightConversionScope&) = delete;

 private:
  ConvertedWeights* previous_;
};

// Throws, naming the tensor and the supported types, if any tensor of the
// file has a type tandem can neither compute with nor convert: checked
// before anything is converted or copied, so a file that cannot load fails
// at once.
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
// An f32 vector of n elements; null when absent and not required.
const float* weight_vector(const gguf::File& f, const std::string& name, int64_t n, bool required = true);

}  // namespace tandem
