#include "model/expert_ffn.h"

#include <algorithm>
#include <cstring>
#include <cmath>
#include <numeric>
#include <span>

#include "gguf/gguf.h"
#include "kernels/ops.h"
#include "model/weights.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace tandem {

ExpertFfnWeights load_expert_ffn(const gguf::File& f, const std::string& p, const ModelConfig& c, int64_t first,
                                 int64_t count) {
  ExpertFfnWeights w;
  w.first_local = first;
  w.n_local = count >= 0 ? count : c.n_expert;
  w.ffn_norm = weight_vector(f, p + (c.arch == "qwen3next" ? "post_attention_norm.weight" : "ffn_norm.weight"), c.n_embd);
  w.router = weight_matrix(f, p + "ffn_gate_inp.weight", c.n_embd, c.n_expert);
  w.gate = expert_matrices(f, p + "ffn_gate_exps.weight", c.n_embd, c.n_ff_exp, c.n_expert);
  w.up = expert_matrices(f, p + "ffn_up_exps.weight", c.n_embd, c.n_ff_exp, c.n_expert);
  w.down = expert_matrices(f, p + "ffn_down_exps.weight", c.n_ff_exp, c.n_embd, c.n_expert);
  // Another rank's experts stay in the file: never copied, never read.
  for (int64_t e = 0; e < c.n_expert; ++e)
    if (e < w.first_local || e >= w.first_local + w.n_local)
      for (auto* experts : {&w.gate, &w.up, &w.down}) (*experts)[static_cast<size_t>(e)] = {};
  if (f.find_tensor(p + "ffn_up_shexp.weight") != nullptr) {
    const int64_t F = c.n_ff_shexp > 0 ? c.n_ff_shexp : c.n_ff;
    w.has_shared = true;
    w.shared_gate_inp = weight_matrix(f, p + "ffn_gate_inp_shexp.weight", c.n_embd, 1);
    w.shared_gate = weight_matrix(f, p + "ffn_gate_shexp.weight", c.n_embd, F);
    w.shared_up = weight_matrix(f, p + "ffn_up_shexp.weight", c.n_embd, F);
    w.shared_down = weight_matrix(f, p + "ffn_down_shexp.weight", F, c.n_embd);
  }
  return w;
}

std::vector<kernels::WeightMatrix*> ExpertFfnWeights::matrices() {
  std::vector<kernels::WeightMatrix*> all{&router};
  for (auto* experts : {&gate, &up, &down})
    for (kernels::WeightMatrix& m : *experts)
      if (m.data != nullptr) all.push_back(&m);
  if (has_shared)
    for (kernels::WeightMatrix* m : {&shared_gate_inp, &shared_gate, &shared_up, &shared_down}) all.push_back(m);
  return all;
}

uint64_t ExpertFfnWeights::per_token(int64_t n_used, MatrixMeasure measure) const {
  const uint64_t shared =
      has_shared ? measure(shared_gate_inp) + measure(shared_gate) + measure(shared_up) + measure(shared_down) : 0;
  if (n_local == 0) return measure(router) + shared;
  const auto e = static_cast<size_t>(first_local);
  return measure(router) + shared + static_cast<uint64_t>(n_used) * (measure(gate[e]) + measure(up[e]) + measure(down[e]));
}

void route_token(const float* logits, int64_t n_expert, int64_t n_used, float scale, int32_t* experts,
                 float* weights) {
  thread_local std::vector<float> probs;
  thread_local std::vector<int32_t> order;
  probs.resize(static_cast<size_t>(n_expert));
  order.resize(static_cast<size_t>(n_expert));
  std::copy_n(logits, n_expert, probs.data());
  kernels::softmax(probs.data(), n_expert);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + n_used, order.end(), [&](int32_t a, int32_t b) {
    const float pa = probs[static_cast<size_t>(a)], pb = probs[static_cast<size_t>(b)];
    return pa > pb || (pa == pb && a < b);
  });
  float sum = 0;
  for (int64_t s = 0; s < n_used; ++s) {
    experts[s] = order[static_cast<size_t>(s)];
    weights[s] = probs[static_cast<size_t>(experts[s])];
    sum += weights[s];
  }
  sum = std::max(sum, 6.103515625e-5f);  // llama.cpp clamps the sum to the smallest f16 normal
  for (int64_t s = 0; s < n_used; ++s) {
    weights[s] /= sum;
    if (scale != 0.0f && scale != 1.0f) weights[s] *= scale;
  }
}

