// Token sampling (bias, penalties, temperature, top-k, top-p, min-p, seeds,
// logprobs), request validation, and stop strings over streamed text.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "engine/sampling_params.h"
#include "engine/stop_checker.h"

namespace tandem {
namespace {

// Logits whose softmax is exactly `probs` (up to rounding).
std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> out;
  for (double p : probs) out.push_back(static_cast<float>(std::log(p)));
  return out;
}

std::vector<double> softmax_ref(const std::vector<float>& logits, double temperature = 1.0) {
  double max_l = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p;
  double sum = 0.0;
  for (float l : logits) {
    p.push_back(std::exp((l - max_l) / temperature));
    sum += p.back();
  }
  for (double& v : p) v /= sum;
  return p;
}

// Frequencies of n draws, one sampler (one stream) for all.
std::vector<int> histogram(const SamplingParams& params, const std::vector<float>& logits, int n,
                           uint64_t seed = 1234) {
  SequenceSampler sampler(params, seed, {});
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < n; ++i) {
    const int32_t t = sampler.sample(logits).token;
    EXPECT_GE(t, 0);
    EXPECT_LT(t, static_cast<int32_t>(logits.size()));
    ++counts[static_cast<size_t>(t)];
  }
  return counts;
}

int32_t greedy_with(const SamplingParams& params, const std::vector<float>& logits,
                    const std::vector<int32_t>& prompt, const std::vector<int32_t>& output) {
  SequenceSampler sampler(params, 7, prompt);
  for (int32_t t : output) sampler.accept(t);
  return sampler.sample(logits).token;
}

SamplingParams greedy_params() {
  SamplingParams p;
  p.temperature = 0.0f;
  return p;
}

TEST(SamplerTest, GreedyPicksFirstArgmaxWhateverTheSeed) {
  const std::vector<float> logits = {0.1f, 2.0f, -1.0f, 2.0f, 1.5f};
  for (uint64_t seed : {0ull, 1ull, 99ull, ~0ull}) {
    SequenceSampler sampler(greedy_params(), seed, {});
    for (int i = 0; i < 5; ++i) EXPECT_EQ(sampler.sample(logits).token, 1);
  }
  // top_k = 1 is greedy too, at any temperature.
  SamplingParams p;
  p.top_k = 1;
  p.temperature = 5.0f;
  EXPECT_EQ(histogram(p, logits, 200)[1], 200);
}

TEST(SamplerTest, SameSeedSameDrawsDifferentSeedsDiffer) {
  const std::vector<float> logits(100, 0.0f);
  SamplingParams p;
  auto draws = [&](uint64_t seed) {
    SequenceSampler sampler(p, seed, {});
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(sampler.sample(logits).token);
    return out;
  };
  EXPECT_EQ(draws(42), draws(42));
  EXPECT_NE(draws(42), draws(43));
  EXPECT_NE(draws(0), draws(1));
  // A uniform draw over 100 tokens: 64 equal draws would mean a stuck stream.
  const auto d = draws(5);
  EXPECT_GT(std::set<int32_t>(d.begin(), d.end()).size(), 30u);
}

TEST(SamplerTest, TemperatureFrequenciesMatchSoftmax) {
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, 3.0f, -1.0f, 2.5f};
  for (float temperature : {1.0f, 0.7f, 1.8f}) {
    SamplingParams p;
    p.temperature = temperature;
    const int n = 20000;
    const auto counts = histogram(p, logits, n);
    const auto expected = softmax_ref(logits, temperature);
    for (size_t i = 0; i < logits.size(); ++i) {
      // Standard error is at most 0.0036 here; 0.015 is about 4 of them.
      EXPECT_NEAR(counts[i] / static_cast<double>(n), expected[i], 0.015)
          << "token " << i << " at temperature " << temperature;
    }
  }
}

