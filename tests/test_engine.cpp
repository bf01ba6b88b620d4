// The engine core driven step by step (no thread): continuous batching,
// chunked prefill, preemption, prefix caching, parallel sampling, stop
// conditions and aborts, with the KV accounting checked after every drain.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine_core.h"
#include "util/block_budget.h"
#include "gguf/gguf.h"
#include "kernels/ops.h"
#include "model/model.h"
#include "model_fixtures.h"
#include "tokenizer/tokenizer.h"
#include "util/thread_pool.h"

namespace tandem {
namespace {

testing::LoadedTinyModel& fixture() { return testing::tiny_llama_f16(); }

// Everything one request produced, gathered from its outputs.
struct Collected {
  std::map<int32_t, std::vector<int32_t>> tokens;
  std::map<int32_t, std::string> text;
  std::map<int32_t, FinishReason> finish;
  std::map<int32_t, std::string> stop_reason;
  std::map<int32_t, double> cumulative_logprob;
  std::map<int32_t, size_t> n_logprobs;
  int32_t cached_tokens = -1;
  bool finished = false;
  int outputs_after_finish = 0;
};

class Harness {
 public:
  explicit Harness(EngineConfig cfg, testing::LoadedTinyModel& m = fixture())
      : engine_(*m.model, *m.tokenizer, cfg) {}

  uint64_t submit(std::vector<int32_t> prompt, SamplingParams p) {
    const uint64_t id = next_id_++;
    EngineRequest r;
    r.id = id;
    r.prompt = std::move(prompt);
    r.params = p;
    r.sink = [this, id](RequestOutput&& out) {
      std::lock_guard<std::mutex> lock(mu_);  // the loop-thread test calls this from the engine thread
      Collected& c = results_[id];
      if (c.finished) ++c.outputs_after_finish;
      c.cached_tokens = out.cached_tokens;
      for (auto& d : out.sequences) {
        auto& t = c.tokens[d.index];
        t.insert(t.end(), d.tokens.begin(), d.tokens.end());
        c.text[d.index] += d.text;
        c.n_logprobs[d.index] += d.logprobs.size();
        c.cumulative_logprob[d.index] = d.cumulative_logprob;
        if (d.finish != FinishReason::kNone) {
          c.finish[d.index] = d.finish;
          c.stop_reason[d.index] = d.stop_reason;
        }
      }
      c.finished |= out.finished;
    };
    auto err = engine_.add_request(std::move(r));
    EXPECT_FALSE(err.has_value()) << *err;
    return id;
  }

  void run_until_idle(int max_steps = 100000) {
    for (int i = 0; i < max_steps && engine_.has_work(); ++i) engine_.step();
    EXPECT_FALSE(engine_.has_work());
  }

  // After a drain nothing is owned: every block is free or cached, every
  // recurrent-state slot free.
  void expect_no_leak() {
    const BlockManagerStats s = engine_.kv_stats();
    EXPECT_EQ(s.owned, 0);
    EXPECT_EQ(s.free + s.cached, s.total);
    EXPECT_EQ(engine_.state_slots_used(), 0);
  }

  EngineCore& engine() { return engine_; }
  Collected& result(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    return results_[id];
  }
  bool is_finished(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    return results_[id].finished;
  }

