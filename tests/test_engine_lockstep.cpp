// Engines as ranks of a lockstep group (data parallelism in one process: one
// thread per engine, each with its own model and gloo context over loopback).
#include <gtest/gtest.h>
#include <unistd.h>

#include <condition_variable>
#include <filesystem>
#include <map>
#include <mutex>

#include "engine/engine_core.h"
#include "model/model.h"
#include "model_fixtures.h"
#include "tokenizer/tokenizer.h"
#include "transport/gloo_transport.h"

namespace tandem {
namespace {

// What the requests of one engine produced.
class Outputs {
 public:
  OutputSink sink(uint64_t id) {
    return [this, id](RequestOutput&& out) {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& d : out.sequences) {
        tokens_[id].insert(tokens_[id].end(), d.tokens.begin(), d.tokens.end());
        logprob_[id] = d.cumulative_logprob;
      }
      if (!out.error.empty()) errors_[id] = out.error;
      if (out.finished) ++finished_, cv_.notify_all();
    };
  }
  bool wait_finished(int n, int timeout_ms) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return finished_ >= n; });
  }
  std::map<uint64_t, std::vector<int32_t>> tokens() {
    std::lock_guard<std::mutex> lock(mu_);
    return tokens_;
  }
  std::map<uint64_t, std::string> errors() {
    std::lock_guard<std::mutex> lock(mu_);
    return errors_;
  }
  // Each request's cumulative log-probability: equal bits, equal logits.
  std::map<uint64_t, double> logprobs() {
    std::lock_guard<std::mutex> lock(mu_);
    return logprob_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int finished_ = 0;
  std::map<uint64_t, std::vector<int32_t>> tokens_;
  std::map<uint64_t, std::string> errors_;
  std::map<uint64_t, double> logprob_;
};

struct Rank {
  std::unique_ptr<Model> model;
  std::unique_ptr<EngineCore> engine;
  Outputs outputs;
};

EngineConfig small_engine() {
  EngineConfig c;
  c.kv_cache_bytes = 8 << 20;
  c.threads = 1;
  return c;
}

