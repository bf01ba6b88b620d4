#include "model/model.h"

#include <algorithm>
#include <array>
#include <span>
#include <cmath>
#include <initializer_list>
#include <numeric>
#include <cstring>

#include "gguf/gguf.h"
#include "model/weights.h"
#include "kernels/attention.h"
#include "kernels/kv_write.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace tandem {

namespace {

using kernels::DType;
using kernels::WeightMatrix;

// How much of a matrix is interleaved before its file pages are dropped: a
// tied output is the whole embedding table (145 MB in a Qwen2.5-0.5B
// Q4_K_M file), which would otherwise be resident twice at the peak.
constexpr int64_t kInterleaveSliceBytes = 16 << 20;

// Reads one byte per page of each range; progress continues from `done` of `total`.
void prefault(std::span<const std::pair<const uint8_t*, uint64_t>> ranges, uint64_t done, uint64_t total,
              const LoadOptions& options) {
  constexpr uint64_t kPage = 4096;
  constexpr uint64_t kReportEvery = 16ull << 20;
  volatile uint8_t sink = 0;
  for (const auto& [base, n] : ranges) {
    for (uint64_t off = 0; off < n; off += kPage, done += kPage) {
      sink = static_cast<uint8_t>(sink + base[off]);
      if (options.progress && done % kReportEvery == 0) options.progress(std::min(done, total), total);
    }
  }
}


}  // namespace

