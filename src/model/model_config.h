// Hyper-parameters of a llama-family model, read from GGUF metadata.
#pragma once

#include <cstdint>
#include <string>

namespace tandem {

namespace gguf {
class File;
}

struct ModelConfig {
  std::string arch;  // "llama", "qwen2", "qwen3" or "qwen3moe"
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

  // Reads and validates the config; throws tandem::Error naming the key.
  static ModelConfig from_gguf(const gguf::File& file);
  // Supported architectures, for error messages.
  static const char* supported_architectures() { return "llama, qwen2, qwen3, qwen3moe"; }
};

}  // namespace tandem
