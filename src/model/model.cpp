#include "model/model.h"

#include <algorithm>
#include <array>
#include <span>
#include <cmath>
#include <initializer_list>
#include <numeric>
#include <cstring>

#include "gguf/gguf.h"
#include "kernels/attention.h"
#include "kernels/kv_write.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace tandem {

namespace {

using kernels::DType;
using kernels::WeightMatrix;

DType compute_dtype(const gguf::File& f, const gguf::TensorInfo& t) {
  switch (t.type) {
    case gguf::TensorType::F32: return DType::kF32;
    case gguf::TensorType::F16: return DType::kF16;
    case gguf::TensorType::BF16: return DType::kBF16;
    case gguf::TensorType::Q8_0: return DType::kQ8_0;
    default: break;
  }
  throw Error(f.path() + ": tensor '" + t.name + "' has type " + gguf::type_name(t.type) +
              ", which tandem cannot compute with (supported: f32, f16, bf16, q8_0); re-quantize the model "
              "to one of those");
}

std::string shape_text(std::initializer_list<int64_t> dims) {
  std::string s = "[";
  for (int64_t d : dims) s += (s.size() > 1 ? ", " : "") + std::to_string(d);
  return s + "]";
}

WeightMatrix matrix(const gguf::File& f, const std::string& name, int64_t cols, int64_t rows) {
  const gguf::TensorInfo& t = f.tensor(name);
  if (t.dims.size() != 2 || static_cast<int64_t>(t.dims[0]) != cols || static_cast<int64_t>(t.dims[1]) != rows)
    throw Error(f.path() + ": tensor '" + name + "' has shape " + t.shape_string() + ", expected " +
                shape_text({cols, rows}));
  WeightMatrix w;
  w.type = compute_dtype(f, t);
  if (w.type == DType::kQ8_0 && cols % 32 != 0)
    throw Error(f.path() + ": q8_0 tensor '" + name + "' has rows not made of whole blocks");
  w.data = t.data;
  w.rows = rows;
  w.cols = cols;
  w.row_bytes = kernels::dtype_row_bytes(w.type, cols);
  TANDEM_ASSERT(w.row_bytes * static_cast<size_t>(rows) == t.n_bytes);
  return w;
}

const float* vector_f32(const gguf::File& f, const std::string& name, int64_t n, bool required = true) {
  const gguf::TensorInfo* t = f.find_tensor(name);
  if (t == nullptr) {
    if (required) f.tensor(name);  // throws the standard "missing tensor" error
    return nullptr;
  }
  if (t->type != gguf::TensorType::F32)
    throw Error(f.path() + ": tensor '" + name + "' must be f32 (it is " + gguf::type_name(t->type) + ")");
  if (t->n_elements() != static_cast<uint64_t>(n))
    throw Error(f.path() + ": tensor '" + name + "' has shape " + t->shape_string() + ", expected [" +
                std::to_string(n) + "]");
  // GGUF data is aligned (32 bytes by default), so an f32 view is aligned.
  TANDEM_ASSERT(reinterpret_cast<uintptr_t>(t->data) % alignof(float) == 0);
  return reinterpret_cast<const float*>(t->data);
}

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

uint64_t matrix_bytes(const WeightMatrix& w) { return static_cast<uint64_t>(w.row_bytes) * static_cast<uint64_t>(w.rows); }

}  // namespace

