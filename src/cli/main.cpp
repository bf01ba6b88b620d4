// tandem: an LLM serving engine built around prefill/decode disaggregation.
#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "util/error.h"

int main(int argc, char** argv) {
  CLI::App app{"tandem: LLM inference and serving with prefill/decode disaggregation"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show help for every subcommand");
  tandem::cli::add_make_model(app);
  tandem::cli::add_generate(app);
  tandem::cli::add_bench(app);
  tandem::cli::add_serve(app);
  tandem::cli::add_sim(app);
  tandem::cli::add_sim_lockstep(app);
  tandem::cli::add_router(app);
  tandem::cli::add_cluster(app);
  tandem::cli::add_tensor_worker(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const tandem::Error& e) {
    std::fprintf(stderr, "tandem: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem: unexpected error: %s\n", e.what());
    return 2;
  }
  return 0;
}
