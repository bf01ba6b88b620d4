#include "kernels/matmul.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/isa_kernels.h"
#include "kernels/k_quants.h"
#include "kernels/legacy_quants.h"
#include "kernels/ops.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace tandem::kernels {
namespace {

constexpr size_t kMaxOutputs = 8;
static_assert(kMaxOutputs <= IdleFetch::kMaxRanges, "a next share has a range per output");

}  // namespace

InterleavedLayout interleaved_layout(DType t, Isa isa) {
  // The block types in panels for the AVX-512 and AVX2 tiles (the scalar
  // reference reads panels too, but is built for chunk groups).
  if (has_block_panels(t) && (isa == Isa::kAvx512 || isa == Isa::kAvx2))
    return {kPanelRows, static_cast<int64_t>(dtype_block_bytes(t))};
  // Block types: groups of 8 rows by whole blocks.
  if (!is_float_dtype(t)) return {8, static_cast<int64_t>(dtype_block_bytes(t))};
  if (t == DType::kBF16) return {kPanelRows, 4};  // pairs, for vdpbf16ps
  return {kPanelRows, static_cast<int64_t>(dtype_row_bytes(t, 1))};
}

bool has_block_panels(DType t) { return has_legacy_panels(t) || has_k_quant_panels(t); }

bool is_panel_layout(DType t, int64_t group) {
  return group == kPanelRows && (is_float_dtype(t) || has_block_panels(t));
}

bool can_interleave(const WeightMatrix& w, Isa isa) {
  const InterleavedLayout l = interleaved_layout(w.type, isa);
  return w.group == 1 && w.rows % l.group == 0 && static_cast<int64_t>(w.row_bytes) % l.chunk_bytes == 0;
}

namespace {

// Group by group, chunk c of its rows i to out[c * group + i]; kChunk > 0 is
// the chunk size known at compile time (panels: 2- and 4-byte elements, where
// a memcpy call per element would make loading several times slower).
template <int64_t kChunk>
void interleave_groups(const WeightMatrix& w, uint8_t* dst, int64_t group, int64_t chunk) {
  if constexpr (kChunk > 0) chunk = kChunk;
  const int64_t n_chunks = static_cast<int64_t>(w.row_bytes) / chunk;
  for (int64_t g = 0; g < w.rows / group; ++g) {
    uint8_t* out = dst + static_cast<size_t>(g * group) * w.row_bytes;
    const uint8_t* in = w.data + static_cast<size_t>(g * group) * w.row_bytes;
    for (int64_t c = 0; c < n_chunks; ++c)
      for (int64_t i = 0; i < group; ++i)
        std::memcpy(out + (c * group + i) * chunk, in + static_cast<size_t>(i) * w.row_bytes + c * chunk,
                    static_cast<size_t>(chunk));
  }
}

// Block types' panels: each block of a group's rows becomes one panel block
// (legacy_quants.h, k_quants.h).
void interleave_block_panels(const WeightMatrix& w, uint8_t* dst) {
  const auto block = static_cast<int64_t>(dtype_block_bytes(w.type));
  const int64_t n_blocks = static_cast<int64_t>(w.row_bytes) / block;
  const uint8_t* blocks[kPanelRows];
  for (int64_t g = 0; g < w.rows / kPanelRows; ++g) {
    const size_t first = static_cast<size_t>(g * kPanelRows) * w.row_bytes;
    for (int64_t b = 0; b < n_blocks; ++b) {
      for (int r = 0; r < kPanelRows; ++r) blocks[r] = w.data + first + r * w.row_bytes + b * block;
      uint8_t* panel = dst + first + b * kPanelRows * block;
      if (has_k_quant_panels(w.type)) {
        pack_k_quant_panel(w.type, blocks, panel);
      } else {
        pack_legacy_panel(w.type, blocks, panel);
      }
    }
  }
}

}  // namespace

WeightMatrix interleave_rows(const WeightMatrix& w, uint8_t* dst, Isa isa) {
  TANDEM_ASSERT(can_interleave(w, isa));
  const auto [group, chunk] = interleaved_layout(w.type, isa);
  if (is_panel_layout(w.type, group) && has_block_panels(w.type)) {
    interleave_block_panels(w, dst);
  } else {
    switch (chunk) {
      case 2: interleave_groups<2>(w, dst, group, chunk); break;
      case 4: interleave_groups<4>(w, dst, group, chunk); break;
      default: interleave_groups<0>(w, dst, group, chunk); break;
    }
  }
  WeightMatrix out = w;
  out.data = dst;
  out.group = group;
  out.chunk_bytes = chunk;
  return out;
}

