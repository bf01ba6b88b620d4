// Token sampling for one sequence: logit bias, penalties, temperature, top-k,
// top-p, min-p, seeded randomness, and log-probabilities.
//
// A sequence's sampler owns its random stream, so a seeded request samples
// the same tokens whatever else shares the batch (the logits themselves are
// batch-invariant). Siblings of one request (n > 1) get distinct streams
// derived from the request seed and their index.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/sampling_params.h"
#include "util/error.h"

namespace tandem {

// Logits with a NaN or an infinity: the model's output, so a property of
// the weights a user brought (NaN or Inf in a tensor, or activations that
// overflow, as some models do in F16), not of tandem's logic. The request
// fails with the message; the server goes on.
class NonFiniteLogits : public Error {
 public:
  using Error::Error;
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

struct SampleResult {
  int32_t token = 0;
  // log_softmax of the raw logits (before bias, penalties and temperature),
  // as vLLM reports them; also what best_of ranks by.
  float logprob = 0.0f;
  std::vector<TokenLogprob> top;  // params.logprobs alternatives, most likely first
};

class SequenceSampler {
 public:
  // `seed` is the stream of this sequence (see derive_seed).
  SequenceSampler(const SamplingParams& params, uint64_t seed, std::span<const int32_t> prompt);

  // Samples from `logits` (n_vocab raw values; not modified). Throws
  // NonFiniteLogits when one of them is NaN or infinite.
  SampleResult sample(std::span<const float> logits);
  // Records a token as part of the output (for the penalties).
  void accept(int32_t token);

  // The stream of sibling `index` of a request: from the request seed when
  // given, otherwise from `fallback_entropy`.
  static uint64_t derive_seed(const SamplingParams& params, int32_t index, uint64_t fallback_entropy);

 private:
  // The random part of sample(): temperature, top-k, top-p, min-p and the draw
  // over scratch_ (the biased, penalized logits); returns the token id.
  int64_t draw(int64_t n_vocab);
  SamplingParams params_;
  uint64_t rng_state_;
  std::vector<uint8_t> in_prompt_;      // per token id (sparse ids are fine: vocab-sized)
  std::vector<int32_t> output_counts_;  // per token id
  std::vector<float> scratch_;
  std::vector<int32_t> index_scratch_;
};

}  // namespace tandem