std::unique_ptr<Model> Model::load(std::shared_ptr<const gguf::File> file, const LoadOptions& options) {
  std::unique_ptr<Model> m(new Model());
  const gguf::File& f = *file;
  m->file_ = std::move(file);
  m->config_ = ModelConfig::from_gguf(f);
  check_tensor_types(f);
  const ModelConfig& c = m->config_;

  m->token_embd_ = weight_matrix(f, "token_embd.weight", c.n_embd, c.n_vocab);
  m->output_ = c.tied_embeddings ? m->token_embd_ : weight_matrix(f, "output.weight", c.n_embd, c.n_vocab);
  m->output_norm_ = weight_vector(f, "output_norm.weight", c.n_embd);
  if (const float* factors = weight_vector(f, "rope_freqs.weight", c.n_rot / 2, false))
    m->rope_freq_factors_.assign(factors, factors + c.n_rot / 2);

  m->shards_ = tandem::tensor_shards(c, options.tensor_rank, options.tensor_ranks);
  const TensorShards& tp = m->shards_;
  if (tp.active() && options.expert_ranks > 1)
    throw Error("tensor parallelism and expert parallelism in one engine are not supported together");
  // Split: each matrix becomes this rank's block of rows. One that the whole
  // layout would not interleave stays plain (its slice could be), so that
  // every row reduces as in the whole matrix; its tensor is not prefaulted
  // (the other ranks' rows are not this rank's to page in).
  std::vector<const WeightMatrix*> keep_plain;
  std::vector<const uint8_t*> sharded_tensors;
  auto shard = [&](WeightMatrix& w, const ColumnBounds& bounds, int64_t scale = 1) {
    if (!tp.active()) return;
    if (!kernels::can_interleave(w)) keep_plain.push_back(&w);
    sharded_tensors.push_back(w.data);
    w = slice_rows(w, scale * TensorShards::begin(bounds, tp.rank), scale * TensorShards::end(bounds, tp.rank));
  };
  ColumnBounds kv_rows;
  for (int r = 0; r <= tp.size; ++r) kv_rows.push_back(c.head_dim * (c.n_head_kv / tp.size) * r);
  const std::vector<LayerPlan> plan = layer_plan(c);
  m->layers_.resize(static_cast<size_t>(c.n_layer));
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    Layer& layer = m->layers_[static_cast<size_t>(l)];
    layer.plan = plan[static_cast<size_t>(l)];
    switch (layer.plan.mixer) {
      case MixerKind::kFullAttention:
        layer.attn = load_attention(f, p, c);
        layer.kv_layer = c.kv_layer(l);
        shard(layer.attn.wq, tp.q_cols, c.gated_attention ? 2 : 1);
        shard(layer.attn.wk, kv_rows);
        shard(layer.attn.wv, kv_rows);
        shard(layer.attn.wo, tp.embd_cols);
        break;
      case MixerKind::kGatedDeltaNet:
        layer.delta = load_delta_net(f, p, c);
        layer.state_layer = c.state_layer(l);
        break;
    }
    switch (layer.plan.ffn) {
      case FfnKind::kDense:
        layer.ffn = load_dense_ffn(f, p, c);
        shard(layer.ffn.w_gate, tp.ff_cols);
        shard(layer.ffn.w_up, tp.ff_cols);
        shard(layer.ffn.w_down, tp.embd_cols);
        break;
      case FfnKind::kExperts: {
        const int64_t first = first_expert_of(options.expert_rank, c.n_expert, options.expert_ranks);
        const int64_t end = first_expert_of(options.expert_rank + 1, c.n_expert, options.expert_ranks);
        layer.experts = load_expert_ffn(f, p, c, first, end - first);
        for (WeightMatrix& m : layer.experts.gate) shard(m, tp.ff_exp_cols);
        for (WeightMatrix& m : layer.experts.up) shard(m, tp.ff_exp_cols);
        for (WeightMatrix& m : layer.experts.down) shard(m, tp.embd_cols);
        if (layer.experts.has_shared) {
          shard(layer.experts.shared_gate, tp.ff_shexp_cols);
          shard(layer.experts.shared_up, tp.ff_shexp_cols);
          shard(layer.experts.shared_down, tp.embd_cols);
        }
        break;
      }
    }
  }
  shard(m->output_, tp.vocab_cols);
  // Interleave every matrix that can be (not the embedding table, which is
  // read by rows), each into its slice of one anonymous mapping, dropping its
  // file pages at once so that memory holds one copy at any time. An output
  // tied to the embedding table is interleaved all the same, as a copy: the
  // LM head is the largest matmul of a step (half of a Qwen2.5-0.5B one), and
  // on the plain layout it streamed at under half the speed. The table is
  // then not prefaulted (its file pages were read to interleave it): the
  // embedding reads one row a token from the file, so memory still holds
  // about one copy.
  std::vector<WeightMatrix*> to_interleave;
  if (options.interleave_weights) {
    for (Layer& layer : m->layers_)
      for (WeightMatrix* x : layer.matrices()) to_interleave.push_back(x);
    to_interleave.push_back(&m->output_);
    std::erase_if(to_interleave, [&](const WeightMatrix* x) {
      return !kernels::can_interleave(*x) || std::find(keep_plain.begin(), keep_plain.end(), x) != keep_plain.end();
    });
  }
  uint64_t interleaved_bytes = 0;
  std::vector<const uint8_t*> copied;  // file bytes of the interleaved matrices
  for (const WeightMatrix* x : to_interleave) {
    interleaved_bytes += matrix_bytes(*x);
    copied.push_back(x->data);
  }
  std::sort(copied.begin(), copied.end());
  // The rest of the tensors are paged in afterwards (interleaving reads the matrices).
  std::vector<std::pair<const uint8_t*, uint64_t>> rest;
  uint64_t rest_bytes = 0;
  if (options.prefault) {
    for (const gguf::TensorInfo& t : f.tensors()) {
      if (std::binary_search(copied.begin(), copied.end(), t.data)) continue;
      if (std::find(sharded_tensors.begin(), sharded_tensors.end(), t.data) != sharded_tensors.end()) continue;
      rest.emplace_back(t.data, t.n_bytes);
      rest_bytes += t.n_bytes;
    }
  }
  const uint64_t total = interleaved_bytes + rest_bytes;
  if (interleaved_bytes > 0) {
    m->interleaved_ = AnonymousMemory(interleaved_bytes);
    uint64_t offset = 0;
    for (WeightMatrix* x : to_interleave) {
      const WeightMatrix plain = *x;
      *x = kernels::interleave_rows_in_slices(plain, m->interleaved_.data() + offset, kInterleaveSliceBytes,
                                              [&](const uint8_t* done, size_t n_bytes) { f.drop_pages(done, n_bytes); });
      offset += matrix_bytes(plain);
      if (options.progress) options.progress(offset, total);
    }
  }
  prefault(rest, interleaved_bytes, total, options);
  m->weight_bytes_per_step_ = matrix_bytes(m->output_) + m->token_embd_.row_bytes;
  m->multiply_adds_per_token_ = matrix_multiply_adds(m->output_);
  for (Layer& layer : m->layers_) {
    m->weight_bytes_per_step_ += layer.per_token(c, matrix_bytes);
    m->multiply_adds_per_token_ += layer.per_token(c, matrix_multiply_adds);
  }
  if (options.progress && total > 0) options.progress(total, total);
  const bool plain_layers = std::all_of(m->layers_.begin(), m->layers_.end(), [](const Layer& layer) {
    return layer.plan.mixer == MixerKind::kFullAttention && layer.plan.ffn == FfnKind::kDense;
  });
  if (plain_layers && !tp.active() && !c.gated_attention) {
    const kernels::MatmulSplit qkv = qkv_rows_split(c, c.n_head * c.head_dim, c.n_head_kv * c.head_dim);
    for (const Layer& layer : m->layers_) {
      m->decode_order_.add({&layer.attn.wq, &layer.attn.wk, &layer.attn.wv}, qkv);
      m->decode_order_.add({&layer.attn.wo}, {});
      m->decode_order_.add({&layer.ffn.w_gate, &layer.ffn.w_up}, gate_up_split());
      m->decode_order_.add({&layer.ffn.w_down}, {});
    }
    m->decode_order_.add({&m->output_}, {});
  }
  return m;
}

