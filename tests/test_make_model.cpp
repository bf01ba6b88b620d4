// make-model: deterministic bytes, size limits, loadable by tandem with a
// tokenizer that round-trips text; and the CLI commands built on it.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <set>
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

// The mixes choose each tensor's type as llama.cpp's quantizer does for its
// Q4_K_M and Q5_K_M files: the output matrix q6_K; attn_v and ffn_down q6_K
// in the layers of use_more_bits (for 24 layers: 0-2, 5, 8, ..., 20, 21-23,
// the pattern of llama.cpp's 24-layer Q4_K_M files); an 8-expert model's
// attn_k and attn_v q8_0 and (q4_k_m) attn_output q5_K; rows that are not
// whole 256-blocks fall back to q5_0 (from q4_K), q5_1 (q5_K) and q8_0 (q6_K).
TEST(MakeModel, MixesChooseLlamaCppsPerTensorTypes) {
  using gguf::TensorType;
  const std::set<int> more_bits = {0, 1, 2, 5, 8, 11, 14, 17, 20, 21, 22, 23};
  struct Case {
    std::string preset, arch, mix;
    TensorType base, more, output;
  };
  for (const Case& c : {Case{"tiny-wide", "llama", "q4_k_m", TensorType::Q4_K, TensorType::Q6_K, TensorType::Q6_K},
                        Case{"tiny-wide", "qwen2", "q5_k_m", TensorType::Q5_K, TensorType::Q6_K, TensorType::Q6_K},
                        Case{"tiny", "llama", "q4_k_m", TensorType::Q5_0, TensorType::Q8_0, TensorType::Q8_0},
                        Case{"tiny", "qwen3", "q5_k_m", TensorType::Q5_1, TensorType::Q8_0, TensorType::Q8_0}}) {
    SCOPED_TRACE(c.preset + " " + c.arch + " " + c.mix);
    MakeModelOptions o;
    o.preset = c.preset;
    o.arch = c.arch;
    o.n_layer = 24;
    set_weight_type(c.mix, &o);
    const std::string path = temp_path("mix.gguf");
    make_model(o, path);
    const gguf::File f = gguf::File::open(path);
    EXPECT_EQ(f.get_u64_or("general.file_type", 0), c.mix == "q4_k_m" ? 15u : 17u);
    EXPECT_EQ(f.tensor("output.weight").type, c.output);
    EXPECT_EQ(f.tensor("token_embd.weight").type, c.base);
    for (int l = 0; l < 24; ++l) {
      const std::string pre = "blk." + std::to_string(l) + ".";
      const TensorType want = more_bits.count(l) ? c.more : c.base;
      EXPECT_EQ(f.tensor(pre + "attn_v.weight").type, want) << l;
      EXPECT_EQ(f.tensor(pre + "ffn_down.weight").type, want) << l;
      for (const char* name : {"attn_q.weight", "attn_k.weight", "attn_output.weight", "ffn_gate.weight", "ffn_up.weight"})
        EXPECT_EQ(f.tensor(pre + name).type, c.base) << pre << name;
    }
    EXPECT_NO_THROW(Model::load(std::make_shared<const gguf::File>(gguf::File::open(path))));
    std::filesystem::remove(path);
  }
  // 8 experts (qwen3moe tiny-wide), 2 layers: use_more_bits picks layer 1 of 2.
  MakeModelOptions o;
  o.preset = "tiny-wide";
  o.arch = "qwen3moe";
  set_weight_type("q4_k_m", &o);
  const std::string path = temp_path("mix-moe.gguf");
  make_model(o, path);
  const gguf::File f = gguf::File::open(path);
  for (int l = 0; l < 2; ++l) {
    const std::string pre = "blk." + std::to_string(l) + ".";
    EXPECT_EQ(f.tensor(pre + "attn_v.weight").type, TensorType::Q8_0);
    EXPECT_EQ(f.tensor(pre + "attn_k.weight").type, TensorType::Q8_0);
    EXPECT_EQ(f.tensor(pre + "attn_output.weight").type, TensorType::Q5_K);
    EXPECT_EQ(f.tensor(pre + "attn_q.weight").type, TensorType::Q4_K);
    EXPECT_EQ(f.tensor(pre + "ffn_gate_inp.weight").type, TensorType::F32);
    EXPECT_EQ(f.tensor(pre + "ffn_down_exps.weight").type, l == 1 ? TensorType::Q6_K : TensorType::Q4_K);
  }
  std::filesystem::remove(path);
  // qwen3next (8 experts, 4 layers, the last full attention): the delta
  // layers' attn_qkv count as attn_v; ffn_down q6_K in layers 2 and 3 of 4.
  o.arch = "qwen3next";
  set_weight_type("q5_k_m", &o);
  make_model(o, path);
  const gguf::File g = gguf::File::open(path);
  for (int l = 0; l < 4; ++l) {
    const std::string pre = "blk." + std::to_string(l) + ".";
    EXPECT_EQ(g.tensor(pre + (l == 3 ? "attn_v.weight" : "attn_qkv.weight")).type, TensorType::Q8_0) << l;
    EXPECT_EQ(g.tensor(pre + "ffn_down_exps.weight").type, l >= 2 ? TensorType::Q6_K : TensorType::Q5_K) << l;
  }
  EXPECT_EQ(g.tensor("blk.3.attn_output.weight").type, TensorType::Q5_K);
  std::filesystem::remove(path);
  EXPECT_THROW(set_weight_type("q3_k_m", &o), Error);
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
  const std::string json = run(bin + " bench model -m " + path + " -r 2 -p 16 -n 4 --batches 2,3 --json", &status);
  ASSERT_EQ(status, 0);
  for (const char* key : {"\"pp16_tps\"", "\"tg4_tps\"", "\"batched_decode_tps\"", "\"memory_bandwidth_gbps\"",
                          "\"roofline_ratio\"", "\"roofline_paired_ratio\""})
    EXPECT_NE(json.find(key), std::string::npos) << key << " in " << json;
  // Each generation run judged against the probe passes around it: one pair per run.
  size_t pairs = 0;
  for (size_t at = json.find("\"probe_gbps\""); at != std::string::npos; at = json.find("\"probe_gbps\"", at + 1)) ++pairs;
  EXPECT_EQ(pairs, 2u) << json;
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
  EXPECT_NE(table.find("roofline, paired: each tg4 run's weight stream"), std::string::npos) << table;
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
