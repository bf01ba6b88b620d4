#include "model/architecture.h"

namespace tandem {

std::vector<LayerPlan> layer_plan(const ModelConfig& c) {
  // llama, qwen2, qwen3: every layer full attention and a dense SwiGLU FFN
  // (their differences, QKV biases and per-head norms, are optional weights
  // of the attention kind).
  return std::vector<LayerPlan>(static_cast<size_t>(c.n_layer), LayerPlan{MixerKind::kFullAttention, FfnKind::kDense});
}

}  // namespace tandem