std::vector<WeightMatrix*> Layer::mixer_matrices() {
  switch (plan.mixer) {
    case MixerKind::kFullAttention: return attn.matrices();
    case MixerKind::kGatedDeltaNet: return delta.matrices();
  }
  return {};
}

std::vector<WeightMatrix*> Layer::ffn_matrices() {
  switch (plan.ffn) {
    case FfnKind::kDense: return ffn.matrices();
    case FfnKind::kExperts: return experts.matrices();
  }
  return {};
}

std::vector<WeightMatrix*> Layer::matrices() {
  std::vector<WeightMatrix*> all = mixer_matrices();
  const std::vector<WeightMatrix*> f = ffn_matrices();
  all.insert(all.end(), f.begin(), f.end());
  return all;
}

DType Model::weight_dtype() const {
  for (const Layer& layer : layers_)
    if (layer.plan.mixer == MixerKind::kFullAttention) return layer.attn.wq.type;
  return layers_[0].delta.wqkv.type;
}

uint64_t Layer::per_token(const ModelConfig& c, MatrixMeasure measure) {
  uint64_t sum = 0;
  for (const WeightMatrix* w : mixer_matrices()) sum += measure(*w);
  if (plan.ffn == FfnKind::kExperts) return sum + experts.per_token(c.n_expert_used, measure);
  for (const WeightMatrix* w : ffn_matrices()) sum += measure(*w);
  return sum;
}



KvPoolShape Model::kv_shape(int64_t n_blocks, int block_size, DType dtype, int64_t n_state_slots) const {
  KvPoolShape s;
  s.n_layers = static_cast<int>(config_.n_attention_layers());
  if (config_.hybrid()) {
    s.n_state_slots = n_state_slots;
    s.state_slot_bytes = state_slot_bytes(config_);
  }
  s.n_kv_heads = static_cast<int>(config_.n_head_kv);
  s.head_dim = static_cast<int>(config_.head_dim);
  s.block_size = block_size;
  s.dtype = dtype;
  s.n_blocks = n_blocks;
  return s;
}

void Model::check_batch(const Batch& b, const KvPool& kv) const {
  const KvPoolShape& s = kv.shape();
  TANDEM_ASSERT(s.n_layers == config_.n_attention_layers() && s.n_kv_heads == config_.n_head_kv &&
                    s.head_dim == config_.head_dim,
                "KV pool shape does not match the model");
  if (config_.hybrid()) {
    TANDEM_ASSERT(s.state_slot_bytes == state_slot_bytes(config_), "state slots do not match the model");
    std::vector<bool> slot_used(static_cast<size_t>(s.n_state_slots), false);
    for (const BatchSequence& seq : b.sequences) {
      TANDEM_ASSERT(seq.state_slot >= 0 && seq.state_slot < s.n_state_slots, "a hybrid model's sequence needs its state slot");
      TANDEM_ASSERT(!slot_used[static_cast<size_t>(seq.state_slot)], "two sequences of a batch share a state slot");
      slot_used[static_cast<size_t>(seq.state_slot)] = true;
    }
  }
  TANDEM_ASSERT(b.positions.size() == b.tokens.size());
  std::vector<bool> covered(b.tokens.size(), false);
  for (const BatchSequence& seq : b.sequences) {
    TANDEM_ASSERT(seq.n_tokens > 0 && seq.first_row >= 0 && seq.first_row + seq.n_tokens <= b.n_rows());
    const int32_t last_pos = b.positions[static_cast<size_t>(seq.first_row + seq.n_tokens - 1)];
    TANDEM_ASSERT(static_cast<int64_t>(seq.block_table.size()) * s.block_size > last_pos,
                  "block table does not cover the sequence's last position");
    for (int32_t block : seq.block_table) TANDEM_ASSERT(block >= 0 && block < s.n_blocks, "block id out of range");
    for (int32_t i = 0; i < seq.n_tokens; ++i) {
      const auto row = static_cast<size_t>(seq.first_row + i);
      TANDEM_ASSERT(!covered[row], "a batch row belongs to two sequences");
      covered[row] = true;
      TANDEM_ASSERT(b.positions[row] == b.positions[static_cast<size_t>(seq.first_row)] + i,
                    "positions within a sequence must be consecutive");
    }
  }
  for (size_t i = 0; i < covered.size(); ++i) TANDEM_ASSERT(covered[i], "a batch row belongs to no sequence");
  for (int32_t tok : b.tokens) TANDEM_ASSERT(tok >= 0 && tok < config_.n_vocab, "token id out of range");
  for (int32_t r : b.logit_rows) TANDEM_ASSERT(r >= 0 && r < b.n_rows(), "logit row out of range");
}

