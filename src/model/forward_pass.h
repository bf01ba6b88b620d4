// What every layer kind of one forward pass shares: the batch's rows and
// their residual stream, the scratch buffers, the thread pool, the KV pool
// with each row's slot in it, the RoPE tables, and the profile. A layer kind
// (attention_layer.h, dense_ffn.h) reads and adds to the residual `ws.x`.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <utility>
#include <vector>

#include "kernels/attention.h"
#include "kernels/kv_write.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "kv/kv_pool.h"
#include "model/decode_order.h"
#include "model/model_config.h"
#include "model/op_profile.h"
#include "model/tensor_parallel.h"

namespace tandem {

class ThreadPool;

// Scratch reused across calls (the forward is driven by one thread).
struct ForwardWorkspace {
  std::vector<float> x, xn, q, k, v, attn, proj, gate, up, cos, sin, logits_in;
  std::vector<kernels::AttentionSequence> sequences;
  std::vector<kernels::KvSlot> kv_slots;
  std::vector<kernels::BlockQ8_0Act> xq;
  std::vector<int32_t> xsum;  // block sums of xq
  // The input of a projection back to the model width (out_proj, down),
  // quantized by the threads that produced it (ForwardPass::projection_input).
  std::vector<kernels::BlockQ8_0Act> proj_xq;
  std::vector<int32_t> proj_xsum;
  kernels::MatmulRowNorm row_norm;  // a decode row's norm, that each thread applies (norm_rows)
  std::vector<std::pair<int32_t, int32_t>> slot_of_row;  // (block, offset) of each row's position
  // Routed experts (expert_ffn.h): router logits, each row's chosen experts
  // and weights, and the rows gathered per expert with their results.
  std::vector<float> router_logits, expert_weight, expert_in, expert_gate, expert_up, expert_out;
  std::vector<float> shared_gate, shared_gate_up, shared_out;  // qwen3next's shared expert
  std::vector<int32_t> expert_of_slot, row_of_slot, expert_first_row, expert_next_row;
  std::vector<kernels::MatmulTask> expert_tasks;
  // Expert parallelism (expert_exchange.h): rows out, rows in, outputs back.
  std::vector<float> ep_send, ep_recv, ep_back, ep_ret;
  std::vector<int64_t> ep_send_rows, ep_recv_rows, ep_ret_rows;
  std::vector<int32_t> ep_grouped_of_recv, ep_first_row;
  // Gated delta-net (delta_net_layer.h) and gated attention.
  std::vector<float> ssm_qkv, ssm_conv, ssm_conv_keep, ssm_z, ssm_ba, ssm_out, qg, attn_gate;
  std::vector<int32_t> state_slots;  // per entry of `sequences`
};

class ExpertExchange;

struct ForwardPass {
  const ModelConfig& c;
  int64_t n = 0;  // rows
  ThreadPool& pool;
  KvPool& kv;
  ForwardWorkspace& ws;
  OpProfile* prof = nullptr;
  kernels::RopeParams rope;
  ExpertExchange* experts = nullptr;  // expert parallelism: the exchange (null: every expert here)
  // Tensor parallelism (tensor_parallel.h): this rank's shards and the
  // gather between split matmuls (null: every matrix whole here).
  const TensorShards* tp = nullptr;
  TensorGather* gather = nullptr;
  // The model's decode order (decode_order.h), or null.
  const DecodeOrder* order = nullptr;

  bool split() const { return tp != nullptr && tp->active(); }
  // For one row (batch-1 decode): the group the model multiplies after the
  // one whose first weight is `first`, to fetch ahead; else null.
  const kernels::NextMatmul* after(const kernels::WeightMatrix& first) const {
    return n == 1 && order != nullptr ? order->after(&first) : nullptr;
  }
  // Gathers the split columns of n rows of `buf` (ld apart) onto every rank
  // (root < 0) or `root`; a no-op without tensor parallelism.
  void gather_columns(float* buf, int64_t rows, int64_t ld, const ColumnBounds& bounds, int root = -1);

  // RMSNorm of the residual rows as the input of a matmul group: quantized
  // directly for an all-Q8_0 group (one row: by every thread of the group
  // for itself, kernels::MatmulRowNorm), else f32 rows in ws.xn.
  kernels::MatmulInput norm_rows(const float* weight, std::span<const kernels::MatmulOutput> group);
  // RMSNorm of the residual rows into ws.xn, always f32.
  const float* norm_rows_f32(const float* weight);
  // Counts a matmul group's work for the profile's GFLOP/s and GB/s columns.
  void account(Op op, std::initializer_list<const kernels::WeightMatrix*> matrices, int64_t tokens) const;
  // The residual add, in the epilogue of a projection back to the model
  // width: rows [b, e) of ws.proj into ws.x, every token.
  void add_residual(int64_t b, int64_t e);
  // A projection back to the model width (w.cols wide rows at in.x) with the
  // residual add in its epilogue, timed and counted as `op`. Split: this
  // rank's block of the width, gathered, then the (replicated) residual add.
  void project_to_residual(Op op, const kernels::WeightMatrix& w, const kernels::MatmulInput& in);
  void project_to_residual(Op op, const kernels::WeightMatrix& w, const float* in) {
    project_to_residual(op, w, kernels::MatmulInput{in, w.cols});
  }
  // Whether the producer of w's input (cols wide) quantizes it into
  // ws.proj_xq itself, in the region that computes it, so that the
  // projection does not quantize it on the caller between regions: for
  // q8_0-activation weights of a model whole on this rank. Sizes the buffers.
  bool quantizes_projection_input(const kernels::WeightMatrix& w);
  // The projection's input: the f32 rows at x, and their blocks in ws.proj_xq
  // when quantizes_projection_input said so.
  kernels::MatmulInput projection_input(const float* x, int64_t cols, bool quantized) const;
  // Each row's K and V slots in layer `layer` of the pool.
  void kv_slots_of_layer(int64_t layer);
};

}  // namespace tandem
