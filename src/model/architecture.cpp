#include "model/architecture.h"

namespace tandem {

std::vector<LayerPlan> layer_plan(const ModelConfig& c) {
  // llama, qwen2, qwen3: every layer full attention and a dense SwiGLU FFN
  // (their differences, QKV biases and per-head norms, are optional weights
  // of the attention kind). qwen3moe: qwen3's attention, routed experts.
  // qwen3next: gated delta-net layers with gated attention every
  // full_attention_interval-th (ModelConfig::recurrent), routed experts and a
  // shared expert.
  const FfnKind ffn = c.n_expert > 0 ? FfnKind::kExperts : FfnKind::kDense;
  std::vector<LayerPlan> plan(static_cast<size_t>(c.n_layer), LayerPlan{MixerKind::kFullAttention, ffn});
  for (size_t l = 0; l < c.recurrent.size(); ++l)
    if (c.recurrent[l]) plan[l].mixer = MixerKind::kGatedDeltaNet;
  return plan;
}

}  // namespace tandem
