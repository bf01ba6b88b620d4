#include "model/delta_net_layer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "gguf/gguf.h"
#include "kernels/ops.h"
#include "model/weights.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace tandem {

namespace {

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }  // as ggml

void l2_normalise(float* x, int64_t n, float eps) {
  double ss = 0;  // ggml sums squares in double
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float scale = 1.0f / std::max(std::sqrt(static_cast<float>(ss)), eps);
  for (int64_t i = 0; i < n; ++i) x[i] *= scale;
}

}  // namespace

size_t state_slot_bytes(const ModelConfig& c) {
  return static_cast<size_t>(c.n_recurrent_layers() * (c.conv_state_floats() + c.ssm_state_floats())) * sizeof(float);
}

DeltaNetWeights load_delta_net(const gguf::File& f, const std::string& p, const ModelConfig& c) {
  const int64_t E = c.n_embd;
  const int64_t C = c.ssm_conv_channels();
  DeltaNetWeights w;
  w.attn_norm = weight_vector(f, p + "attn_norm.weight", E);
  if (f.find_tensor(p + "ssm_in.weight") != nullptr && f.find_tensor(p + "attn_qkv.weight") == nullptr)
    throw Error(f.path() + ": " + p + "ssm_in.weight is the legacy fused QKVZ layout; convert the model again with "
                "a current llama.cpp (it writes attn_qkv and attn_gate)");
  w.wqkv = weight_matrix(f, p + "attn_qkv.weight", E, C);
  w.wgate = weight_matrix(f, p + "attn_gate.weight", E, c.ssm_value_dim());
  w.wba = weight_matrix(f, p + "ssm_ba.weight", E, 2 * c.ssm_n_v_heads);
  w.conv = weight_vector(f, p + "ssm_conv1d.weight", c.ssm_d_conv * C);
  w.dt_bias = weight_vector(f, p + "ssm_dt.bias", c.ssm_n_v_heads);
  w.a = weight_vector(f, p + "ssm_a", c.ssm_n_v_heads);
  w.norm = weight_vector(f, p + "ssm_norm.weight", c.ssm_d_state);
  w.wout = weight_matrix(f, p + "ssm_out.weight", c.ssm_value_dim(), E);
  return w;
}