TEST(SamplerTest, TopKOnlyReturnsTheKBest) {
  std::vector<float> logits;
  for (int i = 0; i < 50; ++i) logits.push_back(static_cast<float>((i * 37) % 50) * 0.05f);
  // (i * 37) % 50 is 49 at i = 27 and 48 at i = 4 (23 is the inverse of 37).
  ASSERT_EQ(std::max_element(logits.begin(), logits.end()) - logits.begin(), 27);
  ASSERT_FLOAT_EQ(logits[4], 48 * 0.05f);
  SamplingParams p;
  p.top_k = 2;
  p.temperature = 3.0f;  // flat, so a leak would show
  const auto counts = histogram(p, logits, 4000);
  EXPECT_GT(counts[27], 0);
  EXPECT_GT(counts[4], 0);
  EXPECT_EQ(counts[27] + counts[4], 4000);
  // Renormalized over the two: p(27) = 1 / (1 + e^(-0.05 / 3)).
  EXPECT_NEAR(counts[27] / 4000.0, 1.0 / (1.0 + std::exp(-0.05 / 3.0)), 0.03);
}

TEST(SamplerTest, TopKTiesGoToTheLowerId) {
  SamplingParams p;
  p.top_k = 2;
  const auto counts = histogram(p, {1.0f, 3.0f, 3.0f, 3.0f}, 1000);
  EXPECT_EQ(counts[1] + counts[2], 1000);
}

TEST(SamplerTest, TopPKeepsExactlyTheNucleus) {
  const auto logits = logits_of({0.1, 0.5, 0.05, 0.3, 0.05});
  struct Case {
    float top_p;
    std::set<int> kept;
  };
  // Sorted: 1 (0.5), 3 (0.3), 0 (0.1), then 2 and 4 (0.05 each, 2 first).
  for (const Case& c : {Case{0.45f, {1}}, Case{0.75f, {1, 3}}, Case{0.85f, {1, 3, 0}},
                        Case{0.93f, {1, 3, 0, 2}}, Case{0.99f, {0, 1, 2, 3, 4}}}) {
    SamplingParams p;
    p.top_p = c.top_p;
    const auto counts = histogram(p, logits, 6000);
    double kept_mass = 0.0;
    for (int id : c.kept) kept_mass += std::exp(logits[static_cast<size_t>(id)]);
    for (int id = 0; id < 5; ++id) {
      if (c.kept.count(id)) {
        const double expected = std::exp(logits[static_cast<size_t>(id)]) / kept_mass;
        EXPECT_NEAR(counts[static_cast<size_t>(id)] / 6000.0, expected, 0.03)
            << "token " << id << " top_p " << c.top_p;
      } else {
        EXPECT_EQ(counts[static_cast<size_t>(id)], 0) << "token " << id << " top_p " << c.top_p;
      }
    }
  }
}

TEST(SamplerTest, TopPOverALargeShuffledVocab) {
  // 1000 tokens with geometrically falling probabilities, in a scrambled id
  // order; the nucleus is larger than the first partially sorted chunk.
  const int n_vocab = 1000;
  std::vector<int> rank_to_id(n_vocab);
  for (int r = 0; r < n_vocab; ++r) rank_to_id[static_cast<size_t>(r)] = (r * 617 + 11) % n_vocab;
  std::vector<float> logits(n_vocab);
  for (int r = 0; r < n_vocab; ++r)
    logits[static_cast<size_t>(rank_to_id[static_cast<size_t>(r)])] =
        -0.01f * static_cast<float>(r);
  const float top_p = 0.6f;
  const auto probs = softmax_ref(logits);
  size_t nucleus = 0;
  double cum = 0.0;
  while (cum < top_p) cum += probs[static_cast<size_t>(rank_to_id[nucleus++])];
  ASSERT_GT(nucleus, 64u);
  ASSERT_LT(nucleus, 200u);
  SamplingParams p;
  p.top_p = top_p;
  const auto counts = histogram(p, logits, 20000);
  std::set<int> kept(rank_to_id.begin(), rank_to_id.begin() + static_cast<ptrdiff_t>(nucleus));
  int in_nucleus = 0;
  for (int id = 0; id < n_vocab; ++id)
    if (kept.count(id)) in_nucleus += counts[static_cast<size_t>(id)];
  EXPECT_EQ(in_nucleus, 20000);
  // The least likely member is still drawn (expected about 60 times).
  EXPECT_GT(counts[static_cast<size_t>(rank_to_id[nucleus - 1])], 0);
}