WeightMatrix interleave_rows_in_slices(const WeightMatrix& w, uint8_t* dst, int64_t max_slice_bytes,
                                       FunctionRef<void(const uint8_t*, size_t)> done, Isa isa) {
  TANDEM_ASSERT(can_interleave(w, isa));
  // Groups are independent in every layout, so a slice of whole groups
  // interleaves into its own place: its rows' bytes.
  const int64_t group = interleaved_layout(w.type, isa).group;
  const auto row_bytes = static_cast<int64_t>(w.row_bytes);
  const int64_t slice_rows = std::max<int64_t>(1, max_slice_bytes / (row_bytes * group)) * group;
  WeightMatrix out;
  for (int64_t r = 0; r < w.rows; r += slice_rows) {
    WeightMatrix slice = w;
    slice.data = w.data + r * row_bytes;
    slice.rows = std::min(slice_rows, w.rows - r);
    out = interleave_rows(slice, dst + r * row_bytes, isa);
    done(slice.data, static_cast<size_t>(slice.rows * row_bytes));
  }
  out.data = dst;
  out.rows = w.rows;
  return out;
}

void sum_q8_blocks(const BlockQ8_0Act* xq, int64_t ld_blocks, int64_t n_tokens, int64_t n_blocks, int32_t* xsum) {
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t b = 0; b < n_blocks; ++b) {
      int32_t s = 0;
      for (int i = 0; i < 32; ++i) s += xq[t * ld_blocks + b].qs[i];
      xsum[t * ld_blocks + b] = s;
    }
}

bool all_take_q8_activations(std::span<const MatmulOutput> outputs) {
  return std::all_of(outputs.begin(), outputs.end(),
                     [](const MatmulOutput& o) { return takes_q8_activations(o.w->type); });
}