void run_delta_net(ForwardPass& pass, const DeltaNetWeights& w, int64_t state_layer) {
  const ModelConfig& c = pass.c;
  ForwardWorkspace& ws = pass.ws;
  const int64_t n = pass.n;
  const int64_t C = c.ssm_conv_channels();
  const int64_t S = c.ssm_d_state;
  const int64_t Hk = c.ssm_n_k_heads, Hv = c.ssm_n_v_heads;
  const int64_t r = Hv / Hk;  // value heads per key head (grouped: value head j reads key head j / r)
  const int64_t key_dim = c.ssm_key_dim(), value_dim = c.ssm_value_dim();
  const int64_t taps = c.ssm_d_conv;
  const auto size = [](int64_t a, int64_t b) { return static_cast<size_t>(a * b); };
  ws.ssm_qkv.resize(size(n, C));
  ws.ssm_conv.resize(size(n, C));
  ws.ssm_z.resize(size(n, value_dim));
  ws.ssm_ba.resize(size(n, 2 * Hv));
  ws.ssm_out.resize(size(n, value_dim));
  // Where this layer's state sits in a slot.
  const size_t layer_floats = static_cast<size_t>(c.conv_state_floats() + c.ssm_state_floats());
  auto conv_state = [&](size_t seq) {
    return reinterpret_cast<float*>(pass.kv.state_slot(ws.state_slots[seq])) + static_cast<size_t>(state_layer) * layer_floats;
  };
  {
    const kernels::MatmulOutput group[] = {{&w.wqkv, ws.ssm_qkv.data(), C},
                                           {&w.wgate, ws.ssm_z.data(), value_dim},
                                           {&w.wba, ws.ssm_ba.data(), 2 * Hv}};
    const kernels::MatmulInput in = pass.norm_rows(w.attn_norm, group);
    OpTimer timer(pass.prof, Op::kQkv);
    kernels::matmul(group, in, n, pass.pool);
    pass.account(Op::kQkv, {&w.wqkv, &w.wgate, &w.wba}, n);
  }
  ws.ssm_conv_keep.resize(size(taps - 1, C));
  {
  OpTimer timer(pass.prof, Op::kRecurrent);
  // The causal convolution and SiLU, per channel across threads: each
  // channel's taps run oldest first over [state, new inputs], then the state
  // keeps the newest taps - 1 inputs (time-major: state[k * C + ch]).
  pass.pool.parallel_for(C, 64, [&](int64_t cb, int64_t ce) {
    for (size_t s = 0; s < ws.sequences.size(); ++s) {
      const kernels::AttentionSequence& seq = ws.sequences[s];
      float* state = conv_state(s);
      for (int32_t t = 0; t < seq.n_rows; ++t) {
        const int64_t row = seq.first_row + t;
        for (int64_t ch = cb; ch < ce; ++ch) {
          // Input k of the window (k = 0 oldest) is state row t + k while
          // t + k < taps - 1, else new row t + k - (taps - 1).
          float sum = 0;
          for (int64_t k = 0; k < taps; ++k) {
            const int64_t src = t + k - (taps - 1);
            const float x = src < 0 ? state[(t + k) * C + ch] : ws.ssm_qkv[size(seq.first_row + src, C) + static_cast<size_t>(ch)];
            sum += x * w.conv[ch * taps + k];
          }
          ws.ssm_conv[size(row, C) + static_cast<size_t>(ch)] = sum / (1.0f + std::exp(-sum));
        }
      }
      // The new state: the last taps - 1 inputs of [state, rows].
      const int64_t keep = taps - 1;
      for (int64_t k = 0; k < keep; ++k) {
        const int64_t src = seq.n_rows - keep + k;  // index into the new rows; < 0: an older state row
        for (int64_t ch = cb; ch < ce; ++ch) {
          const float x = src < 0 ? state[(seq.n_rows + k) * C + ch] : ws.ssm_qkv[size(seq.first_row + src, C) + static_cast<size_t>(ch)];
          ws.ssm_conv_keep[static_cast<size_t>(k * C + ch)] = x;
        }
      }
      for (int64_t k = 0; k < keep; ++k)
        std::copy_n(ws.ssm_conv_keep.data() + k * C + cb, ce - cb, state + k * C + cb);
    }
  });
  // The delta rule per (sequence, value head), token by token.
  const float eps = c.rms_eps;
  const float scale = 1.0f / std::sqrt(static_cast<float>(S));
  const auto n_pairs = static_cast<int64_t>(ws.sequences.size()) * Hv;
  pass.pool.parallel_for(n_pairs, 1, [&](int64_t pb, int64_t pe) {
    thread_local std::vector<float> qk;
    qk.resize(static_cast<size_t>(2 * S));
    for (int64_t pair = pb; pair < pe; ++pair) {
      const auto s = static_cast<size_t>(pair / Hv);
      const int64_t h = pair % Hv;
      const int64_t kh = h / r;
      const kernels::AttentionSequence& seq = ws.sequences[s];
      float* state = conv_state(s) + c.conv_state_floats() + h * S * S;
      for (int32_t t = 0; t < seq.n_rows; ++t) {
        const int64_t row = seq.first_row + t;
        const float* conv = ws.ssm_conv.data() + row * C;
        float* q = qk.data();
        float* k = qk.data() + S;
        std::copy_n(conv + kh * S, S, q);
        std::copy_n(conv + key_dim + kh * S, S, k);
        l2_normalise(q, S, eps);
        l2_normalise(k, S, eps);
        const float* v = conv + 2 * key_dim + h * S;
        const float* ba = ws.ssm_ba.data() + row * 2 * Hv + kh * 2 * r;
        const float beta = sigmoid(ba[h % r]);
        const float decay = std::exp(softplus(ba[r + h % r] + w.dt_bias[h]) * w.a[h]);
        float* o = ws.ssm_out.data() + row * value_dim + h * S;
        kernels::delta_rule_step(state, S, k, q, v, decay, beta, scale, o);
        // Gated RMSNorm of the head's output.
        kernels::rms_norm(o, S, w.norm, o, S, 1, S, eps);
        const float* z = ws.ssm_z.data() + row * value_dim + h * S;
        for (int64_t j = 0; j < S; ++j) o[j] *= z[j] / (1.0f + std::exp(-z[j]));
      }
    }
  });
  }
  pass.project_to_residual(Op::kOutProj, w.wout, ws.ssm_out.data());
}

}  // namespace tandem
