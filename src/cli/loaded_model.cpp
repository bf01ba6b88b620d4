#include "cli/loaded_model.h"

#include <cstdio>

#include "gguf/gguf.h"
#include "util/clock.h"

namespace tandem::cli {

LoadedModel load_model(const std::string& path, bool quiet, LoadOptions options) {
  Stopwatch sw;
  LoadedModel m;
  m.file = std::make_shared<const gguf::File>(gguf::File::open(path));
  constexpr uint64_t kProgressThresholdBytes = 100ull << 20;
  if (!quiet && m.file->file_size() > kProgressThresholdBytes) {
    options.progress = [](uint64_t done, uint64_t total) {
      std::fprintf(stderr, "\rloading weights: %3d%% (%llu / %llu MiB)", static_cast<int>(done * 100 / total),
                   static_cast<unsigned long long>(done >> 20), static_cast<unsigned long long>(total >> 20));
      if (done == total) std::fputc('\n', stderr);
      std::fflush(stderr);
    };
  }
  // The tokenizer first: a vocabulary tandem cannot read fails in
  // milliseconds, before the weights are paged in and copied.
  m.tokenizer = std::make_unique<Tokenizer>(Tokenizer::from_gguf(*m.file));
  m.model = Model::load(m.file, options);
  m.load_seconds = sw.elapsed_s();
  return m;
}

}  // namespace tandem::cli
