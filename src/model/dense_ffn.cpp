#include "model/dense_ffn.h"

#include "gguf/gguf.h"
#include "model/weights.h"

namespace tandem {

DenseFfnWeights load_dense_ffn(const gguf::File& f, const std::string& p, const ModelConfig& c) {
  DenseFfnWeights w;
  w.ffn_norm = weight_vector(f, p + "ffn_norm.weight", c.n_embd);
  w.w_gate = weight_matrix(f, p + "ffn_gate.weight", c.n_embd, c.n_ff);
  w.w_up = weight_matrix(f, p + "ffn_up.weight", c.n_embd, c.n_ff);
  w.w_down = weight_matrix(f, p + "ffn_down.weight", c.n_ff, c.n_embd);
  return w;
}

kernels::MatmulSplit gate_up_split() { return {.row_grain = 32, .same_rows = true}; }

void run_dense_ffn(ForwardPass& pass, const DenseFfnWeights& w) {
  ForwardWorkspace& ws = pass.ws;
  const int64_t n = pass.n;
  const int64_t F = pass.c.n_ff;
  // Split: this rank's block of the FFN width (gathered before down).
  const int64_t f0 = pass.split() ? TensorShards::begin(pass.tp->ff_cols, pass.tp->rank) : 0;
  const bool quantized = pass.quantizes_projection_input(w.w_down);
  {
    const kernels::MatmulOutput gate_up[] = {{&w.w_gate, ws.gate.data() + f0, F}, {&w.w_up, ws.up.data() + f0, F}};
    const kernels::MatmulInput in = pass.norm_rows(w.ffn_norm, gate_up);
    OpTimer timer(pass.prof, Op::kGateUp);
    // SwiGLU, in the epilogue of gate/up: with the same_rows split a thread
    // computes the same rows of both, up's range right after gate's; and
    // down's input quantized there too (whole blocks: the split's grain).
    auto swiglu = [&](size_t index, int64_t b, int64_t e) {
      if (index != 1) return;
      b += f0;
      e += f0;
      for (int64_t t = 0; t < n; ++t) {
        float* g = ws.gate.data() + t * F + b;
        kernels::silu_mul(g, ws.up.data() + t * F + b, e - b);
        if (quantized)
          kernels::quantize_row_q8_0(g, ws.proj_xq.data() + (t * F + b) / 32, e - b, ws.proj_xsum.data() + (t * F + b) / 32);
      }
    };
    if (w.w_gate.rows > 0) kernels::matmul(gate_up, in, n, pass.pool, gate_up_split(), swiglu, {.early = {}, .next = pass.after(w.w_gate)});
    pass.account(Op::kGateUp, {&w.w_gate, &w.w_up}, n);
  }
  pass.gather_columns(ws.gate.data(), n, F, pass.split() ? pass.tp->ff_cols : ColumnBounds{});
  pass.project_to_residual(Op::kDown, w.w_down, pass.projection_input(ws.gate.data(), F, quantized));
}

}  // namespace tandem
