#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/ops.h"
#include "util/error.h"

namespace tandem {

namespace {

constexpr uint64_t kGoldenGamma = 0x9E3779B97F4A7C15ull;

// The splitmix64 output function: a bijective 64-bit mix.
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// splitmix64: a 64-bit state is all the header keeps per sequence, it passes
// BigCrush, and it is specified bit for bit, so a seed gives the same stream
// with every compiler and standard library (std:: distributions do not).
uint64_t next_u64(uint64_t& state) {
  state += kGoldenGamma;
  return mix64(state);
}

// Uniform in [0, 1) with 53 random bits.
double next_unit(uint64_t& state) { return static_cast<double>(next_u64(state) >> 11) * 0x1.0p-53; }

// Candidates before a partial sort of the nucleus is widened; most nuclei are
// far smaller than this, so top-p over a 152k vocabulary is usually O(V).
constexpr int64_t kFirstNucleusChunk = 64;

}  // namespace

SequenceSampler::SequenceSampler(const SamplingParams& params, uint64_t seed,
                                 std::span<const int32_t> prompt)
    : params_(params), rng_state_(seed) {
  for (int32_t token : prompt) {
    TANDEM_ASSERT(token >= 0, "negative prompt token " + std::to_string(token));
    if (static_cast<size_t>(token) >= in_prompt_.size())
      in_prompt_.resize(static_cast<size_t>(token) + 1, 0);
    in_prompt_[static_cast<size_t>(token)] = 1;
  }
}

void SequenceSampler::accept(int32_t token) {
  TANDEM_ASSERT(token >= 0, "negative output token " + std::to_string(token));
  const auto t = static_cast<size_t>(token);
  if (t >= output_counts_.size()) output_counts_.resize(t + 1, 0);
  ++output_counts_[t];
}

uint64_t SequenceSampler::derive_seed(const SamplingParams& params, int32_t index,
                                      uint64_t fallback_entropy) {
  TANDEM_ASSERT(index >= 0);
  const uint64_t base = params.seed ? *params.seed : fallback_entropy;
  // mix64 is a bijection and the gamma is odd, so for one base every index
  // yields a different state; the outer mix decorrelates neighbouring indices.
  return mix64(mix64(base) + (static_cast<uint64_t>(index) + 1) * kGoldenGamma);
}

SampleResult SequenceSampler::sample(std::span<const float> logits) {
  const auto n_vocab = static_cast<int64_t>(logits.size());
  TANDEM_ASSERT(n_vocab > 0);
  const float* raw = logits.data();
  SampleResult result;

  // Log-partition of the raw logits: logprobs and best_of ranking use the
  // model's own distribution, whatever the request does to it afterwards.
  // Vectorized: a scalar pass of std::exp over a 152k vocabulary took about
  // 1 ms a row, a fifth of a 64-row serving step.
  const double log_z = kernels::log_sum_exp(raw, n_vocab);
  // A NaN anywhere, or an infinite logit, propagates here.
  if (!std::isfinite(log_z))
    throw NonFiniteLogits(
        "the model produced logits that are NaN or infinite: its weights hold NaN or Inf values, or its activations "
        "overflowed (some models overflow in F16 but not in BF16 or F32: try the file in another type)");
  auto raw_logprob = [&](int64_t token) { return static_cast<float>(raw[token] - log_z); };

  // The k best by raw logit, kept sorted in a small array: O(V) for k <= 20,
  // and no vocab-sized index array. Scanning ids in order, a tie with the
  // current k-th never displaces it, so ties go to the lower id.
  if (params_.logprobs > 0) {
    const auto k = static_cast<size_t>(std::min<int64_t>(params_.logprobs, n_vocab));
    auto& top = result.top;
    top.reserve(k + 1);
    for (int64_t i = 0; i < n_vocab; ++i) {
      const float v = raw[i];
      if (top.size() == k && !(v > top.back().logprob)) continue;
      auto pos =
          std::upper_bound(top.begin(), top.end(), v,
                           [](float value, const TokenLogprob& e) { return value > e.logprob; });
      top.insert(pos, TokenLogprob{static_cast<int32_t>(i), v});
      if (top.size() > k) top.pop_back();
    }
    for (auto& e : top) e.logprob = raw_logprob(e.token);
  }

  const float rep = params_.repetition_penalty;
  const float presence = params_.presence_penalty;
  const float frequency = params_.frequency_penalty;
  const bool rep_on = rep != 1.0f;
  const bool greedy = params_.temperature == 0.0f || params_.top_k == 1;
  if (greedy && params_.logit_bias.empty() && !rep_on && presence == 0.0f && frequency == 0.0f) {
    // Nothing changes the logits: no copy of the row.
    result.token = static_cast<int32_t>(kernels::argmax(raw, n_vocab));
    result.logprob = raw_logprob(result.token);
    return result;
  }

  auto& s = scratch_;
  s.assign(raw, raw + n_vocab);

  for (const auto& [token, bias] : params_.logit_bias) {
    TANDEM_ASSERT(token >= 0 && token < n_vocab, "logit_bias token out of range (not validated?)");
    s[static_cast<size_t>(token)] += bias;
  }

  if (rep_on || presence != 0.0f || frequency != 0.0f) {
    // Ids past both arrays were never seen.
    const auto n_seen = std::min<size_t>(static_cast<size_t>(n_vocab),
                                         std::max(in_prompt_.size(), output_counts_.size()));
    for (size_t i = 0; i < n_seen; ++i) {
      const int32_t count = i < output_counts_.size() ? output_counts_[i] : 0;
      const bool seen = count > 0 || (i < in_prompt_.size() && in_prompt_[i] != 0);
      if (!seen) continue;
      float& l = s[i];
      // Dividing a negative logit would raise it, so those are multiplied.
      if (rep_on) l = l > 0.0f ? l / rep : l * rep;
      if (count > 0) l -= frequency * static_cast<float>(count) + presence;
    }
  }

  int64_t token = 0;
  if (greedy) {
    // Greedy takes no random draw, so a greedy step never shifts the stream.
    token = kernels::argmax(s.data(), n_vocab);
  } else {
    token = draw(n_vocab);
  }
  result.token = static_cast<int32_t>(token);
  result.logprob = raw_logprob(token);
  return result;
}

int64_t SequenceSampler::draw(int64_t n_vocab) {
  auto& s = scratch_;
  float max_l = s[0];
  for (int64_t i = 1; i < n_vocab; ++i) max_l = std::max(max_l, s[i]);
  TANDEM_ASSERT(std::isfinite(max_l), "processed logits are not finite");
  const float temperature = params_.temperature;
  // Unnormalized probability relative to the most likely token, which gets 1;
  // so min-p (prob < min_p * max prob) is simply weight < min_p.
  auto weight = [&](int64_t i) { return std::exp((s[i] - max_l) / temperature); };
  const float min_p = params_.min_p;

  const bool use_top_k = params_.top_k > 0 && params_.top_k < n_vocab;
  const bool use_top_p = params_.top_p < 1.0f;

  if (!use_top_k && !use_top_p) {
    // Pure temperature (and min-p): three O(V) passes, no index array.
    double total = 0.0;
    for (int64_t i = 0; i < n_vocab; ++i) {
      float w = weight(i);
      if (w < min_p) w = 0.0f;
      s[i] = w;
      total += w;
    }
    const double target = next_unit(rng_state_) * total;
    double cum = 0.0;
    int64_t last_positive = 0;
    for (int64_t i = 0; i < n_vocab; ++i) {
      if (s[i] <= 0.0f) continue;
      cum += s[i];
      last_positive = i;
      if (target < cum) return i;
    }
    return last_positive;  // target rounded up to total
  }

  // Candidates in a total order (logit, then lower id), so the kept set and
  // the walk below do not depend on how the standard library's nth_element
  // or sort arrange equal elements.
  auto& idx = index_scratch_;
  idx.resize(static_cast<size_t>(n_vocab));
  std::iota(idx.begin(), idx.end(), 0);
  auto better = [&](int32_t a, int32_t b) { return s[a] > s[b] || (s[a] == s[b] && a < b); };
  int64_t n = n_vocab;
  if (use_top_k) {
    n = params_.top_k;
    std::nth_element(idx.begin(), idx.begin() + n, idx.end(), better);
  }
  if (use_top_p) {
    // Nucleus of the (top-k renormalized) distribution: the shortest prefix in
    // descending order whose mass reaches top_p. Widen a sorted prefix until
    // it holds the nucleus, instead of sorting everything.
    double total = 0.0;
    for (int64_t j = 0; j < n; ++j) total += weight(idx[j]);
    const double threshold = static_cast<double>(params_.top_p) * total;
    double cum = 0.0;
    int64_t sorted = 0;
    int64_t keep = n;
    int64_t chunk = std::min(n, kFirstNucleusChunk);
    for (;;) {
      std::nth_element(idx.begin() + sorted, idx.begin() + chunk, idx.begin() + n, better);
      std::sort(idx.begin() + sorted, idx.begin() + chunk, better);
      for (; sorted < chunk; ++sorted) {
        if (cum >= threshold) break;  // the first token always gets in: threshold > 0
        cum += weight(idx[sorted]);
      }
      if (sorted < chunk || chunk == n) {
        keep = sorted;
        break;
      }
      chunk = std::min(n, chunk * 4);
    }
    n = keep;
  } else {
    std::sort(idx.begin(), idx.begin() + n, better);
  }

  // Weights of the kept candidates, min-p, and the draw, in the sorted order.
  double total = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    float w = weight(idx[j]);
    if (w < min_p) w = 0.0f;
    s[idx[j]] = w;
    total += w;
  }
  const double target = next_unit(rng_state_) * total;
  double cum = 0.0;
  int64_t last_positive = idx[0];
  for (int64_t j = 0; j < n; ++j) {
    const float w = s[idx[j]];
    if (w <= 0.0f) continue;
    cum += w;
    last_positive = idx[j];
    if (target < cum) return idx[j];
  }
  return last_positive;
}

}  // namespace tandem
