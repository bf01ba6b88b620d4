// A prefill and a decode instance in one process: two engines, two transfer
// agents driving the real protocol cores, and the UCX transport moving the
// KV between their pools, over TCP and over shared memory, in WRITE and READ
// mode. Output must be token-identical to one engine serving the request
// alone ("both"), and every block must be back in the pools afterwards.
#include <gtest/gtest.h>

#include <condition_variable>
#include <map>
#include <mutex>

#include "engine/engine_core.h"
#include "instance/fingerprint.h"
#include "instance/transfer_agent.h"
#include "model_fixtures.h"
#include "transport/ucx_transport.h"
#include "util/clock.h"

namespace tandem::instance {
namespace {

using testing::LoadedTinyModel;

constexpr pd::NodeId kPrefillNode = 2, kDecodeNode = 3;

struct Result {
  std::map<int32_t, std::vector<int32_t>> tokens;
  bool finished = false;
  std::string error;
};

// Collects outputs from any thread.
class Results {
 public:
  OutputSink sink(uint64_t key) {
    return [this, key](RequestOutput&& out) {
      std::lock_guard<std::mutex> lock(mu_);
      Result& r = results_[key];
      for (auto& d : out.sequences) r.tokens[d.index].insert(r.tokens[d.index].end(), d.tokens.begin(), d.tokens.end());
      if (!out.error.empty()) r.error = out.error;
      r.finished |= out.finished;
      cv_.notify_all();
    };
  }
  bool wait(uint64_t key, int timeout_ms = 20000) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return results_[key].finished; });
  }
  Result get(uint64_t key) {
    std::lock_guard<std::mutex> lock(mu_);
    return results_[key];
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Result> results_;
};

EngineConfig engine_config() {
  EngineConfig c;
  c.kv_cache_bytes = 4 << 20;
  c.block_size = 4;
  c.max_num_batched_tokens = 32;
  c.max_num_seqs = 16;
  c.threads = 1;
  return c;
}

// One instance: its own copy of the model (a Model is used by one engine), an
// engine, and for P/D roles a transport and an agent.
struct Instance {
  std::unique_ptr<Model> model;
  std::unique_ptr<EngineCore> engine;
  std::unique_ptr<TransferAgent> agent;
  transport::UcxTransport* transport = nullptr;

  Instance(pd::Role role, pd::NodeId node, pd::TransferMode mode, const std::string& tls,
           EngineConfig config = engine_config(), const std::string& arch = "llama", bool skip_state = false) {
    LoadedTinyModel& m = testing::tiny_f16(arch);
    model = Model::load(m.file);
    engine = std::make_unique<EngineCore>(*model, *m.tokenizer, config);
    engine->start();
    if (role == pd::Role::kRouter) return;  // "both": no transfer
    KvPool& pool = engine->kv_pool();
    transport::UcxTransportConfig tc;
    tc.secret = "test-secret";
    tc.self.node = node;
    tc.self.epoch = 1;
    tc.self.role = role;
    tc.self.fingerprint = make_fingerprint(*m.file, pool.shape(), mode);
    tc.region = pool.data();
    tc.region_bytes = pool.transfer_bytes();
    tc.n_blocks = static_cast<int32_t>(pool.n_transfer_blocks());
    tc.block_bytes = pool.block_bytes();
    tc.tls = tls;
    auto t = std::make_unique<transport::UcxTransport>(tc);
    transport = t.get();
    TransferAgentConfig ac;
    ac.role = role;
    ac.node = node;
    ac.mutation_skip_state_transfer = skip_state;
    agent = std::make_unique<TransferAgent>(*engine, std::move(t), ac);
    agent->start();
  }
  ~Instance() {
    if (agent) agent->stop();
    engine->stop();
  }
};

SamplingParams greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

std::vector<int32_t> prompt_of(int n, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back((i * 53 + salt * 97 + 11) % 1000);
  return p;
}

// Polls `done` until it holds or timeout_ms passes.
bool eventually(const std::function<bool()>& done, int timeout_ms = 10000) {
  for (int64_t until = monotonic_ms() + timeout_ms; monotonic_ms() < until;) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return done();
}

