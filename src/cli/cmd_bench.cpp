// `tandem bench model`: prompt processing, generation and batched decode
// speed of one model, with a memory-bandwidth roofline for decode.
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/tensor_parallel.h"
#include "cli/commands.h"
#include "cli/loaded_model.h"
#include "gguf/gguf.h"
#include "kernels/isa.h"
#include "kernels/memory_bandwidth.h"
#include "kernels/multiply_peak.h"
#include "model/decode_limits.h"
#include "loadgen/loadgen.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/percentile.h"
#include "util/thread_pool.h"

namespace tandem::cli {

namespace {

constexpr size_t kProbeBytes = size_t{1} << 30;
constexpr int kProbePasses = 8;        // after all the tests, for the roofline and the batched limits
constexpr int kPairedProbePasses = 2;  // before and after each generation run

struct BenchArgs {
  std::string model_path;
  int threads = 0;
  int repeats = 3;
  int n_prompt = 512;
  int n_gen = 128;
  std::vector<int> batches = {8, 32, 64};
  int batched_steps = 32;
  int batched_prompt = 16;
  std::string kv_dtype = "f16";
  bool json = false;
  bool profile = false;
  bool no_interleave = false;
  TensorParallelOptions tp;
};

// Peak resident memory of this process so far, in MiB (getrusage reports KiB on Linux).
double max_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Deterministic token ids in [0, n_vocab) (the content does not matter for speed).
std::vector<int32_t> bench_tokens(int64_t n, int64_t n_vocab, uint64_t salt) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  uint64_t s = 0x2545f4914f6cdd1dull ^ salt;
  for (auto& v : t) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    v = static_cast<int32_t>(s % static_cast<uint64_t>(n_vocab));
  }
  return t;
}

// A generation run judged against the probe passes taken around it.
struct PairedRun {
  double decode_bps = 0;  // weight bytes a decode step reads x steps per second
  double probe_bps = 0;   // the best of the passes just before and just after
  double ratio() const { return decode_bps / probe_bps; }
};

struct BenchResult {
  double pp_tps = 0, tg_tps = 0, bandwidth_bps = 0;
  kernels::ReadBandwidth bandwidth;
  std::vector<PairedRun> tg_paired;
  kernels::MultiplyPeak multiply;
  std::vector<std::pair<int, double>> batched_tps;
  OpProfile pp_profile, tg_profile, batched_profile;  // batched: the largest batch's decode steps
};

// Per-op breakdown of one phase: time per forward, share, and for the matmul
// ops the arithmetic rate and the weight bytes read per second.
void print_profile(const char* phase, const OpProfile& p) {
  if (p.forwards == 0) return;
  const double total_ns = static_cast<double>(p.total_ns());
  std::printf("profile %s (%lld forwards):\n", phase, static_cast<long long>(p.forwards));
  std::printf("  %-16s %12s %7s %10s %12s\n", "op", "ms/forward", "share", "GFLOP/s", "weights GB/s");
  for (int i = 0; i < kOpCount; ++i) {
    const double ns = static_cast<double>(p.ns[i]);
    if (ns == 0) continue;
    std::printf("  %-16s %12.3f %6.1f%%", std::string(name(static_cast<Op>(i))).c_str(),
                ns / 1e6 / static_cast<double>(p.forwards), 100.0 * ns / total_ns);
    if (p.flops[i] > 0) {
      std::printf(" %10.1f %12.2f\n", p.flops[i] / ns, p.weight_bytes[i] / ns);
    } else {
      std::printf(" %10s %12s\n", "-", "-");
    }
  }
  std::printf("  (matmul epilogues: qkv includes biases, RoPE and the K/V write; gate_up SwiGLU; out_proj and down "
              "the residual add)\n");
}

void print_profile_json(const char* key, const OpProfile& p) {
  std::printf(", \"%s\": {", key);
  for (int i = 0; i < kOpCount; ++i)
    std::printf("%s\"%s_ms\": %.4f", i ? ", " : "", std::string(name(static_cast<Op>(i))).c_str(),
                p.forwards ? static_cast<double>(p.ns[i]) / 1e6 / static_cast<double>(p.forwards) : 0.0);
  std::printf("}");
}

