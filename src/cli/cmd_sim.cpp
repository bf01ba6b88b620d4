// `tandem sim`: runs the real P/D protocol cores in the deterministic cluster
// simulator over a range of seeds and reports violations and coverage.
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "pd/types.h"
#include "sim/run_seeds.h"

namespace tandem::cli {

namespace {

// Below this many seeds a range is a replay or a probe, not a verdict, so
// missing coverage is reported but does not fail the run.
constexpr int64_t kCoverageVerdictSeeds = 100;

void print_coverage(const std::map<std::string, int64_t>& coverage) {
  std::printf("coverage:\n");
  for (const auto& [key, n] : coverage) std::printf("  %-40s %lld\n", key.c_str(), static_cast<long long>(n));
}

}  // namespace

void add_sim(CLI::App& app) {
  struct Args {
    int64_t seeds = 100;
    uint64_t first_seed = 1;
    int64_t seed = -1;
    sim::SimOptions options;
    std::string mode = "mixed", faults = "all", mutation = "none";
    bool list_mutations = false, trace = false, keep_going = false, show_coverage = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "sim", "Run the P/D transfer protocol in the deterministic cluster simulator");
  cmd->add_option("--seeds", args->seeds, "How many seeds to run")->check(CLI::PositiveNumber);
  cmd->add_option("--first-seed", args->first_seed, "First seed of the range");
  cmd->add_option("--seed", args->seed, "Run this one seed (same as --first-seed S --seeds 1)");
  cmd->add_option("--prefill", args->options.n_prefill, "Prefill instances")->check(CLI::Range(1, 16));
  cmd->add_option("--decode", args->options.n_decode, "Decode instances")->check(CLI::Range(1, 16));
  cmd->add_option("--requests", args->options.n_requests, "Client requests per seed")->check(CLI::Range(1, 100000));
  cmd->add_option("--mode", args->mode, "Transfer mode")->check(CLI::IsMember({"write", "read", "mixed"}));
  cmd->add_option("--faults", args->faults, "Faults to inject")->check(CLI::IsMember({"none", "network", "all"}));
  cmd->add_option("--mutation", args->mutation, "Switch on one known bug (see --list-mutations)");
  cmd->add_flag("--list-mutations", args->list_mutations, "List the mutations and exit");
  cmd->add_flag("--trace", args->trace, "Print the event trace of the (first failing) seed");
  cmd->add_flag("--keep-going", args->keep_going, "Do not stop at the first failing seed");
  cmd->add_flag("--coverage", args->show_coverage, "Print every coverage counter");
  cmd->add_flag("--long", args->options.long_run,
                "Long virtual time: deadline and retransmit limit scaled down, faults that outlast them");
  cmd->callback([args] {
    if (args->list_mutations) {
      for (int i = 1; i < pd::kMutationCount; ++i)
        std::printf("%s\n", std::string(pd::name(static_cast<pd::Mutation>(i))).c_str());
      return;
    }
    sim::SimOptions& o = args->options;
    sim::parse_mode(args->mode, &o.mode);
    sim::parse_faults(args->faults, &o.faults);
    if (!pd::parse_mutation(args->mutation, &o.mutation))
      throw CLI::ValidationError("--mutation", "unknown mutation '" + args->mutation +
                                                   "' (tandem sim --list-mutations)");
    if (o.mutation != pd::Mutation::kNone && !pd::kMutationsBuilt)
      throw CLI::ValidationError("--mutation", "this Release build has no mutations compiled in; configure a test "
                                               "build (cmake -B build-dev -DCMAKE_BUILD_TYPE=RelWithDebInfo) and run "
                                               "its tandem sim");
    if (args->seed >= 0) {
      args->first_seed = static_cast<uint64_t>(args->seed);
      args->seeds = 1;
    }
    std::printf("tandem sim: seeds %llu..%llu, %dP%dD, %d requests/seed, mode %s, faults %s, mutation %s\n",
                static_cast<unsigned long long>(args->first_seed),
                static_cast<unsigned long long>(args->first_seed + args->seeds - 1), o.n_prefill,
                o.n_decode, o.n_requests, args->mode.c_str(), args->faults.c_str(),
                args->mutation.c_str());
    sim::SeedRangeResult r = sim::run_seeds(args->first_seed, args->seeds, o, args->keep_going);
    std::printf("seeds: %lld  events: %lld  time: %.2f s  seeds/s: %.1f  events/s: %.0f\n",
                static_cast<long long>(r.seeds_run), static_cast<long long>(r.events), r.seconds,
                static_cast<double>(r.seeds_run) / r.seconds, static_cast<double>(r.events) / r.seconds);
    std::printf("requests: %lld completed, %lld failed\n", static_cast<long long>(r.requests_completed),
                static_cast<long long>(r.requests_failed));
    std::printf("violations: %lld\n", static_cast<long long>(r.failing_seeds));
    if (args->show_coverage) print_coverage(r.coverage);
    std::vector<std::string> missing = sim::missing_coverage(r.coverage, o);
    bool coverage_fails = !missing.empty() && r.seeds_run >= kCoverageVerdictSeeds && !r.has_failure;
    if (!missing.empty()) {
      std::printf("coverage missing (%s):", coverage_fails ? "the run does not count" : "note");
      for (const std::string& key : missing) std::printf(" %s", key.c_str());
      std::printf("\n");
    } else {
      std::printf("coverage: all %zu required points exercised\n", sim::required_coverage(o).size());
    }
    if (r.has_failure) {
      const sim::RunResult& f = r.first_failure;
      std::printf("FAIL seed %llu (after %lld seeds):\n", static_cast<unsigned long long>(f.seed),
                  static_cast<long long>(r.seeds_run));
      for (const std::string& v : f.violations) std::printf("  %s\n", v.c_str());
      std::printf("replay: %s\n", sim::replay_command(f.seed, o).c_str());
    }
    if (args->trace) {
      uint64_t seed = r.has_failure ? r.first_failure.seed : args->first_seed;
      sim::RunResult traced = sim::run_scenario(sim::make_scenario(seed, o), true);
      std::printf("trace of seed %llu (hash %016llx):\n", static_cast<unsigned long long>(seed),
                  static_cast<unsigned long long>(traced.trace_hash));
      for (const std::string& line : traced.trace) std::printf("%s\n", line.c_str());
      for (const std::string& v : traced.violations) std::printf("VIOLATION %s\n", v.c_str());
    }
    std::fflush(stdout);
    if (r.has_failure || coverage_fails) throw CLI::RuntimeError(1);
  });
}

}  // namespace tandem::cli
