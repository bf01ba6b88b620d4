// The dense feed-forward layer kind: RMSNorm, gate and up projections,
// SwiGLU, the down projection added to the residual.
#pragma once

#include <string>
#include <vector>

#include "kernels/matmul.h"
#include "model/forward_pass.h"

namespace tandem {

namespace gguf {
class File;
}

struct DenseFfnWeights {
  const float* ffn_norm = nullptr;
  kernels::WeightMatrix w_gate, w_up, w_down;

  std::vector<kernels::WeightMatrix*> matrices() { return {&w_gate, &w_up, &w_down}; }
};

DenseFfnWeights load_dense_ffn(const gguf::File& f, const std::string& prefix, const ModelConfig& c);

// Adds the layer's feed-forward output to pass.ws.x.
void run_dense_ffn(ForwardPass& pass, const DenseFfnWeights& w);

// How gate and up are cut across threads: the same rows of each, so that a
// thread's SwiGLU epilogue has both halves, in whole q8_0 blocks of down's
// input (32 rows).
kernels::MatmulSplit gate_up_split();

}  // namespace tandem
