#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "model/make_model.h"
#include "util/clock.h"

namespace tandem::cli {

void add_make_model(CLI::App& app) {
  struct Args {
    std::string preset = "tiny", arch = "llama", dtype = "f16", out;
    uint64_t seed = 0;
    int64_t layers = 0;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("make-model", "Write a deterministic random-weight GGUF model");
  cmd->add_option("--preset", args->preset, "Model shape")->check(CLI::IsMember({"tiny", "tiny-wide", "tiny-tied", "small", "base"}));
  cmd->add_option("--arch", args->arch, "Architecture")->check(CLI::IsMember({"llama", "qwen2", "qwen3", "qwen3moe", "qwen3next"}));
  cmd->add_option("--dtype", args->dtype, "Weight type, or a mix of llama.cpp's (q4_k_m, q5_k_m)")
      ->check(CLI::IsMember(weight_type_names()));
  cmd->add_option("--seed", args->seed, "Seed for the weights");
  cmd->add_option("--layers", args->layers, "Number of layers (default: the preset's)")->check(CLI::PositiveNumber);
  cmd->add_option("-o,--output", args->out, "Output file")->required();
  cmd->callback([args] {
    MakeModelOptions o;
    o.preset = args->preset;
    o.arch = args->arch;
    set_weight_type(args->dtype, &o);
    o.seed = args->seed;
    o.n_layer = args->layers;
    Stopwatch sw;
    make_model(o, args->out);
    std::fprintf(stderr, "wrote %s (%s %s %s, seed %llu) in %.1f s\n", args->out.c_str(), args->preset.c_str(),
                 args->arch.c_str(), args->dtype.c_str(), static_cast<unsigned long long>(args->seed), sw.elapsed_s());
  });
}

}  // namespace tandem::cli
