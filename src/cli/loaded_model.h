// Opening a GGUF model for the CLI commands: the file, the model, its
// tokenizer, and how long loading took.
#pragma once

#include <memory>
#include <string>

#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace tandem::cli {

struct LoadedModel {
  std::shared_ptr<const gguf::File> file;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
  double load_seconds = 0;
};

// Shows a progress line on stderr for files over 100 MB.
// interleave: LoadOptions::interleave_weights (off only to measure its effect).
// `options`: how to load (its progress is set here).
LoadedModel load_model(const std::string& path, bool quiet = false, LoadOptions options = {});

}  // namespace tandem::cli