TEST(SamplerTest, TopPActsOnTheTopKRenormalizedDistribution) {
  // After top_k = 3 the probabilities are 4/9, 3/9, 2/9: the first two reach
  // 0.72 (7/9); without renormalization (0.4 + 0.3 = 0.7) a third would join.
  const auto logits = logits_of({0.4, 0.3, 0.2, 0.1});
  SamplingParams p;
  p.top_k = 3;
  p.top_p = 0.72f;
  const auto counts = histogram(p, logits, 4000);
  EXPECT_EQ(counts[0] + counts[1], 4000);
  EXPECT_GT(counts[1], 0);
}

TEST(SamplerTest, MinPDropsUnlikelyTokens) {
  const auto logits = logits_of({0.5, 0.3, 0.15, 0.05});
  struct Case {
    float min_p;
    int n_kept;  // tokens 0..n_kept-1 survive
  };
  // Thresholds 0.5 * min_p: 0.1 keeps three, 0.25 two, 0.0 all.
  for (const Case& c : {Case{0.2f, 3}, Case{0.5f, 2}, Case{0.0f, 4}, Case{1.0f, 1}}) {
    SamplingParams p;
    p.min_p = c.min_p;
    const auto counts = histogram(p, logits, 4000);
    for (int id = 0; id < 4; ++id) {
      if (id < c.n_kept)
        EXPECT_GT(counts[static_cast<size_t>(id)], 0) << "min_p " << c.min_p << " token " << id;
      else
        EXPECT_EQ(counts[static_cast<size_t>(id)], 0) << "min_p " << c.min_p << " token " << id;
    }
  }
}

TEST(SamplerTest, LogitBiasForcesAndBans) {
  const std::vector<float> logits = {5.0f, 0.0f, 0.0f, 4.0f};
  SamplingParams force = greedy_params();
  force.logit_bias = {{2, 100.0f}};
  SequenceSampler greedy(force, 1, {});
  const auto r = greedy.sample(logits);
  EXPECT_EQ(r.token, 2);
  // The reported logprob is the model's, not the biased one.
  EXPECT_NEAR(r.logprob, std::log(softmax_ref(logits)[2]), 1e-5);

  force.temperature = 1.0f;
  EXPECT_EQ(histogram(force, logits, 1000)[2], 1000);

  SamplingParams ban;
  ban.logit_bias = {{0, -100.0f}};
  const auto counts = histogram(ban, logits, 2000);
  EXPECT_EQ(counts[0], 0);
  EXPECT_GT(counts[3], 1500);  // now the favourite
}

TEST(SamplerTest, RepetitionPenaltyDividesPositiveAndMultipliesNegative) {
  const std::vector<float> pos = {2.0f, 1.8f, -1.0f};
  SamplingParams p = greedy_params();
  p.repetition_penalty = 1.2f;  // 2 / 1.2 = 1.67 < 1.8
  EXPECT_EQ(greedy_with(p, pos, {0}, {}), 1);
  EXPECT_EQ(greedy_with(p, pos, {}, {0}), 1);     // output tokens count too
  EXPECT_EQ(greedy_with(p, pos, {2, 2}, {}), 0);  // unrelated tokens do not
  p.repetition_penalty = 1.1f;                    // 2 / 1.1 = 1.82 > 1.8
  EXPECT_EQ(greedy_with(p, pos, {0}, {}), 0);

  // -1.0 * 1.2 = -1.2 < -1.1; dividing instead would give -0.83 and keep token 0.
  const std::vector<float> neg = {-1.0f, -1.1f, -5.0f};
  p.repetition_penalty = 1.2f;
  EXPECT_EQ(greedy_with(p, neg, {0}, {}), 1);
  // A penalty below 1 encourages: 1.8 / 0.5 = 3.6 > 2.
  p.repetition_penalty = 0.5f;
  EXPECT_EQ(greedy_with(p, pos, {1}, {}), 1);
}

