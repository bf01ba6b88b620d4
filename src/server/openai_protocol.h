// The OpenAI-compatible API as plain data: request bodies parsed into structs
// (SamplingParams included), and structs turned into response JSON. No I/O:
// the HTTP server parses with these, runs the engine, fills the response
// structs and writes what the builders return.
//
// Parsing follows the OpenAI API (and vLLM's extensions where noted):
// unknown fields are ignored, as clients send extras; an explicit null means
// "not given"; every wrong type is a 400 whose param names the field; a
// feature tandem does not implement (parsing tool calls from the output,
// suffix, structured output, ...) is a 400 naming the field rather than being silently ignored.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/sampling_params.h"
#include "server/api_error.h"
#include "server/chat_template.h"

namespace tandem::server {

template <class T>
using Parsed = std::variant<T, ApiError>;

// ---------------------------------------------------------------------------
// Requests

// POST /v1/completions.
struct CompletionRequest {
  std::string model;  // empty when not given
  // The prompt: text, or token ids when prompt_is_tokens (OpenAI accepts both;
  // ["text"] and [[ids]] are read as the single prompt they hold).
  std::string prompt_text;
  std::vector<int32_t> prompt_tokens;
  bool prompt_is_tokens = false;
  std::optional<int32_t> max_tokens;  // always set: OpenAI's default is 16
  // Validated against the vocabulary; max_tokens is settled by fit_to_context.
  SamplingParams sampling;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool echo = false;           // the choice's text starts with the prompt
};

// POST /v1/chat/completions.
struct ChatRequest {
  std::string model;
  // At least one message; content parts joined with "\n"; tools,
  // documents, chat_template_kwargs, add_generation_prompt (vLLM's).
  ChatConversation conversation;
  // max_completion_tokens, else max_tokens; nullopt: whatever the context has
  // left (fit_to_context fills it in).
  std::optional<int32_t> max_tokens;
  SamplingParams sampling;  // logprobs: -1 unless "logprobs": true, then top_logprobs
  bool stream = false;
  bool include_usage = false;
};

// POST /tokenize (vLLM): either a prompt or chat messages.
struct TokenizeRequest {
  std::string model;
  bool is_chat = false;
  std::string prompt;                 // when !is_chat
  ChatConversation conversation;      // when is_chat
  // nullopt: true for a prompt; the chat template's choice for messages.
  std::optional<bool> add_special_tokens;
  bool return_token_strs = false;
};

// POST /detokenize (vLLM).
struct DetokenizeRequest {
  std::string model;
  std::vector<int32_t> tokens;  // each in [0, n_vocab)
};

// n_vocab bounds token ids (prompt, logit_bias, stop_token_ids); the sampling
// settings pass SamplingParams::validate, except that max_tokens still has to
// be fitted to the prompt (fit_to_context).
Parsed<CompletionRequest> parse_completion_request(std::string_view body, int64_t n_vocab);
Parsed<ChatRequest> parse_chat_request(std::string_view body, int64_t n_vocab);
Parsed<TokenizeRequest> parse_tokenize_request(std::string_view body);
Parsed<DetokenizeRequest> parse_detokenize_request(std::string_view body, int64_t n_vocab);

// An empty name is accepted (the server serves one model); otherwise it must
// be one of `served` (404 model_not_found).
std::optional<ApiError> check_model(std::string_view requested,
                                    std::span<const std::string> served);

// Once the prompt is tokenized: sets sampling.max_tokens to `max_tokens`, or
// when that is nullopt to what the context has left. 400 when the prompt is
// empty or prompt + max_tokens exceeds max_model_len (OpenAI and vLLM refuse
// rather than truncate). param: "prompt" or "messages".
std::optional<ApiError> fit_to_context(std::optional<int32_t> max_tokens, int64_t prompt_tokens,
                                       int64_t max_model_len, std::string_view param,
                                       SamplingParams& sampling);

// ---------------------------------------------------------------------------
// Responses

struct ResponseHeader {
  std::string id;       // "cmpl-..." or "chatcmpl-..." (make_response_id)
  int64_t created = 0;  // Unix seconds; the same in every chunk of a stream
  std::string model;    // the served model's name
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;  // over all returned choices
  int64_t cached_tokens = 0;      // prompt tokens served from the prefix cache
};

// Token texts are the raw bytes of each token's piece (possibly part of a
// UTF-8 character); the builders write them as valid UTF-8 text, and the chat
// format also gives the exact bytes. Log-probabilities that are -inf (or not
// finite) are written as -9999.0, as vLLM does, since JSON has no infinity.
struct LogprobCandidate {
  std::string token;
  float logprob = 0.0f;
};

struct OutputLogprob {
  std::string token;  // the sampled token
  float logprob = 0.0f;
  std::vector<LogprobCandidate> top;  // most likely first
};

// finish_reason: "stop", "length", ...; empty is written as null (a stream
// chunk of an unfinished choice).
struct CompletionChoice {
  int32_t index = 0;
  std::string text;
  std::optional<std::vector<OutputLogprob>> logprobs;  // nullopt: not requested (null)
  // Characters of this choice's text that precede `text` (earlier chunks, the
  // echoed prompt): where text_offset starts counting.
  int64_t text_offset = 0;
  std::string finish_reason;
};

struct ChatChoice {
  int32_t index = 0;
  std::string content;
  std::optional<std::vector<OutputLogprob>> logprobs;
  std::string finish_reason;
};

struct ChatChunkChoice {
  int32_t index = 0;
  bool first = false;  // the delta opens the message: it carries role "assistant"
  std::string content;
  std::optional<std::vector<OutputLogprob>> logprobs;
  std::string finish_reason;
};

struct ModelCard {
  std::string id;
  int64_t created = 0;
  std::string owned_by = "tandem";
  int64_t max_model_len = 0;  // vLLM extension
};

// object "text_completion"; usage with prompt_tokens_details.cached_tokens.
nlohmann::json completion_response(const ResponseHeader& header,
                                   std::span<const CompletionChoice> choices, const Usage& usage);
// with_usage: stream_options.include_usage was set, so the chunk carries
// "usage": null (the usage itself comes in a last chunk, *_usage_chunk).
nlohmann::json completion_chunk(const ResponseHeader& header,
                                std::span<const CompletionChoice> choices, bool with_usage);
nlohmann::json completion_usage_chunk(const ResponseHeader& header, const Usage& usage);

// object "chat.completion".
nlohmann::json chat_response(const ResponseHeader& header, std::span<const ChatChoice> choices,
                             const Usage& usage);
// object "chat.completion.chunk".
nlohmann::json chat_chunk(const ResponseHeader& header, std::span<const ChatChunkChoice> choices,
                          bool with_usage);
nlohmann::json chat_usage_chunk(const ResponseHeader& header, const Usage& usage);

// GET /v1/models.
nlohmann::json models_response(std::span<const ModelCard> models);
// vLLM's /tokenize and /detokenize responses; token_strs is written as null
// when not asked for.
nlohmann::json tokenize_response(std::span<const int32_t> tokens, int64_t max_model_len,
                                 const std::vector<std::string>* token_strs = nullptr);
nlohmann::json detokenize_response(std::string_view text);

// prefix + 16 hex digits of `random` ("cmpl-", "chatcmpl-").
std::string make_response_id(std::string_view prefix, uint64_t random);
// The body text: invalid UTF-8 (which the builders never produce) is replaced
// instead of throwing.
std::string dump_body(const nlohmann::json& body);
// One server-sent event carrying `body`, and the event that ends a stream.
std::string sse_event(const nlohmann::json& body);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

}  // namespace tandem::server