namespace {

// Each row: its experts' outputs (ws.expert_out at ws.row_of_slot),
// weighted, summed in rank order, then the shared expert's, then added to the
// residual (llama.cpp's order of additions).
void add_expert_outputs(ForwardPass& pass, const ExpertFfnWeights& w) {
  ForwardWorkspace& ws = pass.ws;
  const int64_t n = pass.n;
  const int64_t E = pass.c.n_embd;
  const int64_t K = pass.c.n_expert_used;
  OpTimer timer(pass.prof, Op::kRoute);
  pass.pool.parallel_for(n, 16, [&](int64_t b, int64_t e) {
    thread_local std::vector<float> acc;
    acc.resize(static_cast<size_t>(E));
    for (int64_t t = b; t < e; ++t) {
      for (int64_t s = 0; s < K; ++s) {
        const auto slot = static_cast<size_t>(t * K + s);
        const float wt = ws.expert_weight[slot];
        const float* o = ws.expert_out.data() + static_cast<int64_t>(ws.row_of_slot[slot]) * E;
        if (s == 0)
          for (int64_t i = 0; i < E; ++i) acc[static_cast<size_t>(i)] = wt * o[i];
        else
          for (int64_t i = 0; i < E; ++i) acc[static_cast<size_t>(i)] += wt * o[i];
      }
      if (w.has_shared) {
        // llama.cpp: moe_out + shared * sigmoid(gate).
        const float g = 1.0f / (1.0f + std::exp(-ws.shared_gate[static_cast<size_t>(t)]));
        const float* y = ws.shared_out.data() + t * E;
        for (int64_t i = 0; i < E; ++i) acc[static_cast<size_t>(i)] += y[i] * g;
      }
      kernels::add_inplace(ws.x.data() + t * E, acc.data(), E);
    }
  });
}

// Rows grouped by expert (expert e's from first_row[e] in `in`) through each
// expert's SwiGLU FFN into `out`, row for row; experts without rows do not run.
void run_grouped_experts(ForwardWorkspace& ws, const ExpertFfnWeights& w, const ModelConfig& c, ThreadPool& pool,
                         const float* in, const std::vector<int32_t>& first_row, float* out) {
  const int64_t E = c.n_embd;
  const int64_t F = c.n_ff_exp;
  const int64_t rows = first_row.back();
  ws.expert_gate.resize(static_cast<size_t>(rows * F));
  ws.expert_up.resize(static_cast<size_t>(rows * F));
  const auto each_expert = [&](auto&& task) {
    for (int64_t e = 0; e + 1 < static_cast<int64_t>(first_row.size()); ++e) {
      const int32_t b = first_row[static_cast<size_t>(e)], count = first_row[static_cast<size_t>(e + 1)] - b;
      if (count > 0) task(e, b, count);
    }
  };
  ws.expert_tasks.clear();
  each_expert([&](int64_t e, int32_t b, int32_t count) {
    ws.expert_tasks.push_back({{&w.gate[static_cast<size_t>(e)], ws.expert_gate.data() + b * F, F}, {in + b * E, E}, count});
    ws.expert_tasks.push_back({{&w.up[static_cast<size_t>(e)], ws.expert_up.data() + b * F, F}, {in + b * E, E}, count});
  });
  kernels::matmul_tasks(ws.expert_tasks, pool, kernels::MatmulSplit{.same_rows = true},
                        [&](size_t index, int64_t b, int64_t e) {
                          if (index % 2 != 1) return;
                          const kernels::MatmulTask& up = ws.expert_tasks[index];
                          float* g = ws.expert_tasks[index - 1].out.y;
                          for (int64_t t = 0; t < up.n_tokens; ++t)
                            kernels::silu_mul(g + t * up.out.ldy + b, up.out.y + t * up.out.ldy + b, e - b);
                        });
  ws.expert_tasks.clear();
  each_expert([&](int64_t e, int32_t b, int32_t count) {
    ws.expert_tasks.push_back({{&w.down[static_cast<size_t>(e)], out + b * E, E}, {ws.expert_gate.data() + b * F, F}, count});
  });
  kernels::matmul_tasks(ws.expert_tasks, pool, kernels::MatmulSplit{.same_rows = true});
}

// The shared expert over every row (ws.shared_out), its SwiGLU in the gate
// and up product's epilogue, as the single-rank path computes it.
void run_shared_expert(ForwardPass& pass, const ExpertFfnWeights& w, const float* xn) {
  if (!w.has_shared) return;
  ForwardWorkspace& ws = pass.ws;
  const int64_t n = pass.n, E = pass.c.n_embd, Fs = w.shared_gate.rows;
  ws.shared_gate_up.resize(static_cast<size_t>(2 * n * Fs));
  float* sg = ws.shared_gate_up.data();
  float* su = sg + n * Fs;
  ws.expert_tasks.clear();
  ws.expert_tasks.push_back({{&w.shared_gate, sg, Fs}, {xn, E}, n});
  ws.expert_tasks.push_back({{&w.shared_up, su, Fs}, {xn, E}, n});
  kernels::matmul_tasks(ws.expert_tasks, pass.pool, kernels::MatmulSplit{.same_rows = true},
                        [&](size_t index, int64_t b, int64_t e) {
                          if (index == 1)
                            for (int64_t t = 0; t < n; ++t) kernels::silu_mul(sg + t * Fs + b, su + t * Fs + b, e - b);
                        });
  ws.shared_out.resize(static_cast<size_t>(n * E));
  ws.expert_tasks.clear();
  ws.expert_tasks.push_back({{&w.shared_down, ws.shared_out.data(), E}, {sg, Fs}, n});
  kernels::matmul_tasks(ws.expert_tasks, pass.pool, kernels::MatmulSplit{.same_rows = true});
}

// Expert parallelism: every slot's row goes to the rank holding its expert
// (rank order, slots ascending within a rank), this rank runs its experts
// over the rows that arrive, and the outputs come back in the order sent:
// ws.expert_out then holds slot s's output at row ws.row_of_slot[s], as the
// single-rank path leaves it, so the sum is the same.
void exchange_and_run_experts(ForwardWorkspace& ws, const ExpertFfnWeights& w, const ModelConfig& c, ThreadPool& pool,
                              ExpertExchange& ex, const float* xn, int64_t n) {
  const int N = ex.size();
  const int64_t E = c.n_embd, K = c.n_expert_used, X = c.n_expert;
  const int64_t row_floats = E + 1;  // the row, then its expert's id (the bits of an int32)
  ws.ep_send_rows.assign(static_cast<size_t>(N), 0);
  for (int64_t slot = 0; slot < n * K; ++slot)
    ++ws.ep_send_rows[static_cast<size_t>(expert_owner(ws.expert_of_slot[static_cast<size_t>(slot)], X, N))];
  std::vector<int64_t> next(static_cast<size_t>(N), 0);
  for (int r = 1; r < N; ++r) next[static_cast<size_t>(r)] = next[static_cast<size_t>(r - 1)] + ws.ep_send_rows[static_cast<size_t>(r - 1)];
  ws.row_of_slot.resize(static_cast<size_t>(n * K));
  ws.ep_send.resize(static_cast<size_t>(n * K * row_floats));
  for (int64_t slot = 0; slot < n * K; ++slot) {
    const int32_t e = ws.expert_of_slot[static_cast<size_t>(slot)];
    const int64_t at = next[static_cast<size_t>(expert_owner(e, X, N))]++;
    ws.row_of_slot[static_cast<size_t>(slot)] = static_cast<int32_t>(at);
    std::copy_n(xn + slot / K * E, E, ws.ep_send.data() + at * row_floats);
    std::memcpy(ws.ep_send.data() + at * row_floats + E, &e, sizeof e);
  }
  ex.all_to_all(false, ws.ep_send, ws.ep_send_rows, row_floats, ws.ep_recv, ws.ep_recv_rows);

  int64_t m = 0;
  for (int64_t r : ws.ep_recv_rows) m += r;
  ws.ep_first_row.assign(static_cast<size_t>(X + 1), 0);
  const auto expert_of_recv = [&](int64_t i) {
    int32_t e = 0;
    std::memcpy(&e, ws.ep_recv.data() + i * row_floats + E, sizeof e);
    TANDEM_ASSERT(e >= w.first_local && e < w.first_local + w.n_local, "a row sent to the rank holding its expert");
    return e;
  };
  for (int64_t i = 0; i < m; ++i) ++ws.ep_first_row[static_cast<size_t>(expert_of_recv(i)) + 1];
  for (int64_t e = 0; e < X; ++e) ws.ep_first_row[static_cast<size_t>(e + 1)] += ws.ep_first_row[static_cast<size_t>(e)];
  ws.expert_next_row.assign(ws.ep_first_row.begin(), ws.ep_first_row.end() - 1);
  ws.ep_grouped_of_recv.resize(static_cast<size_t>(m));
  ws.expert_in.resize(static_cast<size_t>(m * E));
  for (int64_t i = 0; i < m; ++i) {
    const int32_t g = ws.expert_next_row[static_cast<size_t>(expert_of_recv(i))]++;
    ws.ep_grouped_of_recv[static_cast<size_t>(i)] = g;
    std::copy_n(ws.ep_recv.data() + i * row_floats, E, ws.expert_in.data() + g * E);
  }
  ws.expert_out.resize(static_cast<size_t>(m * E));
  run_grouped_experts(ws, w, c, pool, ws.expert_in.data(), ws.ep_first_row, ws.expert_out.data());
  ws.ep_back.resize(static_cast<size_t>(m * E));
  for (int64_t i = 0; i < m; ++i)
    std::copy_n(ws.expert_out.data() + ws.ep_grouped_of_recv[static_cast<size_t>(i)] * E, E, ws.ep_back.data() + i * E);
  ex.all_to_all(true, ws.ep_back, ws.ep_recv_rows, E, ws.ep_ret, ws.ep_ret_rows);
  TANDEM_ASSERT(ws.ep_ret_rows == ws.ep_send_rows, "every row sent comes back");
  ws.expert_out.swap(ws.ep_ret);
}

}  // namespace

