#include "kernels/matmul.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/isa_kernels.h"
#include "kernels/ops.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace tandem::kernels {
namespace {

constexpr size_t kMaxOutputs = 8;

}  // namespace

InterleavedLayout interleaved_layout(DType t) {
  if (t == DType::kQ8_0) return {8, kQ8ChunkBytes};
  if (t == DType::kBF16) return {kPanelRows, 4};  // pairs, for vdpbf16ps
  return {kPanelRows, static_cast<int64_t>(dtype_row_bytes(t, 1))};
}

bool can_interleave(const WeightMatrix& w) {
  const InterleavedLayout l = interleaved_layout(w.type);
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

}  // namespace

WeightMatrix interleave_rows(const WeightMatrix& w, uint8_t* dst) {
  TANDEM_ASSERT(can_interleave(w));
  const auto [group, chunk] = interleaved_layout(w.type);
  switch (chunk) {
    case 2: interleave_groups<2>(w, dst, group, chunk); break;
    case 4: interleave_groups<4>(w, dst, group, chunk); break;
    default: interleave_groups<0>(w, dst, group, chunk); break;
  }
  WeightMatrix out = w;
  out.data = dst;
  out.group = group;
  out.chunk_bytes = chunk;
  return out;
}

bool all_q8_0(std::span<const MatmulOutput> outputs) {
  return std::all_of(outputs.begin(), outputs.end(), [](const MatmulOutput& o) { return o.w->type == DType::kQ8_0; });
}

void matmul(std::span<const MatmulOutput> outputs, const MatmulInput& in, int64_t n_tokens, ThreadPool& pool,
            const MatmulSplit& split, const MatmulEpilogue& epilogue) {
  const float* x = in.x;
  const int64_t ldx = in.ldx;
  if (outputs.empty() || n_tokens == 0) return;
  TANDEM_ASSERT(outputs.size() <= kMaxOutputs);
  const int64_t k = outputs[0].w->cols;
  bool any_q8 = false, any_bf16 = false;
  int64_t total_rows = 0;
  for (const auto& o : outputs) {
    TANDEM_ASSERT(o.w->cols == k, "a matmul group must share its input width");
    any_q8 |= o.w->type == DType::kQ8_0;
    any_bf16 |= o.w->type == DType::kBF16;
    total_rows += o.w->rows;
  }

  // Q8_0 weights multiply activations quantized per row in blocks of 32; a
  // row's quantization depends on that row only.
  TANDEM_ASSERT(x != nullptr || (in.xq != nullptr && all_q8_0(outputs)), "a matmul group needs its f32 input");
  thread_local std::vector<BlockQ8_0Act> xq_scratch;
  const BlockQ8_0Act* xq = in.xq;
  int64_t ldxq = in.ldxq;
  if (any_q8 && xq == nullptr) {
    TANDEM_ASSERT(k % 32 == 0, "q8_0 weights need a row length that is a multiple of 32");
    ldxq = k / 32;
    xq_scratch.resize(static_cast<size_t>(ldxq * n_tokens));
    BlockQ8_0Act* q = xq_scratch.data();
    xq = q;
    // Per token, across threads for a prompt (one token runs inline: parallel_for's single chunk).
    pool.parallel_for(n_tokens, 1, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) quantize_row_q8_0(x + t * ldx, q + t * ldxq, k);
    });
  }

  // bf16 weights: the activations rounded to bf16, once, as f32 and as bf16.
  thread_local std::vector<float> x_rounded;
  thread_local std::vector<uint16_t> xb;
  if (any_bf16) {
    x_rounded.resize(static_cast<size_t>(k * n_tokens));
    xb.resize(x_rounded.size());
    uint16_t* b16 = xb.data();
    float* f32 = x_rounded.data();
    pool.parallel_for(n_tokens, 1, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) round_row_bf16(x + t * ldx, b16 + t * k, f32 + t * k, k);
    });
  }

  const IsaKernels& isa = active_kernels();
  GemmArgs args[kMaxOutputs];
  int64_t first_row[kMaxOutputs + 1];
  first_row[0] = 0;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const auto& o = outputs[i];
    args[i] = GemmArgs{o.w->data, o.w->row_bytes, k,     x,          ldx,
                       xq,        ldxq,           xb.data(), k, n_tokens, o.y, o.ldy, o.w->group, o.w->chunk_bytes};
    if (o.w->type == DType::kBF16) {
      args[i].x = x_rounded.data();
      args[i].ldx = k;
    }
    first_row[i + 1] = first_row[i] + o.w->rows;
  }

  TANDEM_ASSERT(split.row_grain > 0);
  if (epilogue && !split.same_rows)
    for (size_t i = 0; i + 1 < outputs.size(); ++i)
      TANDEM_ASSERT(outputs[i].w->rows % split.row_grain == 0, "an epilogue needs outputs of whole row grains");
  auto run = [&](size_t i, int64_t b, int64_t e) {
    gemm_for(isa, outputs[i].w->type)(args[i], b, e);
    if (epilogue) epilogue(i, b, e);
  };
  if (split.same_rows) {
    // The same range of every output.
    const int64_t rows = outputs[0].w->rows;
    for (const auto& o : outputs) TANDEM_ASSERT(o.w->rows == rows, "same_rows needs outputs of equal rows");
    pool.parallel_for(rows, split.row_grain, [&](int64_t begin, int64_t end) {
      for (size_t i = 0; i < outputs.size(); ++i) run(i, begin, end);
    });
    return;
  }
  // The concatenated row space of all outputs.
  pool.parallel_for(total_rows, split.row_grain, [&](int64_t begin, int64_t end) {
    for (size_t i = 0; i < outputs.size(); ++i) {
      const int64_t b = std::max(begin, first_row[i]);
      const int64_t e = std::min(end, first_row[i + 1]);
      if (b < e) run(i, b - first_row[i], e - first_row[i]);
    }
  });
}

}  // namespace tandem::kernels
