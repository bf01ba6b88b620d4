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

// What a prefill/decode transfer needs to hear about a request's KV
// (EngineRequest::kv_role other than kLocal).
enum class KvEvent : uint8_t {
  kNone,
  kPrefillComputed,   // prefill: the KV of the prompt's first N-1 tokens is in kv_blocks
  kAllocated,         // decode: kv_blocks will hold the first N-1 tokens' KV
                      // (an allocation waits for free blocks; it never fails)
};

struct RequestOutput {
  uint64_t request_id = 0;
  uint64_t step = 0;  // engine step that produced it
  std::vector<SequenceDelta> sequences;
  bool finished = false;  // every sibling has finished
  int32_t prompt_tokens = 0;
  int32_t cached_tokens = 0;  // prompt tokens served from the prefix cache
  std::string error;          // set when the request failed
  // P/D: the request's KV. The blocks carry one reference held for the
  // transfer, dropped by EngineCore::release_transfer_blocks.
  KvEvent kv_event = KvEvent::kNone;
  std::vector<int32_t> kv_blocks;
  int32_t kv_cached_blocks = 0;  // leading kv_blocks that were prefix-cache hits (decode)
};

// Called on the engine thread; must return quickly (push into a queue).
using OutputSink = std::function<void(RequestOutput&&)>;

// How a request's prompt KV comes to be.
enum class KvRole : uint8_t {
  kLocal,        // computed here, then decoded here
  kPrefillOnly,  // prefill instance: compute prompt[0, N-1) and hold it (no sampling)
  kRemoteKv,     // decode instance: allocate for prompt[0, N-1), wait for the KV to
                 // arrive from a prefill, then compute token N and decode
};

struct EngineRequest {
  uint64_t id = 0;
  KvRole kv_role = KvRole::kLocal;
  std::vector<int32_t> prompt;
  SamplingParams params;
  OutputSink sink;
};

}  // namespace tandem
