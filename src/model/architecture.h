// An architecture is a declared composition of layer kinds: for each layer,
// which token mixer (attention_layer.h, delta_net_layer.h) and which
// feed-forward (dense_ffn.h, expert_ffn.h) it runs. Model::forward is
// a loop over this plan, so the next architecture is a new plan and, where it
// needs one, a new layer kind in its own file, not new branches in forward.
#pragma once

#include <cstdint>
#include <vector>

#include "model/model_config.h"

namespace tandem {

enum class MixerKind : uint8_t { kFullAttention, kGatedDeltaNet };
enum class FfnKind : uint8_t { kDense, kExperts };

struct LayerPlan {
  MixerKind mixer = MixerKind::kFullAttention;
  FfnKind ffn = FfnKind::kDense;
};

// The plan of c.arch, one entry per layer (ModelConfig::from_gguf has
// refused every architecture without one).
std::vector<LayerPlan> layer_plan(const ModelConfig& c);

}  // namespace tandem
