// The routed-experts feed-forward layer kind (qwen3moe, qwen3next): RMSNorm,
// a router that ranks the experts per token (softmax, top n_expert_used,
// weights renormalised to sum 1), each chosen expert's SwiGLU FFN over the
// rows sent to it, and the weighted sum of a row's expert outputs added to
// the residual. qwen3next adds a shared expert every token runs, scaled by
// sigmoid(its gate . x), and names the norm post_attention_norm.
//
// Batch invariance: a row's expert outputs come from batch-invariant kernels
// over its own row, and a row sums them in its own rank order, so its result
// never depends on which other rows share its experts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/matmul.h"
#include "model/expert_exchange.h"
#include "model/forward_pass.h"
#include "model/weights.h"

namespace tandem {

namespace gguf {
class File;
}

struct ExpertFfnWeights {
  const float* ffn_norm = nullptr;
  kernels::WeightMatrix router;                      // ffn_gate_inp: n_expert rows
  std::vector<kernels::WeightMatrix> gate, up, down;  // one per expert
  // Expert parallelism: the experts this rank holds (the others are empty).
  int64_t first_local = 0;
  int64_t n_local = 0;
  bool has_shared = false;
  kernels::WeightMatrix shared_gate_inp;  // one row: the shared expert's gate
  kernels::WeightMatrix shared_gate, shared_up, shared_down;

  std::vector<kernels::WeightMatrix*> matrices();
  // `measure` (weights.h) summed over what one token reads: the router,
  // n_used experts, the shared expert.
  uint64_t per_token(int64_t n_used, MatrixMeasure measure) const;
};

// Loads the layer, keeping experts [first, first + count) (count -1: all).
ExpertFfnWeights load_expert_ffn(const gguf::File& f, const std::string& prefix, const ModelConfig& c,
                                 int64_t first = 0, int64_t count = -1);

// Adds the layer's feed-forward output to pass.ws.x; with pass.experts,
// exchanging rows with the ranks that hold the experts they are routed to.
void run_expert_ffn(ForwardPass& pass, const ExpertFfnWeights& w);

// Expert parallelism: the layer's exchanges for a rank with no rows of its
// own, computing its experts for the rows its peers send.
void run_expert_exchange_empty(ForwardWorkspace& ws, const ExpertFfnWeights& w, const ModelConfig& c, ThreadPool& pool,
                               ExpertExchange& exchange);

// The experts of one token and their weights, from its router logits, as
// llama.cpp chooses them: softmax, the n_used most probable (ties to the
// lower index), weights divided by their sum (at least 2^-14), then scaled.
void route_token(const float* logits, int64_t n_expert, int64_t n_used, float scale, int32_t* experts,
                 float* weights);

}  // namespace tandem
