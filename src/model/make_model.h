// Deterministic random-weight GGUF models for tests, demos and benchmarks.
// The same options give the same bytes. The files carry a byte-level BPE
// tokenizer built by tandem (so text round-trips) and load in llama.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/dtype.h"

namespace tandem {

struct ModelPreset {
  std::string name;
  int64_t n_embd, n_layer, n_head, n_head_kv, n_ff, n_vocab, n_ctx;
  bool tied_embeddings;
  // Routed experts (MoE architectures only; 0 otherwise).
  int64_t n_expert = 0, n_expert_used = 0, n_ff_exp = 0;
  // qwen3next: the shared expert, the attention head size (0: n_embd /
  // n_head), and the gated delta-net layers (all but every
  // full_attention_interval-th).
  int64_t n_ff_shexp = 0, head_dim = 0;
  int64_t ssm_d_conv = 0, ssm_d_state = 0, ssm_n_k_heads = 0, ssm_n_v_heads = 0, full_attention_interval = 0;
};

// Every architecture has tiny-wide: tiny with rows of 256 and more (n_embd
// 256), which the 256-element K-quant blocks need (tests of q4_k, q6_k).
// Dense architectures: tiny (tests, < 5 MB), tiny-tied (tiny with the
// output tied to the embedding table), small (~336M parameters), base
// (Qwen2.5-0.5B shape, tied). qwen3moe: tiny (8 experts, top 2) and small (16
// experts, top 4, ~240M parameters of which ~90M active per token).
// qwen3next: tiny (4 layers, 1 attention) and small (8 layers, 2 attention,
// 16 experts, top 4).
const ModelPreset& find_preset(const std::string& name, const std::string& arch = "llama");
std::vector<std::string> preset_names();

// A per-tensor type choice on top of the model's type, as llama.cpp's
// quantizer makes for its file types (llama_tensor_get_type): q4_k_m and
// q5_k_m give the output matrix (the token embedding when tied) q6_K, and
// attn_v (and the delta-net's attn_qkv) and ffn_down q6_K in the layers
// use_more_bits picks (the first and last eighths and every third between);
// with 8 experts attn_k and attn_v q8_0, and (q4_k_m) attn_output q5_K.
enum class QuantMix { kNone, kQ4_K_M, kQ5_K_M };

struct MakeModelOptions {
  std::string preset = "tiny";
  std::string arch = "llama";  // llama, qwen2, qwen3, qwen3moe, qwen3next
  kernels::DType dtype = kernels::DType::kF16;  // every matrix's type, or a mix's base type
  QuantMix mix = QuantMix::kNone;
  int64_t n_layer = 0;  // 0: the preset's
  uint64_t seed = 0;
};

// Sets dtype and mix from a --dtype name: a type of kernels::parse_dtype, or
// q4_k_m / q5_k_m (base q4_k / q5_k). Throws tandem::Error otherwise.
void set_weight_type(const std::string& name, MakeModelOptions* options);
// Every name set_weight_type takes.
std::vector<std::string> weight_type_names();

// Writes the model to `path`; throws tandem::Error on a bad option or I/O error.
void make_model(const MakeModelOptions& options, const std::string& path);

}  // namespace tandem
