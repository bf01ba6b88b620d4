#include "cli/demo_model.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "model/make_model.h"

namespace tandem::cli {

std::string ensure_demo_model() {
  namespace fs = std::filesystem;
  fs::path dir;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
    dir = fs::path(xdg) / "tandem";
  } else if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    dir = fs::path(home) / ".cache" / "tandem";
  } else {
    dir = fs::temp_directory_path() / "tandem";
  }
  const fs::path path = dir / "demo-small-llama-f16-seed0.gguf";
  if (fs::exists(path)) return path.string();
  fs::create_directories(dir);
  std::fprintf(stderr, "no model given: generating the demo model (small preset, llama, f16) at %s\n",
               path.c_str());
  MakeModelOptions o;
  o.preset = "small";
  o.arch = "llama";
  o.dtype = kernels::DType::kF16;
  // Write to a temporary name first so an interrupted run never leaves a torn file.
  const fs::path tmp = path.string() + ".partial";
  make_model(o, tmp.string());
  fs::rename(tmp, path);
  return path.string();
}

}  // namespace tandem::cli
