// The full (softmax) attention layer kind of llama, qwen2, qwen3, qwen3moe and
// qwen3next: RMSNorm,
// the Q/K/V projections (optional biases, optional per-head norms), RoPE, K
// and V written to the paged pool, attention over the pool, the output
// projection added to the residual.
#pragma once

#include <string>
#include <vector>

#include "kernels/matmul.h"
#include "model/forward_pass.h"

namespace tandem {

namespace gguf {
class File;
}

struct AttentionWeights {
  const float* attn_norm = nullptr;
  kernels::WeightMatrix wq, wk, wv, wo;
  const float* bq = nullptr;  // qwen2 biases (null when absent)
  const float* bk = nullptr;
  const float* bv = nullptr;
  const float* q_norm = nullptr;  // qwen3 per-head norms
  const float* k_norm = nullptr;

  // The matrices, for interleaving and the per-step weight bytes.
  std::vector<kernels::WeightMatrix*> matrices() { return {&wq, &wk, &wv, &wo}; }
};

// Loads blk.<layer>.attn_* (`prefix` is "blk.<layer>.").
AttentionWeights load_attention(const gguf::File& f, const std::string& prefix, const ModelConfig& c);

// How the Q/K/V group's rows are cut across threads (q_rows and kv_rows
// of them on this rank): whole heads, so that the epilogue ropes and writes
// per head, and whole panels where the shapes allow.
kernels::MatmulSplit qkv_rows_split(const ModelConfig& c, int64_t q_rows, int64_t kv_rows);

// Adds the layer's attention output to pass.ws.x, writing its K and V for
// every row into layer `kv_layer` of pass.kv first. With
// ModelConfig::gated_attention (qwen3next), Q's rows are each head's query
// then its gate, and the attention output is multiplied by sigmoid(gate).
void run_attention(ForwardPass& pass, const AttentionWeights& w, int64_t kv_layer);

}  // namespace tandem