TEST(SamplerTest, FrequencyPenaltyScalesWithTheCount) {
  const std::vector<float> logits = {3.0f, 2.0f};
  SamplingParams p = greedy_params();
  p.frequency_penalty = 0.4f;
  EXPECT_EQ(greedy_with(p, logits, {}, {0, 0}), 0);        // 3 - 0.8 = 2.2
  EXPECT_EQ(greedy_with(p, logits, {}, {0, 0, 0}), 1);     // 3 - 1.2 = 1.8
  EXPECT_EQ(greedy_with(p, logits, {0, 0, 0, 0}, {}), 0);  // prompt tokens are not counted
  p.frequency_penalty = -0.6f;
  EXPECT_EQ(greedy_with(p, logits, {}, {1, 1}), 1);  // 2 + 1.2 = 3.2
}

TEST(SamplerTest, PresencePenaltyIgnoresTheCount) {
  const std::vector<float> logits = {3.0f, 2.0f};
  SamplingParams p = greedy_params();
  p.presence_penalty = 0.9f;
  EXPECT_EQ(greedy_with(p, logits, {}, {0, 0, 0, 0, 0}), 0);  // 2.1
  p.presence_penalty = 1.1f;
  EXPECT_EQ(greedy_with(p, logits, {}, {0}), 1);  // 1.9
  EXPECT_EQ(greedy_with(p, logits, {0}, {}), 0);  // prompt tokens are not penalized
  // Both together: 3 - 2 * 0.3 - 0.5 = 1.9.
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.3f;
  EXPECT_EQ(greedy_with(p, logits, {}, {0, 0}), 1);
  EXPECT_EQ(greedy_with(p, logits, {}, {0}), 0);  // 2.2
}

TEST(SamplerTest, LogprobsAreTheRawLogSoftmaxAndTopIsOrdered) {
  const std::vector<float> logits = {1.0f, 2.0f, 3.0f, 0.5f, 2.0f};
  const double log_z = std::log(std::exp(1.0) + 2 * std::exp(2.0) + std::exp(3.0) + std::exp(0.5));
  SamplingParams p = greedy_params();
  p.logprobs = 4;
  p.logit_bias = {{3, 10.0f}};  // changes the pick, not the reported numbers
  p.repetition_penalty = 2.0f;
  SequenceSampler sampler(p, 3, std::vector<int32_t>{2});
  const auto r = sampler.sample(logits);
  EXPECT_EQ(r.token, 3);
  EXPECT_NEAR(r.logprob, 0.5 - log_z, 1e-5);
  ASSERT_EQ(r.top.size(), 4u);
  const int32_t ids[] = {2, 1, 4, 0};  // the 2.0 tie goes to the lower id
  const double values[] = {3.0, 2.0, 2.0, 1.0};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(r.top[i].token, ids[i]) << i;
    EXPECT_NEAR(r.top[i].logprob, values[i] - log_z, 1e-5) << i;
  }

  p.logprobs = 0;  // only the sampled token's
  EXPECT_TRUE(SequenceSampler(p, 3, {}).sample(logits).top.empty());
  p.logprobs = 20;  // more than the vocabulary
  const auto all = SequenceSampler(p, 3, {}).sample(logits);
  ASSERT_EQ(all.top.size(), 5u);
  for (size_t i = 1; i < all.top.size(); ++i) EXPECT_GE(all.top[i - 1].logprob, all.top[i].logprob);
}

