// A llama-family transformer (llama, qwen2, qwen3) whose forward pass runs a
// flat batch of rows from many sequences over a paged KV pool.
//
// Batch invariance: the logits of a row depend only on its sequence's tokens
// and positions, never on the other rows of the batch, on how the sequence's
// prompt was chunked across calls, or on the thread count. Every kernel
// reduces each output element in one fixed order and splits work across rows
// and heads only; K/V are written to the pool before attention reads them, so
// a chunk sees exactly the values a later chunk would. The cost: no split-K
// parallelism, which matters only for very small matrices.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "model/op_profile.h"
#include "kernels/kv_write.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "kv/kv_pool.h"
#include "model/batch.h"
#include "model/model_config.h"
#include "util/anonymous_memory.h"

namespace tandem {

namespace gguf {
class File;
}
class ThreadPool;

struct LayerWeights {
  const float* attn_norm = nullptr;
  kernels::WeightMatrix wq, wk, wv, wo;
  const float* bq = nullptr;  // qwen2 biases (null when absent)
  const float* bk = nullptr;
  const float* bv = nullptr;
  const float* q_norm = nullptr;  // qwen3 per-head norms
  const float* k_norm = nullptr;
  const float* ffn_norm = nullptr;
  kernels::WeightMatrix w_gate, w_up, w_down;
};

struct LoadOptions {
  // Called with (bytes done, bytes total) while the weights are paged in; set
  // for files over 100 MB by the CLI to show progress.
  std::function<void(uint64_t, uint64_t)> progress;
  bool prefault = true;  // read every weight page once at load time
  // Copy the matrices into the interleaved layout the kernels stream best
  // (WeightMatrix::group), dropping the file's pages as each is copied, so
  // the process keeps one copy. Results are bitwise the same either way.
  bool interleave_weights = true;
};

class Model {
 public:
  // Loads from a parsed GGUF file (kept alive by the model). Throws
  // tandem::Error for an unsupported architecture, a missing tensor, a shape
  // mismatch or a tensor type other than f32, f16, bf16 or q8_0.
  static std::unique_ptr<Model> load(std::shared_ptr<const gguf::File> file, const LoadOptions& options = {});

  const ModelConfig& config() const { return config_; }
  const gguf::File& file() const { return *file_; }
  // Bytes of weights read by one decode step (every matrix once, plus one embedding row).
  uint64_t weight_bytes_per_step() const;
  // Bytes of weights copied into the interleaved layout at load (0: plain).
  uint64_t interleaved_bytes() const { return interleaved_.size(); }
  // The main weight dtype (of the attention Q projection), for reports.
  kernels::DType weight_dtype() const { return layers_[0].wq.type; }

  // A KV pool shape for this model.
  KvPoolShape kv_shape(int64_t n_blocks, int block_size, kernels::DType dtype) const;

  // Runs the batch: writes each row's K and V into `kv` at its position and
  // stores the logits of batch.logit_rows, in order, into `logits`
  // (logit_rows.size() x n_vocab floats).
  void forward(const Batch& batch, KvPool& kv, ThreadPool& pool, float* logits);
  std::vector<float> forward(const Batch& batch, KvPool& kv, ThreadPool& pool);

  // Accumulate per-op times of every forward into `profile` (null: off).
  void set_profile(OpProfile* profile) { profile_ = profile; }

 private:
  Model() = default;
  void check_batch(const Batch& batch, const KvPool& kv) const;
  // RMSNorm of the residual rows (ws_.x) as the input of a matmul group:
  // quantized directly for an all-Q8_0 group, else f32 rows in ws_.xn.
  kernels::MatmulInput norm_rows(const float* weight, std::span<const kernels::MatmulOutput> group, int64_t n,
                                 ThreadPool& pool);

  std::shared_ptr<const gguf::File> file_;
  ModelConfig config_;
  kernels::WeightMatrix token_embd_;
  kernels::WeightMatrix output_;
  const float* output_norm_ = nullptr;
  std::vector<float> rope_freq_factors_;
  std::vector<LayerWeights> layers_;
  AnonymousMemory interleaved_;  // the interleaved matrices, when LoadOptions::interleave_weights
  OpProfile* profile_ = nullptr;

  // Scratch reused across calls (the forward is driven by one thread).
  struct Workspace {
    std::vector<float> x, xn, q, k, v, attn, proj, gate, up, cos, sin, logits_in;
    std::vector<kernels::AttentionSequence> sequences;
    std::vector<kernels::KvSlot> kv_slots;
    std::vector<kernels::BlockQ8_0Act> xq;
  } ws_;
};

}  // namespace tandem
