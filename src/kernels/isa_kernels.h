// The table of per-ISA kernel entry points. Internal to src/kernels: callers
// use matmul.h, attention.h and ops.h, which dispatch through this table.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/dtype.h"
#include "kernels/isa.h"

namespace tandem::kernels {

// One Q8_0 block as stored in GGUF: a half-precision scale and 32 int8 values.
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[32];
};
static_assert(sizeof(BlockQ8_0) == 34);

// Activations quantized for the Q8_0 dot product (float scale for accuracy).
struct BlockQ8_0Act {
  float d;
  int8_t qs[32];
};

// y[t * ldy + r] = dot(x row t, weight row r) for r in [row_begin, row_end),
// t in [0, n_tokens). Each output element is reduced in one fixed order that
// does not depend on n_tokens, the row range or the tiling, which is what makes
// the forward pass batch-invariant.
struct GemmArgs {
  const uint8_t* w = nullptr;  // weight rows, w_row_bytes apart
  size_t w_row_bytes = 0;
  int64_t k = 0;               // reduction length (weight row length)
  const float* x = nullptr;    // activations, ldx floats apart (f32/f16/bf16 weights)
  int64_t ldx = 0;
  const BlockQ8_0Act* xq = nullptr;  // activations quantized per row (q8_0 weights)
  int64_t ldxq = 0;                  // blocks between two token rows of xq
  int64_t n_tokens = 0;
  float* y = nullptr;
  int64_t ldy = 0;
};

using GemmFn = void (*)(const GemmArgs& args, int64_t row_begin, int64_t row_end);
using DotF32Fn = float (*)(const float* a, const void* b, int64_t n);
using AxpyFn = void (*)(float alpha, const void* x, float* y, int64_t n);

struct IsaKernels {
  GemmFn gemm_f32;
  GemmFn gemm_f16;
  GemmFn gemm_bf16;
  GemmFn gemm_q8_0;
  // dot(a, b) and y += alpha * x with b / x in f32, f16 or bf16 (the KV dtypes).
  DotF32Fn dot_f32;
  DotF32Fn dot_f16;
  DotF32Fn dot_bf16;
  AxpyFn axpy_f32;
  AxpyFn axpy_f16;
  AxpyFn axpy_bf16;
};

extern const IsaKernels kScalarKernels;
extern const IsaKernels kAvx2Kernels;
extern const IsaKernels kAvx512Kernels;

const IsaKernels& active_kernels();

// The GEMM entry point of a table for a weight type.
GemmFn gemm_for(const IsaKernels& kernels, DType type);

}  // namespace tandem::kernels
