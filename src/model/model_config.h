// Hyper-parameters of a llama-family model, read from GGUF metadata.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tandem {

namespace gguf {
class File;
}

struct ModelConfig {
  std::string arch;  // "llama", "qwen2", "qwen3", "qwen3moe" or "qwen3next"
  std::string name;  // general.name, if any
  int64_t n_vocab = 0;
  int64_t n_embd = 0;
  int64_t n_layer = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;
  int64_t n_ff = 0;
  int64_t n_ctx_train = 0;
  float rms_eps = 1e-5f;
  float rope_freq_base = 10000.0f;
  int n_rot = 0;
  bool rope_neox = false;       // qwen2/qwen3: rotate halves; llama: adjacent pairs
  bool qkv_bias = false;        // qwen2
  bool qk_norm = false;         // qwen3: RMSNorm per head on q and k
  bool tied_embeddings = false; // no output.weight: the embedding matrix is reused
  // Routed experts (qwen3moe): every layer's FFN is n_expert experts of
  // n_ff_exp, of which each token uses the n_expert_used its router ranks
  // highest, their weights renormalised to sum 1 (llama.cpp's norm_w).
  int64_t n_expert = 0;
  int64_t n_expert_used = 0;
  int64_t n_ff_exp = 0;
  float expert_weights_scale = 0.0f;  // 0 or 1: none
  int64_t n_ff_shexp = 0;             // qwen3next: the shared expert's width (0: none)

  // Hybrid (qwen3next): recurrent[l] marks a gated delta-net layer, the
  // others are gated full attention (Q projection = query and output gate
  // per head). Only attention layers have KV in the pool; recurrent layers
  // keep a per-sequence state (kv/state_slots.h).
  std::vector<bool> recurrent;  // empty: no recurrent layer
  int64_t ssm_d_conv = 0;       // causal convolution width
  int64_t ssm_d_state = 0;      // key (and value) head size of the delta rule
  int64_t ssm_n_k_heads = 0;    // ssm.group_count
  int64_t ssm_n_v_heads = 0;    // ssm.time_step_rank
  bool gated_attention = false;

  bool hybrid() const { return !recurrent.empty(); }
  int64_t n_attention_layers() const;
  // The KV layer of attention layer l (its index among the attention layers).
  int64_t kv_layer(int64_t l) const;
  // The recurrent index of recurrent layer l.
  int64_t state_layer(int64_t l) const;
  int64_t n_recurrent_layers() const { return n_layer - n_attention_layers(); }
  int64_t ssm_key_dim() const { return ssm_d_state * ssm_n_k_heads; }
  int64_t ssm_value_dim() const { return ssm_d_state * ssm_n_v_heads; }
  int64_t ssm_conv_channels() const { return 2 * ssm_key_dim() + ssm_value_dim(); }
  // Floats of one recurrent layer's state: the convolution's last
  // d_conv - 1 inputs, then one S x S delta-rule matrix per value head.
  int64_t conv_state_floats() const { return (ssm_d_conv - 1) * ssm_conv_channels(); }
  int64_t ssm_state_floats() const { return ssm_n_v_heads * ssm_d_state * ssm_d_state; }

  // Reads and validates the config; throws tandem::Error naming the key.
  static ModelConfig from_gguf(const gguf::File& file);
  // Supported architectures, for error messages.
  static const char* supported_architectures() { return "llama, qwen2, qwen3, qwen3moe, qwen3next"; }
};

}  // namespace tandem
