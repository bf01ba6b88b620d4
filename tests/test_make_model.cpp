// make-model: deterministic bytes, size limits, loadable by tandem with a
// tokenizer that round-trips text; and the CLI commands built on it.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>

#include <unistd.h>

#include "gguf/gguf.h"
#include "model/make_model.h"
#include "model/model.h"
#include "model_fixtures.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace tandem {
namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("tandem-mm-" + std::to_string(::getpid()) + "-" + name)).string();
}

TEST(MakeModel, SameArgumentsSameBytesAndSeedMatters) {
  MakeModelOptions o;
  o.arch = "qwen2";
  o.dtype = kernels::DType::kQ8_0;
  o.seed = 42;
  const std::string a = temp_path("a.gguf"), b = temp_path("b.gguf"), c = temp_path("c.gguf");
  make_model(o, a);
  make_model(o, b);
  o.seed = 43;
  make_model(o, c);
  EXPECT_EQ(read_all(a), read_all(b));
  EXPECT_NE(read_all(a), read_all(c));
  for (const auto& p : {a, b, c}) std::filesystem::remove(p);
}

TEST(MakeModel, TinyIsUnderFiveMegabytesInEveryDtypeAndLoads) {
  for (const std::string arch : {"llama", "qwen2", "qwen3", "qwen3moe", "qwen3next"}) {
    for (kernels::DType t : {kernels::DType::kF32, kernels::DType::kF16, kernels::DType::kBF16, kernels::DType::kQ8_0}) {
      const std::string path = testing::tiny_model_path(arch, t);
      EXPECT_LT(std::filesystem::file_size(path), 5u << 20) << path;
      auto file = std::make_shared<const gguf::File>(gguf::File::open(path));
      auto model = Model::load(file);
      EXPECT_EQ(model->config().arch, arch);
      EXPECT_EQ(model->weight_dtype(), t);
      EXPECT_EQ(model->config().n_vocab, 1024);
      EXPECT_EQ(model->config().tied_embeddings, false);
    }
  }
}

TEST(MakeModel, PresetsHaveTheDocumentedShapes) {
  const ModelPreset& small = find_preset("small");
  EXPECT_EQ(small.n_embd, 1024);
  EXPECT_EQ(small.n_layer, 24);
  EXPECT_EQ(small.n_head, 16);
  EXPECT_EQ(small.n_head_kv, 4);
  EXPECT_EQ(small.n_ff, 2816);
  EXPECT_EQ(small.n_vocab, 32000);
  const ModelPreset& base = find_preset("base");
  EXPECT_EQ(base.n_embd, 896);
  EXPECT_EQ(base.n_head, 14);
  EXPECT_EQ(base.n_head_kv, 2);
  EXPECT_EQ(base.n_ff, 4864);
  EXPECT_EQ(base.n_vocab, 151936);
  EXPECT_TRUE(base.tied_embeddings);
  // Parameter count of small: about 336M.
  const int64_t hd = small.n_embd / small.n_head;
  const int64_t per_layer = small.n_embd * (small.n_head * hd + 2 * small.n_head_kv * hd) + small.n_head * hd * small.n_embd +
                            3 * small.n_embd * small.n_ff;
  const int64_t params = small.n_layer * per_layer + 2 * small.n_vocab * small.n_embd;
  EXPECT_NEAR(static_cast<double>(params) / 1e6, 336, 5);
  EXPECT_THROW(find_preset("huge"), Error);
}

TEST(MakeModel, TokenizerFromTheFileRoundTripsText) {
  const gguf::File f = gguf::File::open(testing::tiny_model_path("llama", kernels::DType::kF16));
  const Tokenizer tok = Tokenizer::from_gguf(f);
  const std::string text = "Hello, world! Ünïcödé 東京 🙂 tabs\tand  spaces\n";
  const std::vector<int32_t> ids = tok.encode(text, false, false);
  EXPECT_LT(ids.size(), text.size());  // merges actually apply
  EXPECT_EQ(tok.decode(ids), text);
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_FALSE(f.get_string("tokenizer.chat_template").empty());
}

