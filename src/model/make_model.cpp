#include "model/make_model.h"

#include <cmath>
#include <algorithm>
#include <cstring>
#include <optional>

#include "gguf/gguf.h"
#include "kernels/ops.h"
#include "tokenizer/demo_vocab.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace tandem {

namespace {

using kernels::DType;

const std::vector<ModelPreset>& presets() {
  static const std::vector<ModelPreset> kPresets = {
      {"tiny", 64, 2, 4, 2, 160, 1024, 512, false},
      {"tiny-wide", 256, 2, 4, 2, 512, 1024, 512, false},
      {"tiny-tied", 64, 2, 4, 2, 160, 1024, 512, true},
      {"small", 1024, 24, 16, 4, 2816, 32000, 4096, false},
      {"base", 896, 24, 14, 2, 4864, 151936, 32768, true},
  };
  return kPresets;
}

const std::vector<ModelPreset>& moe_presets() {
  static const std::vector<ModelPreset> kPresets = {
      {"tiny", 64, 2, 4, 2, 160, 1024, 512, false, 8, 2, 64},
      {"tiny-wide", 256, 2, 4, 2, 512, 1024, 512, false, 8, 2, 256},
      {"small", 1024, 8, 16, 4, 2816, 32000, 4096, false, 16, 4, 384},
  };
  return kPresets;
}

const std::vector<ModelPreset>& hybrid_presets() {
  auto preset = [](std::string name, int64_t E, int64_t L, int64_t H, int64_t KV, int64_t D, int64_t V, int64_t ctx,
                   int64_t X, int64_t K, int64_t F, int64_t S, int64_t hk, int64_t hv) {
    ModelPreset p{std::move(name), E, L, H, KV, 4 * F, V, ctx, false, X, K, F};
    p.n_ff_shexp = F;
    p.head_dim = D;
    p.ssm_d_conv = 4;
    p.ssm_d_state = S;
    p.ssm_n_k_heads = hk;
    p.ssm_n_v_heads = hv;
    p.full_attention_interval = 4;
    return p;
  };
  static const std::vector<ModelPreset> kPresets = {
      preset("tiny", 64, 4, 4, 2, 16, 1024, 512, 8, 2, 64, 16, 2, 4),
      preset("tiny-wide", 256, 4, 4, 2, 64, 1024, 512, 8, 2, 256, 16, 2, 4),
      preset("small", 1024, 8, 8, 2, 128, 32000, 4096, 16, 4, 384, 64, 4, 8),
  };
  return kPresets;
}

bool is_hybrid(const std::string& arch) { return arch == "qwen3next"; }
bool is_moe(const std::string& arch) { return arch == "qwen3moe" || is_hybrid(arch); }

// splitmix64: a tiny, portable generator (the standard library's
// distributions differ between implementations, which would break "same
// arguments, same bytes").
struct Rng {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [-1, 1).
  float uniform() { return static_cast<float>(static_cast<double>(next() >> 40) / static_cast<double>(1ull << 23) - 1.0); }
};

uint64_t fnv1a(const std::string& s, uint64_t seed) {
  uint64_t h = 0xcbf29ce484222325ull ^ seed;
  for (unsigned char ch : s) {
    h ^= ch;
    h *= 0x100000001b3ull;
  }
  return h;
}

uint32_t file_type(DType t, QuantMix mix) {
  if (mix == QuantMix::kQ4_K_M) return 15;  // llama_ftype numbering
  if (mix == QuantMix::kQ5_K_M) return 17;
  switch (t) {
    case DType::kF32: return 0;
    case DType::kF16: return 1;
    case DType::kQ4_0: return 2;
    case DType::kQ4_1: return 3;
    case DType::kQ8_0: return 7;
    case DType::kQ5_0: return 8;
    case DType::kQ5_1: return 9;
    case DType::kQ4_K: return 15;  // MOSTLY_Q4_K_M: the closest ftype of a file all q4_K
    case DType::kQ5_K: return 17;  // MOSTLY_Q5_K_M, likewise
    case DType::kQ6_K: return 18;
    case DType::kIQ4_NL: return 25;
    case DType::kQ2_K: return 10;
    case DType::kQ3_K: return 11;  // MOSTLY_Q3_K_S: the closest ftype of a file all q3_K
    case DType::kIQ4_XS: return 30;
    case DType::kBF16: return 32;
  }
  return 0;
}

// The type a matrix of `cols` columns takes instead of t when its rows are
// not whole blocks of t: llama.cpp's fallbacks (a 32-element type of about
// the same size), then f16.
DType fallback_type(DType t, int64_t cols) {
  if (cols % kernels::dtype_block_elements(t) == 0) return t;
  DType smaller = DType::kQ8_0;  // q6_K, and q8_0 itself (then f16)
  if (t == DType::kQ2_K || t == DType::kQ3_K) smaller = DType::kQ4_0;
  if (t == DType::kQ4_K) smaller = DType::kQ5_0;
  if (t == DType::kQ5_K) smaller = DType::kQ5_1;
  if (t == DType::kIQ4_XS) smaller = DType::kIQ4_NL;
  return cols % kernels::dtype_block_elements(smaller) == 0 ? smaller : DType::kF16;
}

// llama.cpp's use_more_bits: the layers of a q4_k_m / q5_k_m file whose
// attn_v and ffn_down get q6_K.
bool use_more_bits(int64_t i, int64_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

// Where a tensor sits, for a mix's choice.
struct MixPlace {
  int64_t n_layer = 0;
  int64_t n_expert = 0;
  bool tied_embeddings = false;
};

// Whether a tensor is one llama.cpp counts as attn_v (the delta-net's fused
// attn_qkv is one too).
bool attn_v_like(const std::string& name) {
  return name.find("attn_v.weight") != std::string::npos || name.find("attn_qkv.weight") != std::string::npos;
}

// The type llama.cpp's quantizer (3f545becc) gives tensor `name` of a q4_k_m
// / q5_k_m file of base type `base`, before the fallback. i_attn_v counts the
// attn_v-like tensors before this one in layer order; ffn_down's index is
// its layer, out of n_layer, as llama.cpp counts them.
DType mix_type(QuantMix mix, DType base, const std::string& name, const MixPlace& p, int64_t i_attn_v, int64_t layer) {
  const auto has = [&](const char* part) { return name.find(part) != std::string::npos; };
  if (name == "output.weight" || (p.tied_embeddings && name == "token_embd.weight")) return DType::kQ6_K;
  if (attn_v_like(name)) {
    if (p.n_expert == 8) return DType::kQ8_0;
    return use_more_bits(i_attn_v, p.n_layer) ? DType::kQ6_K : base;
  }
  if (has("attn_k.weight") && p.n_expert == 8) return DType::kQ8_0;
  if (has("attn_output.weight") && p.n_expert == 8 && mix == QuantMix::kQ4_K_M) return DType::kQ5_K;
  if (has("ffn_down")) return use_more_bits(layer, p.n_layer) ? DType::kQ6_K : base;
  return base;
}

class Builder {
 public:
  Builder(gguf::Writer& w, uint64_t seed, DType dtype, QuantMix mix, const MixPlace& place)
      : w_(w), seed_(seed), dtype_(dtype), mix_(mix), place_(place) {}

  // A matrix of `rows` rows of `cols` values uniform with standard deviation
  // `std`; with n_expert > 0, n_expert such matrices as one 3-D tensor. The
  // type is the model's (or its mix's choice) unless given (routers stay f32,
  // as llama.cpp's quantizer leaves them).
  void matrix(const std::string& name, int64_t cols, int64_t rows, float std_dev, int64_t n_expert = 0,
              std::optional<DType> type = std::nullopt) {
    DType dtype = type.value_or(dtype_);
    if (!type && mix_ != QuantMix::kNone) {
      const int64_t layer = name.rfind("blk.", 0) == 0 ? std::stoll(name.substr(4)) : 0;
      dtype = mix_type(mix_, dtype_, name, place_, i_attn_v_, layer);
    }
    if (attn_v_like(name)) ++i_attn_v_;
    dtype = fallback_type(dtype, cols);
    Rng rng{fnv1a(name, seed_)};
    const float amp = std_dev * std::sqrt(3.0f);
    std::vector<float> row(static_cast<size_t>(cols));
    const size_t row_bytes = kernels::dtype_row_bytes(dtype, cols);
    const int64_t all_rows = rows * std::max<int64_t>(n_expert, 1);
    std::vector<uint8_t> data(row_bytes * static_cast<size_t>(all_rows));
    for (int64_t r = 0; r < all_rows; ++r) {
      for (auto& v : row) v = amp * rng.uniform();
      kernels::convert_row(row.data(), dtype, data.data() + static_cast<size_t>(r) * row_bytes, cols);
    }
    std::vector<uint64_t> dims{static_cast<uint64_t>(cols), static_cast<uint64_t>(rows)};
    if (n_expert > 0) dims.push_back(static_cast<uint64_t>(n_expert));
    w_.add_tensor(name, kernels::gguf_tensor_type(dtype), dims, std::move(data));
  }

  // An f32 vector of values center + uniform(-spread, spread).
  void vector(const std::string& name, int64_t n, float center, float spread) {
    Rng rng{fnv1a(name, seed_)};
    std::vector<uint8_t> data(static_cast<size_t>(n) * 4);
    for (int64_t i = 0; i < n; ++i) {
      const float v = center + spread * rng.uniform();
      std::memcpy(data.data() + 4 * i, &v, 4);
    }
    w_.add_tensor(name, gguf::TensorType::F32, {static_cast<uint64_t>(n)}, std::move(data));
  }

 private:
  gguf::Writer& w_;
  uint64_t seed_;
  DType dtype_;
  QuantMix mix_;
  MixPlace place_;
  int64_t i_attn_v_ = 0;
};

}  // namespace

const ModelPreset& find_preset(const std::string& name, const std::string& arch) {
  const bool moe = is_moe(arch);
  for (const auto& p : is_hybrid(arch) ? hybrid_presets() : moe ? moe_presets() : presets())
    if (p.name == name) return p;
  throw Error("unknown preset '" + name + "' for " + arch + ": expected one of " +
              (moe ? "tiny, tiny-wide, small" : "tiny, tiny-wide, tiny-tied, small, base"));
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const auto& p : presets()) names.push_back(p.name);
  return names;
}