namespace {

// An input made ready for every weight type of its products: quantized for
// q8_0 weights, rounded to bf16 for bf16 weights (each row on its own, so a
// row's result never depends on the other rows).
struct InputScratch {
  std::vector<BlockQ8_0Act> xq;
  std::vector<int32_t> xsum;
  std::vector<float> rounded;
  std::vector<uint16_t> xb;
};

// The rows a parallel region of products splits between threads: those of
// each output when every thread takes the same rows of all of them
// (same_rows), else those of the outputs one after the other.
int64_t region_rows(const WeightMatrix* const* w, size_t n, bool same_rows) {
  if (same_rows) {
    for (size_t i = 0; i < n; ++i) TANDEM_ASSERT(w[i]->rows == w[0]->rows, "same_rows needs outputs of equal rows");
    return w[0]->rows;
  }
  int64_t rows = 0;
  for (size_t i = 0; i < n; ++i) rows += w[i]->rows;
  return rows;
}

// Calls fn(i, b, e) with output i's rows [b, e) of a thread's region rows
// [begin, end) (region_rows), for each output they cover.
template <typename Fn>
void for_each_output_part(const WeightMatrix* const* w, size_t n, bool same_rows, int64_t begin, int64_t end, Fn&& fn) {
  int64_t first = 0;
  for (size_t i = 0; i < n; ++i) {
    const int64_t b = same_rows ? begin : std::max(begin, first) - first;
    const int64_t e = same_rows ? end : std::min(end, first + w[i]->rows) - first;
    if (b < e) fn(i, b, e);
    first += w[i]->rows;
  }
}

struct PreparedInput {
  const float* x = nullptr;
  int64_t ldx = 0;
  const BlockQ8_0Act* xq = nullptr;
  int64_t ldxq = 0;
  const float* rounded = nullptr;  // bf16-rounded x, k apart
  const uint16_t* xb = nullptr;
  const int32_t* xsum = nullptr;  // block sums of xq, for panels of the 32-element types
};

// What a group's weights need of its input.
struct InputNeeds {
  bool q8 = false;       // quantized activations
  bool bf16 = false;     // bf16-rounded activations
  bool q8_sums = false;  // and their block sums
  void add(const WeightMatrix& w) {
    q8 |= takes_q8_activations(w.type);
    bf16 |= w.type == DType::kBF16;
    q8_sums |= has_block_panels(w.type) && is_panel_layout(w.type, w.group);
  }
};

PreparedInput prepare_input(const MatmulInput& in, int64_t k, int64_t n_tokens, const InputNeeds& needs,
                            InputScratch& s, ThreadPool& pool) {
  const bool any_q8 = needs.q8, any_bf16 = needs.bf16;
  PreparedInput p{in.x, in.ldx, in.xq, in.ldxq, nullptr, nullptr, in.xq != nullptr ? in.xsum : nullptr};
  const float* x = in.x;
  const int64_t ldx = in.ldx;
  if (any_q8 && p.xq == nullptr) {
    TANDEM_ASSERT(k % 32 == 0, "quantized weights need a row length that is a multiple of 32");
    p.ldxq = k / 32;
    s.xq.resize(static_cast<size_t>(p.ldxq * n_tokens));
    BlockQ8_0Act* q = s.xq.data();
    p.xq = q;
    int32_t* sums = nullptr;
    if (needs.q8_sums) {
      s.xsum.resize(s.xq.size());
      sums = s.xsum.data();
      p.xsum = sums;
    }
    // Per token, across threads for a prompt (one token runs inline: parallel_for's single chunk).
    pool.parallel_for(n_tokens, 1, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t)
        quantize_row_q8_0(x + t * ldx, q + t * p.ldxq, k, sums != nullptr ? sums + t * p.ldxq : nullptr);
    });
  }
  if (needs.q8_sums && p.xsum == nullptr) {
    s.xsum.resize(static_cast<size_t>(p.ldxq * n_tokens));
    int32_t* sums = s.xsum.data();
    const BlockQ8_0Act* q = p.xq;
    const int64_t ld = p.ldxq;
    pool.parallel_for(n_tokens, 1, [&](int64_t b, int64_t e) { sum_q8_blocks(q + b * ld, ld, e - b, k / 32, sums + b * ld); });
    p.xsum = sums;
  }
  if (any_bf16) {
    s.rounded.resize(static_cast<size_t>(k * n_tokens));
    s.xb.resize(s.rounded.size());
    uint16_t* b16 = s.xb.data();
    float* f32 = s.rounded.data();
    pool.parallel_for(n_tokens, 1, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) round_row_bf16(x + t * ldx, b16 + t * k, f32 + t * k, k);
    });
    p.rounded = f32;
    p.xb = b16;
  }
  return p;
}

GemmArgs gemm_args(const MatmulOutput& o, const PreparedInput& p, int64_t n_tokens) {
  const int64_t k = o.w->cols;
  GemmArgs a{o.w->data, o.w->row_bytes, k,        p.x,   p.ldx, p.xq,         p.ldxq,
             p.xb,      k,              n_tokens, o.y,   o.ldy, o.w->group,   o.w->chunk_bytes};
  a.xsum = p.xsum;
  if (o.w->type == DType::kBF16) {
    a.x = p.rounded;
    a.ldx = k;
  }
  return a;
}

// A batch-1 decode step's activations (up to this much) are fetched whole when a
// thread starts its share: the caller has just written them, so every line is
// a transfer from its core (about 200 ns on the development VM), and the tiles
// read them a block at a time, a few transfers in flight at most; issued
// together they overlap (docs/BENCHMARKS.md, "A parallel region's fixed cost").
constexpr size_t kPrefetchInputMaxBytes = 4096;

void prefetch_lines(const void* p, size_t bytes) {
  if (p == nullptr || bytes > kPrefetchInputMaxBytes) return;
  const char* c = static_cast<const char*>(p);
  for (size_t off = 0; off < bytes; off += 64) __builtin_prefetch(c + off, 0, 3);
}

void prefetch_input(const GemmArgs& a) {
  const auto rows = static_cast<size_t>(a.n_tokens);
  if (a.xq != nullptr) {
    prefetch_lines(a.xq, rows * static_cast<size_t>(a.ldxq) * sizeof(BlockQ8_0Act));
    prefetch_lines(a.xsum, rows * static_cast<size_t>(a.ldxq) * sizeof(int32_t));
  } else {
    prefetch_lines(a.x, rows * static_cast<size_t>(a.ldx) * sizeof(float));
  }
}