 private:
  std::mutex mu_;
  EngineCore engine_;
  uint64_t next_id_ = 1;
  std::map<uint64_t, Collected> results_;
};

EngineConfig small_config() {
  EngineConfig c;
  c.kv_cache_bytes = 4 << 20;
  c.block_size = 4;
  c.max_num_batched_tokens = 32;
  c.max_num_seqs = 16;
  c.threads = 2;
  return c;
}

std::vector<int32_t> prompt_of(int n, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back((i * 53 + salt * 97 + 11) % 1000);
  return p;
}

// Greedy tokens of a prompt computed directly with the model, one sequence.
std::vector<int32_t> greedy_alone(const std::vector<int32_t>& prompt, int n, Model& m = *fixture().model) {
  ThreadPool pool(1);
  KvPool kv(m.kv_shape(64, 16, kernels::DType::kF16));
  SimpleBlockAllocator alloc(64);
  const auto table = alloc.allocate(64);
  Batch b;
  b.add_sequence(prompt, 0, table, true, 0);
  std::vector<float> logits = m.forward(b, kv, pool);
  std::vector<int32_t> out;
  int32_t pos = static_cast<int32_t>(prompt.size());
  for (int i = 0; i < n; ++i) {
    const auto t = static_cast<int32_t>(kernels::argmax(logits.data(), m.config().n_vocab));
    out.push_back(t);
    Batch d;
    const int32_t one[] = {t};
    d.add_sequence(one, pos++, table, true, 0);
    logits = m.forward(d, kv, pool);
  }
  return out;
}

SamplingParams greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

TEST(StepComposition, CountsOnePositionChunksPastThePromptAsDecodeRows) {
  Sequence a, b, c;
  a.n_prompt = 9;   // a prompt in two chunks, then its first decode row
  b.n_prompt = 9;   // decoding: position 10 holds its second generated token
  c.n_prompt = 5;   // preempted after 7 generated tokens: recomputed whole
  SchedulerOutput out;
  out.chunks = {{&a, 0, 8, false}, {&a, 8, 1, true}, {&a, 9, 1, true}, {&b, 10, 1, true}, {&c, 0, 12, true}};
  const StepComposition got = composition_of(out);
  EXPECT_EQ(got.prefill_tokens, 8 + 1 + 12);
  EXPECT_EQ(got.decode_rows, 2);
  EXPECT_EQ(composition_of(SchedulerOutput{}).prefill_tokens, 0);
}

// Every step is counted under one kind, and the kinds' tokens add up to the
// prompts and the generated tokens: a request of P prompt tokens and G
// generated ones runs P prompt positions and G - 1 decode rows (the last
// token is sampled, never run).
TEST(EngineMetrics, StepsAreSplitByWhatTheyCarried) {
  EngineConfig cfg = small_config();
  cfg.enable_prefix_caching = false;
  Harness h(cfg);
  int64_t prompt_tokens = 0, decode_rows = 0;
  for (int i = 0; i < 12; ++i) {
    const int n_prompt = 5 + (i * 7) % 23, n_out = 3 + i % 5;
    h.submit(prompt_of(n_prompt, 200 + i), greedy(n_out));
    prompt_tokens += n_prompt;
    decode_rows += n_out - 1;
  }
  h.run_until_idle();
  const EngineMetrics& m = h.engine().metrics();
  int64_t steps = 0, prefill = 0, decode = 0, step_ns = 0;
  for (int i = 0; i < kStepKinds; ++i) {
    const StepKindCounters& k = m.step_kinds[static_cast<size_t>(i)];
    SCOPED_TRACE(kStepKindNames[i]);
    EXPECT_GT(k.steps.load(), 0) << "the load was meant to produce every kind of step";
    EXPECT_GT(k.forward_time_ns.load(), 0);
    EXPECT_GE(k.step_time_ns.load(), k.forward_time_ns.load());
    steps += k.steps;
    prefill += k.prefill_tokens;
    decode += k.decode_rows;
    step_ns += k.step_time_ns;
  }
  EXPECT_EQ(m.step_kinds[static_cast<size_t>(StepKind::kDecode)].prefill_tokens.load(), 0);
  EXPECT_EQ(m.step_kinds[static_cast<size_t>(StepKind::kPrefill)].decode_rows.load(), 0);
  EXPECT_GT(m.step_kinds[static_cast<size_t>(StepKind::kMixed)].prefill_tokens.load(), 0);
  EXPECT_GT(m.step_kinds[static_cast<size_t>(StepKind::kMixed)].decode_rows.load(), 0);
  EXPECT_EQ(steps, m.steps.load());
  EXPECT_EQ(step_ns, m.step_time_ns_total.load());
  EXPECT_EQ(prefill, prompt_tokens);
  EXPECT_EQ(decode, decode_rows);
  h.expect_no_leak();
}

// The engine tests that every architecture must pass (dense, routed experts,
// recurrent state): the model under test is the parameter.
class EngineArchs : public ::testing::TestWithParam<std::string> {
 protected:
  testing::LoadedTinyModel& loaded() const { return testing::tiny_f16(GetParam()); }
  Model& model() const { return *loaded().model; }
};

TEST_P(EngineArchs, ConcurrentGreedyRequestsEqualTheirAloneOutput) {
  Harness h(small_config(), loaded());
  std::vector<uint64_t> ids;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 32; ++i) {
    prompts.push_back(prompt_of(3 + (i * 7) % 29, i));
    ids.push_back(h.submit(prompts.back(), greedy(4 + i % 9)));
  }
  h.run_until_idle();
  for (size_t i = 0; i < ids.size(); ++i) {
    const Collected& c = h.result(ids[i]);
    ASSERT_TRUE(c.finished);
    EXPECT_EQ(c.tokens.at(0), greedy_alone(prompts[i], 4 + static_cast<int>(i) % 9, model())) << "request " << i;
    EXPECT_EQ(c.finish.at(0), FinishReason::kLength);
    EXPECT_EQ(c.outputs_after_finish, 0);
  }
  h.expect_no_leak();
}

TEST_P(EngineArchs, PreemptionUnderASmallPoolKeepsGreedyOutput) {
  EngineConfig cfg = small_config();
  cfg.kv_cache_bytes = 0;  // computed below: room for few blocks
  {
    Model& m = model();
    cfg.kv_cache_bytes = static_cast<int64_t>(KvPool::bytes_per_block(m.kv_shape(1, cfg.block_size, cfg.kv_dtype))) * 24;
  }
  cfg.enable_prefix_caching = false;
  Harness h(cfg, loaded());
  std::vector<uint64_t> ids;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) {
    prompts.push_back(prompt_of(9 + i, 40 + i));
    ids.push_back(h.submit(prompts.back(), greedy(24)));
  }
  h.run_until_idle();
  EXPECT_GT(h.engine().metrics().preemptions.load(), 0) << "the pool was meant to be too small for all at once";
  for (size_t i = 0; i < ids.size(); ++i)
    EXPECT_EQ(h.result(ids[i]).tokens.at(0), greedy_alone(prompts[i], 24, model())) << "request " << i;
  h.expect_no_leak();
}

