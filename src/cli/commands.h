// Subcommands of the `tandem` binary. Each registers its options on the
// parser and returns the callback that runs it.
#pragma once

#include <CLI/CLI.hpp>

namespace tandem::cli {

void add_make_model(CLI::App& app);
void add_generate(CLI::App& app);
void add_bench(CLI::App& app);
void add_bench_transfer(CLI::App& bench);
void add_bench_router(CLI::App& bench);
void add_bench_lockstep(CLI::App& bench);
void add_bench_ring(CLI::App& bench);
void add_bench_region(CLI::App& bench);
void add_serve(CLI::App& app);
void add_sim(CLI::App& app);
void add_sim_lockstep(CLI::App& app);
void add_router(CLI::App& app);
void add_cluster(CLI::App& app);
void add_tensor_worker(CLI::App& app);

}  // namespace tandem::cli