TEST(SamplerTest, SampledLogprobIgnoresTemperature) {
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f};
  const auto probs = softmax_ref(logits);
  SamplingParams p;
  p.temperature = 0.3f;
  SequenceSampler sampler(p, 11, {});
  for (int i = 0; i < 20; ++i) {
    const auto r = sampler.sample(logits);
    EXPECT_NEAR(r.logprob, std::log(probs[static_cast<size_t>(r.token)]), 1e-5);
  }
}

TEST(SamplerTest, LargeVocabularyAllModes) {
  // A Qwen-sized vocabulary: every path works and stays inside it.
  const int n_vocab = 151936;
  std::vector<float> logits(n_vocab);
  for (int i = 0; i < n_vocab; ++i)
    logits[static_cast<size_t>(i)] = static_cast<float>((i * 7919) % 1000) * 0.01f;
  std::vector<int32_t> prompt = {5, 1000, 151935};
  auto run = [&](SamplingParams p) {
    p.logprobs = 5;
    SequenceSampler sampler(p, 77, prompt);
    for (int i = 0; i < 8; ++i) {
      const auto r = sampler.sample(logits);
      EXPECT_GE(r.token, 0);
      EXPECT_LT(r.token, n_vocab);
      EXPECT_EQ(r.top.size(), 5u);
      sampler.accept(r.token);
    }
  };
  run(greedy_params());
  SamplingParams temp;
  temp.repetition_penalty = 1.3f;
  temp.frequency_penalty = 0.5f;
  run(temp);
  SamplingParams nucleus;
  nucleus.top_p = 0.9f;
  nucleus.min_p = 0.05f;
  run(nucleus);
  SamplingParams both;
  both.top_k = 40;
  both.top_p = 0.95f;
  run(both);
}

TEST(SamplerTest, DeriveSeedGivesDistinctSiblingStreams) {
  SamplingParams seeded;
  seeded.seed = 1234;
  std::set<uint64_t> seeds;
  for (int32_t i = 0; i < 16; ++i) {
    const uint64_t s = SequenceSampler::derive_seed(seeded, i, 999);
    // The request seed decides; the fallback entropy does not.
    EXPECT_EQ(s, SequenceSampler::derive_seed(seeded, i, 31337));
    seeds.insert(s);
  }
  EXPECT_EQ(seeds.size(), 16u);
  SamplingParams other;
  other.seed = 1235;
  EXPECT_NE(SequenceSampler::derive_seed(seeded, 0, 0), SequenceSampler::derive_seed(other, 0, 0));

  SamplingParams unseeded;
  EXPECT_NE(SequenceSampler::derive_seed(unseeded, 0, 1),
            SequenceSampler::derive_seed(unseeded, 0, 2));
  EXPECT_NE(SequenceSampler::derive_seed(unseeded, 0, 1),
            SequenceSampler::derive_seed(unseeded, 1, 1));
  EXPECT_EQ(SequenceSampler::derive_seed(unseeded, 3, 5),
            SequenceSampler::derive_seed(unseeded, 3, 5));

  // Siblings draw different sequences from the same logits.
  const std::vector<float> logits(50, 0.0f);
  std::vector<std::vector<int32_t>> draws;
  for (int32_t i = 0; i < 3; ++i) {
    SequenceSampler sampler(seeded, SequenceSampler::derive_seed(seeded, i, 0), {});
    draws.emplace_back();
    for (int k = 0; k < 32; ++k) draws.back().push_back(sampler.sample(logits).token);
  }
  EXPECT_NE(draws[0], draws[1]);
  EXPECT_NE(draws[1], draws[2]);
}

// --- SamplingParams::validate ---

TEST(SamplingParamsTest, DefaultsAndTypicalValuesAreValid) {
  EXPECT_EQ(SamplingParams{}.validate(1000), "");
  SamplingParams p;
  p.temperature = 0.0f;
  p.top_k = -1;
  p.top_p = 0.9f;
  p.min_p = 1.0f;
  p.repetition_penalty = 1.1f;
  p.presence_penalty = -2.0f;
  p.frequency_penalty = 2.0f;
  p.logit_bias = {{0, -100.0f}, {999, 100.0f}};
  p.seed = 5;
  p.max_tokens = 1;
  p.stop = {"\n\n", "。", "🛑"};
  p.stop_token_ids = {0, 999};
  p.n = 2;
  p.best_of = 3;
  p.logprobs = 20;
  EXPECT_EQ(p.validate(1000), "");
}