void set_weight_type(const std::string& name, MakeModelOptions* o) {
  if (name == "q4_k_m" || name == "q5_k_m") {
    o->mix = name == "q4_k_m" ? QuantMix::kQ4_K_M : QuantMix::kQ5_K_M;
    o->dtype = name == "q4_k_m" ? DType::kQ4_K : DType::kQ5_K;
    return;
  }
  try {
    o->dtype = kernels::parse_dtype(name);
    o->mix = QuantMix::kNone;
  } catch (const Error&) {
    throw Error("unknown weight type '" + name + "': expected one of " + kernels::dtype_names() + ", q4_k_m, q5_k_m");
  }
}

std::vector<std::string> weight_type_names() {
  std::vector<std::string> names;
  for (int i = 0; i < kernels::kDTypeCount; ++i) names.push_back(kernels::dtype_name(static_cast<DType>(i)));
  names.push_back("q4_k_m");
  names.push_back("q5_k_m");
  return names;
}

void make_model(const MakeModelOptions& o, const std::string& path) {
  if (o.arch != "llama" && o.arch != "qwen2" && o.arch != "qwen3" && !is_moe(o.arch))
    throw Error("unknown architecture '" + o.arch + "': expected one of llama, qwen2, qwen3, qwen3moe, qwen3next");
  ModelPreset p = find_preset(o.preset, o.arch);
  if (o.n_layer < 0) throw Error("--layers must be positive");
  if (o.n_layer > 0) p.n_layer = o.n_layer;
  const bool moe = is_moe(o.arch);
  const bool qk_norm = o.arch == "qwen3" || moe;
  const int64_t head_dim = p.head_dim > 0 ? p.head_dim : p.n_embd / p.n_head;
  const bool hybrid = is_hybrid(o.arch);
  const int64_t q_dim = p.n_head * head_dim;
  const int64_t kv_dim = p.n_head_kv * head_dim;
  const bool llama = o.arch == "llama";

  gguf::Writer w;
  const std::string& a = o.arch;
  w.set("general.architecture", gguf::Value::make_string(a));
  w.set("general.name", gguf::Value::make_string("tandem-demo-" + p.name + "-" + a));
  w.set("general.file_type", gguf::Value::make_u32(file_type(o.dtype, o.mix)));
  w.set("general.quantization_version", gguf::Value::make_u32(2));
  w.set(a + ".vocab_size", gguf::Value::make_u32(static_cast<uint32_t>(p.n_vocab)));
  w.set(a + ".context_length", gguf::Value::make_u32(static_cast<uint32_t>(p.n_ctx)));
  w.set(a + ".embedding_length", gguf::Value::make_u32(static_cast<uint32_t>(p.n_embd)));
  w.set(a + ".block_count", gguf::Value::make_u32(static_cast<uint32_t>(p.n_layer)));
  w.set(a + ".feed_forward_length", gguf::Value::make_u32(static_cast<uint32_t>(p.n_ff)));
  w.set(a + ".attention.head_count", gguf::Value::make_u32(static_cast<uint32_t>(p.n_head)));
  w.set(a + ".attention.head_count_kv", gguf::Value::make_u32(static_cast<uint32_t>(p.n_head_kv)));
  w.set(a + ".attention.layer_norm_rms_epsilon", gguf::Value::make_f32(llama ? 1e-5f : 1e-6f));
  w.set(a + ".rope.freq_base", gguf::Value::make_f32(llama ? 10000.0f : 1000000.0f));
  // qwen3next rotates a quarter of each head (partial_rotary_factor 0.25).
  w.set(a + ".rope.dimension_count", gguf::Value::make_u32(static_cast<uint32_t>(hybrid ? head_dim / 4 : head_dim)));
  if (moe) {
    w.set(a + ".expert_count", gguf::Value::make_u32(static_cast<uint32_t>(p.n_expert)));
    w.set(a + ".expert_used_count", gguf::Value::make_u32(static_cast<uint32_t>(p.n_expert_used)));
    w.set(a + ".expert_feed_forward_length", gguf::Value::make_u32(static_cast<uint32_t>(p.n_ff_exp)));
  }
  if (hybrid) {
    w.set(a + ".expert_shared_feed_forward_length", gguf::Value::make_u32(static_cast<uint32_t>(p.n_ff_shexp)));
    w.set(a + ".ssm.conv_kernel", gguf::Value::make_u32(static_cast<uint32_t>(p.ssm_d_conv)));
    w.set(a + ".ssm.state_size", gguf::Value::make_u32(static_cast<uint32_t>(p.ssm_d_state)));
    w.set(a + ".ssm.group_count", gguf::Value::make_u32(static_cast<uint32_t>(p.ssm_n_k_heads)));
    w.set(a + ".ssm.time_step_rank", gguf::Value::make_u32(static_cast<uint32_t>(p.ssm_n_v_heads)));
    w.set(a + ".ssm.inner_size", gguf::Value::make_u32(static_cast<uint32_t>(p.ssm_d_state * p.ssm_n_v_heads)));
    w.set(a + ".full_attention_interval", gguf::Value::make_u32(static_cast<uint32_t>(p.full_attention_interval)));
  }
  if (qk_norm) {
    w.set(a + ".attention.key_length", gguf::Value::make_u32(static_cast<uint32_t>(head_dim)));
    w.set(a + ".attention.value_length", gguf::Value::make_u32(static_cast<uint32_t>(head_dim)));
  }

  const VocabData vocab = make_demo_vocab(static_cast<int32_t>(p.n_vocab), llama ? "llama-bpe" : "qwen2");
  w.set("tokenizer.ggml.model", gguf::Value::make_string(vocab.model));
  w.set("tokenizer.ggml.pre", gguf::Value::make_string(vocab.pre));
  w.set("tokenizer.ggml.tokens", gguf::Value::make_string_array(vocab.tokens));
  std::vector<int32_t> types;
  types.reserve(vocab.token_types.size());
  for (TokenType t : vocab.token_types) types.push_back(static_cast<int32_t>(t));
  w.set("tokenizer.ggml.token_type", gguf::Value::make_i32_array(types));
  w.set("tokenizer.ggml.merges", gguf::Value::make_string_array(vocab.merges));
  w.set("tokenizer.ggml.bos_token_id", gguf::Value::make_u32(static_cast<uint32_t>(vocab.bos_id)));
  w.set("tokenizer.ggml.eos_token_id", gguf::Value::make_u32(static_cast<uint32_t>(vocab.eos_id)));
  w.set("tokenizer.ggml.eot_token_id", gguf::Value::make_u32(static_cast<uint32_t>(vocab.eot_id)));
  w.set("tokenizer.ggml.padding_token_id", gguf::Value::make_u32(static_cast<uint32_t>(vocab.eos_id)));
  w.set("tokenizer.ggml.add_bos_token", gguf::Value::make_bool(vocab.add_bos));
  w.set("tokenizer.chat_template", gguf::Value::make_string(demo_chat_template()));

  // Scales keep activations near unit size through the residual stream and
  // make the logits peaked (std ~6), so greedy decoding is robust to rounding
  // differences between implementations.
  const MixPlace place{p.n_layer, moe ? p.n_expert : 0, p.tied_embeddings};
  Builder b(w, o.seed, o.dtype, o.mix, place);
  const auto inv_sqrt = [](int64_t n) { return 1.0f / std::sqrt(static_cast<float>(n)); };
  const float out_std = 6.0f * inv_sqrt(p.n_embd);
  b.matrix("token_embd.weight", p.n_embd, p.n_vocab, p.tied_embeddings ? out_std : 1.0f);
  b.vector("output_norm.weight", p.n_embd, 1.0f, 0.1f);
  if (!p.tied_embeddings) b.matrix("output.weight", p.n_embd, p.n_vocab, out_std);
  for (int64_t l = 0; l < p.n_layer; ++l) {
    const std::string pre = "blk." + std::to_string(l) + ".";
    b.vector(pre + "attn_norm.weight", p.n_embd, 1.0f, 0.1f);
    if (hybrid && (l + 1) % p.full_attention_interval != 0) {
      // A gated delta-net layer (llama.cpp's tensor names and shapes).
      const int64_t key_dim = p.ssm_d_state * p.ssm_n_k_heads, value_dim = p.ssm_d_state * p.ssm_n_v_heads;
      const int64_t channels = 2 * key_dim + value_dim;
      b.matrix(pre + "attn_qkv.weight", p.n_embd, channels, inv_sqrt(p.n_embd));
      b.matrix(pre + "attn_gate.weight", p.n_embd, value_dim, inv_sqrt(p.n_embd));
      b.matrix(pre + "ssm_ba.weight", p.n_embd, 2 * p.ssm_n_v_heads, inv_sqrt(p.n_embd));
      b.matrix(pre + "ssm_conv1d.weight", p.ssm_d_conv, channels, 0.5f, 0, DType::kF32);
      b.vector(pre + "ssm_dt.bias", p.ssm_n_v_heads, 0.0f, 0.5f);
      b.vector(pre + "ssm_a", p.ssm_n_v_heads, -1.0f, 0.5f);  // -exp(A_log)
      b.vector(pre + "ssm_norm.weight", p.ssm_d_state, 1.0f, 0.1f);
      b.matrix(pre + "ssm_out.weight", value_dim, p.n_embd, inv_sqrt(value_dim));
    } else {
    b.matrix(pre + "attn_q.weight", p.n_embd, hybrid ? 2 * q_dim : q_dim, inv_sqrt(p.n_embd));
    b.matrix(pre + "attn_k.weight", p.n_embd, kv_dim, inv_sqrt(p.n_embd));
    b.matrix(pre + "attn_v.weight", p.n_embd, kv_dim, inv_sqrt(p.n_embd));
    if (a == "qwen2") {
      b.vector(pre + "attn_q.bias", q_dim, 0.0f, 0.1f);
      b.vector(pre + "attn_k.bias", kv_dim, 0.0f, 0.1f);
      b.vector(pre + "attn_v.bias", kv_dim, 0.0f, 0.1f);
    }
    if (qk_norm) {
      b.vector(pre + "attn_q_norm.weight", head_dim, 1.0f, 0.1f);
      b.vector(pre + "attn_k_norm.weight", head_dim, 1.0f, 0.1f);
    }
    b.matrix(pre + "attn_output.weight", q_dim, p.n_embd, inv_sqrt(q_dim));
    }
    b.vector(pre + (hybrid ? "post_attention_norm.weight" : "ffn_norm.weight"), p.n_embd, 1.0f, 0.1f);
    if (moe) {
      // Router logits of unit size, so a token's experts are clearly ranked.
      b.matrix(pre + "ffn_gate_inp.weight", p.n_embd, p.n_expert, 2.0f * inv_sqrt(p.n_embd), 0, DType::kF32);
      b.matrix(pre + "ffn_gate_exps.weight", p.n_embd, p.n_ff_exp, inv_sqrt(p.n_embd), p.n_expert);
      b.matrix(pre + "ffn_up_exps.weight", p.n_embd, p.n_ff_exp, inv_sqrt(p.n_embd), p.n_expert);
      b.matrix(pre + "ffn_down_exps.weight", p.n_ff_exp, p.n_embd, inv_sqrt(p.n_ff_exp), p.n_expert);
      if (hybrid) {
        b.vector(pre + "ffn_gate_inp_shexp.weight", p.n_embd, 0.0f, 2.0f * std::sqrt(3.0f) * inv_sqrt(p.n_embd));
        b.matrix(pre + "ffn_gate_shexp.weight", p.n_embd, p.n_ff_shexp, inv_sqrt(p.n_embd));
        b.matrix(pre + "ffn_up_shexp.weight", p.n_embd, p.n_ff_shexp, inv_sqrt(p.n_embd));
        b.matrix(pre + "ffn_down_shexp.weight", p.n_ff_shexp, p.n_embd, inv_sqrt(p.n_ff_shexp));
      }
      continue;
    }
    b.matrix(pre + "ffn_gate.weight", p.n_embd, p.n_ff, inv_sqrt(p.n_embd));
    b.matrix(pre + "ffn_up.weight", p.n_embd, p.n_ff, inv_sqrt(p.n_embd));
    b.matrix(pre + "ffn_down.weight", p.n_ff, p.n_embd, inv_sqrt(p.n_ff));
  }
  w.write(path);
}

}  // namespace tandem
