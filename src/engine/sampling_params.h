// Per-request sampling settings, as the OpenAI API and vLLM define them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tandem {

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy
  int32_t top_k = 0;         // 0 or -1 = disabled
  float top_p = 1.0f;        // 1 = disabled
  float min_p = 0.0f;        // 0 = disabled
  // vLLM semantics: repetition_penalty (> 1 discourages) applies to tokens seen
  // in the prompt or the output; presence/frequency penalties to output tokens.
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::vector<std::pair<int32_t, float>> logit_bias;  // added to the raw logits
  std::optional<uint64_t> seed;  // same seed, same output, whatever else runs
  int32_t max_tokens = 16;
  std::vector<std::string> stop;      // stop strings (also across token boundaries)
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  bool include_stop_str_in_output = false;
  int32_t n = 1;        // sequences returned
  int32_t best_of = 1;  // sequences generated (>= n); the n best by cumulative logprob are returned
  int32_t logprobs = -1;  // -1: none; k >= 0: the sampled token's logprob and the top k alternatives

  // Empty when valid; otherwise a message naming the field and its allowed range.
  std::string validate(int64_t n_vocab) const;
};

}  // namespace tandem