void run_expert_exchange_empty(ForwardWorkspace& ws, const ExpertFfnWeights& w, const ModelConfig& c, ThreadPool& pool,
                               ExpertExchange& exchange) {
  ws.expert_of_slot.clear();
  exchange_and_run_experts(ws, w, c, pool, exchange, nullptr, 0);
}

void run_expert_ffn(ForwardPass& pass, const ExpertFfnWeights& w) {
  ForwardWorkspace& ws = pass.ws;
  const ModelConfig& c = pass.c;
  const int64_t n = pass.n;
  const int64_t E = c.n_embd;
  const int64_t F = c.n_ff_exp;
  const int64_t X = c.n_expert;
  const int64_t K = c.n_expert_used;
  const auto size = [](int64_t a, int64_t b) { return static_cast<size_t>(a * b); };
  const float* xn = pass.norm_rows_f32(w.ffn_norm);
  {
    OpTimer timer(pass.prof, Op::kRoute);
    ws.router_logits.resize(size(n, X));
    ws.shared_gate.resize(static_cast<size_t>(n));
    const kernels::MatmulOutput routers[] = {{&w.router, ws.router_logits.data(), X},
                                             {&w.shared_gate_inp, ws.shared_gate.data(), 1}};
    kernels::matmul(std::span(routers, w.has_shared ? 2 : 1), kernels::MatmulInput{xn, E}, n, pass.pool);
    pass.account(Op::kRoute, {&w.router}, n);
    // Slot (t, s) is row t's s-th ranked expert.
    ws.expert_of_slot.resize(size(n, K));
    ws.expert_weight.resize(size(n, K));
    for (int64_t t = 0; t < n; ++t)
      route_token(ws.router_logits.data() + t * X, X, K, c.expert_weights_scale, ws.expert_of_slot.data() + t * K,
                  ws.expert_weight.data() + t * K);
    if (pass.experts != nullptr) {
      exchange_and_run_experts(ws, w, c, pass.pool, *pass.experts, xn, n);
      run_shared_expert(pass, w, xn);
      add_expert_outputs(pass, w);
      return;
    }
    // Rows grouped by expert (experts ascending, rows ascending within one).
    ws.expert_first_row.assign(static_cast<size_t>(X + 1), 0);
    for (int32_t e : ws.expert_of_slot) ++ws.expert_first_row[static_cast<size_t>(e) + 1];
    for (int64_t e = 0; e < X; ++e) ws.expert_first_row[static_cast<size_t>(e + 1)] += ws.expert_first_row[static_cast<size_t>(e)];
    ws.row_of_slot.resize(size(n, K));
    ws.expert_next_row.assign(ws.expert_first_row.begin(), ws.expert_first_row.end() - 1);
    for (size_t slot = 0; slot < ws.expert_of_slot.size(); ++slot)
      ws.row_of_slot[slot] = ws.expert_next_row[static_cast<size_t>(ws.expert_of_slot[slot])]++;
    // One token's experts all read its one row in place; a prompt's rows are gathered.
    if (n > 1) {
      ws.expert_in.resize(size(n * K, E));
      for (size_t slot = 0; slot < ws.row_of_slot.size(); ++slot)
        std::copy_n(xn + static_cast<int64_t>(slot) / K * E, E, ws.expert_in.data() + ws.row_of_slot[slot] * E);
    }
  }
  ws.expert_gate.resize(size(n * K, F));
  ws.expert_up.resize(size(n * K, F));
  ws.expert_out.resize(size(n * K, E));
  // Tensor parallelism: this rank's block of every expert's width (f0) and
  // of the model width (e0), into the whole-width buffers, gathered after
  // gate/up and after down (tensor_parallel.h).
  const bool split = pass.split();
  const TensorShards* tp = split ? pass.tp : nullptr;
  const int64_t f0 = tp ? TensorShards::begin(tp->ff_exp_cols, tp->rank) : 0;
  const int64_t fs0 = tp ? TensorShards::begin(tp->ff_shexp_cols, tp->rank) : 0;
  const int64_t e0 = tp ? TensorShards::begin(tp->embd_cols, tp->rank) : 0;
  const int64_t Fs = !w.has_shared ? 0 : tp ? tp->ff_shexp_cols.back() : w.shared_gate.rows;
  ws.shared_gate_up.resize(size(2 * n, Fs));
  float* sg = ws.shared_gate_up.data();
  float* su = sg + n * Fs;
  auto rows_of = [&](int64_t e) {
    const int32_t b = ws.expert_first_row[static_cast<size_t>(e)];
    return std::pair<int32_t, int32_t>{b, ws.expert_first_row[static_cast<size_t>(e + 1)] - b};
  };
  {
    OpTimer timer(pass.prof, Op::kGateUp);
    ws.expert_tasks.clear();
    for (int64_t e = 0; e < X; ++e) {
      const auto [first, count] = rows_of(e);
      if (count == 0) continue;
      const float* in = n > 1 ? ws.expert_in.data() + first * E : xn;
      ws.expert_tasks.push_back({{&w.gate[static_cast<size_t>(e)], ws.expert_gate.data() + first * F + f0, F}, {in, E}, count});
      ws.expert_tasks.push_back({{&w.up[static_cast<size_t>(e)], ws.expert_up.data() + first * F + f0, F}, {in, E}, count});
    }
    // The shared expert runs every row: in the same region when its width is the experts'.
    const bool shared_with_experts = w.has_shared && w.shared_gate.rows == w.gate[0].rows;
    if (shared_with_experts) {
      ws.expert_tasks.push_back({{&w.shared_gate, sg + fs0, Fs}, {xn, E}, n});
      ws.expert_tasks.push_back({{&w.shared_up, su + fs0, Fs}, {xn, E}, n});
    }
    // SwiGLU in the epilogue: each thread computes the same rows of an expert's gate and up.
    auto swiglu = [&](size_t index, int64_t b, int64_t e) {
      if (index % 2 != 1) return;
      const kernels::MatmulTask& up = ws.expert_tasks[index];
      float* g = ws.expert_tasks[index - 1].out.y;
      const int64_t ld = up.out.ldy;
      for (int64_t t = 0; t < up.n_tokens; ++t) kernels::silu_mul(g + t * ld + b, up.out.y + t * ld + b, e - b);
    };
    kernels::matmul_tasks(ws.expert_tasks, pass.pool, kernels::MatmulSplit{.same_rows = true}, swiglu);
    if (w.has_shared && !shared_with_experts) {
      float* g = sg + fs0;
      float* u = su + fs0;
      const kernels::MatmulOutput shared[] = {{&w.shared_gate, g, Fs}, {&w.shared_up, u, Fs}};
      kernels::matmul(shared, kernels::MatmulInput{xn, E}, n, pass.pool, kernels::MatmulSplit{.same_rows = true},
                      [&](size_t index, int64_t b, int64_t e) {
                        if (index == 1)
                          for (int64_t t = 0; t < n; ++t) kernels::silu_mul(g + t * Fs + b, u + t * Fs + b, e - b);
                      });
    }
    if (pass.prof != nullptr)
      for (const kernels::MatmulTask& t : ws.expert_tasks) pass.account(Op::kGateUp, {t.out.w}, t.n_tokens);
  }
  if (split) {
    pass.gather_columns(ws.expert_gate.data(), n * K, F, pass.tp->ff_exp_cols);
    if (w.has_shared) pass.gather_columns(sg, n, Fs, pass.tp->ff_shexp_cols);
  }
  {
    OpTimer timer(pass.prof, Op::kDown);
    ws.expert_tasks.clear();
    for (int64_t e = 0; e < X; ++e) {
      const auto [first, count] = rows_of(e);
      if (count == 0) continue;
      ws.expert_tasks.push_back({{&w.down[static_cast<size_t>(e)], ws.expert_out.data() + first * E + e0, E},
                                 {ws.expert_gate.data() + first * F, F},
                                 count});
    }
    ws.shared_out.resize(size(n, E));
    if (w.has_shared) ws.expert_tasks.push_back({{&w.shared_down, ws.shared_out.data() + e0, E}, {sg, Fs}, n});
    kernels::matmul_tasks(ws.expert_tasks, pass.pool, kernels::MatmulSplit{.same_rows = true});
    if (pass.prof != nullptr)
      for (const kernels::MatmulTask& t : ws.expert_tasks) pass.account(Op::kDown, {t.out.w}, t.n_tokens);
  }
  if (split) {
    pass.gather_columns(ws.expert_out.data(), n * K, E, pass.tp->embd_cols);
    if (w.has_shared) pass.gather_columns(ws.shared_out.data(), n, E, pass.tp->embd_cols);
  }
  add_expert_outputs(pass, w);
}

}  // namespace tandem
