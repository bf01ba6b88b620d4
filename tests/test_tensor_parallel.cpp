// Tensor parallelism in the model (model/tensor_parallel.h): two ranks, each
// loading only its shards, joined by the lockstep group's gathers over gloo
// (threads in one process), produce logits bitwise equal to one rank's, on
// every architecture, over mixed prefill and decode steps, with the KV pool
// shared as the TP workers share it (each rank writes its own heads).
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include "engine/lockstep_tensor_gather.h"
#include "kv/kv_pool.h"
#include "model/model.h"
#include "model/tensor_parallel.h"
#include "model_fixtures.h"
#include "transport/gloo_transport.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace tandem {
namespace {

// Three sequences over six steps: prompts in chunks beside decode tokens.
std::vector<Batch> scenario(const ModelConfig& c) {
  std::vector<std::vector<int32_t>> tokens(3);
  for (int s = 0; s < 3; ++s)
    for (int i = 0; i < 48; ++i) tokens[static_cast<size_t>(s)].push_back(static_cast<int32_t>((s * 977 + i * 131 + 7) % c.n_vocab));
  auto blocks = [](int s) { return std::vector<int32_t>{4 * s, 4 * s + 1, 4 * s + 2, 4 * s + 3}; };
  struct Chunk {
    int seq, start, length;
  };
  const std::vector<std::vector<Chunk>> steps = {
      {{0, 0, 20}, {1, 0, 7}},
      {{0, 20, 1}, {1, 7, 6}, {2, 0, 34}},
      {{0, 21, 1}, {1, 13, 1}, {2, 34, 1}},
      {{0, 22, 1}, {1, 14, 1}, {2, 35, 1}},
      {{1, 15, 17}, {2, 36, 1}},
      {{0, 23, 1}, {1, 32, 1}, {2, 37, 1}},
  };
  std::vector<Batch> out;
  for (const auto& step : steps) {
    Batch b;
    for (const Chunk& k : step)
      b.add_sequence(std::span<const int32_t>(tokens[static_cast<size_t>(k.seq)]).subspan(static_cast<size_t>(k.start), static_cast<size_t>(k.length)),
                     k.start, blocks(k.seq), true, c.hybrid() ? k.seq : -1);
    out.push_back(std::move(b));
  }
  return out;
}

std::vector<std::vector<float>> run_whole(const std::shared_ptr<const gguf::File>& file, const std::vector<Batch>& steps) {
  auto model = Model::load(file);
  KvPool kv(model->kv_shape(16, 16, kernels::DType::kF16, 4));
  ThreadPool pool(1);
  std::vector<std::vector<float>> logits;
  for (const Batch& b : steps) logits.push_back(model->forward(b, kv, pool));
  return logits;
}

// Rank 0's logits of each step, `size` ranks over gloo with shared-memory frames.
std::vector<std::vector<float>> run_split(const std::shared_ptr<const gguf::File>& file, const std::vector<Batch>& steps,
                                          int size) {
  static std::atomic<int> counter{0};
  const auto dir = std::filesystem::temp_directory_path() /
                   ("tandem-tp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
  std::filesystem::create_directories(dir);
  std::vector<std::unique_ptr<Model>> models;
  for (int r = 0; r < size; ++r) {
    LoadOptions o;
    o.tensor_rank = r;
    o.tensor_ranks = size;
    models.push_back(Model::load(file, o));
  }
  KvPool kv(models[0]->kv_shape(16, 16, kernels::DType::kF16, 4));  // one pool, as the workers share it
  std::vector<std::vector<float>> logits(steps.size());
  std::vector<std::string> errors(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      try {
        GlooGroupOptions o;
        o.rank = r;
        o.size = size;
        o.rendezvous_dir = dir.string();
        o.timeout_ms = 20000;
        o.shared_memory_frames = true;
        Model& m = *models[static_cast<size_t>(r)];
        parallel::LockstepGroup group(std::make_unique<GlooTransport>(o),
                                      parallel::LockstepConfig{0, 0, m.n_tensor_gathers(), "tensor-parallel"});
        LockstepTensorGather gather;
        gather.bind(&group);
        m.set_tensor_gather(&gather);
        ThreadPool pool(1);
        for (size_t s = 0; s < steps.size(); ++s) {
          parallel::StepHeader h;
          h.phase = parallel::StepPhase::kMixed;
          h.n_tokens = steps[s].n_rows();
          group.begin_step(static_cast<int64_t>(s) + 1, h);
          std::vector<float> out = m.forward(steps[s], kv, pool);
          group.end_step();
          if (r == 0) logits[s] = std::move(out);
        }
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  std::filesystem::remove_all(dir);
  for (int r = 0; r < size; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
  return logits;
}

class TensorParallelModel : public ::testing::TestWithParam<std::string> {};

TEST_P(TensorParallelModel, TwoRanksEqualOneRankBitwiseOverPrefillAndDecode) {
  const std::string arch = GetParam();
  for (kernels::DType dtype : {kernels::DType::kF16, kernels::DType::kQ8_0}) {
    auto file = std::make_shared<const gguf::File>(gguf::File::open(testing::tiny_model_path(arch, dtype)));
    const auto steps = scenario(ModelConfig::from_gguf(*file));
    const auto whole = run_whole(file, steps);
    const auto split = run_split(file, steps, 2);
    ASSERT_EQ(split.size(), whole.size());
    for (size_t s = 0; s < whole.size(); ++s) {
      ASSERT_EQ(split[s].size(), whole[s].size()) << "step " << s;
      EXPECT_EQ(std::memcmp(split[s].data(), whole[s].data(), whole[s].size() * sizeof(float)), 0)
          << arch << " " << kernels::dtype_name(dtype) << ": step " << s << " differs";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Arch, TensorParallelModel, ::testing::Values("llama", "qwen2", "qwen3", "qwen3moe", "qwen3next"),
                         [](const auto& info) { return info.param; });

TEST(TensorParallelShards, EveryMatrixSplitsOnWholePanelsAndKvHeads) {
  auto file = std::make_shared<const gguf::File>(gguf::File::open(testing::tiny_model_path("llama", kernels::DType::kF16)));
  const ModelConfig c = ModelConfig::from_gguf(*file);
  const TensorShards s0 = tensor_shards(c, 0, 2), s1 = tensor_shards(c, 1, 2);
  EXPECT_EQ(s0.kv_head_begin, 0);
  EXPECT_EQ(s0.kv_head_end, c.n_head_kv / 2);
  EXPECT_EQ(s1.kv_head_end, c.n_head_kv);
  EXPECT_EQ(s0.q_cols, (ColumnBounds{0, c.n_head * c.head_dim / 2, c.n_head * c.head_dim}));
  for (const ColumnBounds* b : {&s0.embd_cols, &s0.ff_cols, &s0.vocab_cols}) {
    EXPECT_EQ(b->front(), 0);
    EXPECT_EQ((*b)[1] % kernels::kPanelRows, 0);
  }
  EXPECT_EQ(split_bounds(100, 16, 3), (ColumnBounds{0, 32, 64, 100}));
  // A size that does not divide the KV heads is refused, naming them.
  try {
    tensor_shards(c, 0, 3);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KV heads do not split evenly over 3 ranks"), std::string::npos) << e.what();
  }
  // Each rank loads only its rows: together exactly the whole model's per-step bytes (plus the embedding row).
  LoadOptions o0, o1;
  o0.tensor_ranks = o1.tensor_ranks = 2;
  o1.tensor_rank = 1;
  auto whole = Model::load(file), m0 = Model::load(file, o0), m1 = Model::load(file, o1);
  const uint64_t extra = m0->weight_bytes_per_step() + m1->weight_bytes_per_step() - whole->weight_bytes_per_step();
  // The shards together are the whole model, with one more embedding row.
  EXPECT_GT(extra, 0u);
  EXPECT_LT(extra, whole->weight_bytes_per_step() / 10);
  EXPECT_EQ(m0->n_tensor_gathers(), 4 * static_cast<int>(c.n_layer) + 1);
  EXPECT_EQ(whole->n_tensor_gathers(), 0);
}

}  // namespace
}  // namespace tandem