// Test-only switches of a cluster (mutations of the state transfer).
struct Mutations {
  bool skip_state_transfer = false;   // the RMA leaves the state blocks out
  bool advance_state_twice = false;   // the decode recomputes the last moved token
};

struct Cluster {
  Instance both, prefill, decode;
  Results results;
  pd::TransferMode mode;
  uint64_t next_transfer = 100;

  static EngineConfig with(EngineConfig c, const Mutations& m) {
    c.mutation_advance_state_twice = m.advance_state_twice;
    return c;
  }

  Cluster(pd::TransferMode m, const std::string& tls, EngineConfig decode_config = engine_config(),
          const std::string& arch = "llama", Mutations mutations = {})
      : both(pd::Role::kRouter, 0, m, tls, engine_config(), arch),
        prefill(pd::Role::kPrefill, kPrefillNode, m, tls, engine_config(), arch, mutations.skip_state_transfer),
        decode(pd::Role::kDecode, kDecodeNode, m, tls, with(decode_config, mutations), arch,
               mutations.skip_state_transfer),
        mode(m) {
    decode.agent->connect("127.0.0.1", prefill.agent->listen_port());
    EXPECT_TRUE(eventually([&] {
      auto p = prefill.agent->snapshot(), d = decode.agent->snapshot();
      return p && d && p->connected_peers.size() == 1 && d->connected_peers.size() == 1;
    })) << "the instances did not connect";
  }

  // The request served by one engine alone.
  Result alone(const std::vector<int32_t>& prompt, const SamplingParams& params) {
    uint64_t key = next_transfer++;
    EngineRequest r;
    r.id = key;
    r.prompt = prompt;
    r.params = params;
    r.sink = results.sink(key);
    EXPECT_FALSE(both.engine->add_request(std::move(r)).has_value());
    EXPECT_TRUE(results.wait(key));
    return results.get(key);
  }

  // Submits the request to both instances as the router would; returns its key.
  uint64_t submit(const std::vector<int32_t>& prompt, const SamplingParams& params) {
    uint64_t transfer = next_transfer++;
    PdRequest p;
    p.transfer = transfer;
    p.mode = mode;
    p.peer = kDecodeNode;
    p.peer_epoch = 1;
    p.prompt = prompt;
    PdRequest d = p;
    d.peer = kPrefillNode;
    d.params = params;
    d.sink = results.sink(transfer);
    prefill.agent->submit(std::move(p));
    decode.agent->submit(std::move(d));
    return transfer;
  }

  Result disaggregated(const std::vector<int32_t>& prompt, const SamplingParams& params) {
    uint64_t key = submit(prompt, params);
    EXPECT_TRUE(results.wait(key)) << "the disaggregated request did not finish";
    return results.get(key);
  }

  // After the drain: no transfer alive, nothing held for one, nothing owned.
  void expect_drained() {
    for (Instance* i : {&prefill, &decode}) {
      EXPECT_TRUE(eventually([&] {
        auto s = i->agent->snapshot();
        return s && s->live_transfers == 0 && s->blocks_held == 0 && i->engine->metrics().transfer_blocks_held == 0 &&
               i->engine->kv_stats().owned == 0 && i->engine->state_slots_used() == 0;
      })) << "an instance did not return to its baseline";
      BlockManagerStats st = i->engine->kv_stats();
      EXPECT_EQ(st.free + st.cached, st.total);
    }
  }
};

struct Case {
  pd::TransferMode mode;
  std::string tls;
  std::string arch = "llama";
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.arch << " " << pd::name(c.mode) << " over " << c.tls; }

class PdInstancesTest : public ::testing::TestWithParam<Case> {};