void print_bandwidth(const kernels::ReadBandwidth& b, int threads) {
  std::printf("memory read bandwidth: best %.2f GB/s, median %.2f, worst %.2f over %zu passes of %.2f GiB (%s loop, %d "
              "threads)\n",
              b.best_bps / 1e9, b.median_bps / 1e9, b.worst_bps / 1e9, b.runs_bps.size(),
              static_cast<double>(b.size_bytes) / (1 << 30), b.loop.c_str(), threads);
}

void print_multiply_peak(const kernels::MultiplyPeak& m, int threads) {
  std::printf("multiply-add peak (%s): best %.1f G/s, median %.1f, worst %.1f over %zu passes (%d threads)\n",
              kernels::multiply_instruction_name(m.instruction), m.best_per_s / 1e9, m.median_per_s / 1e9,
              m.worst_per_s / 1e9, m.runs_per_s.size(), threads);
}

void run_bench_model(const BenchArgs& a) {
  if (a.tp.enabled() && a.profile)
    throw Error("--profile times the ops of this process's forwards: not with --tensor-parallel-size (the workers run them)");
  LoadOptions load;
  load.interleave_weights = !a.no_interleave;
  // Tensor parallelism: the whole model as views of the file, for its
  // per-step bytes (the workers together read them all); nothing paged in.
  if (a.tp.enabled()) load.prefault = false, load.interleave_weights = false;
  LoadedModel lm = load_model(a.model_path, a.json, load);
  const double load_rss_mib = max_rss_mib();
  Model& model = *lm.model;
  const ModelConfig& c = model.config();
  ThreadPool pool(a.threads);
  const int block_size = 16;
  const int max_batch = a.batches.empty() ? 1 : *std::max_element(a.batches.begin(), a.batches.end());
  const int64_t ctx = std::max<int64_t>({a.n_prompt, a.n_gen, a.batched_prompt + a.batched_steps});
  const int64_t blocks_per_seq = (ctx + block_size - 1) / block_size;
  const int64_t n_blocks = blocks_per_seq * std::max(max_batch, 1);
  // A hybrid model's sequences each take a state slot (sequence s: slot s).
  std::unique_ptr<TensorParallelDir> tp_dir;
  if (a.tp.enabled()) tp_dir = std::make_unique<TensorParallelDir>();
  KvPool kv(model.kv_shape(n_blocks, block_size, kernels::parse_dtype(a.kv_dtype), std::max(max_batch, 1)),
            tp_dir ? tp_dir->kv_backing() : KvPoolBacking{});
  std::unique_ptr<TensorParallelExecutor> tp;
  if (a.tp.enabled()) {
    TensorParallelOptions o = a.tp;
    size_tensor_parallel(o, a.model_path, c.n_vocab, std::max<int64_t>({a.n_prompt, max_batch * a.batched_prompt, 1}),
                         std::max(max_batch, 1), ctx, block_size, a.threads);
    tp = std::make_unique<TensorParallelExecutor>(o, kv, tp_dir->kv_path());
  }
  std::vector<float> scratch_logits;
  auto forward = [&](const Batch& b, float* logits) {
    if (logits == nullptr) {
      scratch_logits.resize(b.logit_rows.size() * static_cast<size_t>(c.n_vocab));
      logits = scratch_logits.data();
    }
    if (tp)
      tp->forward(b, logits);
    else
      model.forward(b, kv, pool, logits);
  };
  SimpleBlockAllocator alloc(n_blocks);
  std::vector<std::vector<int32_t>> tables;
  for (int i = 0; i < std::max(max_batch, 1); ++i) tables.push_back(alloc.allocate(blocks_per_seq));

  BenchResult r;
  auto progress = [&](const char* what) {
    if (!a.json) std::fprintf(stderr, "bench: %s...\n", what);
  };

  progress("prompt processing");
  std::vector<double> runs;
  const std::vector<int32_t> prompt = bench_tokens(a.n_prompt, c.n_vocab, 1);
  {
    // One unmeasured forward first, as llama-bench does: the first one pays
    // for touching the workspace and KV pages (about 10 % of a 512-token
    // prompt on small F16).
    Batch b;
    b.add_sequence(prompt, 0, tables[0], true, 0);
    forward(b, nullptr);
  }
  if (a.profile) model.set_profile(&r.pp_profile);
  for (int rep = 0; rep < a.repeats; ++rep) {
    Batch b;
    b.add_sequence(prompt, 0, tables[0], true, 0);
    Stopwatch sw;
    forward(b, nullptr);
    runs.push_back(a.n_prompt / sw.elapsed_s());
  }
  r.pp_tps = median(runs);

  progress("generation");
  runs.clear();
  // On a host whose bandwidth other tenants take, a probe run after all the
  // tests is not the bandwidth a run saw minutes earlier (one VM's probe read
  // 26-77 GB/s within an hour): each generation run is also judged against
  // the probe passes just around it. The passes evict the caches, which only
  // a model smaller than the last-level cache would notice.
  kernels::ReadProbe probe(pool, kProbeBytes);
  const double bytes_per_token = static_cast<double>(model.weight_bytes_per_step());
  auto probe_best_of = [&](int passes) {
    double best = 0;
    for (int i = 0; i < passes; ++i) best = std::max(best, probe.pass_bps());
    return best;
  };
  const TensorParallelSnapshot tp_before = tp ? tp->snapshot() : TensorParallelSnapshot{};
  const std::vector<int32_t> gen = bench_tokens(a.n_gen, c.n_vocab, 2);
  std::vector<float> logits(static_cast<size_t>(c.n_vocab));
  if (a.profile) model.set_profile(&r.tg_profile);
  for (int rep = 0; rep < a.repeats; ++rep) {
    const double before_bps = probe_best_of(kPairedProbePasses);
    Stopwatch sw;
    for (int i = 0; i < a.n_gen; ++i) {
      Batch b;
      b.add_sequence(std::span<const int32_t>(gen).subspan(static_cast<size_t>(i), 1), i, tables[0], true, 0);
      forward(b, logits.data());
    }
    runs.push_back(a.n_gen / sw.elapsed_s());
    const double after_bps = probe_best_of(kPairedProbePasses);
    r.tg_paired.push_back({runs.back() * bytes_per_token, std::max(before_bps, after_bps)});
  }
  r.tg_tps = median(runs);
  model.set_profile(nullptr);
  if (tp && !a.json) {
    // Where a decode step's time goes: the core's wait for the step, the
    // workers' time in it, and their collectives inside it.
    const TensorParallelSnapshot s = tp->snapshot();
    const double steps = static_cast<double>(s.steps - tp_before.steps);
    const auto per_step_us = [&](int64_t now, int64_t before) { return static_cast<double>(now - before) / steps / 1e3; };
    const double core_us = per_step_us(s.forward_ns, tp_before.forward_ns);
    std::printf("tensor parallel, decode step (batch 1): %.1f us in the core (the step as the engine sees it)\n", core_us);
    for (size_t w = 0; w < s.workers.size(); ++w) {
      const TensorWorkerSnapshot &x = s.workers[w], &y = tp_before.workers[w];
      const double step_us = per_step_us(x.step_ns, y.step_ns), gather_us = per_step_us(x.gather_ns, y.gather_ns),
                   cons_us = per_step_us(x.consensus_ns, y.consensus_ns);
      std::printf("  worker %zu: %.1f us in the step, of which %.1f us (%.0f%%) in %.0f gathers and %.1f us in the "
                  "consensus; ring and hand-off %.1f us (%.0f%%)\n",
                  w, step_us, gather_us, 100.0 * gather_us / core_us,
                  static_cast<double>(x.gathers - y.gathers) / steps, cons_us, core_us - step_us,
                  100.0 * (core_us - step_us) / core_us);
    }
  }

  for (int n_seq : a.batches) {
    progress(("batched decode x" + std::to_string(n_seq)).c_str());
    runs.clear();
    std::vector<float> blogits(static_cast<size_t>(n_seq) * static_cast<size_t>(c.n_vocab));
    for (int rep = 0; rep < a.repeats; ++rep) {
      Batch pre;
      for (int s = 0; s < n_seq; ++s)
        pre.add_sequence(bench_tokens(a.batched_prompt, c.n_vocab, 100 + static_cast<uint64_t>(s)), 0,
                         tables[static_cast<size_t>(s)], true, s);
      forward(pre, blogits.data());
      if (a.profile && n_seq == max_batch) model.set_profile(&r.batched_profile);
      Stopwatch sw;
      for (int step = 0; step < a.batched_steps; ++step) {
        Batch b;
        for (int s = 0; s < n_seq; ++s) {
          const int32_t tok[] = {static_cast<int32_t>((step * 31 + s * 7) % c.n_vocab)};
          b.add_sequence(tok, a.batched_prompt + step, tables[static_cast<size_t>(s)], true, s);
        }
        forward(b, blogits.data());
      }
      runs.push_back(static_cast<double>(n_seq) * a.batched_steps / sw.elapsed_s());
      model.set_profile(nullptr);
    }
    r.batched_tps.emplace_back(n_seq, median(runs));
  }

  progress("memory bandwidth");
  r.bandwidth = kernels::measure_read_bandwidth(probe, kProbePasses);
  r.bandwidth_bps = r.bandwidth.best_bps;
  std::vector<double> paired_ratios;
  for (const PairedRun& p : r.tg_paired) paired_ratios.push_back(p.ratio());
  const RateSpread paired = rate_spread(paired_ratios);
  const double roofline_tps = r.bandwidth_bps / bytes_per_token;
  // Batched decode's second ceiling: the multiply-adds, at the peak of the
  // instruction this weight type's matmul multiplies with.
  progress("multiply-add peak");
  r.multiply = kernels::measure_multiply_peak(pool, kernels::multiply_instruction(model.weight_dtype()));
  const double macs_per_token = static_cast<double>(model.multiply_adds_per_token());
  // KV one batched sequence reads per step, at the bench's mean context.
  const double kv_bytes_per_sequence = static_cast<double>(a.batched_prompt + a.batched_steps / 2) *
                                       static_cast<double>(c.n_attention_layers() * 2 * c.n_head_kv * c.head_dim) *
                                       static_cast<double>(kernels::dtype_block_bytes(kernels::parse_dtype(a.kv_dtype)));
  auto limits = [&](int n) {
    return decode_limits(n, bytes_per_token, kv_bytes_per_sequence, macs_per_token, r.bandwidth_bps, r.multiply.best_per_s);
  };
  const double crossover = limits_crossover_batch(bytes_per_token, macs_per_token, r.bandwidth_bps, r.multiply.best_per_s);

  const std::string dtype = kernels::dtype_name(model.weight_dtype());
  if (a.json) {
    std::printf("{\"model\": \"%s\", \"arch\": \"%s\", \"dtype\": \"%s\", \"threads\": %d, \"tensor_parallel\": %d, "
                "\"isa\": \"%s\", ",
                a.model_path.c_str(), c.arch.c_str(), dtype.c_str(), pool.size(), a.tp.size,
                kernels::isa_name(kernels::active_isa()).c_str());
    std::printf("\"pp%d_tps\": %.2f, \"tg%d_tps\": %.2f, \"batched_decode_tps\": {", a.n_prompt, r.pp_tps, a.n_gen,
                r.tg_tps);
    for (size_t i = 0; i < r.batched_tps.size(); ++i)
      std::printf("%s\"%d\": %.2f", i ? ", " : "", r.batched_tps[i].first, r.batched_tps[i].second);
    std::printf("}, \"weight_bytes_per_token\": %.0f, \"memory_bandwidth_gbps\": %.2f, \"roofline_tg_tps\": %.2f, "
                "\"roofline_ratio\": %.3f, \"memory_bandwidth_median_gbps\": %.2f, \"memory_bandwidth_worst_gbps\": %.2f, "
                "\"load_s\": %.3f, \"interleaved_bytes\": %llu, \"load_max_rss_mib\": %.1f",
                bytes_per_token, r.bandwidth_bps / 1e9, roofline_tps, r.tg_tps / roofline_tps,
                r.bandwidth.median_bps / 1e9, r.bandwidth.worst_bps / 1e9, lm.load_seconds,
                static_cast<unsigned long long>(model.interleaved_bytes()), load_rss_mib);
    std::printf(", \"roofline_paired_ratio\": %.3f, \"roofline_paired\": [", paired.median);
    for (size_t i = 0; i < r.tg_paired.size(); ++i)
      std::printf("%s{\"decode_gbps\": %.2f, \"probe_gbps\": %.2f}", i ? ", " : "", r.tg_paired[i].decode_bps / 1e9,
                  r.tg_paired[i].probe_bps / 1e9);
    std::printf("]");
    std::printf(", \"multiply_adds_per_token\": %.0f, \"multiply_instruction\": \"%s\", \"multiply_peak_gps\": %.2f, "
                "\"limits_crossover_batch\": %.1f, \"batched_limits\": {",
                macs_per_token, kernels::multiply_instruction_name(r.multiply.instruction), r.multiply.best_per_s / 1e9,
                crossover);
    for (size_t i = 0; i < r.batched_tps.size(); ++i) {
      const DecodeLimits l = limits(r.batched_tps[i].first);
      std::printf("%s\"%d\": {\"memory_tps\": %.2f, \"compute_tps\": %.2f, \"bound\": \"%s\", \"ratio\": %.3f}",
                  i ? ", " : "", r.batched_tps[i].first, l.memory_tps, l.compute_tps,
                  l.compute_bound() ? "compute" : "memory", r.batched_tps[i].second / l.bound_tps());
    }
    std::printf("}");
    if (a.profile) {
      print_profile_json("profile_pp", r.pp_profile);
      print_profile_json("profile_tg", r.tg_profile);
      print_profile_json("profile_batched", r.batched_profile);
    }
    std::printf("}\n");
    return;
  }
  std::printf("model: %s (%s, %s, %lld layers, hidden %lld), %d threads, tensor-parallel size %d, isa %s\n",
              a.model_path.c_str(), c.arch.c_str(), dtype.c_str(), static_cast<long long>(c.n_layer),
              static_cast<long long>(c.n_embd), pool.size(), a.tp.size, kernels::isa_name(kernels::active_isa()).c_str());
  std::printf("%-28s %12s\n", "test", "tokens/s");
  std::printf("%-28s %12.2f\n", ("pp" + std::to_string(a.n_prompt) + " (batch 1)").c_str(), r.pp_tps);
  std::printf("%-28s %12.2f\n", ("tg" + std::to_string(a.n_gen) + " (batch 1)").c_str(), r.tg_tps);
  for (const auto& [n, tps] : r.batched_tps)
    std::printf("%-28s %12.2f\n", ("batched decode x" + std::to_string(n)).c_str(), tps);
  std::printf("roofline: %.1f MB of weights per decode step / %.2f GB/s measured read bandwidth = %.1f tokens/s "
              "possible; achieved %.1f = %.0f%%\n",
              bytes_per_token / 1e6, r.bandwidth_bps / 1e9, roofline_tps, r.tg_tps, 100.0 * r.tg_tps / roofline_tps);
  std::printf("roofline, paired: each tg%d run's weight stream against the best of the %d probe passes on either side "
              "of it: median %.0f%% (%.0f-%.0f%% over %zu runs)\n",
              a.n_gen, kPairedProbePasses, 100.0 * paired.median, 100.0 * paired.worst, 100.0 * paired.best,
              r.tg_paired.size());
  for (const PairedRun& p : r.tg_paired)
    std::printf("  decode %.2f GB/s, probe around it %.2f GB/s: %.0f%%\n", p.decode_bps / 1e9, p.probe_bps / 1e9,
                100.0 * p.ratio());
  print_bandwidth(r.bandwidth, pool.size());
  print_multiply_peak(r.multiply, pool.size());
  std::printf("batched decode limits: memory (%.1f MB of weights per step, %.2f MB of KV per sequence, at %.2f GB/s), "
              "compute (%.1f M multiply-adds per token at %.1f G/s); they meet at %.0f sequences\n",
              bytes_per_token / 1e6, kv_bytes_per_sequence / 1e6, r.bandwidth_bps / 1e9, macs_per_token / 1e6,
              r.multiply.best_per_s / 1e9, crossover);
  for (const auto& [n, tps] : r.batched_tps) {
    const DecodeLimits l = limits(n);
    std::printf("  x%-4d %10.1f tokens/s: memory limit %10.1f, compute limit %10.1f; %s-bound, at %.0f%% of that limit\n",
                n, tps, l.memory_tps, l.compute_tps, l.compute_bound() ? "compute" : "memory", 100.0 * tps / l.bound_tps());
  }
  std::printf("load: %.2f s, %.1f MB of weights interleaved, peak resident memory after load %.0f MiB\n",
              lm.load_seconds, static_cast<double>(model.interleaved_bytes()) / 1e6, load_rss_mib);
  if (a.profile) {
    print_profile(("pp" + std::to_string(a.n_prompt)).c_str(), r.pp_profile);
    print_profile(("tg" + std::to_string(a.n_gen)).c_str(), r.tg_profile);
    print_profile(("batched decode x" + std::to_string(max_batch)).c_str(), r.batched_profile);
  }
}

}  // namespace

