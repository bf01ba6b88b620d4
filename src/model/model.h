// A transformer (llama, qwen2, qwen3, qwen3moe, qwen3next) whose forward pass runs a flat batch of
// rows from many sequences over a paged KV pool: embedding, then per layer
// the kinds its architecture declares (architecture.h), then the LM head.
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

#include "model/architecture.h"
#include "model/attention_layer.h"
#include "model/delta_net_layer.h"
#include "model/dense_ffn.h"
#include "model/weights.h"
#include "model/expert_ffn.h"
#include "model/forward_pass.h"
#include "model/op_profile.h"
#include "model/tensor_parallel.h"
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

// One layer: its kinds (architecture.h) and the weights of each.
struct Layer {
  LayerPlan plan;
  int64_t kv_layer = -1;     // attention: its layer in the KV pool
  int64_t state_layer = -1;  // recurrent: its place in a state slot
  AttentionWeights attn;
  DeltaNetWeights delta;
  DenseFfnWeights ffn;
  ExpertFfnWeights experts;
  std::vector<kernels::WeightMatrix*> matrices();  // the mixer's, then the FFN's
  std::vector<kernels::WeightMatrix*> mixer_matrices();
  std::vector<kernels::WeightMatrix*> ffn_matrices();
  // `measure` summed over the matrices one decode token reads (only the
  // experts it is routed to): its weight bytes, or its multiply-adds.
  uint64_t per_token(const ModelConfig& c, MatrixMeasure measure);
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
  // Expert parallelism: this rank holds only its block of every MoE layer's
  // experts (expert_exchange.h).
  int expert_rank = 0;
  int expert_ranks = 1;
  // Tensor parallelism: this rank holds only its shards of every split
  // matrix (tensor_parallel.h says which); forward() then needs a gather.
  int tensor_rank = 0;
  int tensor_ranks = 1;
};

class Model {
 public:
  // Loads from a parsed GGUF file (kept alive by the model). Throws
  // tandem::Error for an unsupported architecture, a missing tensor, a shape
  // mismatch or a tensor type the kernels do not compute with
  // (kernels::DType).
  static std::unique_ptr<Model> load(std::shared_ptr<const gguf::File> file, const LoadOptions& options = {});

  const ModelConfig& config() const { return config_; }
  const gguf::File& file() const { return *file_; }
  // Bytes of weights read by one decode step of one token (every matrix
  // once, n_expert_used experts of each expert layer, one embedding row).
  uint64_t weight_bytes_per_step() const { return weight_bytes_per_step_; }
  // Multiply-adds of one token's matmuls (the same matrices; attention over
  // the context and the norms are not counted).
  uint64_t multiply_adds_per_token() const { return multiply_adds_per_token_; }
  // Bytes of weights copied into the interleaved layout at load (0: plain).
  uint64_t interleaved_bytes() const { return interleaved_.size(); }
  // The main weight dtype (of the first attention layer's Q projection), for reports.
  kernels::DType weight_dtype() const;

  // A KV pool shape for this model: its attention layers' KV and, for a
  // hybrid model, n_state_slots recurrent-state slots (one per live sequence).
  KvPoolShape kv_shape(int64_t n_blocks, int block_size, kernels::DType dtype, int64_t n_state_slots = 16) const;

  // Runs the batch: writes each row's K and V into `kv` at its position and
  // stores the logits of batch.logit_rows, in order, into `logits`
  // (logit_rows.size() x n_vocab floats).
  void forward(const Batch& batch, KvPool& kv, ThreadPool& pool, float* logits);
  std::vector<float> forward(const Batch& batch, KvPool& kv, ThreadPool& pool);

  // Expert parallelism: forward() exchanges each MoE layer's rows through
  // `exchange` (null: every expert is here; loaded with LoadOptions::expert_ranks).
  void set_expert_exchange(ExpertExchange* exchange) { experts_exchange_ = exchange; }
  // The MoE layers (each one dispatch and one combine under expert parallelism).
  int n_expert_layers() const;
  // A rank with no rows this step: every MoE layer's exchanges, computing
  // its experts for its peers' rows.
  void run_expert_layers_empty(ThreadPool& pool);

  // Tensor parallelism: the gather between split matmuls (the model loaded
  // with LoadOptions::tensor_ranks > 1). With it, forward() leaves the logits
  // on rank 0 only.
  void set_tensor_gather(TensorGather* gather) { tensor_gather_ = gather; }
  const TensorShards& tensor_shards() const { return shards_; }
  // The gathers of every forward (the same on every rank and every step).
  int n_tensor_gathers() const;

  // The matmul groups of a batch-1 decode step in order (decode_order.h).
  const DecodeOrder& decode_order() const { return decode_order_; }

  // Accumulate per-op times of every forward into `profile` (null: off).
  void set_profile(OpProfile* profile) { profile_ = profile; }

 private:
  Model() = default;
  void check_batch(const Batch& batch, const KvPool& kv) const;

  std::shared_ptr<const gguf::File> file_;
  ModelConfig config_;
  kernels::WeightMatrix token_embd_;
  kernels::WeightMatrix output_;
  const float* output_norm_ = nullptr;
  std::vector<float> rope_freq_factors_;
  std::vector<Layer> layers_;
  uint64_t weight_bytes_per_step_ = 0;
  uint64_t multiply_adds_per_token_ = 0;
  AnonymousMemory interleaved_;  // the interleaved matrices, when LoadOptions::interleave_weights
  OpProfile* profile_ = nullptr;
  ExpertExchange* experts_exchange_ = nullptr;
  TensorShards shards_;  // size 1: not split
  TensorGather* tensor_gather_ = nullptr;
  DecodeOrder decode_order_;  // empty unless every layer is attention + dense FFN, whole here

  ForwardWorkspace ws_;  // scratch reused across calls (the forward is driven by one thread)
};

}  // namespace tandem