TEST_P(PdInstancesTest, GreedyOutputEqualsOneInstanceAndPoolsDrain) {
  Cluster c(GetParam().mode, GetParam().tls, engine_config(), GetParam().arch);
  // Lengths around block boundaries (block size 4), and N = 1 (nothing moves).
  for (int n : {1, 2, 4, 5, 9, 17, 31}) {
    std::vector<int32_t> prompt = prompt_of(n, n);
    Result want = c.alone(prompt, greedy(8));
    Result got = c.disaggregated(prompt, greedy(8));
    EXPECT_EQ(got.error, "") << "prompt of " << n;
    EXPECT_EQ(got.tokens, want.tokens) << "prompt of " << n;
    ASSERT_EQ(got.tokens[0].size(), 8u);
  }
  c.expect_drained();
  auto d = c.decode.agent->snapshot();
  ASSERT_TRUE(d);
  EXPECT_GT(d->counters.rma_posts + d->counters.exposes, 0);
}

TEST_P(PdInstancesTest, SeededSiblingsAndBestOfEqualOneInstance) {
  Cluster c(GetParam().mode, GetParam().tls, engine_config(), GetParam().arch);
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_k = 20;
  p.seed = 1234;
  p.n = 3;
  p.best_of = 4;
  p.max_tokens = 6;
  p.ignore_eos = true;
  std::vector<int32_t> prompt = prompt_of(13, 5);
  Result want = c.alone(prompt, p);
  Result got = c.disaggregated(prompt, p);
  EXPECT_EQ(got.error, "");
  ASSERT_EQ(got.tokens.size(), 4u);
  EXPECT_EQ(got.tokens, want.tokens);
  c.expect_drained();
}

TEST_P(PdInstancesTest, ConcurrentRequestsAndAPrefixHitOnTheDecode) {
  Cluster c(GetParam().mode, GetParam().tls, engine_config(), GetParam().arch);
  std::vector<std::vector<int32_t>> prompts;
  std::map<uint64_t, size_t> which;
  for (int i = 0; i < 12; ++i) prompts.push_back(prompt_of(6 + i * 3, i));
  prompts.push_back(prompts[5]);  // the same prompt again: its full blocks are cached on the decode
  std::vector<Result> want;
  for (auto& p : prompts) want.push_back(c.alone(p, greedy(5)));
  for (size_t i = 0; i + 1 < prompts.size(); ++i) which[c.submit(prompts[i], greedy(5))] = i;
  for (auto& [key, i] : which) {
    ASSERT_TRUE(c.results.wait(key));
    EXPECT_EQ(c.results.get(key).tokens, want[i].tokens) << "request " << i;
  }
  Result again = c.disaggregated(prompts.back(), greedy(5));
  EXPECT_EQ(again.tokens, want.back().tokens);
  c.expect_drained();
}

