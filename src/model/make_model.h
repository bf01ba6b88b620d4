// Deterministic random-weight GGUF models for tests, demos and benchmarks.
// The same options give the same bytes. The files carry a byte-level BPE
// tokenizer built by tandem (so text round-trips) and load in llama.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/dtype.h"

namespace tandem {

struct ModelPreset {
  std::string name;
  int64_t n_embd, n_layer, n_head, n_head_kv, n_ff, n_vocab, n_ctx;
  bool tied_embeddings;
};

// tiny (tests, < 5 MB), small (~336M parameters), base (Qwen2.5-0.5B shape).
const ModelPreset& find_preset(const std::string& name);
std::vector<std::string> preset_names();

struct MakeModelOptions {
  std::string preset = "tiny";
  std::string arch = "llama";  // llama, qwen2, qwen3
  kernels::DType dtype = kernels::DType::kF16;
  uint64_t seed = 0;
};

// Writes the model to `path`; throws tandem::Error on a bad option or I/O error.
void make_model(const MakeModelOptions& options, const std::string& path);

}  // namespace tandem