TEST(Engine, PrefixCacheReusesBlocksAndReportsCachedTokens) {
  Harness h(small_config());
  const std::vector<int32_t> prompt = prompt_of(22, 5);
  const uint64_t a = h.submit(prompt, greedy(5));
  h.run_until_idle();
  const uint64_t b = h.submit(prompt, greedy(5));
  h.run_until_idle();
  EXPECT_EQ(h.result(a).cached_tokens, 0);
  EXPECT_EQ(h.result(b).cached_tokens, 20);  // 5 full blocks of 4; the last token is always computed
  EXPECT_EQ(h.result(a).tokens.at(0), h.result(b).tokens.at(0));
  EXPECT_GT(h.engine().kv_stats().prefix_hits_tokens, 0);
  h.expect_no_leak();
}

TEST_P(EngineArchs, ParallelSamplingSiblingsForkAndAreReproducible) {
  auto run = [this](uint64_t seed, int salt_requests) {
    Harness h(small_config(), loaded());
    for (int i = 0; i < salt_requests; ++i) h.submit(prompt_of(7 + i, 200 + i), greedy(6));
    SamplingParams p;
    p.temperature = 1.0f;
    p.n = 4;
    p.best_of = 4;
    p.max_tokens = 12;
    p.seed = seed;
    p.ignore_eos = true;
    const uint64_t id = h.submit(prompt_of(13, 9), p);  // 13 tokens: the last prompt block is shared and partial
    h.run_until_idle();
    h.expect_no_leak();
    return h.result(id).tokens;
  };
  const auto alone = run(7, 0);
  const auto crowded = run(7, 5);
  ASSERT_EQ(alone.size(), 4u);
  EXPECT_EQ(alone, crowded) << "a seeded request samples the same tokens whatever else runs";
  int distinct = 0;
  for (int i = 1; i < 4; ++i) distinct += alone.at(i) != alone.at(0);
  EXPECT_GT(distinct, 0) << "siblings draw from distinct streams";
  EXPECT_NE(run(8, 0), alone);
}

