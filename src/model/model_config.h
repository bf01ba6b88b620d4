// Hyper-parameters of a llama-family model, read from GGUF metadata.
#pragma once

#include <cstdint>
#include <string>

namespace tandem {

namespace gguf {
class File;
}

struct ModelConfig {
  std::string arch;  // "llama", "qwen2" or "qwen3"
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

  // Reads and validates the config; throws tandem::Error naming the key.
  static ModelConfig from_gguf(const gguf::File& file);
  // Supported architectures, for error messages.
  static const char* supported_architectures() { return "llama, qwen2, qwen3"; }
};

}  // namespace tandem
