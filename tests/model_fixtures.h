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

// A copy of the tiny llama model of `dtype` (f16 or q8_0) whose embedding
// row of `token` holds an infinity (f16: its first element; q8_0: its first
// block's scale), as an activation that overflows f16 does: the norms turn
// it into a NaN among finite values, so the logits of any prompt with that
// token are NaN, or finite garbage where a quantization hides the NaN;
// other prompts are untouched.
inline std::string infinite_token_model_path(int32_t token, kernels::DType dtype = kernels::DType::kF16) {
  const std::string clean = tiny_model_path("llama", dtype);
  const std::string path = (process_scratch_dir() / ("tiny-llama-" + std::string(kernels::dtype_name(dtype)) +
                                                     "-inf-token-" + std::to_string(token) + ".gguf"))
                               .string();
  std::filesystem::copy_file(clean, path, std::filesystem::copy_options::overwrite_existing);
  const gguf::File f = gguf::File::open(clean);
  const gguf::TensorInfo& embd = f.tensor("token_embd.weight");
  if (embd.type != gguf::TensorType::F16 && embd.type != gguf::TensorType::Q8_0)
    throw std::runtime_error("the tiny model's embeddings are neither f16 nor q8_0");
  // Both types start a row with an f16: its first element, its first block's scale.
  const uint64_t at = f.data_offset() + embd.offset + static_cast<uint64_t>(token) * (embd.n_bytes / embd.dims[1]);
  std::FILE* out = std::fopen(path.c_str(), "r+b");
  const uint16_t inf = 0x7c00;  // f16 +infinity
  const bool written = out != nullptr && std::fseek(out, static_cast<long>(at), SEEK_SET) == 0 &&
                       std::fwrite(&inf, sizeof inf, 1, out) == 1;
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