// One thread's share of a parallel region of products. The region's closures
// hold their state by value, not by reference to the caller's frame: each
// reference a worker follows into memory the caller has just written is one
// more cross-core transfer before it can start (see kPrefetchInputMaxBytes).
struct ProductsRegion {
  const WeightMatrix* const* w;
  const GemmArgs* args;
  size_t n;
  const IsaKernels* isa;
  const MatmulEpilogue* epilogue;  // null when there is none
  bool same_rows;
  const MatmulWarmup* warmup;  // null when there is none
  const ThreadPool* pool;
  const MatmulRowNorm* norm;  // null when there is none

  // A thread's own blocks of a MatmulRowNorm.
  struct NormedRow {
    std::vector<BlockQ8_0Act> xq;
    std::vector<int32_t> xsum;
  };

  void product(size_t i, int64_t b, int64_t e, const NormedRow* normed) const {
    if (args[i].n_tokens > 0) {
      if (normed == nullptr) {
        gemm_for(*isa, w[i]->type)(args[i], b, e);
      } else {
        GemmArgs a = args[i];
        a.xq = normed->xq.data();
        a.xsum = normed->xsum.data();
        gemm_for(*isa, w[i]->type)(a, b, e);
      }
    }
    if (epilogue != nullptr) (*epilogue)(i, b, e);
  }
  // Thread t's rows [begin, end) of every output (same_rows), or of their concatenation.
  void operator()(int t, int64_t begin, int64_t end) const {
    if (warmup != nullptr && warmup->early) warmup->early(t);
    if (begin < end) {
      if (norm == nullptr) {
        products(begin, end, nullptr);
      } else {
        thread_local NormedRow normed;
        const int64_t k = w[0]->cols;
        normed.xq.resize(static_cast<size_t>(k / 32));
        normed.xsum.resize(normed.xq.size());
        rms_norm_q8_0(norm->x, k, norm->weight, normed.xq.data(), k / 32, 1, k, norm->eps, normed.xsum.data());
        products(begin, end, &normed);
      }
    }
    if (warmup != nullptr && warmup->next != nullptr)
      IdleFetch::this_thread().queue(next_share(*warmup->next, *pool, t), kIdleFetchMaxBytes);
  }
  void products(int64_t begin, int64_t end, const NormedRow* normed) const {
    if (normed == nullptr)
      for (size_t i = 0; i < n; ++i)
        if (i == 0 || args[i].xq != args[i - 1].xq || args[i].x != args[i - 1].x) prefetch_input(args[i]);
    for_each_output_part(w, n, same_rows, begin, end, [&](size_t i, int64_t b, int64_t e) { product(i, b, e, normed); });
  }
};

// Runs products i in [0, n) (weights w[i], arguments args[i]) in one parallel region.
void run_products(const WeightMatrix* const* w, const GemmArgs* args, size_t n, ThreadPool& pool,
                  const MatmulSplit& split, const MatmulEpilogue& epilogue, const MatmulWarmup* warmup,
                  const MatmulRowNorm* norm = nullptr) {
  TANDEM_ASSERT(split.row_grain > 0);
  if (epilogue && !split.same_rows)
    for (size_t i = 0; i + 1 < n; ++i)
      TANDEM_ASSERT(w[i]->rows % split.row_grain == 0, "an epilogue needs outputs of whole row grains");
  const ProductsRegion region{w, args, n, &active_kernels(), epilogue ? &epilogue : nullptr, split.same_rows, warmup, &pool, norm};
  pool.parallel_for_balanced(region_rows(w, n, split.same_rows), split.row_grain, region);
}

}  // namespace

IdleFetch::Ranges next_share(const NextMatmul& next, const ThreadPool& pool, int t) {
  IdleFetch::Ranges out;
  if (next.weights.empty()) return out;
  const WeightMatrix* const* w = next.weights.data();
  const size_t n = next.weights.size();
  const auto [begin, end] = pool.balanced_range(region_rows(w, n, next.split.same_rows), next.split.row_grain, t);
  for_each_output_part(w, n, next.split.same_rows, begin, end, [&](size_t i, int64_t b, int64_t e) {
    TANDEM_ASSERT(out.n < IdleFetch::kMaxRanges);
    // Whole groups: a panel's rows are interleaved.
    const int64_t group = std::max<int64_t>(w[i]->group, 1);
    const auto group_bytes = static_cast<int64_t>(w[i]->row_bytes) * group;
    out.range[static_cast<size_t>(out.n++)] = {w[i]->data + b / group * group_bytes,
                                               ((e + group - 1) / group - b / group) * group_bytes};
  });
  return out;
}

