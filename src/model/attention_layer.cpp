#include "model/attention_layer.h"

#include <cmath>
#include <algorithm>
#include <numeric>
#include <span>

#include "gguf/gguf.h"
#include "kernels/attention.h"
#include "kernels/kv_write.h"
#include "model/weights.h"
#include "util/thread_pool.h"

namespace tandem {

namespace {
// How much of its heads' KV a thread fetches ahead of a decode step's
// attention: a quarter of a 1 MB L2, about 1000 positions of one 64-wide
// f16 head (longer contexts fetch their first blocks; the tile fetches
// the rest a block ahead).
constexpr size_t kDecodeKvFetchBytes = 256 * 1024;
}  // namespace

AttentionWeights load_attention(const gguf::File& f, const std::string& p, const ModelConfig& c) {
  const int64_t q_dim = c.n_head * c.head_dim;
  const int64_t kv_dim = c.n_head_kv * c.head_dim;
  AttentionWeights w;
  w.attn_norm = weight_vector(f, p + "attn_norm.weight", c.n_embd);
  // Gated attention (qwen3next): per head, the query then its output gate.
  w.wq = weight_matrix(f, p + "attn_q.weight", c.n_embd, c.gated_attention ? 2 * q_dim : q_dim);
  w.wk = weight_matrix(f, p + "attn_k.weight", c.n_embd, kv_dim);
  w.wv = weight_matrix(f, p + "attn_v.weight", c.n_embd, kv_dim);
  w.wo = weight_matrix(f, p + "attn_output.weight", q_dim, c.n_embd);
  w.bq = weight_vector(f, p + "attn_q.bias", q_dim, c.qkv_bias);
  w.bk = weight_vector(f, p + "attn_k.bias", kv_dim, c.qkv_bias);
  w.bv = weight_vector(f, p + "attn_v.bias", kv_dim, c.qkv_bias);
  if (c.qk_norm) {
    w.q_norm = weight_vector(f, p + "attn_q_norm.weight", c.head_dim);
    w.k_norm = weight_vector(f, p + "attn_k_norm.weight", c.head_dim);
  }
  return w;
}

kernels::MatmulSplit qkv_rows_split(const ModelConfig& c, int64_t q_rows, int64_t kv_rows) {
  kernels::MatmulSplit split{std::lcm(c.head_dim, kernels::kPanelRows)};
  if (q_rows % split.row_grain != 0 || kv_rows % split.row_grain != 0) split.row_grain = c.head_dim;
  return split;
}

void run_attention(ForwardPass& pass, const AttentionWeights& w, int64_t kv_layer) {
  const ModelConfig& c = pass.c;
  ForwardWorkspace& ws = pass.ws;
  KvPool& kv = pass.kv;
  const int64_t n = pass.n;
  const int64_t q_dim = c.n_head * c.head_dim;
  const int64_t kv_dim = c.n_head_kv * c.head_dim;
  const int hd = static_cast<int>(c.head_dim);
  const kernels::KvBlockShape kv_block{hd, kv.shape().block_size};
  const int64_t layer = kv_layer;
  // This rank's KV heads (all of them unless split), their query heads, and
  // where their rows start in the whole Q and K/V: the matmuls write the
  // rank's block of the full-width buffers, and the epilogues work in the
  // whole layer's coordinates (heads, biases, KV slots).
  const int kv_h0 = pass.split() ? pass.tp->kv_head_begin : 0;
  const int kv_h1 = pass.split() ? pass.tp->kv_head_end : static_cast<int>(c.n_head_kv);
  const int64_t group = c.n_head / c.n_head_kv;
  const int64_t q0 = kv_h0 * group * c.head_dim, q1 = kv_h1 * group * c.head_dim;
  const int64_t k0 = kv_h0 * c.head_dim, k1 = kv_h1 * c.head_dim;
  pass.kv_slots_of_layer(layer);
  {
    // QKV threads take whole heads (the epilogue ropes and writes per head),
    // and whole panels where the shapes allow.
    const kernels::MatmulSplit qkv_split = qkv_rows_split(c, q1 - q0, k1 - k0);
    const kernels::MatmulOutput qkv[] = {{&w.wq, ws.q.data() + q0, q_dim}, {&w.wk, ws.k.data() + k0, kv_dim},
                                         {&w.wv, ws.v.data() + k0, kv_dim}};
    const int64_t first_row[] = {q0, k0, k0};
    const kernels::MatmulInput in = pass.norm_rows(w.attn_norm, qkv);
    OpTimer timer(pass.prof, Op::kQkv);
    // Per head range [b, e) of Q, K or V, every token: bias, per-head norm,
    // RoPE; K and V then go to the pool (attention reads every position,
    // this call's own included, from the pool in the pool's dtype).
    struct QkvPart {
      float* y;
      int64_t ld;
      const float* bias;       // qwen2, else null
      const float* head_norm;  // qwen3 (Q and K), else null
    };
    const QkvPart parts[] = {{ws.q.data(), q_dim, w.bq, w.q_norm},
                             {ws.k.data(), kv_dim, w.bk, w.k_norm},
                             {ws.v.data(), kv_dim, w.bv, nullptr}};
    // [b, e): rows of the whole Q, K or V.
    auto epilogue = [&](size_t index, int64_t b, int64_t e) {
      const int h0 = static_cast<int>(b / c.head_dim);
      const int h1 = static_cast<int>(e / c.head_dim);
      const auto [y, ld, bias, head_norm] = parts[index];
      if (bias != nullptr)
        for (int64_t t = 0; t < n; ++t) kernels::add_inplace(y + t * ld + b, bias + b, e - b);
      if (head_norm != nullptr)
        for (int64_t t = 0; t < n; ++t)
          kernels::rms_norm(y + t * ld + b, c.head_dim, head_norm, y + t * ld + b, c.head_dim, h1 - h0, c.head_dim,
                            c.rms_eps);
      if (index == 0) {
        kernels::rope_apply(y + b, q_dim, n, h1 - h0, hd, pass.rope, ws.cos.data(), ws.sin.data());
      } else if (index == 1) {
        kernels::rope_write_k(y, kv_dim, n, h0, h1, kv_block, pass.rope, ws.cos.data(), ws.sin.data(),
                              ws.kv_slots.data(), kv.shape().dtype);
      } else {
        kernels::write_v(y, kv_dim, n, h0, h1, kv_block, ws.kv_slots.data(), kv.shape().dtype);
      }
    };
    if (!c.gated_attention) {
      // One decode row: each thread fetches the KV of the heads it attends
      // next while its Q/K/V weights stream.
      kernels::MatmulWarmup warmup{.early = {}, .next = pass.after(w.wq)};
      if (n == 1 && ws.sequences.size() == 1)
        warmup.early = [&](int t) {
          const auto [h0, h1] = kernels::decode_kv_heads(kv_h0, kv_h1, t, pass.pool.size());
          kernels::prefetch_decode_kv(ws.sequences[0], kv.layer_view(static_cast<int>(layer)), hd, h0, h1,
                                      kDecodeKvFetchBytes);
        };
      kernels::matmul(
          qkv, in, n, pass.pool, qkv_split,
          [&](size_t index, int64_t b, int64_t e) { epilogue(index, first_row[index] + b, first_row[index] + e); },
          warmup);
    } else {
      // The query and gate rows of whole heads go to ws.q and ws.attn_gate,
      // then the query takes the same norm and RoPE as an ungated one.
      ws.qg.resize(static_cast<size_t>(n * 2 * q_dim));
      ws.attn_gate.resize(static_cast<size_t>(n * q_dim));
      const kernels::MatmulOutput qg[] = {{&w.wq, ws.qg.data() + 2 * q0, 2 * q_dim}};
      kernels::MatmulSplit qg_split{std::lcm(2 * c.head_dim, kernels::kPanelRows)};
      if ((2 * (q1 - q0)) % qg_split.row_grain != 0) qg_split.row_grain = 2 * c.head_dim;
      kernels::matmul(qg, in, n, pass.pool, qg_split, [&](size_t, int64_t b, int64_t e) {
        const int64_t D = c.head_dim;
        b += 2 * q0;
        e += 2 * q0;
        for (int64_t t = 0; t < n; ++t)
          for (int64_t h = b / (2 * D); h < e / (2 * D); ++h) {
            std::copy_n(ws.qg.data() + t * 2 * q_dim + h * 2 * D, D, ws.q.data() + t * q_dim + h * D);
            std::copy_n(ws.qg.data() + t * 2 * q_dim + h * 2 * D + D, D, ws.attn_gate.data() + t * q_dim + h * D);
          }
        epilogue(0, b / 2, e / 2);
      });
      kernels::matmul(std::span(qkv).subspan(1), in, n, pass.pool, qkv_split,
                      [&](size_t index, int64_t b, int64_t e) { epilogue(index + 1, k0 + b, k0 + e); });
    }
    pass.account(Op::kQkv, {&w.wq, &w.wk, &w.wv}, n);
  }
  // The attention threads quantize out_proj's input as they write it (but
  // not when a gate multiplies it afterwards).
  const bool quantized = !c.gated_attention && group * c.head_dim % 32 == 0 && pass.quantizes_projection_input(w.wo);
  {
    OpTimer timer(pass.prof, Op::kAttention);
    const float attn_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    const kernels::AttentionQ8Out q8_out{ws.proj_xq.data(), ws.proj_xsum.data(), q_dim / 32};
    kernels::paged_attention(ws.q.data(), q_dim, ws.sequences, kv.layer_view(static_cast<int>(layer)),
                             static_cast<int>(c.n_head), static_cast<int>(c.n_head_kv), hd, attn_scale,
                             ws.attn.data(), q_dim, pass.pool, kv_h0, kv_h1, quantized ? &q8_out : nullptr);
  }
  if (c.gated_attention) {
    OpTimer timer(pass.prof, Op::kAttention);
    pass.pool.parallel_for(n, 16, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t)
        for (int64_t i = t * q_dim + q0; i < t * q_dim + q1; ++i)
          ws.attn[static_cast<size_t>(i)] *= 1.0f / (1.0f + std::exp(-ws.attn_gate[static_cast<size_t>(i)]));
    });
  }
  // Split: every rank needs every head's output for its block of the output projection.
  pass.gather_columns(ws.attn.data(), n, q_dim, pass.split() ? pass.tp->q_cols : ColumnBounds{});
  pass.project_to_residual(Op::kOutProj, w.wo, pass.projection_input(ws.attn.data(), q_dim, quantized));
}

}  // namespace tandem
