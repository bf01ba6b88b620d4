// An independent, deliberately naive forward in double precision, for one
// sequence, returning the last token's logits: weights dequantized from the
// file, K/V rounded to f16 like the pool. Covers every architecture tandem
// loads: llama, qwen2 (QKV biases), qwen3 (q/k norms), qwen3moe (routed
// experts) and qwen3next (gated attention, gated delta-net layers with their
// causal convolution, a shared expert, post-attention norm).
#pragma once

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "gguf/dequantize.h"
#include "gguf/gguf.h"
#include "kernels/ops.h"
#include "model/model_config.h"
#include "util/fp16.h"

namespace tandem::testing {

inline std::vector<double> reference_forward(const gguf::File& f, const ModelConfig& c, const std::vector<int32_t>& toks) {
  using Vec = std::vector<double>;
  using kernels::DType;
  auto tensor = [&](const std::string& name) {
    const gguf::TensorInfo& t = f.tensor(name);
    std::vector<float> out(t.n_elements());
    gguf::dequantize_row(t.type, t.data, out.data(), static_cast<int64_t>(out.size()));
    return Vec(out.begin(), out.end());
  };
  auto has = [&](const std::string& name) { return f.find_tensor(name) != nullptr; };
  const size_t E = static_cast<size_t>(c.n_embd), H = static_cast<size_t>(c.n_head), KV = static_cast<size_t>(c.n_head_kv),
               D = static_cast<size_t>(c.head_dim), n = toks.size();
  auto matvec = [](const Vec& w, const Vec& x, size_t rows, size_t cols, size_t offset = 0) {
    Vec y(rows);
    for (size_t r = 0; r < rows; ++r)
      for (size_t k = 0; k < cols; ++k) y[r] += w[offset + r * cols + k] * x[k];
    return y;
  };
  auto rmsnorm = [&](Vec x, const Vec& w, size_t off, size_t len) {
    double ss = 0;
    for (size_t i = 0; i < len; ++i) ss += x[off + i] * x[off + i];
    const double s = 1.0 / std::sqrt(ss / static_cast<double>(len) + c.rms_eps);
    for (size_t i = 0; i < len; ++i) x[off + i] = x[off + i] * s * w[i];
    return x;
  };
  auto sigmoid = [](double v) { return 1.0 / (1.0 + std::exp(-v)); };
  auto silu = [&](double v) { return v * sigmoid(v); };
  const size_t rot = static_cast<size_t>(c.n_rot);
  auto rope = [&](Vec& v, size_t heads, size_t pos) {
    for (size_t h = 0; h < heads; ++h)
      for (size_t i = 0; i < rot / 2; ++i) {
        const double theta = static_cast<double>(pos) * std::pow(static_cast<double>(c.rope_freq_base), -2.0 * static_cast<double>(i) / static_cast<double>(rot));
        const size_t a = c.rope_neox ? i : 2 * i, b = c.rope_neox ? i + rot / 2 : 2 * i + 1;
        const double x0 = v[h * D + a], x1 = v[h * D + b];
        v[h * D + a] = x0 * std::cos(theta) - x1 * std::sin(theta);
        v[h * D + b] = x0 * std::sin(theta) + x1 * std::cos(theta);
      }
  };
  // A SwiGLU FFN of width w_ff whose matrices start at element `offset` of each tensor.
  auto swiglu = [&](const Vec& wg, const Vec& wu, const Vec& wd, size_t w_ff, size_t offset, const Vec& xn) {
    Vec g = matvec(wg, xn, w_ff, E, offset);
    const Vec u = matvec(wu, xn, w_ff, E, offset);
    for (size_t i = 0; i < w_ff; ++i) g[i] = silu(g[i]) * u[i];
    return matvec(wd, g, E, w_ff, offset);
  };
  // The layer's FFN output: dense, or the routed experts (softmax, the top
  // n_expert_used renormalised) plus a sigmoid-gated shared expert.
  auto ffn = [&](const std::string& p, const Vec& xn) {
    if (c.n_expert == 0)
      return swiglu(tensor(p + "ffn_gate.weight"), tensor(p + "ffn_up.weight"), tensor(p + "ffn_down.weight"),
                    static_cast<size_t>(c.n_ff), 0, xn);
    const size_t X = static_cast<size_t>(c.n_expert), K = static_cast<size_t>(c.n_expert_used), Fe = static_cast<size_t>(c.n_ff_exp);
    Vec prob = matvec(tensor(p + "ffn_gate_inp.weight"), xn, X, E);
    const double mx = *std::max_element(prob.begin(), prob.end());
    double sum = 0;
    for (auto& e : prob) sum += (e = std::exp(e - mx));
    for (auto& e : prob) e /= sum;
    std::vector<size_t> order(X);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return prob[a] > prob[b]; });
    double chosen = 0;
    for (size_t s = 0; s < K; ++s) chosen += prob[order[s]];
    const Vec wg = tensor(p + "ffn_gate_exps.weight"), wu = tensor(p + "ffn_up_exps.weight"), wd = tensor(p + "ffn_down_exps.weight");
    Vec out(E);
    for (size_t s = 0; s < K; ++s) {
      const Vec y = swiglu(wg, wu, wd, Fe, order[s] * Fe * E, xn);
      for (size_t i = 0; i < E; ++i) out[i] += prob[order[s]] / chosen * y[i];
    }
    if (has(p + "ffn_up_shexp.weight")) {
      const Vec y = swiglu(tensor(p + "ffn_gate_shexp.weight"), tensor(p + "ffn_up_shexp.weight"),
                           tensor(p + "ffn_down_shexp.weight"), static_cast<size_t>(c.n_ff_shexp), 0, xn);
      const double g = sigmoid(matvec(tensor(p + "ffn_gate_inp_shexp.weight"), xn, 1, E)[0]);
      for (size_t i = 0; i < E; ++i) out[i] += g * y[i];
    }
    return out;
  };
  auto to_f16 = [](double e) { return static_cast<double>(f16_to_f32(f32_to_f16(static_cast<float>(e)))); };
  // Full attention over all tokens (gated: the Q rows are each head's query then gate).
  auto attention = [&](const std::string& p, const std::vector<Vec>& xn) {
    const Vec wq = tensor(p + "attn_q.weight"), wk = tensor(p + "attn_k.weight"), wv = tensor(p + "attn_v.weight"),
              wo = tensor(p + "attn_output.weight");
    std::vector<Vec> q(n), k(n), v(n), gate(n);
    for (size_t t = 0; t < n; ++t) {
      if (c.gated_attention) {
        const Vec qg = matvec(wq, xn[t], 2 * H * D, E);
        q[t].resize(H * D);
        gate[t].resize(H * D);
        for (size_t h = 0; h < H; ++h)
          for (size_t i = 0; i < D; ++i) q[t][h * D + i] = qg[h * 2 * D + i], gate[t][h * D + i] = qg[h * 2 * D + D + i];
      } else {
        q[t] = matvec(wq, xn[t], H * D, E);
      }
      k[t] = matvec(wk, xn[t], KV * D, E);
      v[t] = matvec(wv, xn[t], KV * D, E);
      if (has(p + "attn_q.bias")) {
        const Vec bq = tensor(p + "attn_q.bias"), bk = tensor(p + "attn_k.bias"), bv = tensor(p + "attn_v.bias");
        for (size_t i = 0; i < q[t].size(); ++i) q[t][i] += bq[i];
        for (size_t i = 0; i < k[t].size(); ++i) k[t][i] += bk[i], v[t][i] += bv[i];
      }
      if (has(p + "attn_q_norm.weight")) {
        const Vec qn = tensor(p + "attn_q_norm.weight"), kn = tensor(p + "attn_k_norm.weight");
        for (size_t h = 0; h < H; ++h) q[t] = rmsnorm(q[t], qn, h * D, D);
        for (size_t h = 0; h < KV; ++h) k[t] = rmsnorm(k[t], kn, h * D, D);
      }
      rope(q[t], H, t);
      rope(k[t], KV, t);
      for (auto& e : k[t]) e = to_f16(e);
      for (auto& e : v[t]) e = to_f16(e);
    }
    std::vector<Vec> out(n);
    for (size_t t = 0; t < n; ++t) {
      Vec attn(H * D);
      for (size_t h = 0; h < H; ++h) {
        const size_t g = h / (H / KV);
        Vec s(t + 1);
        double mx = -1e300, sum = 0;
        for (size_t j = 0; j <= t; ++j) {
          double d = 0;
          for (size_t i = 0; i < D; ++i) d += q[t][h * D + i] * k[j][g * D + i];
          s[j] = d / std::sqrt(static_cast<double>(D));
          mx = std::max(mx, s[j]);
        }
        for (auto& e : s) sum += (e = std::exp(e - mx));
        for (size_t j = 0; j <= t; ++j)
          for (size_t i = 0; i < D; ++i) attn[h * D + i] += s[j] / sum * v[j][g * D + i];
      }
      if (c.gated_attention)
        for (size_t i = 0; i < H * D; ++i) attn[i] *= sigmoid(gate[t][i]);
      out[t] = matvec(wo, attn, E, H * D);
    }
    return out;
  };
  // A gated delta-net layer over all tokens from a zero state.
  auto delta_net = [&](const std::string& p, const std::vector<Vec>& xn) {
    const size_t S = static_cast<size_t>(c.ssm_d_state), Hk = static_cast<size_t>(c.ssm_n_k_heads),
                 Hv = static_cast<size_t>(c.ssm_n_v_heads), r = Hv / Hk, kd = S * Hk, vd = S * Hv, C = 2 * kd + vd,
                 taps = static_cast<size_t>(c.ssm_d_conv);
    const Vec wqkv = tensor(p + "attn_qkv.weight"), wz = tensor(p + "attn_gate.weight"), wba = tensor(p + "ssm_ba.weight"),
              conv = tensor(p + "ssm_conv1d.weight"), dt = tensor(p + "ssm_dt.bias"), a = tensor(p + "ssm_a"),
              norm = tensor(p + "ssm_norm.weight"), wout = tensor(p + "ssm_out.weight");
    std::vector<Vec> mixed(n);
    for (size_t t = 0; t < n; ++t) mixed[t] = matvec(wqkv, xn[t], C, E);
    std::vector<Vec> state(Hv, Vec(S * S));  // state[h][j * S + i]: value element j, key element i
    std::vector<Vec> out(n);
    for (size_t t = 0; t < n; ++t) {
      Vec x(C);  // the causal convolution (zero before the first token), then SiLU
      for (size_t ch = 0; ch < C; ++ch) {
        double sum = 0;
        for (size_t k = 0; k < taps; ++k)
          if (t + k + 1 >= taps) sum += mixed[t + k + 1 - taps][ch] * conv[ch * taps + k];
        x[ch] = silu(sum);
      }
      const Vec z = matvec(wz, xn[t], vd, E), ba = matvec(wba, xn[t], 2 * Hv, E);
      Vec o(vd);
      for (size_t h = 0; h < Hv; ++h) {
        const size_t kh = h / r;
        Vec q(x.begin() + static_cast<ptrdiff_t>(kh * S), x.begin() + static_cast<ptrdiff_t>((kh + 1) * S));
        Vec k(x.begin() + static_cast<ptrdiff_t>(kd + kh * S), x.begin() + static_cast<ptrdiff_t>(kd + (kh + 1) * S));
        for (Vec* u : {&q, &k}) {
          double ss = 0;
          for (double e : *u) ss += e * e;
          const double scale = 1.0 / std::max(std::sqrt(ss), static_cast<double>(c.rms_eps));
          for (double& e : *u) e *= scale;
        }
        const double beta = sigmoid(ba[kh * 2 * r + h % r]);
        const double alpha = ba[kh * 2 * r + r + h % r] + dt[h];
        const double decay = std::exp(std::log1p(std::exp(alpha)) * a[h]);
        Vec& st = state[h];
        for (size_t j = 0; j < S; ++j) {
          double sk = 0;
          for (size_t i = 0; i < S; ++i) sk += (st[j * S + i] *= decay) * k[i];
          const double d = (x[2 * kd + h * S + j] - sk) * beta;
          double so = 0;
          for (size_t i = 0; i < S; ++i) so += (st[j * S + i] += k[i] * d) * q[i];
          o[h * S + j] = so / std::sqrt(static_cast<double>(S));
        }
        o = rmsnorm(o, norm, h * S, S);
        for (size_t j = 0; j < S; ++j) o[h * S + j] *= silu(z[h * S + j]);
      }
      out[t] = matvec(wout, o, E, vd);
    }
    return out;
  };
  const Vec embd = tensor("token_embd.weight");
  std::vector<Vec> x(n);
  for (size_t t = 0; t < n; ++t)
    x[t].assign(embd.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(toks[t]) * E),
                embd.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(toks[t] + 1) * E));
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const Vec an = tensor(p + "attn_norm.weight");
    std::vector<Vec> xn(n);
    for (size_t t = 0; t < n; ++t) xn[t] = rmsnorm(x[t], an, 0, E);
    const bool recurrent = c.hybrid() && c.recurrent[static_cast<size_t>(l)];
    const std::vector<Vec> mixed = recurrent ? delta_net(p, xn) : attention(p, xn);
    const Vec fn = tensor(p + (c.arch == "qwen3next" ? "post_attention_norm.weight" : "ffn_norm.weight"));
    for (size_t t = 0; t < n; ++t) {
      for (size_t i = 0; i < E; ++i) x[t][i] += mixed[t][i];
      const Vec y = ffn(p, rmsnorm(x[t], fn, 0, E));
      for (size_t i = 0; i < E; ++i) x[t][i] += y[i];
    }
  }
  const Vec xn = rmsnorm(x.back(), tensor("output_norm.weight"), 0, E);
  return matvec(tensor(has("output.weight") ? "output.weight" : "token_embd.weight"), xn, static_cast<size_t>(c.n_vocab), E);
}

}  // namespace tandem::testing