TEST_P(EngineArchs, GreedySiblingsAllEqualTheAloneOutput) {
  Harness h(small_config(), loaded());
  SamplingParams p = greedy(10);
  p.n = 3;
  p.best_of = 3;
  const std::vector<int32_t> prompt = prompt_of(10, 3);
  const uint64_t id = h.submit(prompt, p);
  h.run_until_idle();
  const auto want = greedy_alone(prompt, 10, model());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(h.result(id).tokens.at(i), want);
  h.expect_no_leak();
}

TEST(Engine, BestOfGeneratesAllCandidatesWithLogprobs) {
  Harness h(small_config());
  SamplingParams p;
  p.temperature = 0.8f;
  p.n = 2;
  p.best_of = 5;
  p.max_tokens = 6;
  p.seed = 1;
  p.logprobs = 2;
  p.ignore_eos = true;
  const uint64_t id = h.submit(prompt_of(6, 1), p);
  h.run_until_idle();
  const Collected& c = h.result(id);
  EXPECT_EQ(c.tokens.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(c.n_logprobs.at(i), 6u);
    EXPECT_LT(c.cumulative_logprob.at(i), 0.0);
  }
}

TEST(Engine, StopTokenStopStringAndMaxTokensEndSequences) {
  Harness h(small_config());
  const std::vector<int32_t> prompt = prompt_of(8, 2);
  const auto want = greedy_alone(prompt, 8);
  SamplingParams by_token = greedy(8);
  by_token.stop_token_ids = {want[3]};
  const uint64_t a = h.submit(prompt, by_token);
  const uint64_t b = h.submit(prompt, greedy(8));
  h.run_until_idle();
  // The first occurrence of want[3] ends the sequence, with that token as the reason.
  size_t first = 0;
  while (want[first] != want[3]) ++first;
  EXPECT_EQ(h.result(a).tokens.at(0).size(), first + 1);
  EXPECT_EQ(h.result(a).finish.at(0), FinishReason::kStop);
  EXPECT_EQ(h.result(a).stop_reason.at(0), std::to_string(want[3]));
  EXPECT_EQ(h.result(b).finish.at(0), FinishReason::kLength);

  // A stop string taken from the middle of the full text cuts the text there.
  const std::string full = h.result(b).text.at(0);
  ASSERT_GE(full.size(), 4u);
  SamplingParams by_string = greedy(8);
  by_string.stop = {full.substr(full.size() / 2, 2)};
  const uint64_t c = h.submit(prompt, by_string);
  h.run_until_idle();
  EXPECT_EQ(h.result(c).finish.at(0), FinishReason::kStop);
  EXPECT_EQ(h.result(c).text.at(0), full.substr(0, full.find(by_string.stop[0])));
  h.expect_no_leak();
}

TEST_P(EngineArchs, AbortFreesEverythingInTheSameStep) {
  Harness h(small_config(), loaded());
  const uint64_t a = h.submit(prompt_of(30, 1), greedy(200));
  const uint64_t b = h.submit(prompt_of(12, 2), greedy(10));
  for (int i = 0; i < 5; ++i) h.engine().step();
  EXPECT_GT(h.engine().kv_stats().owned, 0);
  h.engine().abort_request(a);
  h.engine().abort_request(a);  // idempotent
  h.engine().abort_request(999);  // unknown: ignored
  h.engine().step();
  EXPECT_TRUE(h.result(a).finished);
  EXPECT_EQ(h.result(a).finish.at(0), FinishReason::kAbort);
  h.run_until_idle();
  EXPECT_TRUE(h.result(b).finished);
  h.expect_no_leak();
}


