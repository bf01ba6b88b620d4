#include "kernels/attention.h"

#include <algorithm>
#include <atomic>
#include <vector>

#include "kernels/isa_kernels.h"
#include "kernels/kv_layout.h"
#include "kernels/ops.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace tandem::kernels {

void paged_attention(const float* q, int64_t ldq, std::span<const AttentionSequence> sequences,
                     const PagedKvLayer& kv, int n_head, int n_head_kv, int head_dim, float scale, float* out,
                     int64_t ldo, ThreadPool& pool, int kv_head_begin, int kv_head_end, const AttentionQ8Out* q8_out) {
  TANDEM_ASSERT(n_head_kv > 0 && n_head % n_head_kv == 0);
  TANDEM_ASSERT(is_float_dtype(kv.dtype), "the KV cache is f32, f16 or bf16");
  const AttentionTileFn tile_fn = active_kernels().attention_tile;

  // One work item per (tile of rows, KV head). Causal tiles differ in cost
  // (a late tile reads more blocks), so items are handed out longest first
  // from a shared counter; which thread runs an item never changes its result.
  struct Item {
    AttentionTileArgs args;
    int64_t cost;
  };
  // (Scratch of the calling thread; the workers see it through the reference.)
  thread_local std::vector<Item> scratch;
  std::vector<Item>& items = scratch;
  items.clear();
  const int group = n_head / n_head_kv;
  if (kv_head_end < 0) kv_head_end = n_head_kv;
  TANDEM_ASSERT(kv_head_begin >= 0 && kv_head_begin <= kv_head_end && kv_head_end <= n_head_kv);
  for (const AttentionSequence& seq : sequences) {
    const int32_t last = seq.first_position + seq.n_rows - 1;
    TANDEM_ASSERT(seq.first_position >= 0 && static_cast<int64_t>(last) < static_cast<int64_t>(seq.n_blocks) * kv.block_size,
                  "block table does not cover the query positions");
    for (int32_t r = 0; r < seq.n_rows; r += kAttentionTileRows) {
      const int rows = std::min<int32_t>(kAttentionTileRows, seq.n_rows - r);
      const int64_t row = seq.first_row + r;
      for (int h = kv_head_begin; h < kv_head_end; ++h) {
        AttentionTileArgs a;
        a.q = q + row * ldq;
        a.ldq = ldq;
        a.first_position = seq.first_position + r;
        a.n_rows = rows;
        a.block_table = seq.block_table;
        a.kv = &kv;
        a.kv_head = h;
        a.group = group;
        a.head_dim = head_dim;
        a.scale = scale;
        a.out = out + row * ldo;
        a.ldo = ldo;
        items.push_back({a, static_cast<int64_t>(rows) * (a.first_position + rows)});
      }
    }
  }
  // A tile's output columns (its KV head's query heads) of each of its rows, quantized.
  const int64_t head_cols = int64_t{group} * head_dim;
  TANDEM_ASSERT(q8_out == nullptr || head_cols % 32 == 0, "quantized attention output needs whole blocks per KV head");
  auto attend = [&](const AttentionTileArgs& a) {
    tile_fn(a);
    if (q8_out == nullptr) return;
    for (int r = 0; r < a.n_rows; ++r) {
      const int64_t row = (a.out - out) / ldo + r;
      const int64_t block = a.kv_head * head_cols / 32;
      quantize_row_q8_0(a.out + r * ldo + a.kv_head * head_cols, q8_out->xq + row * q8_out->ldq + block, head_cols,
                        q8_out->xsum + row * q8_out->ldq + block);
    }
  };
  if (sequences.size() == 1 && sequences[0].n_rows == 1) {
    // One decode row: items are its KV heads in order, each thread's fixed.
    pool.run([&](int t, int nt) {
      const auto [h0, h1] = decode_kv_heads(kv_head_begin, kv_head_end, t, nt);
      for (int h = h0; h < h1; ++h) attend(items[static_cast<size_t>(h - kv_head_begin)].args);
    });
    return;
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& x, const Item& y) { return x.cost > y.cost; });
  std::atomic<size_t> next{0};
  pool.run([&](int, int) {
    for (size_t i = next.fetch_add(1, std::memory_order_relaxed); i < items.size();
         i = next.fetch_add(1, std::memory_order_relaxed))
      attend(items[i].args);
  });
}

std::pair<int, int> decode_kv_heads(int kv_head_begin, int kv_head_end, int t, int n_threads) {
  const int n = kv_head_end - kv_head_begin;
  return {kv_head_begin + n * t / n_threads, kv_head_begin + n * (t + 1) / n_threads};
}

void prefetch_decode_kv(const AttentionSequence& seq, const PagedKvLayer& kv, int head_dim, int kv_head_begin,
                        int kv_head_end, size_t max_bytes) {
  const KvBlockShape shape{head_dim, kv.block_size};
  const size_t piece_bytes = dtype_row_bytes(kv.dtype, 1) * static_cast<size_t>(kv_head_elements(shape));
  const int32_t position = seq.first_position + seq.n_rows - 1;
  size_t fetched = 0;
  for (int32_t b = 0; b <= position / kv.block_size && b < seq.n_blocks; ++b) {
    const uint8_t* block = kv.base + static_cast<size_t>(seq.block_table[b]) * kv.block_bytes;
    for (int h = kv_head_begin; h < kv_head_end; ++h) {
      if (fetched + 2 * piece_bytes > max_bytes) return;
      for (size_t part : {kv.k_offset, kv.v_offset})
        for (size_t off = 0; off < piece_bytes; off += 64)
          __builtin_prefetch(block + part + static_cast<size_t>(h) * piece_bytes + off, 0, 2);  // (into L2)
      fetched += 2 * piece_bytes;
    }
  }
}

}  // namespace tandem::kernels
