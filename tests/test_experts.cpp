// Routed experts (qwen3moe): the router's choice as llama.cpp makes it, a
// token's output independent of the tokens that share its experts, and only
// the active experts counted as the bytes a decode step reads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include "gguf/gguf.h"
#include "model/expert_ffn.h"
#include "model/make_model.h"
#include "model/model.h"
#include "kv/kv_pool.h"
#include "model_fixtures.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace tandem {
namespace {

using kernels::DType;

TEST(Experts, RouterTakesTheMostProbableAndRenormalises) {
  const float logits[] = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f};
  int32_t experts[3];
  float weights[3];
  route_token(logits, 5, 3, 0.0f, experts, weights);
  // Experts 1 and 3 tie: the lower index ranks first.
  EXPECT_EQ(experts[0], 1);
  EXPECT_EQ(experts[1], 3);
  EXPECT_EQ(experts[2], 4);
  const double e1 = std::exp(2.0), e4 = std::exp(1.0);
  EXPECT_NEAR(weights[0], e1 / (2 * e1 + e4), 1e-6);
  EXPECT_NEAR(weights[2], e4 / (2 * e1 + e4), 1e-6);
  EXPECT_NEAR(weights[0] + weights[1] + weights[2], 1.0, 1e-6);
  // A scale other than 0 or 1 multiplies the renormalised weights.
  float scaled[3];
  route_token(logits, 5, 3, 2.5f, experts, scaled);
  for (int s = 0; s < 3; ++s) EXPECT_FLOAT_EQ(scaled[s], 2.5f * weights[s]);
}

std::vector<float> last_logits(Model& m, const std::vector<int32_t>& toks, ThreadPool& pool) {
  KvPool kv(m.kv_shape(16, 4, DType::kF16));
  SimpleBlockAllocator alloc(16);
  Batch b;
  b.add_sequence(toks, 0, alloc.allocate(static_cast<int64_t>((toks.size() + 3) / 4)), true);
  return m.forward(b, kv, pool);
}

// Twelve sequences of 1-6 tokens in one batch: with 8 experts and 2 per
// token, the 42 rows share experts many times over; each sequence's logits
// are still bitwise its logits alone.
TEST(Experts, ATokensOutputDoesNotDependOnWhoSharesItsExperts) {
  for (DType dtype : {DType::kF16, DType::kQ8_0}) {
    auto file = std::make_shared<const gguf::File>(gguf::File::open(testing::tiny_model_path("qwen3moe", dtype)));
    auto m = Model::load(file);
    const int64_t V = m->config().n_vocab;
    ThreadPool pool(2);
    std::vector<std::vector<int32_t>> seqs;
    for (int s = 0; s < 12; ++s) {
      std::vector<int32_t> t;
      for (int i = 0; i <= s % 6; ++i) t.push_back(static_cast<int32_t>((s * 131 + i * 17 + 3) % V));
      seqs.push_back(t);
    }
    KvPool kv(m->kv_shape(64, 4, DType::kF16));
    SimpleBlockAllocator alloc(64);
    alloc.shuffle(3);
    Batch b;
    for (const auto& s : seqs) b.add_sequence(s, 0, alloc.allocate(2), true);
    const std::vector<float> batched = m->forward(b, kv, pool);
    for (size_t i = 0; i < seqs.size(); ++i) {
      const std::vector<float> alone = last_logits(*m, seqs[i], pool);
      EXPECT_EQ(std::memcmp(batched.data() + i * static_cast<size_t>(V), alone.data(), alone.size() * 4), 0)
          << kernels::dtype_name(dtype) << " sequence " << i;
    }
  }
}

TEST(Experts, ADecodeStepReadsOnlyTheActiveExperts) {
  auto file = std::make_shared<const gguf::File>(gguf::File::open(testing::tiny_model_path("qwen3moe", DType::kF16)));
  auto m = Model::load(file);
  const ModelConfig& c = m->config();
  ASSERT_EQ(c.n_expert, 8);
  ASSERT_EQ(c.n_expert_used, 2);
  uint64_t all = 0, experts = 0;
  for (const gguf::TensorInfo& t : file->tensors()) {
    if (t.dims.size() < 2) continue;
    all += t.n_bytes;
    if (t.dims.size() == 3) experts += t.n_bytes;
  }
  const uint64_t embd = file->tensor("token_embd.weight").n_bytes;
  // Every 2-D matrix once (the embedding table: one row), a quarter of the experts.
  const uint64_t want = all - experts - embd + embd / static_cast<uint64_t>(c.n_vocab) + experts * 2 / 8;
  EXPECT_EQ(m->weight_bytes_per_step(), want);
}

// Multiply-adds per token (the compute limit of `tandem bench model`): every
// matrix's elements once, the embedding table none, the routed share of the
// experts; for a dense model every matrix but the embedding.
TEST(Experts, ADecodeTokenMultipliesThroughTheMatricesItReads) {
  for (const char* arch : {"qwen3moe", "llama"}) {
    auto file = std::make_shared<const gguf::File>(gguf::File::open(testing::tiny_model_path(arch, DType::kF16)));
    auto m = Model::load(file);
    uint64_t all = 0, experts = 0;
    for (const gguf::TensorInfo& t : file->tensors()) {
      if (t.dims.size() < 2 || t.name == "token_embd.weight") continue;
      uint64_t n = 1;
      for (uint64_t d : t.dims) n *= d;
      all += n;
      if (t.dims.size() == 3) experts += n;
    }
    const ModelConfig& c = m->config();
    const uint64_t routed = c.n_expert > 0 ? experts * static_cast<uint64_t>(c.n_expert_used) / static_cast<uint64_t>(c.n_expert) : 0;
    EXPECT_EQ(m->multiply_adds_per_token(), all - experts + routed) << arch;
  }
}