// A decode pool far smaller than the load: allocations wait for free blocks,
// running requests are preempted and recompute from their token ids (the KV
// that came from the prefill is not needed again), and every output still
// equals one instance's.
TEST_P(PdInstancesTest, ADecodeThatMustPreemptRecomputesLocally) {
  LoadedTinyModel& m = testing::tiny_f16(GetParam().arch);
  EngineConfig small = engine_config();
  small.kv_cache_bytes =
      20 * static_cast<int64_t>(KvPool::bytes_per_block(m.model->kv_shape(1, small.block_size, small.kv_dtype)));
  Cluster c(GetParam().mode, GetParam().tls, small, GetParam().arch);
  ASSERT_EQ(c.decode.engine->n_kv_blocks(), 20);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<Result> want;
  for (int i = 0; i < 8; ++i) {
    prompts.push_back(prompt_of(10, 40 + i));
    want.push_back(c.alone(prompts.back(), greedy(20)));
  }
  std::vector<uint64_t> keys;
  for (auto& p : prompts) keys.push_back(c.submit(p, greedy(20)));
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(c.results.wait(keys[i], 60'000)) << "request " << i << " never finished";
    EXPECT_EQ(c.results.get(keys[i]).tokens, want[i].tokens) << "request " << i;
  }
  EXPECT_GT(c.decode.engine->metrics().preemptions.load(), 0);
  c.expect_drained();
}

INSTANTIATE_TEST_SUITE_P(Modes, PdInstancesTest,
                         ::testing::Values(Case{pd::TransferMode::kWrite, "tcp"}, Case{pd::TransferMode::kRead, "tcp"},
                                           Case{pd::TransferMode::kWrite, "tcp,sm,self"},
                                           Case{pd::TransferMode::kRead, "tcp,sm,self"},
                                           // qwen3next: the recurrent state moves with the KV.
                                           Case{pd::TransferMode::kWrite, "tcp", "qwen3next"},
                                           Case{pd::TransferMode::kRead, "tcp", "qwen3next"},
                                           Case{pd::TransferMode::kWrite, "tcp,sm,self", "qwen3next"}),
                         [](const auto& info) {
                           return std::string(info.param.arch == "llama" ? "" : info.param.arch + "_") +
                                  (info.param.mode == pd::TransferMode::kWrite ? "Write" : "Read") +
                                  (info.param.tls == "tcp" ? "Tcp" : "SharedMemory");
                         });

// A hybrid model's state after the N-1 moved tokens is part of what moves:
// greedy and seeded n = 4 outputs equal one instance's, and both ways of
// getting the state wrong (not moving it; advancing it twice by the last
// moved token) change the outputs, so these tests catch them.
std::vector<std::pair<std::vector<int32_t>, SamplingParams>> hybrid_cases() {
  SamplingParams seeded;
  seeded.temperature = 0.8f;
  seeded.seed = 99;
  seeded.n = 4;
  seeded.best_of = 4;
  seeded.max_tokens = 8;
  seeded.ignore_eos = true;
  SamplingParams greedy4 = greedy(8);
  greedy4.n = 4;
  greedy4.best_of = 4;
  return {{prompt_of(5, 1), greedy(8)}, {prompt_of(13, 2), greedy4}, {prompt_of(22, 3), seeded},
          {prompt_of(9, 4), seeded}};
}

TEST(PdHybrid, StateMovesWithTheKvGreedyAndSeededFourSiblings) {
  for (pd::TransferMode mode : {pd::TransferMode::kWrite, pd::TransferMode::kRead}) {
    Cluster c(mode, "tcp", engine_config(), "qwen3next");
    EXPECT_GT(c.prefill.engine->kv_pool().state_slot_blocks(), 0);
    for (const auto& [prompt, params] : hybrid_cases()) {
      const Result want = c.alone(prompt, params);
      const Result got = c.disaggregated(prompt, params);
      EXPECT_EQ(got.error, "");
      EXPECT_EQ(got.tokens, want.tokens) << pd::name(mode) << ", prompt of " << prompt.size();
    }
    c.expect_drained();
  }
}

// Returns how many of the cases' outputs differ from one instance's.
int outputs_that_differ(Cluster& c) {
  int differ = 0;
  for (const auto& [prompt, params] : hybrid_cases()) {
    const Result want = c.alone(prompt, params);
    const Result got = c.disaggregated(prompt, params);
    EXPECT_EQ(got.error, "");
    differ += got.tokens != want.tokens ? 1 : 0;
  }
  c.expect_drained();
  return differ;
}

TEST(PdHybrid, AStateThatDoesNotMoveIsCaught) {
  if (!pd::kMutationsBuilt) GTEST_SKIP() << "mutations are built only into test builds";
  Cluster c(pd::TransferMode::kWrite, "tcp", engine_config(), "qwen3next", Mutations{.skip_state_transfer = true});
  EXPECT_GT(outputs_that_differ(c), 0) << "a decode that runs from a zero state must give other tokens";
}

TEST(PdHybrid, AStateAdvancedTwiceIsCaught) {
  if (!pd::kMutationsBuilt) GTEST_SKIP() << "mutations are built only into test builds";
  Cluster c(pd::TransferMode::kRead, "tcp", engine_config(), "qwen3next", Mutations{.advance_state_twice = true});
  EXPECT_GT(outputs_that_differ(c), 0) << "a state advanced twice by the last moved token must give other tokens";
}

}  // namespace
}  // namespace tandem::instance
