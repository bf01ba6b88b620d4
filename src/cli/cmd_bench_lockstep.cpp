// `tandem bench lockstep`: the data-parallel group's collectives over gloo on
// loopback, one thread per rank (each with its own gloo context, as separate
// processes have): the step consensus's round trip, and one MoE layer's
// expert dispatch plus combine of a decode step's rows. bench/dp_step_cost.sh
// sets these beside the decode step of the small models.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <thread>
#include <vector>

#include "cli/commands.h"
#include "parallel/lockstep_group.h"
#include "transport/gloo_transport.h"
#include "util/clock.h"
#include "util/percentile.h"

namespace tandem::cli {
namespace {

struct LockstepBenchArgs {
  int ranks = 2;
  int steps = 2000;
  int rows = 8;           // rows each rank sends per exchange (a decode token x its experts on that rank)
  int row_floats = 1024;  // the model width (small presets: 1024)
  bool shm = false;       // control frames through shared memory
};

void run(const LockstepBenchArgs& a) {
  const auto dir = std::filesystem::temp_directory_path() / ("tandem-bench-lockstep-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::vector<double> consensus_us, exchange_us;
  std::vector<std::thread> threads;
  for (int r = 0; r < a.ranks; ++r) {
    threads.emplace_back([&, r] {
      GlooGroupOptions o;
      o.rank = r;
      o.size = a.ranks;
      o.rendezvous_dir = dir.string();
      o.timeout_ms = 30'000;
      o.shared_memory_frames = a.shm;
      GlooTransport transport(o);
      parallel::LockstepGroup group(transport, {/*n_expert_layers=*/1, 0});
      std::vector<float> send(static_cast<size_t>(a.rows * a.row_floats * a.ranks), 1.0f);
      std::vector<int64_t> bytes(static_cast<size_t>(a.ranks), int64_t{a.rows} * a.row_floats * 4);
      std::vector<char> recv;
      parallel::StepHeader h;
      h.n_tokens = 1;
      for (int s = 1; s <= a.steps; ++s) {
        const int64_t t0 = monotonic_ns();
        (void)group.begin_step(s, h);
        const int64_t t1 = monotonic_ns();
        (void)group.op_all_to_all(parallel::OpKind::kExpertDispatch, send.data(), bytes, recv);
        (void)group.op_all_to_all(parallel::OpKind::kExpertCombine, send.data(), bytes, recv);
        const int64_t t2 = monotonic_ns();
        group.end_step();
        if (r == 0 && s > a.steps / 10) {  // the first tenth warms up
          consensus_us.push_back(static_cast<double>(t1 - t0) * 1e-3);
          exchange_us.push_back(static_cast<double>(t2 - t1) * 1e-3);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  std::filesystem::remove_all(dir);
  std::printf("lockstep over %s, %d ranks (threads), %d steps\n",
              a.shm ? "shared memory (frames, and data up to 4 MiB a rank)" : "gloo/TCP on loopback", a.ranks, a.steps);
  std::printf("  step consensus (one %zu-byte frame per rank):          median %7.1f us   p99 %7.1f us\n",
              sizeof(parallel::Frame), percentile(consensus_us, 0.5), percentile(consensus_us, 0.99));
  std::printf("  expert dispatch + combine (%d rows x %d floats per rank): median %7.1f us   p99 %7.1f us\n", a.rows,
              a.row_floats, percentile(exchange_us, 0.5), percentile(exchange_us, 0.99));
}

}  // namespace

void add_bench_lockstep(CLI::App& bench) {
  auto a = std::make_shared<LockstepBenchArgs>();
  CLI::App* cmd = bench.add_subcommand("lockstep", "Step consensus and expert all-to-all latency over gloo");
  cmd->add_option("--ranks", a->ranks, "Ranks (threads)")->check(CLI::Range(2, parallel::kMaxRanks));
  cmd->add_option("--steps", a->steps, "Steps")->check(CLI::Range(10, 10'000'000));
  cmd->add_option("--rows", a->rows, "Rows each rank sends to each rank per exchange")->check(CLI::Range(0, 1 << 16));
  cmd->add_option("--row-floats", a->row_floats, "Floats per row (the model width)")->check(CLI::Range(1, 1 << 16));
  cmd->add_flag("--shm", a->shm, "Through shared memory (as ranks all on one host use)");
  cmd->callback([a] { run(*a); });
}

}  // namespace tandem::cli