// The CLI, end to end, as a user runs it.
std::string run(const std::string& cmd, int* status) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>/dev/null").c_str(), "r");
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  *status = ::pclose(p);
  return out;
}

TEST(Cli, GenerateIsDeterministicAndBenchPrintsJson) {
  const std::string bin = TANDEM_BINARY;
  const std::string path = temp_path("cli.gguf");
  int status = 0;
  run(bin + " make-model --preset tiny --arch qwen3 --dtype f16 --seed 3 -o " + path, &status);
  ASSERT_EQ(status, 0);
  const std::string gen = bin + " generate -m " + path + " -p 'The quick brown fox' -n 12 -t 2";
  const std::string out1 = run(gen, &status);
  ASSERT_EQ(status, 0);
  const std::string out2 = run(gen, &status);
  EXPECT_EQ(out1, out2);
  EXPECT_EQ(out1.rfind("The quick brown fox", 0), 0u) << out1;
  EXPECT_GT(out1.size(), std::string("The quick brown fox\n").size());
  const std::string json = run(bin + " bench model -m " + path + " -r 1 -p 16 -n 4 --batches 2,3 --json", &status);
  ASSERT_EQ(status, 0);
  for (const char* key : {"\"pp16_tps\"", "\"tg4_tps\"", "\"batched_decode_tps\"", "\"memory_bandwidth_gbps\"",
                          "\"roofline_ratio\""})
    EXPECT_NE(json.find(key), std::string::npos) << key << " in " << json;
  // The per-op breakdown: every op of both phases, the matmuls with their rates.
  const std::string profiled =
      run(bin + " bench model -m " + path + " -r 1 -p 16 -n 4 --batches 2 --json --profile", &status);
  ASSERT_EQ(status, 0);
  for (const char* key : {"\"profile_pp\"", "\"profile_tg\"", "\"qkv_matmul_ms\"", "\"attention_ms\"",
                          "\"down_matmul_ms\"", "\"lm_head_ms\""})
    EXPECT_NE(profiled.find(key), std::string::npos) << key << " in " << profiled;
  const std::string table = run(bin + " bench model -m " + path + " -r 1 -p 16 -n 4 --batches 2 --profile", &status);
  ASSERT_EQ(status, 0);
  EXPECT_NE(table.find("profile pp16 (1 forwards)"), std::string::npos) << table;
  EXPECT_NE(table.find("profile tg4 (4 forwards)"), std::string::npos) << table;
  EXPECT_NE(table.find("gate_up_matmul"), std::string::npos) << table;
  run(bin + " generate -m /nonexistent.gguf -n 2", &status);
  EXPECT_NE(status, 0);
  std::filesystem::remove(path);
}

// Every CLI command that runs a model runs the MoE and hybrid ones (a hybrid
// model's sequences need their recurrent-state slots there too).
TEST(Cli, GenerateAndBenchRunTheMoeAndHybridArchitectures) {
  const std::string bin = TANDEM_BINARY;
  for (const std::string arch : {"qwen3moe", "qwen3next"}) {
    SCOPED_TRACE(arch);
    const std::string path = temp_path(arch + ".gguf");
    int status = 0;
    run(bin + " make-model --preset tiny --arch " + arch + " --dtype q8_0 -o " + path, &status);
    ASSERT_EQ(status, 0);
    const std::string out = run(bin + " generate -m " + path + " -p 'Once upon' -n 8 --temp 0 -t 2", &status);
    ASSERT_EQ(status, 0);
    EXPECT_EQ(out.rfind("Once upon", 0), 0u) << out;
    const std::string table =
        run(bin + " bench model -m " + path + " -r 1 -p 16 -n 4 --batches 3 --profile", &status);
    ASSERT_EQ(status, 0);
    EXPECT_NE(table.find("moe_route"), std::string::npos) << table;
    if (arch == "qwen3next") {
      EXPECT_NE(table.find("recurrent"), std::string::npos) << table;
    }
    std::filesystem::remove(path);
  }
}

}  // namespace
}  // namespace tandem