std::unique_ptr<Model> Model::load(std::shared_ptr<const gguf::File> file, const LoadOptions& options) {
  std::unique_ptr<Model> m(new Model());
  const gguf::File& f = *file;
  m->file_ = std::move(file);
  m->config_ = ModelConfig::from_gguf(f);
  const ModelConfig& c = m->config_;
  const int64_t q_dim = c.n_head * c.head_dim;
  const int64_t kv_dim = c.n_head_kv * c.head_dim;

  m->token_embd_ = matrix(f, "token_embd.weight", c.n_embd, c.n_vocab);
  m->output_ = c.tied_embeddings ? m->token_embd_ : matrix(f, "output.weight", c.n_embd, c.n_vocab);
  m->output_norm_ = vector_f32(f, "output_norm.weight", c.n_embd);
  if (const float* factors = vector_f32(f, "rope_freqs.weight", c.n_rot / 2, false))
    m->rope_freq_factors_.assign(factors, factors + c.n_rot / 2);

  m->layers_.resize(static_cast<size_t>(c.n_layer));
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    LayerWeights& w = m->layers_[static_cast<size_t>(l)];
    w.attn_norm = vector_f32(f, p + "attn_norm.weight", c.n_embd);
    w.wq = matrix(f, p + "attn_q.weight", c.n_embd, q_dim);
    w.wk = matrix(f, p + "attn_k.weight", c.n_embd, kv_dim);
    w.wv = matrix(f, p + "attn_v.weight", c.n_embd, kv_dim);
    w.wo = matrix(f, p + "attn_output.weight", q_dim, c.n_embd);
    w.bq = vector_f32(f, p + "attn_q.bias", q_dim, c.qkv_bias);
    w.bk = vector_f32(f, p + "attn_k.bias", kv_dim, c.qkv_bias);
    w.bv = vector_f32(f, p + "attn_v.bias", kv_dim, c.qkv_bias);
    if (c.qk_norm) {
      w.q_norm = vector_f32(f, p + "attn_q_norm.weight", c.head_dim);
      w.k_norm = vector_f32(f, p + "attn_k_norm.weight", c.head_dim);
    }
    w.ffn_norm = vector_f32(f, p + "ffn_norm.weight", c.n_embd);
    w.w_gate = matrix(f, p + "ffn_gate.weight", c.n_embd, c.n_ff);
    w.w_up = matrix(f, p + "ffn_up.weight", c.n_embd, c.n_ff);
    w.w_down = matrix(f, p + "ffn_down.weight", c.n_ff, c.n_embd);
  }
  // Interleave every matrix that can be (not the embedding table, which is
  // read by rows), each into its slice of one anonymous mapping, dropping its
  // file pages at once so that memory holds one copy at any time.
  std::vector<WeightMatrix*> to_interleave;
  if (options.interleave_weights) {
    for (LayerWeights& w : m->layers_)
      for (WeightMatrix* x : {&w.wq, &w.wk, &w.wv, &w.wo, &w.w_gate, &w.w_up, &w.w_down}) to_interleave.push_back(x);
    if (!c.tied_embeddings) to_interleave.push_back(&m->output_);
    std::erase_if(to_interleave, [](const WeightMatrix* x) { return !kernels::can_interleave(*x); });
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
      *x = kernels::interleave_rows(plain, m->interleaved_.data() + offset);
      offset += matrix_bytes(plain);
      f.drop_pages(plain.data, matrix_bytes(plain));
      if (options.progress) options.progress(offset, total);
    }
  }
  prefault(rest, interleaved_bytes, total, options);
  if (options.progress && total > 0) options.progress(total, total);
  return m;
}

uint64_t Model::weight_bytes_per_step() const {
  auto bytes = [](const WeightMatrix& w) { return static_cast<uint64_t>(w.row_bytes) * static_cast<uint64_t>(w.rows); };
  uint64_t total = bytes(output_) + token_embd_.row_bytes;
  for (const LayerWeights& w : layers_)
    total += bytes(w.wq) + bytes(w.wk) + bytes(w.wv) + bytes(w.wo) + bytes(w.w_gate) + bytes(w.w_up) + bytes(w.w_down);
  return total;
}

KvPoolShape Model::kv_shape(int64_t n_blocks, int block_size, DType dtype) const {
  KvPoolShape s;
  s.n_layers = static_cast<int>(config_.n_layer);
  s.n_kv_heads = static_cast<int>(config_.n_head_kv);
  s.head_dim = static_cast<int>(config_.head_dim);
  s.block_size = block_size;
  s.dtype = dtype;
  s.n_blocks = n_blocks;
  return s;
}

