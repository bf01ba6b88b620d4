// What the engine core receives and emits for one client request.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "engine/sampling_params.h"

namespace tandem {

enum class FinishReason { kNone, kStop, kLength, kAbort, kError };

// OpenAI's finish_reason strings ("stop", "length"; "abort" and "error" are
// tandem's for requests that ended early).
const char* finish_reason_name(FinishReason r);

// New output of one sequence (sibling) since the previous RequestOutput.
struct SequenceDelta {
  int32_t index = 0;                  // sibling index, 0..best_of-1
  std::vector<int32_t> tokens;        // new tokens
  std::vector<SampleResult> logprobs; // per new token, when logprobs were asked for
  std::string text;                   // new text (stop strings already applied)
  double cumulative_logprob = 0.0;    // of all tokens so far
  FinishReason finish = FinishReason::kNone;
  std::string stop_reason;            // the stop string, or the stop token id as text
};

struct RequestOutput {
  uint64_t request_id = 0;
  uint64_t step = 0;  // engine step that produced it
  std::vector<SequenceDelta> sequences;
  bool finished = false;  // every sibling has finished
  int32_t prompt_tokens = 0;
  int32_t cached_tokens = 0;  // prompt tokens served from the prefix cache
  std::string error;          // set when the request failed
};

// Called on the engine thread; must return quickly (push into a queue).
using OutputSink = std::function<void(RequestOutput&&)>;

struct EngineRequest {
  uint64_t id = 0;
  std::vector<int32_t> prompt;
  SamplingParams params;
  OutputSink sink;
};

}  // namespace tandem
