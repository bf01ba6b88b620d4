#include "model/model_config.h"

#include "gguf/gguf.h"
#include "util/error.h"

namespace tandem {

namespace {

void read_experts(const gguf::File& f, ModelConfig& c) {
  auto key = [&](const char* suffix) { return f.arch_key(suffix); };
  c.n_expert = static_cast<int64_t>(f.get_u64(key("expert_count")));
  c.n_expert_used = static_cast<int64_t>(f.get_u64(key("expert_used_count")));
  if (c.n_expert <= 0 || c.n_expert_used <= 0 || c.n_expert_used > c.n_expert)
    throw Error(f.path() + ": expert_used_count (" + std::to_string(c.n_expert_used) +
                ") must be between 1 and expert_count (" + std::to_string(c.n_expert) + ")");
  const uint64_t fallback = c.n_ff > 0 ? static_cast<uint64_t>(c.n_ff / c.n_expert_used) : 0;
  c.n_ff_exp = static_cast<int64_t>(f.get_u64_or(key("expert_feed_forward_length"), fallback));
  if (c.n_ff_exp <= 0) throw Error(f.path() + ": expert_feed_forward_length is missing or zero");
  c.expert_weights_scale = static_cast<float>(f.get_f64_or(key("expert_weights_scale"), 0.0));
  c.n_ff_shexp = static_cast<int64_t>(f.get_u64_or(key("expert_shared_feed_forward_length"), 0));
}

// qwen3next's gated delta-net layers (llama.cpp's ssm.* keys) and which
// layers they are: attention.recurrent_layers when present, else every layer
// but each full_attention_interval-th.
void read_hybrid(const gguf::File& f, ModelConfig& c) {
  auto key = [&](const char* suffix) { return f.arch_key(suffix); };
  c.gated_attention = true;
  c.ssm_d_conv = static_cast<int64_t>(f.get_u64(key("ssm.conv_kernel")));
  c.ssm_d_state = static_cast<int64_t>(f.get_u64(key("ssm.state_size")));
  c.ssm_n_k_heads = static_cast<int64_t>(f.get_u64(key("ssm.group_count")));
  c.ssm_n_v_heads = static_cast<int64_t>(f.get_u64(key("ssm.time_step_rank")));
  const auto d_inner = static_cast<int64_t>(f.get_u64(key("ssm.inner_size")));
  if (c.ssm_d_conv < 2 || c.ssm_d_state <= 0 || c.ssm_n_k_heads <= 0 || c.ssm_n_v_heads % c.ssm_n_k_heads != 0)
    throw Error(f.path() + ": ssm.conv_kernel must be at least 2 and ssm.time_step_rank a multiple of ssm.group_count");
  if (d_inner != c.ssm_value_dim())
    throw Error(f.path() + ": ssm.inner_size (" + std::to_string(d_inner) +
                ") must be ssm.state_size x ssm.time_step_rank (value heads of the key head size)");
  if (f.get_u64_or(key("nextn_predict_layers"), 0) != 0)
    throw Error(f.path() + ": multi-token-prediction layers (nextn_predict_layers) are not supported");
  const int64_t interval = static_cast<int64_t>(f.get_u64_or(key("full_attention_interval"), 4));
  if (interval <= 0) throw Error(f.path() + ": full_attention_interval must be positive");
  c.recurrent.assign(static_cast<size_t>(c.n_layer), false);
  if (const gguf::Value* layers = f.find(key("attention.recurrent_layers"))) {
    if (layers->type != gguf::ValueType::ARRAY || static_cast<int64_t>(layers->items.size()) != c.n_layer)
      throw Error(f.path() + ": attention.recurrent_layers must be an array with one entry per layer");
    for (size_t l = 0; l < layers->items.size(); ++l) c.recurrent[l] = layers->items[l].u64 != 0;
  } else {
    for (int64_t l = 0; l < c.n_layer; ++l) c.recurrent[static_cast<size_t>(l)] = (l + 1) % interval != 0;
  }
  if (c.n_attention_layers() == 0) throw Error(f.path() + ": a hybrid model needs at least one attention layer");
}

}  // namespace

int64_t ModelConfig::n_attention_layers() const {
  if (recurrent.empty()) return n_layer;
  int64_t n = 0;
  for (bool r : recurrent) n += r ? 0 : 1;
  return n;
}

int64_t ModelConfig::kv_layer(int64_t l) const {
  if (recurrent.empty()) return l;
  int64_t k = 0;
  for (int64_t i = 0; i < l; ++i) k += recurrent[static_cast<size_t>(i)] ? 0 : 1;
  return k;
}

int64_t ModelConfig::state_layer(int64_t l) const { return l - kv_layer(l); }

ModelConfig ModelConfig::from_gguf(const gguf::File& f) {
  ModelConfig c;
  c.arch = f.architecture();
  if (c.arch != "llama" && c.arch != "qwen2" && c.arch != "qwen3" && c.arch != "qwen3moe" && c.arch != "qwen3next")
    throw Error(f.path() + ": architecture '" + c.arch + "' is not supported (supported: " +
                supported_architectures() + ")");
  c.name = f.get_string_or("general.name", "");
  auto key = [&](const char* suffix) { return f.arch_key(suffix); };
  c.n_embd = static_cast<int64_t>(f.get_u64(key("embedding_length")));
  c.n_layer = static_cast<int64_t>(f.get_u64(key("block_count")));
  const bool moe = c.arch == "qwen3moe" || c.arch == "qwen3next";
  // A MoE file's dense FFN width is informational (llama.cpp falls back to it
  // for the expert width only).
  c.n_ff = static_cast<int64_t>(moe ? f.get_u64_or(key("feed_forward_length"), 0) : f.get_u64(key("feed_forward_length")));
  c.n_head = static_cast<int64_t>(f.get_u64(key("attention.head_count")));
  c.n_head_kv = static_cast<int64_t>(f.get_u64_or(key("attention.head_count_kv"), static_cast<uint64_t>(c.n_head)));
  c.n_ctx_train = static_cast<int64_t>(f.get_u64_or(key("context_length"), 2048));
  c.rms_eps = static_cast<float>(f.get_f64_or(key("attention.layer_norm_rms_epsilon"), 1e-5));
  c.rope_freq_base = static_cast<float>(f.get_f64_or(key("rope.freq_base"), 10000.0));
  if (moe) read_experts(f, c);
  if (c.arch == "qwen3next") read_hybrid(f, c);
  if (c.n_head <= 0 || c.n_embd <= 0 || c.n_layer <= 0 || (c.n_ff <= 0 && !moe) || c.n_head_kv <= 0)
    throw Error(f.path() + ": model dimensions must be positive");
  if (c.n_head % c.n_head_kv != 0)
    throw Error(f.path() + ": head_count (" + std::to_string(c.n_head) + ") is not a multiple of head_count_kv (" +
                std::to_string(c.n_head_kv) + ")");
  c.head_dim = static_cast<int64_t>(f.get_u64_or(key("attention.key_length"), static_cast<uint64_t>(c.n_embd / c.n_head)));
  const auto value_length = static_cast<int64_t>(f.get_u64_or(key("attention.value_length"), static_cast<uint64_t>(c.head_dim)));
  if (value_length != c.head_dim) throw Error(f.path() + ": attention.value_length != key_length is not supported");
  c.n_rot = static_cast<int>(f.get_u64_or(key("rope.dimension_count"), static_cast<uint64_t>(c.head_dim)));
  if (c.n_rot <= 0 || c.n_rot > c.head_dim || c.n_rot % 2 != 0)
    throw Error(f.path() + ": rope.dimension_count must be even and at most the head size");
  c.rope_neox = c.arch != "llama";
  c.qkv_bias = c.arch == "qwen2";
  c.qk_norm = c.arch == "qwen3" || moe;
  const std::string scaling = f.get_string_or(key("rope.scaling.type"), "none");
  if (scaling != "none" && scaling != "linear" && scaling != "llama3")
    throw Error(f.path() + ": rope scaling '" + scaling + "' is not supported (supported: none, llama3 via rope_freqs)");
  if (scaling == "linear" && f.get_f64_or(key("rope.scaling.factor"), 1.0) != 1.0)
    throw Error(f.path() + ": linear rope scaling is not supported");

  const gguf::TensorInfo& embd = f.tensor("token_embd.weight");
  if (embd.dims.size() != 2 || static_cast<int64_t>(embd.dims[0]) != c.n_embd)
    throw Error(f.path() + ": token_embd.weight has shape " + embd.shape_string() + ", expected [" +
                std::to_string(c.n_embd) + ", n_vocab]");
  c.n_vocab = static_cast<int64_t>(embd.dims[1]);
  c.tied_embeddings = f.find_tensor("output.weight") == nullptr;
  return c;
}

}  // namespace tandem