void Model::check_batch(const Batch& b, const KvPool& kv) const {
  const KvPoolShape& s = kv.shape();
  TANDEM_ASSERT(s.n_layers == config_.n_layer && s.n_kv_heads == config_.n_head_kv && s.head_dim == config_.head_dim,
                "KV pool shape does not match the model");
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

kernels::MatmulInput Model::norm_rows(const float* weight, std::span<const kernels::MatmulOutput> group, int64_t n,
                                      ThreadPool& pool) {
  OpTimer timer(profile_, Op::kNorm);
  const int64_t E = config_.n_embd;
  const float eps = config_.rms_eps;
  // Rows across threads for a prompt; a few decode rows are one chunk, run inline.
  constexpr int64_t kRowGrain = 16;
  if (kernels::all_q8_0(group) && E % 32 == 0) {
    // Fused: the normalised rows go straight into Q8_0 activation blocks.
    const int64_t ldq = E / 32;
    ws_.xq.resize(static_cast<size_t>(n * ldq));
    pool.parallel_for(n, kRowGrain, [&](int64_t b, int64_t e) {
      kernels::rms_norm_q8_0(ws_.x.data() + b * E, E, weight, ws_.xq.data() + b * ldq, ldq, e - b, E, eps);
    });
    return kernels::MatmulInput{nullptr, 0, ws_.xq.data(), ldq};
  }
  pool.parallel_for(n, kRowGrain, [&](int64_t b, int64_t e) {
    kernels::rms_norm(ws_.x.data() + b * E, E, weight, ws_.xn.data() + b * E, E, e - b, E, eps);
  });
  return kernels::MatmulInput{ws_.xn.data(), E, nullptr, 0};
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
  std::vector<std::pair<int32_t, int32_t>> slot_of_row(static_cast<size_t>(n));
  const int block_size = kv.shape().block_size;
  for (const BatchSequence& seq : batch.sequences) {
    ws_.sequences.push_back({seq.first_row, seq.n_tokens, batch.positions[static_cast<size_t>(seq.first_row)],
                             seq.block_table.data(), static_cast<int32_t>(seq.block_table.size())});
    for (int32_t i = 0; i < seq.n_tokens; ++i) {
      const auto row = static_cast<size_t>(seq.first_row + i);
      const int32_t pos = batch.positions[row];
      slot_of_row[row] = {seq.block_table[static_cast<size_t>(pos / block_size)], pos % block_size};
    }
  }

  OpProfile* prof = profile_;
  if (prof != nullptr) ++prof->forwards;
  // Counts a matmul group's work for the profile's GFLOP/s and GB/s columns.
  auto account = [&](Op op, std::initializer_list<const kernels::WeightMatrix*> ws, int64_t tokens) {
    if (prof == nullptr) return;
    for (const kernels::WeightMatrix* w : ws) {
      prof->flops[static_cast<int>(op)] += 2.0 * static_cast<double>(w->rows * w->cols * tokens);
      prof->weight_bytes[static_cast<int>(op)] += static_cast<double>(w->row_bytes) * static_cast<double>(w->rows);
    }
  };

  {
    OpTimer timer(prof, Op::kEmbed);
    for (int64_t t = 0; t < n; ++t) {
      const auto tok = static_cast<size_t>(batch.tokens[static_cast<size_t>(t)]);
      kernels::dequantize_row(token_embd_.type, token_embd_.data + tok * token_embd_.row_bytes, ws_.x.data() + t * E, E);
    }
  }

  kernels::RopeParams rope;
  rope.n_rot = c.n_rot;
  rope.neox = c.rope_neox;
  rope.freq_base = c.rope_freq_base;
  rope.freq_factors = rope_freq_factors_.empty() ? nullptr : rope_freq_factors_.data();
  {
    OpTimer timer(prof, Op::kRope);
    kernels::rope_angles(batch.positions.data(), n, rope, ws_.cos.data(), ws_.sin.data());
  }
  const float attn_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));

  // Each row's K and V slots in the pool (the same for every layer but the
  // layer index).
  auto kv_slots_of_layer = [&](int64_t l) {
    for (int64_t t = 0; t < n; ++t) {
      const auto [block, slot] = slot_of_row[static_cast<size_t>(t)];
      ws_.kv_slots[static_cast<size_t>(t)] = {kv.k_part(block, static_cast<int>(l)),
                                              kv.v_part(block, static_cast<int>(l)), slot};
    }
  };
  const int hd = static_cast<int>(c.head_dim);
  const kernels::KvBlockShape kv_block{hd, kv.shape().block_size};
  // QKV threads take whole heads (the epilogue ropes and writes per head), and
  // whole panels where the shapes allow.
  kernels::MatmulSplit qkv_split{std::lcm(c.head_dim, kernels::kPanelRows)};
  if (q_dim % qkv_split.row_grain != 0 || kv_dim % qkv_split.row_grain != 0) qkv_split.row_grain = c.head_dim;
  // The residual add, in the epilogue of out_proj and down: rows [b, e) of
  // proj into x, every token.
  auto add_residual = [&](size_t, int64_t b, int64_t e) {
    for (int64_t t = 0; t < n; ++t) kernels::add_inplace(ws_.x.data() + t * E + b, ws_.proj.data() + t * E + b, e - b);
  };
  // SwiGLU, in the epilogue of gate/up: with the same_rows split a thread
  // computes the same rows of both, up's range right after gate's.
  auto swiglu = [&](size_t index, int64_t b, int64_t e) {
    if (index != 1) return;
    for (int64_t t = 0; t < n; ++t) kernels::silu_mul(ws_.gate.data() + t * F + b, ws_.up.data() + t * F + b, e - b);
  };

  for (int64_t l = 0; l < c.n_layer; ++l) {
    const LayerWeights& w = layers_[static_cast<size_t>(l)];
    kv_slots_of_layer(l);
    {
      const kernels::MatmulOutput qkv[] = {{&w.wq, ws_.q.data(), q_dim}, {&w.wk, ws_.k.data(), kv_dim},
                                           {&w.wv, ws_.v.data(), kv_dim}};
      const kernels::MatmulInput in = norm_rows(w.attn_norm, qkv, n, pool);
      OpTimer timer(prof, Op::kQkv);
      // Per head range [b, e) of Q, K or V, every token: bias, per-head norm,
      // RoPE; K and V then go to the pool (attention reads every position,
      // this call's own included, from the pool in the pool's dtype).
      struct QkvPart {
        float* y;
        int64_t ld;
        const float* bias;       // qwen2, else null
        const float* head_norm;  // qwen3 (Q and K), else null
      };
      const QkvPart parts[] = {{ws_.q.data(), q_dim, w.bq, w.q_norm},
                               {ws_.k.data(), kv_dim, w.bk, w.k_norm},
                               {ws_.v.data(), kv_dim, w.bv, nullptr}};
      auto epilogue = [&](size_t index, int64_t b, int64_t e) {
        const int h0 = static_cast<int>(b / c.head_dim);
        const int h1 = static_cast<int>(e / c.head_dim);
        const auto [y, ld, bias, head_norm] = parts[index];
        if (bias != nullptr)
          for (int64_t t = 0; t < n; ++t) kernels::add_inplace(y + t * ld + b, bias + b, e - b);
        if (head_norm != nullptr)
          for (int64_t t = 0; t < n; ++t)
            kernels::rms_norm(y + t * ld + b, c.head_dim, head_norm, y + t * ld + b, c.head_dim, h1 - h0, c.head_dim,
                              c.rms_eps);
        if (index == 0) {
          kernels::rope_apply(y + b, q_dim, n, h1 - h0, hd, rope, ws_.cos.data(), ws_.sin.data());
        } else if (index == 1) {
          kernels::rope_write_k(y, kv_dim, n, h0, h1, kv_block, rope, ws_.cos.data(), ws_.sin.data(), ws_.kv_slots.data(),
                                kv.shape().dtype);
        } else {
          kernels::write_v(y, kv_dim, n, h0, h1, kv_block, ws_.kv_slots.data(), kv.shape().dtype);
        }
      };
      kernels::matmul(qkv, in, n, pool, qkv_split, epilogue);
      account(Op::kQkv, {&w.wq, &w.wk, &w.wv}, n);
    }
    {
      OpTimer timer(prof, Op::kAttention);
      kernels::paged_attention(ws_.q.data(), q_dim, ws_.sequences, kv.layer_view(static_cast<int>(l)),
                               static_cast<int>(c.n_head), static_cast<int>(c.n_head_kv), static_cast<int>(c.head_dim),
                               attn_scale, ws_.attn.data(), q_dim, pool);
    }
    {
      OpTimer timer(prof, Op::kOutProj);
      const kernels::MatmulOutput out[] = {{&w.wo, ws_.proj.data(), E}};
      kernels::matmul(out, kernels::MatmulInput{ws_.attn.data(), q_dim}, n, pool, {}, add_residual);
      account(Op::kOutProj, {&w.wo}, n);
    }
    {
      const kernels::MatmulOutput gate_up[] = {{&w.w_gate, ws_.gate.data(), F}, {&w.w_up, ws_.up.data(), F}};
      const kernels::MatmulInput in = norm_rows(w.ffn_norm, gate_up, n, pool);
      OpTimer timer(prof, Op::kGateUp);
      kernels::matmul(gate_up, in, n, pool, kernels::MatmulSplit{.same_rows = true}, swiglu);
      account(Op::kGateUp, {&w.w_gate, &w.w_up}, n);
    }
    {
      OpTimer timer(prof, Op::kDown);
      const kernels::MatmulOutput down[] = {{&w.w_down, ws_.proj.data(), E}};
      kernels::matmul(down, kernels::MatmulInput{ws_.gate.data(), F}, n, pool, {}, add_residual);
      account(Op::kDown, {&w.w_down}, n);
    }
  }

  // Final norm and the vocabulary projection, only for the rows asked for.
  const auto n_out = static_cast<int64_t>(batch.logit_rows.size());
  if (n_out == 0) return;
  OpTimer timer(prof, Op::kLmHead);
  ws_.logits_in.resize(size(n_out, E));
  for (int64_t i = 0; i < n_out; ++i) {
    const int64_t row = batch.logit_rows[static_cast<size_t>(i)];
    kernels::rms_norm(ws_.x.data() + row * E, E, output_norm_, ws_.logits_in.data() + i * E, E, 1, E, c.rms_eps);
  }
  kernels::matmul(output_, ws_.logits_in.data(), E, n_out, logits, c.n_vocab, pool);
  account(Op::kLmHead, {&output_}, n_out);
}

std::string_view name(Op op) {
  static constexpr std::array<std::string_view, kOpCount> names = {
      "embed", "rms_norm", "qkv_matmul", "rope_angles", "attention", "out_proj", "gate_up_matmul", "down_matmul",
      "lm_head"};
  return names[static_cast<size_t>(op)];
}

}  // namespace tandem
