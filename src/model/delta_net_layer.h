// The gated delta-net layer kind (qwen3next's linear attention), as
// llama.cpp's qwen3next.cpp and delta-net-base.cpp compute it: RMSNorm; the
// QKV, output-gate (z) and beta/alpha projections; a short causal depthwise
// convolution over the QKV channels and SiLU; L2-normalised q and k; then per
// value head the gated delta rule on an S x S state,
//   S *= exp(g);  d = beta (v - S k);  S += d k^T;  o = S q / sqrt(S)
// with g = softplus(alpha + dt_bias) * a (a = -exp(A_log)) and beta =
// sigmoid(b); o RMS-normalised per head and multiplied by silu(z); the output
// projection added to the residual.
//
// The state (the convolution's last inputs and the S matrices) is the
// sequence's slot in the pool's state region. The rule runs token by token
// for prompts too (the recurrent form, not the chunked one): a state never
// depends on how a prompt was cut into chunks or batched, so chunked equals
// whole, batched equals alone and P/D equals colocated, bitwise. The cost is
// the chunked form's matmul-shaped parallelism over a chunk's tokens; the
// rule is ~4 S^2 flops per head and token, a few percent of the layer's
// projections for Qwen3-Next's shapes, and its work is split over (sequence,
// head) pairs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/matmul.h"
#include "model/forward_pass.h"

namespace tandem {

namespace gguf {
class File;
}

struct DeltaNetWeights {
  const float* attn_norm = nullptr;
  kernels::WeightMatrix wqkv;   // attn_qkv: q, k (key_dim each), v (value_dim) channels
  kernels::WeightMatrix wgate;  // attn_gate: z, value_dim rows
  kernels::WeightMatrix wba;    // ssm_ba: per key head, beta then alpha for its value heads
  const float* conv = nullptr;  // ssm_conv1d: d_conv taps per channel
  const float* dt_bias = nullptr;
  const float* a = nullptr;     // ssm_a = -exp(A_log), per value head
  const float* norm = nullptr;  // ssm_norm, per head element
  kernels::WeightMatrix wout;   // ssm_out

  std::vector<kernels::WeightMatrix*> matrices() { return {&wqkv, &wgate, &wba, &wout}; }
};

DeltaNetWeights load_delta_net(const gguf::File& f, const std::string& prefix, const ModelConfig& c);

// Adds the layer's output to pass.ws.x, advancing each sequence's state
// (recurrent layer `state_layer` of its slot) by its rows.
void run_delta_net(ForwardPass& pass, const DeltaNetWeights& w, int64_t state_layer);

// Bytes of a hybrid model's state slot: every recurrent layer's conv and S states, f32.
size_t state_slot_bytes(const ModelConfig& c);

}  // namespace tandem
