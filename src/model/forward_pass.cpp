#include "model/forward_pass.h"

#include "util/error.h"
#include "util/thread_pool.h"

namespace tandem {

namespace {
// Rows across threads for a prompt; a few decode rows are one chunk, run inline.
constexpr int64_t kRowGrain = 16;
}  // namespace

kernels::MatmulInput ForwardPass::norm_rows(const float* weight, std::span<const kernels::MatmulOutput> group) {
  const int64_t E = c.n_embd;
  const float eps = c.rms_eps;
  if (kernels::all_take_q8_activations(group) && E % 32 == 0 && n == 1) {
    // One row: every thread of the group normalizes it for itself.
    ws.row_norm = {ws.x.data(), weight, eps};
    return kernels::MatmulInput{.x = nullptr, .ldx = 0, .xq = nullptr, .ldxq = 0, .xsum = nullptr, .norm = &ws.row_norm};
  }
  if (kernels::all_take_q8_activations(group) && E % 32 == 0) {
    OpTimer timer(prof, Op::kNorm);
    // Fused: the normalised rows go straight into Q8_0 activation blocks.
    const int64_t ldq = E / 32;
    ws.xq.resize(static_cast<size_t>(n * ldq));
    ws.xsum.resize(ws.xq.size());  // for the block panels' tiles, at no extra pass
    pool.parallel_for(n, kRowGrain, [&](int64_t b, int64_t e) {
      kernels::rms_norm_q8_0(ws.x.data() + b * E, E, weight, ws.xq.data() + b * ldq, ldq, e - b, E, eps,
                             ws.xsum.data() + b * ldq);
    });
    return kernels::MatmulInput{nullptr, 0, ws.xq.data(), ldq, ws.xsum.data()};
  }
  return kernels::MatmulInput{norm_rows_f32(weight), E, nullptr, 0};
}

const float* ForwardPass::norm_rows_f32(const float* weight) {
  OpTimer timer(prof, Op::kNorm);
  const int64_t E = c.n_embd;
  const float eps = c.rms_eps;
  pool.parallel_for(n, kRowGrain, [&](int64_t b, int64_t e) {
    kernels::rms_norm(ws.x.data() + b * E, E, weight, ws.xn.data() + b * E, E, e - b, E, eps);
  });
  return ws.xn.data();
}

void ForwardPass::account(Op op, std::initializer_list<const kernels::WeightMatrix*> matrices, int64_t tokens) const {
  if (prof == nullptr) return;
  for (const kernels::WeightMatrix* w : matrices) {
    prof->flops[static_cast<int>(op)] += 2.0 * static_cast<double>(w->rows * w->cols * tokens);
    prof->weight_bytes[static_cast<int>(op)] += static_cast<double>(w->row_bytes) * static_cast<double>(w->rows);
  }
}

void ForwardPass::add_residual(int64_t b, int64_t e) {
  const int64_t E = c.n_embd;
  for (int64_t t = 0; t < n; ++t) kernels::add_inplace(ws.x.data() + t * E + b, ws.proj.data() + t * E + b, e - b);
}

void ForwardPass::gather_columns(float* buf, int64_t rows, int64_t ld, const ColumnBounds& bounds, int root) {
  if (!split()) return;
  TANDEM_ASSERT(gather != nullptr, "a split model runs with its gather");
  gather->all_gather(buf, rows, ld, bounds, root);
}

bool ForwardPass::quantizes_projection_input(const kernels::WeightMatrix& w) {
  if (split() || !kernels::takes_q8_activations(w.type) || w.cols % 32 != 0) return false;
  ws.proj_xq.resize(static_cast<size_t>(n * w.cols / 32));
  ws.proj_xsum.resize(ws.proj_xq.size());
  return true;
}

kernels::MatmulInput ForwardPass::projection_input(const float* x, int64_t cols, bool quantized) const {
  if (!quantized) return kernels::MatmulInput{x, cols};
  return kernels::MatmulInput{x, cols, ws.proj_xq.data(), cols / 32, ws.proj_xsum.data()};
}

void ForwardPass::project_to_residual(Op op, const kernels::WeightMatrix& w, const kernels::MatmulInput& in) {
  OpTimer timer(prof, op);
  if (split()) {
    const int64_t e0 = TensorShards::begin(tp->embd_cols, tp->rank);
    const kernels::MatmulOutput out[] = {{&w, ws.proj.data() + e0, c.n_embd}};
    if (w.rows > 0) kernels::matmul(out, in, n, pool);
    account(op, {&w}, n);
    gather_columns(ws.proj.data(), n, c.n_embd, tp->embd_cols);
    pool.parallel_for(n, kRowGrain, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) kernels::add_inplace(ws.x.data() + t * c.n_embd, ws.proj.data() + t * c.n_embd, c.n_embd);
    });
    return;
  }
  const kernels::MatmulOutput out[] = {{&w, ws.proj.data(), c.n_embd}};
  kernels::matmul(out, in, n, pool, {}, [&](size_t, int64_t b, int64_t e) { add_residual(b, e); },
                  {.early = {}, .next = after(w)});
  account(op, {&w}, n);
}

void ForwardPass::kv_slots_of_layer(int64_t layer) {
  for (int64_t t = 0; t < n; ++t) {
    const auto [block, slot] = ws.slot_of_row[static_cast<size_t>(t)];
    ws.kv_slots[static_cast<size_t>(t)] = {kv.k_part(block, static_cast<int>(layer)),
                                           kv.v_part(block, static_cast<int>(layer)), slot};
  }
}

}  // namespace tandem
