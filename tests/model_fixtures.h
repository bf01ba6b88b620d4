// Generated tiny models shared by the model tests (made once per test binary).
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "gguf/gguf.h"
#include "scratch_dir.h"
#include "model/make_model.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace tandem::testing {

inline std::string tiny_model_path(const std::string& arch, kernels::DType dtype, uint64_t seed = 0) {
  static std::map<std::string, std::string> made;
  const std::string key = arch + "-" + kernels::dtype_name(dtype) + "-" + std::to_string(seed);
  auto it = made.find(key);
  if (it != made.end()) return it->second;
  const std::string path = (process_scratch_dir() / ("tiny-" + key + ".gguf")).string();
  MakeModelOptions o;
  // K-quant rows are blocks of 256: the tiny preset's 64-wide rows would all
  // fall back to q8_0.
  o.preset = kernels::dtype_block_elements(dtype) == 256 ? "tiny-wide" : "tiny";
  o.arch = arch;
  o.dtype = dtype;
  o.seed = seed;
  make_model(o, path);
  made[key] = path;
  return path;
}

// The tiny llama f16 model loaded once, with its tokenizer (engine and
// server tests share it).
struct LoadedTinyModel {
  std::shared_ptr<const gguf::File> file;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
};

// The tiny f16 model of an architecture, loaded once.
inline LoadedTinyModel& tiny_f16(const std::string& arch) {
  static std::map<std::string, LoadedTinyModel> loaded;
  auto it = loaded.find(arch);
  if (it != loaded.end()) return it->second;
  LoadedTinyModel x;
  x.file = std::make_shared<const gguf::File>(gguf::File::open(tiny_model_path(arch, kernels::DType::kF16)));
  x.model = Model::load(x.file);
  x.tokenizer = std::make_unique<Tokenizer>(Tokenizer::from_gguf(*x.file));
  return loaded.emplace(arch, std::move(x)).first->second;
}

inline LoadedTinyModel& tiny_llama_f16() { return tiny_f16("llama"); }

}  // namespace tandem::testing
