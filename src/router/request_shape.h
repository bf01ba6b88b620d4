// What the router can tell of a request's size before an instance has
// tokenized it, and the block credits that size needs on each leg.
//
// The prompt's token count is not known at the router (it loads no
// tokenizer): it is bounded by its bytes (every token of a byte-level or
// byte-fallback vocabulary covers at least one byte) plus room for the chat
// template's tokens. The prefill's acceptance then reports the exact counts
// and the reservations are corrected (RouterServer::generate).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>

namespace tandem::router {

struct RequestShape {
  int64_t prompt_tokens = 1;   // an upper bound until corrected
  int64_t n_sequences = 1;     // best_of (or n)
  int64_t max_tokens = 0;      // 0: not given (the context's rest)
};

// Tokens a chat template may add around each message, and around them all.
constexpr int64_t kChatTokensPerMessage = 16;
constexpr int64_t kChatTokensPerRequest = 64;

RequestShape estimate_shape(const nlohmann::json& body, bool chat);

// The blocks each leg reserves: the prefill holds the KV of the prompt's
// first N-1 tokens; the decode the worst case of every sequence. A prompt
// estimate beyond the context counts as the context (the instance refuses
// what does not fit).
int64_t prefill_credits(const RequestShape& s, int64_t block_size, int64_t max_model_len);
int64_t decode_credits(const RequestShape& s, int64_t block_size, int64_t max_model_len);

}  // namespace tandem::router
