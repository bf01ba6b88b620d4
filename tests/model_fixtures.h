// Generated tiny models shared by the model tests (made once per test binary).
#pragma once

#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <stdexcept>
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

// A copy of the tiny llama f16 model whose embedding row of `token` holds a
// NaN: the logits of any prompt with that token are NaN, as a damaged file,
// or one whose activations overflow, gives; other prompts are untouched.
inline std::string nan_token_model_path(int32_t token) {
  const std::string clean = tiny_model_path("llama", kernels::DType::kF16);
  const std::string path = (process_scratch_dir() / ("tiny-llama-nan-token-" + std::to_string(token) + ".gguf")).string();
  std::filesystem::copy_file(clean, path, std::filesystem::copy_options::overwrite_existing);
  const gguf::File f = gguf::File::open(clean);
  const gguf::TensorInfo& embd = f.tensor("token_embd.weight");
  if (embd.type != gguf::TensorType::F16) throw std::runtime_error("the tiny model's embeddings are not F16");
  const uint64_t at = f.data_offset() + embd.offset + static_cast<uint64_t>(token) * embd.dims[0] * 2;
  std::FILE* out = std::fopen(path.c_str(), "r+b");
  const uint16_t nan = 0x7e00;  // an F16 quiet NaN
  const bool written = out != nullptr && std::fseek(out, static_cast<long>(at), SEEK_SET) == 0 &&
                       std::fwrite(&nan, sizeof nan, 1, out) == 1;
  if (out != nullptr) std::fclose(out);
  if (!written) throw std::runtime_error("could not write " + path);
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