std::vector<float> Model::forward(const Batch& batch, KvPool& kv, ThreadPool& pool) {
  std::vector<float> logits(batch.logit_rows.size() * static_cast<size_t>(config_.n_vocab));
  forward(batch, kv, pool, logits.data());
  return logits;
}

void Model::forward(const Batch& batch, KvPool& kv, ThreadPool& pool, float* logits) {
  check_batch(batch, kv);
  const ModelConfig& c = config_;
  const int64_t n = batch.n_rows();
  if (n == 0) return;
  const int64_t E = c.n_embd;
  const int64_t q_dim = c.n_head * c.head_dim;
  const int64_t kv_dim = c.n_head_kv * c.head_dim;
  const int64_t F = c.n_ff;
  const int half_rot = c.n_rot / 2;
  auto size = [](int64_t a, int64_t b) { return static_cast<size_t>(a * b); };
  ws_.x.resize(size(n, E));
  ws_.xn.resize(size(n, E));
  ws_.q.resize(size(n, q_dim));
  ws_.k.resize(size(n, kv_dim));
  ws_.v.resize(size(n, kv_dim));
  ws_.attn.resize(size(n, q_dim));
  ws_.proj.resize(size(n, E));
  ws_.gate.resize(size(n, F));
  ws_.up.resize(size(n, F));
  ws_.cos.resize(size(n, half_rot));
  ws_.kv_slots.resize(static_cast<size_t>(n));
  ws_.sin.resize(size(n, half_rot));
  // Attention's view of each sequence, and each row's KV slot.
  ws_.sequences.clear();
  ws_.state_slots.clear();
  ws_.slot_of_row.resize(static_cast<size_t>(n));
  const int block_size = kv.shape().block_size;
  for (const BatchSequence& seq : batch.sequences) {
    ws_.sequences.push_back({seq.first_row, seq.n_tokens, batch.positions[static_cast<size_t>(seq.first_row)],
                             seq.block_table.data(), static_cast<int32_t>(seq.block_table.size())});
    ws_.state_slots.push_back(seq.state_slot);
    // A sequence starting over (a new prompt, a recompute) starts from a zero state.
    // (Split: rank 0 alone owns the recurrent state.)
    if (c.hybrid() && shards_.rank == 0 && batch.positions[static_cast<size_t>(seq.first_row)] == 0)
      std::memset(kv.state_slot(seq.state_slot), 0, kv.shape().state_slot_bytes);
    for (int32_t i = 0; i < seq.n_tokens; ++i) {
      const auto row = static_cast<size_t>(seq.first_row + i);
      const int32_t pos = batch.positions[row];
      ws_.slot_of_row[row] = {seq.block_table[static_cast<size_t>(pos / block_size)], pos % block_size};
    }
  }

  ForwardPass pass{c, n, pool, kv, ws_, profile_, {}, experts_exchange_, &shards_, tensor_gather_, &decode_order_};
  if (pass.prof != nullptr) ++pass.prof->forwards;
  {
    OpTimer timer(pass.prof, Op::kEmbed);
    for (int64_t t = 0; t < n; ++t) {
      const auto tok = static_cast<size_t>(batch.tokens[static_cast<size_t>(t)]);
      kernels::dequantize_row(token_embd_.type, token_embd_.data + tok * token_embd_.row_bytes, ws_.x.data() + t * E, E);
    }
  }
  pass.rope.n_rot = c.n_rot;
  pass.rope.neox = c.rope_neox;
  pass.rope.freq_base = c.rope_freq_base;
  pass.rope.freq_factors = rope_freq_factors_.empty() ? nullptr : rope_freq_factors_.data();
  {
    OpTimer timer(pass.prof, Op::kRope);
    kernels::rope_angles(batch.positions.data(), n, pass.rope, ws_.cos.data(), ws_.sin.data());
  }

  for (int64_t l = 0; l < c.n_layer; ++l) {
    const Layer& layer = layers_[static_cast<size_t>(l)];
    switch (layer.plan.mixer) {
      case MixerKind::kFullAttention: run_attention(pass, layer.attn, layer.kv_layer); break;
      case MixerKind::kGatedDeltaNet:
        // Split: rank 0 runs the layer over the state it alone holds and
        // broadcasts the residual it leaves.
        if (shards_.rank == 0) {
          ForwardPass whole = pass;  // the layer's matrices are whole here
          whole.tp = nullptr;
          run_delta_net(whole, layer.delta, layer.state_layer);
        }
        pass.gather_columns(ws_.x.data(), n, E, shards_.rank0_embd);
        break;
    }
    switch (layer.plan.ffn) {
      case FfnKind::kDense: run_dense_ffn(pass, layer.ffn); break;
      case FfnKind::kExperts: run_expert_ffn(pass, layer.experts); break;
    }
  }

  // Final norm and the vocabulary projection, only for the rows asked for.
  const auto n_out = static_cast<int64_t>(batch.logit_rows.size());
  if (n_out == 0 && !pass.split()) return;  // (split: the gather runs anyway, as every rank plans it)
  OpTimer timer(pass.prof, Op::kLmHead);
  ws_.logits_in.resize(size(n_out, E));
  for (int64_t i = 0; i < n_out; ++i) {
    const int64_t row = batch.logit_rows[static_cast<size_t>(i)];
    kernels::rms_norm(ws_.x.data() + row * E, E, output_norm_, ws_.logits_in.data() + i * E, E, 1, E, c.rms_eps);
  }
  // Split: this rank's block of the vocabulary, gathered to rank 0.
  const int64_t v0 = TensorShards::begin(shards_.vocab_cols, shards_.rank);  // (0 unless split)
  if (n_out > 0 && output_.rows > 0) {
    const kernels::MatmulOutput out[] = {{&output_, logits + v0, c.n_vocab}};
    kernels::matmul(out, kernels::MatmulInput{ws_.logits_in.data(), E}, n_out, pool, {}, {}, {.early = {}, .next = pass.after(output_)});
  }
  pass.account(Op::kLmHead, {&output_}, n_out);
  pass.gather_columns(logits, n_out, c.n_vocab, shards_.vocab_cols, 0);
}