// `n` engines in one lockstep group over gloo.
class Group {
 public:
  explicit Group(int n, int timeout_ms = 5000, const std::string& arch = "llama", bool expert_parallel = false) {
    static int counter = 0;
    dir_ = std::filesystem::temp_directory_path() /
           ("tandem-dp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    auto& fx = testing::tiny_f16(arch);
    used_.assign(static_cast<size_t>(n), 0);
    for (int r = 0; r < n; ++r) {
      auto rank = std::make_unique<Rank>();
      LoadOptions load;
      if (expert_parallel) load.expert_rank = r, load.expert_ranks = n;
      rank->model = Model::load(fx.file, load);
      rank->engine = std::make_unique<EngineCore>(*rank->model, *fx.tokenizer, small_engine());
      LockstepHooks hooks;
      hooks.expert_parallel = expert_parallel;
      hooks.rank = r;
      hooks.size = n;
      const parallel::LockstepConfig plan{expert_parallel ? rank->model->n_expert_layers() : 0, 0};
      hooks.connect = [this, r, n, timeout_ms, plan] {
        GlooGroupOptions o;
        o.rank = r;
        o.size = n;
        o.rendezvous_dir = dir_.string();
        const int gen = generation_.load();
        used_[static_cast<size_t>(r)] = gen;
        o.generation = "g" + std::to_string(gen);
        o.timeout_ms = timeout_ms;
        return std::make_unique<parallel::LockstepGroup>(std::make_unique<GlooTransport>(o), plan);
      };
      // A failed group, or one that did not form, is rebuilt under the next
      // generation's keys; every rank moves on from the same one.
      hooks.on_failure = [this, r](const parallel::LockstepError&) {
        int want = used_[static_cast<size_t>(r)] + 1, seen = generation_.load();
        while (seen < want && !generation_.compare_exchange_weak(seen, want)) {
        }
      };
      rank->engine->set_lockstep(hooks);
      ranks_.push_back(std::move(rank));
    }
    for (auto& r : ranks_) r->engine->start();
  }
  ~Group() {
    for (auto& r : ranks_)
      if (r->engine) r->engine->stop();
    ranks_.clear();
    std::filesystem::remove_all(dir_);
  }
  Rank& rank(int r) { return *ranks_[static_cast<size_t>(r)]; }
  void submit(int r, uint64_t id, std::vector<int32_t> prompt, int max_tokens) {
    EngineRequest req;
    req.id = id;
    req.prompt = std::move(prompt);
    req.params.max_tokens = max_tokens;
    req.params.temperature = 0;
    req.params.ignore_eos = true;
    req.sink = rank(r).outputs.sink(id);
    ASSERT_FALSE(rank(r).engine->add_request(std::move(req)).has_value());
  }
  bool wait_ready(int timeout_ms) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      bool all = true;
      for (auto& r : ranks_) all = all && r->engine->ready();
      if (all) return true;
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  // Stops rank r's engine and drops its gloo context (its peers' next op fails).
  void stop_rank(int r) {
    rank(r).engine->stop();
    ranks_[static_cast<size_t>(r)]->engine.reset();
  }

 private:
  std::filesystem::path dir_;
  std::atomic<int> generation_{0};
  std::vector<int> used_;  // per rank: the generation it last connected under
  std::vector<std::unique_ptr<Rank>> ranks_;
};

std::vector<int32_t> prompt_of(int i) {
  std::vector<int32_t> p;
  for (int k = 0; k < 5 + i % 7; ++k) p.push_back(3 + (i * 13 + k * 7) % 200);
  return p;
}

// The same requests on one engine without a group.
std::map<uint64_t, std::vector<int32_t>> single_engine(int n_requests, int max_tokens, const std::string& arch = "llama",
                                                       std::map<uint64_t, double>* logprobs = nullptr) {
  auto& fx = testing::tiny_f16(arch);
  auto model = Model::load(fx.file);
  EngineCore engine(*model, *fx.tokenizer, small_engine());
  Outputs outputs;
  for (int i = 0; i < n_requests; ++i) {
    EngineRequest req;
    req.id = static_cast<uint64_t>(i + 1);
    req.prompt = prompt_of(i);
    req.params.max_tokens = max_tokens;
    req.params.temperature = 0;
    req.params.ignore_eos = true;
    req.sink = outputs.sink(req.id);
    EXPECT_FALSE(engine.add_request(std::move(req)).has_value());
  }
  while (engine.has_work()) engine.step();
  if (logprobs != nullptr) *logprobs = outputs.logprobs();
  return outputs.tokens();
}

TEST(EngineLockstep, AnIdleRankStepsInLockstepWithABusyOneForAThousandSteps) {
  constexpr int kRequests = 10, kMaxTokens = 100;
  const auto expected = single_engine(kRequests, kMaxTokens);
  Group g(2);
  // One request at a time: about kRequests * kMaxTokens steps with work on rank 0 only.
  for (int i = 0; i < kRequests; ++i) {
    g.submit(0, static_cast<uint64_t>(i + 1), prompt_of(i), kMaxTokens);
    ASSERT_TRUE(g.rank(0).outputs.wait_finished(i + 1, 60'000)) << "request " << i;
  }
  EXPECT_EQ(g.rank(0).outputs.tokens(), expected);  // lockstep changes nothing a rank computes
  EXPECT_TRUE(g.rank(0).outputs.errors().empty());
  EXPECT_TRUE(g.rank(0).engine->ready());
  const LockstepStatus busy = g.rank(0).engine->lockstep_status();
  EXPECT_EQ(busy.size, 2);
  EXPECT_EQ(busy.counters.dummy_steps, 0);
  // Rank 0 leaves; rank 1 sees its group fail and keeps the counters.
  g.stop_rank(0);
  for (int i = 0; i < 2000 && g.rank(1).engine->ready(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const LockstepStatus idle = g.rank(1).engine->lockstep_status();
  EXPECT_FALSE(idle.connected);
  EXPECT_EQ(idle.group_failures, 1);
  EXPECT_GE(idle.counters.dummy_steps, kRequests * kMaxTokens);
  EXPECT_GE(idle.counters.steps, busy.counters.steps);
  EXPECT_LE(idle.counters.steps, busy.counters.steps + 1);  // rank 0 may have left after one more consensus
  const LockstepStatus after = g.rank(1).engine->lockstep_status();
  EXPECT_FALSE(after.last_error.empty());
}

TEST(EngineLockstep, BothRanksServeTheirOwnRequestsAndMatchASingleEngine) {
  constexpr int kRequests = 12, kMaxTokens = 24;
  const auto expected = single_engine(kRequests, kMaxTokens);
  Group g(2);
  for (int i = 0; i < kRequests; ++i) g.submit(i % 2, static_cast<uint64_t>(i + 1), prompt_of(i), kMaxTokens);
  ASSERT_TRUE(g.rank(0).outputs.wait_finished(kRequests / 2, 60'000));
  ASSERT_TRUE(g.rank(1).outputs.wait_finished(kRequests / 2, 60'000));
  auto got = g.rank(0).outputs.tokens();
  got.merge(g.rank(1).outputs.tokens());
  EXPECT_EQ(got, expected);
}

TEST(EngineLockstep, ALostPeerFailsTheInFlightRequestsWithAnErrorNamingIt) {
  Group g(2, /*timeout_ms=*/3000);
  ASSERT_TRUE(g.wait_ready(10'000));
  // As long as the context allows: still in flight when rank 1 goes.
  g.submit(0, 1, prompt_of(1), static_cast<int>(g.rank(0).engine->max_model_len()) - 20);
  for (int i = 0; i < 1000 && g.rank(0).outputs.tokens()[1].empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_FALSE(g.rank(0).outputs.tokens()[1].empty());
  g.stop_rank(1);
  ASSERT_TRUE(g.rank(0).outputs.wait_finished(1, 10'000));
  const auto errors = g.rank(0).outputs.errors();
  ASSERT_EQ(errors.count(1), 1u);
  EXPECT_NE(errors.at(1).find("missing {1}"), std::string::npos) << errors.at(1);
  std::string why;
  EXPECT_FALSE(g.rank(0).engine->ready(&why));
  EXPECT_NE(why.find("not formed"), std::string::npos) << why;
  EXPECT_EQ(g.rank(0).engine->kv_stats().owned, 0);  // the failed request's blocks are back
}

// Expert parallelism: each rank holds half of every MoE layer's experts; a
// token's rows go to the ranks of its experts and come back, summed in its
// own rank order. Output equals the single-rank model bitwise (the same
// tokens and the same cumulative log-probabilities, to the bit).
class EngineExpertParallel : public ::testing::TestWithParam<std::string> {};

TEST_P(EngineExpertParallel, TwoRanksEqualOneBitwiseWithRequestsOnBothAndOnOneRankOnly) {
  const std::string arch = GetParam();
  constexpr int kRequests = 8, kMaxTokens = 20;
  std::map<uint64_t, double> expected_logprobs;
  const auto expected = single_engine(kRequests, kMaxTokens, arch, &expected_logprobs);
  for (bool both : {true, false}) {
    SCOPED_TRACE(both ? "requests on both ranks" : "requests on rank 0, rank 1 only serves its experts");
    Group g(2, 5000, arch, /*expert_parallel=*/true);
    for (int i = 0; i < kRequests; ++i) g.submit(both ? i % 2 : 0, static_cast<uint64_t>(i + 1), prompt_of(i), kMaxTokens);
    ASSERT_TRUE(g.rank(0).outputs.wait_finished(both ? kRequests / 2 : kRequests, 60'000));
    if (both) {
      ASSERT_TRUE(g.rank(1).outputs.wait_finished(kRequests / 2, 60'000));
    }
    auto got = g.rank(0).outputs.tokens();
    got.merge(g.rank(1).outputs.tokens());
    auto logprobs = g.rank(0).outputs.logprobs();
    logprobs.merge(g.rank(1).outputs.logprobs());
    EXPECT_EQ(got, expected);
    EXPECT_EQ(logprobs, expected_logprobs);
    const LockstepStatus st = g.rank(1).engine->lockstep_status();
    EXPECT_GT(st.counters.by_kind[static_cast<size_t>(parallel::OpKind::kExpertDispatch)].count, 0);
    EXPECT_EQ(st.counters.by_kind[static_cast<size_t>(parallel::OpKind::kExpertDispatch)].count,
              st.counters.by_kind[static_cast<size_t>(parallel::OpKind::kExpertCombine)].count);
    if (!both) {
      EXPECT_GT(st.counters.dummy_steps, 0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Moe, EngineExpertParallel, ::testing::Values("qwen3moe", "qwen3next"));

}  // namespace
}  // namespace tandem