// A hybrid model (qwen3next): one recurrent-state slot per live sequence,
// siblings' slots taken at admission, every slot back after the drain.
TEST(EngineHybrid, StateSlotsBoundTheRunningSequencesAndAllComeBack) {
  testing::LoadedTinyModel& m = testing::tiny_f16("qwen3next");
  EngineConfig cfg = small_config();
  cfg.max_num_seqs = 3;  // three slots
  Harness h(cfg, m);
  EXPECT_EQ(h.engine().state_slots_total(), 3);
  SamplingParams p = greedy(6);
  p.n = 3;
  p.best_of = 3;
  const std::vector<int32_t> prompt = prompt_of(9, 4);
  const uint64_t a = h.submit(prompt, p);          // takes all three slots at admission
  const uint64_t b = h.submit(prompt_of(5, 6), greedy(6));  // waits for a slot
  int64_t most = 0;
  bool b_waited = false;
  while (h.engine().has_work()) {
    h.engine().step();
    most = std::max(most, h.engine().state_slots_used());
    if (!h.is_finished(a)) b_waited |= h.result(b).tokens.empty();
  }
  EXPECT_EQ(most, 3);
  EXPECT_TRUE(b_waited);
  const auto want = greedy_alone(prompt, 6, *m.model);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(h.result(a).tokens.at(i), want) << "sibling " << i << " forks the prompt's state";
  EXPECT_EQ(h.result(b).tokens.at(0), greedy_alone(prompt_of(5, 6), 6, *m.model));
  h.expect_no_leak();
}

// Prefix caching is off for a model with recurrent state (a cached block has
// no state after it), and says so in /metrics: the same prompt twice is
// computed twice and gives the same tokens.
TEST(EngineHybrid, PrefixCachingIsOffAndSaysWhy) {
  testing::LoadedTinyModel& m = testing::tiny_f16("qwen3next");
  Harness h(small_config(), m);
  const std::vector<int32_t> prompt = prompt_of(22, 5);
  const uint64_t a = h.submit(prompt, greedy(5));
  h.run_until_idle();
  const uint64_t b = h.submit(prompt, greedy(5));
  h.run_until_idle();
  EXPECT_EQ(h.result(b).cached_tokens, 0);
  EXPECT_EQ(h.result(a).tokens.at(0), h.result(b).tokens.at(0));
  EXPECT_TRUE(h.engine().metrics().prefix_caching_off_for_recurrent_state.load());
  EXPECT_EQ(h.engine().kv_stats().prefix_hits_tokens, 0);
  h.expect_no_leak();
  // A dense model with caching on reports nothing off.
  Harness dense(small_config());
  EXPECT_FALSE(dense.engine().metrics().prefix_caching_off_for_recurrent_state.load());
}

TEST(EngineHybrid, RefusesMoreSiblingsThanStateSlotsNamingWhatToChange) {
  testing::LoadedTinyModel& m = testing::tiny_f16("qwen3next");
  EngineConfig cfg = small_config();
  cfg.max_num_seqs = 2;
  Harness h(cfg, m);
  EngineRequest r;
  r.id = 5;
  r.prompt = prompt_of(6, 1);
  r.params = greedy(4);
  r.params.n = 3;
  r.params.best_of = 3;
  auto err = h.engine().add_request(r);
  ASSERT_TRUE(err.has_value());
  EXPECT_NE(err->find("3 recurrent-state slots"), std::string::npos) << *err;
  EXPECT_NE(err->find("--max-num-seqs"), std::string::npos) << *err;
  EXPECT_FALSE(h.engine().has_work());
}