std::string_view name(Op op) {
  static constexpr std::array<std::string_view, kOpCount> names = {
      "embed", "rms_norm", "qkv_matmul", "rope_angles", "attention", "out_proj", "gate_up_matmul", "down_matmul",
      "moe_route", "recurrent", "lm_head"};
  return names[static_cast<size_t>(op)];
}

int Model::n_tensor_gathers() const {
  if (!shards_.active()) return 0;
  int n = 1;  // the vocabulary projection
  for (const Layer& layer : layers_) {
    n += layer.plan.mixer == MixerKind::kFullAttention ? 2 : 1;
    if (layer.plan.ffn == FfnKind::kDense) n += 2;
    if (layer.plan.ffn == FfnKind::kExperts) n += layer.experts.has_shared ? 4 : 2;
  }
  return n;
}

int Model::n_expert_layers() const {
  int n = 0;
  for (const Layer& layer : layers_) n += layer.plan.ffn == FfnKind::kExperts ? 1 : 0;
  return n;
}

void Model::run_expert_layers_empty(ThreadPool& pool) {
  TANDEM_ASSERT(experts_exchange_ != nullptr, "an empty expert pass is for expert parallelism");
  for (const Layer& layer : layers_)
    if (layer.plan.ffn == FfnKind::kExperts) run_expert_exchange_empty(ws_, layer.experts, config_, pool, *experts_exchange_);
}

}  // namespace tandem