void add_bench(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  auto a = std::make_shared<BenchArgs>();
  CLI::App* cmd = bench->add_subcommand("model", "Prompt, generation and batched-decode speed of a model");
  cmd->add_option("-m,--model", a->model_path, "GGUF model file")->required();
  cmd->add_option("-t,--threads", a->threads, "Threads (0 = one per core)")->check(CLI::Range(0, 1024));
  cmd->add_option("-r,--repeats", a->repeats, "Runs per test (the median is reported)")->check(CLI::Range(1, 100));
  cmd->add_option("-p,--n-prompt", a->n_prompt, "Prompt tokens")->check(CLI::Range(1, 1 << 16));
  cmd->add_option("-n,--n-gen", a->n_gen, "Generated tokens")->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--batches", a->batches, "Sequence counts for batched decode")->delimiter(',');
  cmd->add_option("--kv-dtype", a->kv_dtype, "KV cache type")->check(CLI::IsMember({"f32", "f16", "bf16"}));
  cmd->add_flag("--json", a->json, "Print the figures as one JSON object");
  cmd->add_option("--tensor-parallel-size", a->tp.size, "Worker processes each holding a shard of every matrix")
      ->check(CLI::Range(1, parallel::kMaxRingReaders));
  cmd->add_flag("--no-interleave", a->no_interleave,
                "Keep the file's weight layout (to measure what interleaving at load costs and gains)");
  cmd->add_flag("--profile", a->profile,
                "Also print a per-op time breakdown of prompt processing and generation");
  cmd->callback([a] { run_bench_model(*a); });

  struct BandwidthArgs {
    int threads = 0, passes = 8;
    double gib = 1.0;
  };
  auto bw = std::make_shared<BandwidthArgs>();
  CLI::App* bandwidth = bench->add_subcommand("bandwidth", "The memory read bandwidth probe that bench model's roofline uses");
  bandwidth->add_option("-t,--threads", bw->threads, "Threads (0 = one per core)")->check(CLI::Range(0, 1024));
  bandwidth->add_option("--passes", bw->passes, "Passes over the buffer (best, median and worst reported)")
      ->check(CLI::Range(1, 1000));
  bandwidth->add_option("--gib", bw->gib, "Buffer size in GiB")->check(CLI::Range(0.01, 64.0));
  bandwidth->callback([bw] {
    ThreadPool pool(bw->threads);
    print_bandwidth(kernels::measure_read_bandwidth(pool, static_cast<size_t>(bw->gib * (1 << 30)), bw->passes),
                    pool.size());
  });

  struct MultiplyArgs {
    int threads = 0, passes = 8;
  };
  auto mp = std::make_shared<MultiplyArgs>();
  CLI::App* multiply = bench->add_subcommand(
      "multiply", "The multiply-add peak of each instruction the matmuls use (bench model's compute limit)");
  multiply->add_option("-t,--threads", mp->threads, "Threads (0 = one per core)")->check(CLI::Range(0, 1024));
  multiply->add_option("--passes", mp->passes, "Passes (best, median and worst reported)")->check(CLI::Range(1, 1000));
  multiply->callback([mp] {
    ThreadPool pool(mp->threads);
    for (kernels::Isa isa : {kernels::Isa::kScalar, kernels::Isa::kAvx2, kernels::Isa::kAvx512}) {
      if (!kernels::isa_supported(isa)) continue;
      std::vector<kernels::MultiplyInstruction> seen;
      for (kernels::DType t : {kernels::DType::kF32, kernels::DType::kBF16, kernels::DType::kQ8_0}) {
        const kernels::MultiplyInstruction m = kernels::multiply_instruction(t, isa);
        if (std::find(seen.begin(), seen.end(), m) != seen.end()) continue;
        seen.push_back(m);
        print_multiply_peak(kernels::measure_multiply_peak(pool, m, mp->passes), pool.size());
      }
    }
  });

  struct ServeArgs {
    loadgen::LoadConfig config;
    bool json = false;
    bool no_stream = false;
  };
  auto s = std::make_shared<ServeArgs>();
  CLI::App* serve = bench->add_subcommand(
      "serve", "Load an OpenAI-compatible server (tandem, llama.cpp, vLLM) over a concurrency sweep");
  serve->add_option("--url", s->config.url, "Server base URL");
  serve->add_option("--model", s->config.model, "Model id (default: the first from /v1/models)");
  serve->add_option("--api-key", s->config.api_key, "Bearer token");
  serve->add_option("--endpoint", s->config.endpoint, "API")->check(CLI::IsMember({"completions", "chat"}));
  serve->add_option("-c,--concurrency", s->config.concurrency, "Concurrency levels, e.g. 1,4,16,64")->delimiter(',');
  serve->add_option("--requests", s->config.requests_per_level, "Requests per level (0: 4 x concurrency, at least 8)");
  serve->add_option("--input-len", s->config.input_words, "Prompt length in words (about a token each)")
      ->check(CLI::Range(1, 1 << 20));
  serve->add_option("--input-tokens", s->config.input_tokens,
                    "Prompts of exactly this many token ids (completions; overrides --input-len)")
      ->check(CLI::Range(0, 1 << 20));
  serve->add_option("--output-len", s->config.output_tokens, "max_tokens per request")->check(CLI::Range(1, 1 << 20));
  serve->add_option("--jitter", s->config.jitter, "Random +/- fraction on both lengths")->check(CLI::Range(0.0, 0.9));
  serve->add_option("--shared-prefix", s->config.shared_prefix_words, "Words shared by every prompt's start");
  serve->add_option("-n", s->config.n, "Sequences per request")->check(CLI::Range(1, 64));
  serve->add_option("--best-of", s->config.best_of, "best_of (0: not sent)")->check(CLI::Range(0, 64));
  serve->add_option("--temperature", s->config.temperature, "Sampling temperature");
  serve->add_option("--seed", s->config.seed, "Prompt generator seed");
  serve->add_option("--max-p99-e2e", s->config.max_p99_e2e_s, "Stop after a level whose p99 latency exceeds this (s)");
  serve->add_option("--timeout", s->config.timeout_s, "Per-request timeout (s)");
  serve->add_flag("--no-stream", s->no_stream, "Non-streaming requests (TTFT then equals e2e)");
  serve->add_flag("--json", s->json, "Print the results as JSON");
  serve->callback([s] {
    loadgen::LoadConfig c = s->config;
    c.stream = !s->no_stream;
    const auto results = loadgen::run_sweep(c, [](const std::string& line) {
      std::fprintf(stderr, "\r%-78s", line.c_str());
      std::fflush(stderr);
    });
    std::fputc('\n', stderr);
    std::fputs((s->json ? loadgen::results_to_json(c, results) + "\n" : loadgen::results_to_table(results)).c_str(), stdout);
  });
  add_bench_transfer(*bench);
  add_bench_router(*bench);
  add_bench_lockstep(*bench);
  add_bench_ring(*bench);
  add_bench_region(*bench);
}

}  // namespace tandem::cli