void matmul(std::span<const MatmulOutput> outputs, const MatmulInput& in, int64_t n_tokens, ThreadPool& pool,
            const MatmulSplit& split, const MatmulEpilogue& epilogue, const MatmulWarmup& warmup) {
  if (outputs.empty() || n_tokens == 0) return;
  TANDEM_ASSERT(outputs.size() <= kMaxOutputs);
  const int64_t k = outputs[0].w->cols;
  InputNeeds needs;
  for (const auto& o : outputs) {
    TANDEM_ASSERT(o.w->cols == k, "a matmul group must share its input width");
    needs.add(*o.w);
  }
  TANDEM_ASSERT(in.x != nullptr || in.norm != nullptr || (in.xq != nullptr && all_take_q8_activations(outputs)),
                "a matmul group needs its f32 input");
  if (in.norm != nullptr) {
    TANDEM_ASSERT(n_tokens == 1 && all_take_q8_activations(outputs) && k % 32 == 0,
                  "a row normalized by every thread is one token of a q8_0-activation group");
    GemmArgs args[kMaxOutputs];
    const WeightMatrix* w[kMaxOutputs];
    const PreparedInput p{nullptr, 0, nullptr, k / 32, nullptr, nullptr, nullptr};  // (each thread's blocks)
    for (size_t i = 0; i < outputs.size(); ++i) {
      args[i] = gemm_args(outputs[i], p, n_tokens);
      w[i] = outputs[i].w;
    }
    run_products(w, args, outputs.size(), pool, split, epilogue, &warmup, in.norm);
    return;
  }
  thread_local InputScratch scratch;
  const PreparedInput p = prepare_input(in, k, n_tokens, needs, scratch, pool);
  GemmArgs args[kMaxOutputs];
  const WeightMatrix* w[kMaxOutputs];
  for (size_t i = 0; i < outputs.size(); ++i) {
    args[i] = gemm_args(outputs[i], p, n_tokens);
    w[i] = outputs[i].w;
  }
  run_products(w, args, outputs.size(), pool, split, epilogue, n_tokens == 1 ? &warmup : nullptr);
}

void matmul_tasks(std::span<const MatmulTask> tasks, ThreadPool& pool, const MatmulSplit& split,
                  const MatmulEpilogue& epilogue) {
  if (tasks.empty()) return;
  thread_local std::vector<InputScratch> scratch;
  thread_local std::vector<GemmArgs> args;
  thread_local std::vector<const WeightMatrix*> w;
  args.resize(tasks.size());
  w.resize(tasks.size());
  // Consecutive tasks with the same input (an expert's gate and up) share its preparation.
  size_t n_inputs = 0;
  PreparedInput p;
  for (size_t i = 0; i < tasks.size(); ++i) {
    const MatmulTask& t = tasks[i];
    const bool shared = i > 0 && t.in.x == tasks[i - 1].in.x && t.in.xq == tasks[i - 1].in.xq &&
                        t.n_tokens == tasks[i - 1].n_tokens && t.out.w->cols == tasks[i - 1].out.w->cols;
    if (!shared) {
      InputNeeds needs;
      for (size_t j = i; j < tasks.size() && tasks[j].in.x == t.in.x && tasks[j].in.xq == t.in.xq; ++j)
        needs.add(*tasks[j].out.w);
      TANDEM_ASSERT(t.in.x != nullptr || (t.in.xq != nullptr && !needs.bf16), "a matmul task needs its f32 input");
      if (scratch.size() <= n_inputs) scratch.resize(n_inputs + 1);
      p = prepare_input(t.in, t.out.w->cols, t.n_tokens, needs, scratch[n_inputs++], pool);
    }
    args[i] = gemm_args(t.out, p, t.n_tokens);
    w[i] = t.out.w;
  }
  run_products(w.data(), args.data(), tasks.size(), pool, split, epilogue, nullptr);
}

}  // namespace tandem::kernels