INSTANTIATE_TEST_SUITE_P(Archs, EngineArchs, ::testing::Values("llama", "qwen3moe", "qwen3next"),
                         [](const auto& info) { return info.param; });

TEST(Engine, RejectsRequestsItCanNeverServe) {
  Harness h(small_config());
  SamplingParams p = greedy(10);
  EngineRequest r;
  r.id = 77;
  r.prompt = prompt_of(600, 1);  // the tiny model's context is 512
  r.params = p;
  auto err = h.engine().add_request(r);
  ASSERT_TRUE(err.has_value());
  EXPECT_NE(err->find("maximum context length"), std::string::npos) << *err;
  r.prompt = {};
  EXPECT_TRUE(h.engine().add_request(r).has_value());
  r.prompt = prompt_of(5, 1);
  r.params.best_of = 64;
  r.params.n = 64;
  r.params.max_tokens = 400;
  err = h.engine().add_request(r);
  ASSERT_TRUE(err.has_value());
  EXPECT_NE(err->find("KV blocks"), std::string::npos) << *err;
}

// The admission bound is the shared worst case (util/block_budget.h): every
// sibling after the first owns a copy of the prompt's partial last block. A
// pool of exactly that many blocks serves the request without preempting it;
// one block fewer refuses it.
TEST(Engine, AWorstCaseBudgetCountsEverySiblingsCopiedBlockAndIsExact) {
  const int32_t prompt_tokens = 13, n = 4, max_tokens = 12;  // 13 tokens in blocks of 4: the last is partial
  EngineConfig cfg = small_config();
  cfg.enable_prefix_caching = false;
  const int64_t need = worst_case_request_blocks(prompt_tokens, n, max_tokens, cfg.block_size);
  EXPECT_EQ(need, 7 + 3 * (3 + 1)) << "the first sequence's 25 tokens, then 3 x (12 outputs + a copied block)";
  const auto block_bytes = static_cast<int64_t>(
      KvPool::bytes_per_block(fixture().model->kv_shape(1, cfg.block_size, cfg.kv_dtype)));
  SamplingParams p;
  p.temperature = 1.0f;
  p.n = n;
  p.best_of = n;
  p.max_tokens = max_tokens;
  p.seed = 5;
  p.ignore_eos = true;
  {
    cfg.kv_cache_bytes = block_bytes * need;
    Harness h(cfg);
    const uint64_t id = h.submit(prompt_of(prompt_tokens, 3), p);
    h.run_until_idle();
    EXPECT_EQ(h.engine().metrics().preemptions.load(), 0);
    for (int i = 0; i < n; ++i) EXPECT_EQ(h.result(id).tokens[i].size(), static_cast<size_t>(max_tokens)) << i;
    h.expect_no_leak();
  }
  {
    cfg.kv_cache_bytes = block_bytes * (need - 1);
    Harness h(cfg);
    EngineRequest r;
    r.id = 1;
    r.prompt = prompt_of(prompt_tokens, 3);
    r.params = p;
    EngineCore::Refusal why = EngineCore::Refusal::kNone;
    EXPECT_TRUE(h.engine().add_request(r, &why).has_value());
    EXPECT_EQ(why, EngineCore::Refusal::kTooLargeForCache);
  }
}

TEST(Engine, LoopThreadServesRequestsAndIdlesWithABoundedWait) {
  Harness h(small_config());
  h.engine().start();
  const uint64_t hb0 = h.engine().heartbeat();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_GT(h.engine().heartbeat(), hb0) << "an idle loop still wakes up";
  const uint64_t id = h.submit(prompt_of(9, 4), greedy(5));
  for (int i = 0; i < 500 && !h.is_finished(id); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  h.engine().stop();
  EXPECT_TRUE(h.result(id).finished);
  EXPECT_EQ(h.result(id).tokens.at(0), greedy_alone(prompt_of(9, 4), 5));
}

}  // namespace
}  // namespace tandem