TEST(SamplingParamsTest, RejectsEachBadFieldByName) {
  struct Case {
    const char* field;
    void (*mutate)(SamplingParams&);
  };
  const Case cases[] = {
      {"temperature", [](SamplingParams& p) { p.temperature = -0.1f; }},
      {"temperature", [](SamplingParams& p) { p.temperature = 1000.0f; }},
      {"temperature", [](SamplingParams& p) { p.temperature = std::nanf(""); }},
      {"top_p", [](SamplingParams& p) { p.top_p = 0.0f; }},
      {"top_p", [](SamplingParams& p) { p.top_p = 1.01f; }},
      {"top_k", [](SamplingParams& p) { p.top_k = -2; }},
      {"min_p", [](SamplingParams& p) { p.min_p = -0.01f; }},
      {"min_p", [](SamplingParams& p) { p.min_p = 1.5f; }},
      {"repetition_penalty", [](SamplingParams& p) { p.repetition_penalty = 0.0f; }},
      {"repetition_penalty",
       [](SamplingParams& p) { p.repetition_penalty = std::numeric_limits<float>::infinity(); }},
      {"presence_penalty", [](SamplingParams& p) { p.presence_penalty = 2.5f; }},
      {"frequency_penalty", [](SamplingParams& p) { p.frequency_penalty = -2.5f; }},
      {"logit_bias",
       [](SamplingParams& p) {
         p.logit_bias = {{1000, 1.0f}};
       }},
      {"logit_bias",
       [](SamplingParams& p) {
         p.logit_bias = {{-1, 1.0f}};
       }},
      {"logit_bias",
       [](SamplingParams& p) {
         p.logit_bias = {{3, 101.0f}};
       }},
      {"max_tokens", [](SamplingParams& p) { p.max_tokens = 0; }},
      {"n", [](SamplingParams& p) { p.n = 0; }},
      {"best_of",
       [](SamplingParams& p) {
         p.n = 3;
         p.best_of = 2;
       }},
      {"logprobs", [](SamplingParams& p) { p.logprobs = -2; }},
      {"logprobs", [](SamplingParams& p) { p.logprobs = 21; }},
      {"stop",
       [](SamplingParams& p) {
         p.stop = {"ok", ""};
       }},
      {"stop", [](SamplingParams& p) { p.stop = std::vector<std::string>(17, "x"); }},
      {"stop", [](SamplingParams& p) { p.stop = {"\xC3"}; }},      // truncated UTF-8
      {"stop", [](SamplingParams& p) { p.stop = {"\xC0\xAF"}; }},  // overlong
      {"stop_token_ids", [](SamplingParams& p) { p.stop_token_ids = {1000}; }},
      {"stop_token_ids", [](SamplingParams& p) { p.stop_token_ids = {-1}; }},
  };
  for (const Case& c : cases) {
    SamplingParams p;
    c.mutate(p);
    const std::string msg = p.validate(1000);
    EXPECT_NE(msg.find(c.field), std::string::npos) << "expected '" << c.field << "' in: " << msg;
  }
  // The message carries the value and the range.
  SamplingParams p;
  p.top_p = 1.5f;
  EXPECT_EQ(p.validate(10), "top_p must be in (0, 1], got 1.5");
  p = SamplingParams{};
  p.logit_bias = {{10, 1.0f}};
  EXPECT_EQ(p.validate(10), "logit_bias token id must be in [0, 10), got 10");
}

// --- StopChecker ---