TEST(Experts, MakeModelWritesTheShapesLlamaCppReads) {
  const gguf::File f = gguf::File::open(testing::tiny_model_path("qwen3moe", DType::kQ8_0));
  EXPECT_LT(std::filesystem::file_size(f.path()), 10u << 20);
  EXPECT_EQ(f.get_u64("qwen3moe.expert_count"), 8u);
  EXPECT_EQ(f.get_u64("qwen3moe.expert_used_count"), 2u);
  EXPECT_EQ(f.get_u64("qwen3moe.expert_feed_forward_length"), 64u);
  EXPECT_EQ(f.tensor("blk.0.ffn_gate_exps.weight").shape_string(), "[64, 64, 8]");
  EXPECT_EQ(f.tensor("blk.1.ffn_down_exps.weight").shape_string(), "[64, 64, 8]");
  EXPECT_EQ(f.tensor("blk.0.ffn_gate_exps.weight").type, gguf::TensorType::Q8_0);
  EXPECT_EQ(f.tensor("blk.0.ffn_gate_inp.weight").type, gguf::TensorType::F32);  // as llama.cpp's quantizer leaves it
  EXPECT_EQ(f.find_tensor("blk.0.ffn_gate.weight"), nullptr);
  const ModelPreset& small = find_preset("small", "qwen3moe");
  EXPECT_GE(small.n_expert, 16);
  EXPECT_GE(small.n_expert_used, 2);
  // About 240M parameters, about 90M of them read per token.
  const int64_t hd = small.n_embd / small.n_head;
  const int64_t attn = small.n_embd * (small.n_head * hd + 2 * small.n_head_kv * hd) + small.n_head * hd * small.n_embd;
  const int64_t expert = 3 * small.n_embd * small.n_ff_exp;
  const int64_t params = small.n_layer * (attn + small.n_expert * expert) + 2 * small.n_vocab * small.n_embd;
  const int64_t active = small.n_layer * (attn + small.n_expert_used * expert) + small.n_vocab * small.n_embd;
  EXPECT_NEAR(static_cast<double>(params) / 1e6, 240, 5);
  EXPECT_NEAR(static_cast<double>(active) / 1e6, 91, 3);
  EXPECT_THROW(find_preset("base", "qwen3moe"), Error);
}

TEST(Experts, HybridPresetsHaveTheShapesTheIssueAsksFor) {
  const gguf::File f = gguf::File::open(testing::tiny_model_path("qwen3next", DType::kF16));
  EXPECT_LT(std::filesystem::file_size(f.path()), 10u << 20);
  auto m = Model::load(std::make_shared<const gguf::File>(gguf::File::open(f.path())));
  const ModelConfig& c = m->config();
  EXPECT_EQ(c.recurrent, (std::vector<bool>{true, true, true, false}));
  EXPECT_EQ(c.n_attention_layers(), 1);
  EXPECT_EQ(c.kv_layer(3), 0);
  EXPECT_EQ(c.state_layer(2), 2);
  EXPECT_TRUE(c.gated_attention);
  EXPECT_EQ(c.n_rot, c.head_dim / 4);
  // The KV pool holds the one attention layer; each state slot every
  // recurrent layer's conv inputs (3 x 128 channels) and S matrices (4 x 16 x 16).
  const KvPoolShape shape = m->kv_shape(8, 4, DType::kF16, 3);
  EXPECT_EQ(shape.n_layers, 1);
  EXPECT_EQ(shape.n_state_slots, 3);
  EXPECT_EQ(shape.state_slot_bytes, 3u * (3 * 128 + 4 * 16 * 16) * 4);
  EXPECT_NE(f.find_tensor("blk.0.ffn_up_shexp.weight"), nullptr);
  const ModelPreset& small = find_preset("small", "qwen3next");
  EXPECT_GE(small.n_expert, 16);
  EXPECT_GE(small.n_expert_used, 2);
  EXPECT_GE(small.n_layer, 8);
  EXPECT_EQ(small.n_layer % small.full_attention_interval, 0);
  EXPECT_EQ(small.full_attention_interval, 4);  // a quarter of the layers are full attention
}

TEST(Experts, RejectsMoreUsedExpertsThanExperts) {
  const gguf::File src = gguf::File::open(testing::tiny_model_path("qwen3moe", DType::kF32));
  gguf::Writer w;
  for (const auto& kv : src.metadata())
    if (kv.key != "general.alignment")
      w.set(kv.key, kv.key == "qwen3moe.expert_used_count" ? gguf::Value::make_u32(9) : kv.value);
  for (const auto& t : src.tensors()) w.add_tensor(t.name, t.type, t.dims, std::vector<uint8_t>(t.data, t.data + t.n_bytes));
  auto file = std::make_shared<const gguf::File>(gguf::File::parse(w.to_bytes(), "moe.gguf"));
  try {
    Model::load(file);
    FAIL() << "expert_used_count 9 of 8 experts must be rejected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expert_used_count (9)"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tandem
