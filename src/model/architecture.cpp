#include "model/architecture.h"

namespace tandem {

std::vector<LayerPlan> layer_plan(const ModelConfig& c) {
  // llama, qwen2, qwen3: every layer full attention and a dense SwiGLU FFN
  // (their differences, QKV biases and per-head norms, are optional weights
  // of the attention kind). qwen3moe: qwen3's attention, routed experts.
  const FfnKind ffn = c.arch == "qwen3moe" ? FfnKind::kExperts : FfnKind::kDense;
  return std::vector<LayerPlan>(static_cast<size_t>(c.n_layer), LayerPlan{MixerKind::kFullAttention, ffn});
}

}  // namespace tandem