// Feeds chunks; returns everything emitted (then the flush when not stopped).
struct Fed {
  std::string text;
  bool stopped = false;
  std::string matched;
};
Fed feed(StopChecker& checker, const std::vector<std::string>& chunks) {
  Fed out;
  for (const auto& c : chunks) {
    auto r = checker.push(c);
    EXPECT_FALSE(out.stopped && !r.text.empty()) << "text emitted after the stop";
    out.text += r.text;
    if (r.stopped && !out.stopped) {
      out.stopped = true;
      out.matched = r.matched;
    }
  }
  if (!out.stopped) out.text += checker.flush();
  return out;
}

bool is_valid_utf8(const std::string& s) {
  SamplingParams p;
  p.stop = {s};
  return s.empty() || p.validate(1) == "";
}

TEST(StopCheckerTest, StopInsideOneChunk) {
  StopChecker c({"STOP"}, false);
  const auto r = c.push("hello STOP world");
  EXPECT_EQ(r.text, "hello ");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.matched, "STOP");
  EXPECT_TRUE(c.stopped());
}

TEST(StopCheckerTest, StopSplitAcrossTwoAndThreeChunks) {
  {
    StopChecker c({"STOP"}, false);
    auto r = c.push("hello ST");
    EXPECT_EQ(r.text, "hello ");
    EXPECT_FALSE(r.stopped);
    r = c.push("OP more");
    EXPECT_EQ(r.text, "");
    EXPECT_TRUE(r.stopped);
    EXPECT_EQ(r.matched, "STOP");
  }
  {
    StopChecker c({"STOP"}, false);
    EXPECT_EQ(c.push("x S").text, "x ");
    EXPECT_EQ(c.push("T").text, "");
    EXPECT_EQ(c.push("O").text, "");
    const auto r = c.push("P!");
    EXPECT_TRUE(r.stopped);
    EXPECT_EQ(r.text, "");
  }
}

TEST(StopCheckerTest, PrefixThatDoesNotMatchIsReleased) {
  StopChecker c({"</end>"}, false);
  EXPECT_EQ(c.push("a</e").text, "a");
  EXPECT_EQ(c.push("x").text, "</ex");
  EXPECT_EQ(c.push("<").text, "");
  EXPECT_EQ(c.push("/").text, "");
  EXPECT_EQ(c.flush(), "</");
  EXPECT_FALSE(c.stopped());
  // A held prefix whose tail starts another candidate: "aab" in "aaab".
  StopChecker d({"aab"}, false);
  EXPECT_EQ(d.push("aa").text, "");
  const auto r = d.push("ab");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "a");
}

TEST(StopCheckerTest, OverlappingCandidates) {
  // "ab" completes before "abc" could, whatever the order of the list.
  for (const auto& stops :
       {std::vector<std::string>{"abc", "ab"}, std::vector<std::string>{"ab", "abc"}}) {
    StopChecker c(stops, false);
    EXPECT_EQ(c.push("xa").text, "x");
    const auto r = c.push("bc");
    EXPECT_TRUE(r.stopped);
    EXPECT_EQ(r.matched, "ab");
    EXPECT_EQ(r.text, "");
  }
  // Two stops sharing a prefix; the text follows neither to the end.
  StopChecker c({"abc", "abd"}, false);
  EXPECT_EQ(c.push("ab").text, "");
  EXPECT_EQ(c.push("e").text, "abe");
}

TEST(StopCheckerTest, IncludeStopInOutput) {
  StopChecker c({"STOP"}, true);
  EXPECT_EQ(c.push("hi ST").text, "hi ");
  const auto r = c.push("OP there");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "STOP");
}

