// `tandem generate`: stream a continuation of a prompt, then report speed.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/demo_model.h"
#include "cli/loaded_model.h"
#include "cli/tensor_parallel.h"
#include "engine/sampler.h"
#include "kernels/dtype.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace tandem::cli {

namespace {

struct GenerateArgs {
  std::string model_path;
  std::string prompt = "Once upon a time";
  int n_predict = 64;
  float temperature = 0.0f;
  uint64_t seed = 0;
  int threads = 0;
  int batch_size = 512;
  int block_size = 16;
  std::string kv_dtype = "f16";
  bool ignore_eos = false;
  TensorParallelOptions tp;
};

void run_generate(const GenerateArgs& a) {
  const std::string path = a.model_path.empty() ? ensure_demo_model() : a.model_path;
  LoadedModel lm = load_model(path, false, a.tp.enabled() ? tensor_parallel_core_load(a.tp.size) : LoadOptions{});
  const ModelConfig& c = lm.model->config();
  ThreadPool pool(a.threads);
  std::vector<int32_t> prompt = lm.tokenizer->encode(a.prompt, /*add_special=*/true, /*parse_special=*/true);
  if (prompt.empty()) throw Error("the prompt is empty after tokenization; give some text with -p");
  const int64_t n_ctx = static_cast<int64_t>(prompt.size()) + a.n_predict;
  if (n_ctx > c.n_ctx_train)
    throw Error("prompt (" + std::to_string(prompt.size()) + " tokens) plus -n " + std::to_string(a.n_predict) +
                " exceeds the model's context length " + std::to_string(c.n_ctx_train));

  const int64_t n_blocks = (n_ctx + a.block_size - 1) / a.block_size;
  // Tensor parallelism: the pool in a shared file, the forwards on the workers.
  std::unique_ptr<TensorParallelDir> tp_dir;
  if (a.tp.enabled()) tp_dir = std::make_unique<TensorParallelDir>();
  KvPool kv(lm.model->kv_shape(n_blocks, a.block_size, kernels::parse_dtype(a.kv_dtype), 1),
            tp_dir ? tp_dir->kv_backing() : KvPoolBacking{});
  std::unique_ptr<TensorParallelExecutor> tp;
  if (a.tp.enabled()) {
    TensorParallelOptions o = a.tp;
    size_tensor_parallel(o, path, c.n_vocab, a.batch_size, 1, n_ctx, a.block_size, a.threads);
    tp = std::make_unique<TensorParallelExecutor>(o, kv, tp_dir->kv_path());
  }
  std::vector<float> logits(static_cast<size_t>(c.n_vocab));
  auto forward = [&](const Batch& b) {
    if (tp)
      tp->forward(b, logits.data());
    else
      lm.model->forward(b, kv, pool, logits.data());
  };
  SimpleBlockAllocator alloc(n_blocks);
  const std::vector<int32_t> table = alloc.allocate(n_blocks);

  std::fputs(a.prompt.c_str(), stdout);
  std::fflush(stdout);

  // Prefill in chunks of batch_size; only the last chunk asks for logits.
  Stopwatch prefill_sw;
  for (size_t start = 0; start < prompt.size(); start += static_cast<size_t>(a.batch_size)) {
    const size_t len = std::min(prompt.size() - start, static_cast<size_t>(a.batch_size));
    Batch batch;
    batch.add_sequence(std::span<const int32_t>(prompt).subspan(start, len), static_cast<int32_t>(start), table,
                       start + len == prompt.size(), /*state_slot=*/0);
    forward(batch);
  }
  const double prefill_s = prefill_sw.elapsed_s();

  SamplingParams sampling;
  sampling.temperature = a.temperature;  // 0 = greedy; otherwise plain temperature sampling
  sampling.seed = a.seed;
  SequenceSampler sampler(sampling, SequenceSampler::derive_seed(sampling, 0, 0), prompt);
  IncrementalDetokenizer detok(*lm.tokenizer);
  int n_generated = 0;
  int32_t pos = static_cast<int32_t>(prompt.size());
  Stopwatch gen_sw;
  for (int i = 0; i < a.n_predict; ++i) {
    const int32_t tok = sampler.sample(std::span<const float>(logits.data(), static_cast<size_t>(c.n_vocab))).token;
    sampler.accept(tok);
    ++n_generated;
    if (!a.ignore_eos && lm.tokenizer->is_end_of_generation(tok)) break;
    std::fputs(detok.push(tok).c_str(), stdout);
    std::fflush(stdout);
    if (i + 1 == a.n_predict) break;
    Batch batch;
    const int32_t one[] = {tok};
    batch.add_sequence(one, pos++, table, true, /*state_slot=*/0);
    forward(batch);
  }
  std::fputs(detok.flush().c_str(), stdout);
  std::fputc('\n', stdout);
  const double gen_s = gen_sw.elapsed_s();
  std::fprintf(stderr, "\nmodel: %s (%s, %s, %lld layers)\n", path.c_str(), c.arch.c_str(),
               kernels::dtype_name(lm.model->weight_dtype()).c_str(), static_cast<long long>(c.n_layer));
  std::fprintf(stderr, "load: %.2f s\n", lm.load_seconds);
  std::fprintf(stderr, "prompt: %zu tokens in %.3f s, %.1f tokens/s\n", prompt.size(), prefill_s,
               static_cast<double>(prompt.size()) / prefill_s);
  // The first sampled token comes from the prefill logits, so decode steps = n_generated - 1.
  const int steps = std::max(n_generated - 1, 0);
  std::fprintf(stderr, "generation: %d tokens in %.3f s, %.1f tokens/s (%s)\n", n_generated, gen_s,
               steps > 0 ? steps / gen_s : 0.0,
               tp ? (std::to_string(a.tp.size) + " tensor-parallel workers").c_str()
                  : (std::to_string(pool.size()) + " threads").c_str());
}

}  // namespace

void add_generate(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand("generate", "Stream a generation from a GGUF model (no -m: the demo model)");
  cmd->add_option("-m,--model", a->model_path, "GGUF model file");
  cmd->add_option("-p,--prompt", a->prompt, "Prompt text");
  cmd->add_option("-n,--n-predict", a->n_predict, "Tokens to generate")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--temp", a->temperature, "Sampling temperature (0 = greedy)")->check(CLI::Range(0.0, 100.0));
  cmd->add_option("--seed", a->seed, "Sampling seed");
  cmd->add_option("-t,--threads", a->threads, "Threads (0 = one per core)")->check(CLI::Range(0, 1024));
  cmd->add_option("-b,--batch-size", a->batch_size, "Prompt tokens per forward call")->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--block-size", a->block_size, "KV block size in tokens")->check(CLI::Range(1, 1024));
  cmd->add_option("--kv-dtype", a->kv_dtype, "KV cache type")->check(CLI::IsMember({"f32", "f16", "bf16"}));
  cmd->add_flag("--ignore-eos", a->ignore_eos, "Keep generating past end-of-generation tokens");
  cmd->add_option("--tensor-parallel-size", a->tp.size, "Worker processes each holding a shard of every matrix")
      ->check(CLI::Range(1, parallel::kMaxRingReaders));
  cmd->callback([a] { run_generate(*a); });
}

}  // namespace tandem::cli