TEST(StopCheckerTest, EarliestStopInTheTextWins) {
  for (const auto& stops :
       {std::vector<std::string>{"world", "lo"}, std::vector<std::string>{"lo", "world"}}) {
    StopChecker c(stops, false);
    const auto r = c.push("hello world");
    EXPECT_TRUE(r.stopped);
    EXPECT_EQ(r.matched, "lo");
    EXPECT_EQ(r.text, "hel");
  }
  // One stop inside another: the inner one completes first, so it wins, in
  // one chunk as well as byte by byte.
  StopChecker one({"abcd", "bc"}, false);
  const Fed whole = feed(one, {"xabcd"});
  StopChecker bytes({"abcd", "bc"}, false);
  const Fed split = feed(bytes, {"x", "a", "b", "c", "d"});
  EXPECT_EQ(whole.matched, "bc");
  EXPECT_EQ(whole.text, "xa");
  EXPECT_EQ(split.matched, whole.matched);
  EXPECT_EQ(split.text, whole.text);
}

TEST(StopCheckerTest, SameOutcomeForEveryChunking) {
  const std::string text = "one two <|im_end|> three";
  const std::vector<std::string> stops = {"<|im_end|>", "<|im_start|>", "two <x"};
  StopChecker ref_checker(stops, false);
  const Fed ref = feed(ref_checker, {text});
  EXPECT_EQ(ref.text, "one two ");
  EXPECT_EQ(ref.matched, "<|im_end|>");
  // Every split into two and three chunks.
  for (size_t i = 0; i <= text.size(); ++i) {
    for (size_t j = i; j <= text.size(); ++j) {
      StopChecker c(stops, false);
      const Fed f = feed(c, {text.substr(0, i), text.substr(i, j - i), text.substr(j)});
      EXPECT_EQ(f.text, ref.text) << i << " " << j;
      EXPECT_EQ(f.matched, ref.matched) << i << " " << j;
    }
  }
}

TEST(StopCheckerTest, FlushReleasesHeldText) {
  StopChecker c({"<eos>"}, false);
  EXPECT_EQ(c.push("abc <e").text, "abc ");
  EXPECT_EQ(c.flush(), "<e");
  EXPECT_EQ(c.flush(), "");
  StopChecker none({}, false);
  EXPECT_EQ(none.push("<eos>").text, "<eos>");
  EXPECT_EQ(none.flush(), "");
}

TEST(StopCheckerTest, NothingAfterStopping) {
  StopChecker c({"END"}, true);
  EXPECT_EQ(c.push("a END b").text, "a END");
  const auto r = c.push("more text");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "");
  EXPECT_EQ(c.flush(), "");
  EXPECT_TRUE(c.stopped());
}

TEST(StopCheckerTest, MultiByteStopStrings) {
  {
    StopChecker c({"。"}, false);
    const auto r = c.push("你好。再见");
    EXPECT_TRUE(r.stopped);
    EXPECT_EQ(r.text, "你好");
  }
  {
    StopChecker c({"🛑"}, true);
    EXPECT_EQ(c.push("go ").text, "go ");
    const auto r = c.push("🛑 now");
    EXPECT_TRUE(r.stopped);
    EXPECT_EQ(r.text, "🛑");
  }
  {
    // A two-character stop split across chunks, then a near miss.
    StopChecker c({"再见"}, false);
    EXPECT_EQ(c.push("你再").text, "你");
    EXPECT_EQ(c.push("来").text, "再来");
    EXPECT_EQ(c.push("再").text, "");
    const auto r = c.push("见了");
    EXPECT_TRUE(r.stopped);
    EXPECT_EQ(r.text, "");
  }
  {
    // Stops sharing a lead byte with the text (é = C3 A9, ã = C3 A3): held
    // text is always whole characters.
    StopChecker c({"éa", "👋🏻x"}, false);
    const std::vector<std::string> chunks = {"ã", "é", "ã", "👋", "🏻", "y", "é", "b", "👋", "é"};
    std::string all;
    for (const auto& ch : chunks) {
      const auto r = c.push(ch);
      EXPECT_TRUE(is_valid_utf8(r.text)) << r.text;
      EXPECT_FALSE(r.stopped);
      all += r.text;
    }
    const std::string rest = c.flush();
    EXPECT_TRUE(is_valid_utf8(rest));
    EXPECT_EQ(all + rest, "ãéã👋🏻yéb👋é");
  }
}

}  // namespace
}  // namespace tandem
