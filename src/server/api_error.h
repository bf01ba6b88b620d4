// Errors returned to API clients, in the shape OpenAI's API uses:
//   {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
// The HTTP status goes on the response line; clients (the openai SDKs among
// them) pick their exception class and retry policy from it: 429 and 5xx are
// retried, 4xx other than 429 are not.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

namespace tandem::server {

struct ApiError {
  int status = 400;
  std::string type;     // "invalid_request_error", "rate_limit_error", "server_error"
  std::string message;  // says what was wrong and what to change
  std::string param;    // the offending request field; empty -> null
  std::string code;     // machine-readable reason; empty -> null

  // Every string comes out valid UTF-8 (see valid_utf8), so dump() cannot throw.
  nlohmann::json to_json() const;
};

// JSON text must be valid UTF-8 and nlohmann::json::dump throws on anything
// else; messages can quote model metadata and token pieces can be partial
// characters, so strings from those sources go through this. Each maximal
// invalid subsequence becomes U+FFFD.
std::string valid_utf8(std::string_view s);

// The body is not JSON, or not a JSON object (400).
ApiError bad_json(std::string_view detail);
// A field has the wrong JSON type (400, param = field).
ApiError invalid_type(std::string_view param, std::string_view expected);
// A required field is absent (400, param = field).
ApiError missing_field(std::string_view param);
// A field has the right type but a value outside what is accepted (400).
ApiError invalid_value(std::string_view param, std::string_view message);
// A field or value the API defines but tandem does not implement (400, param =
// field, code "unsupported_parameter").
ApiError unsupported(std::string_view param, std::string_view what);
// The request names a model this server does not serve (404, code "model_not_found").
ApiError model_not_found(std::string_view model);
// prompt + max_tokens does not fit the context (400, code
// "context_length_exceeded", param = "prompt" or "messages").
// max_tokens < 0 means max_tokens was not given (the prompt alone is too long).
ApiError context_length_exceeded(std::string_view param, int64_t max_model_len,
                                 int64_t prompt_tokens, int64_t max_tokens);
// The request could never be scheduled: its sequences (n / best_of of them,
// each up to prompt + max_tokens) need more KV cache than the server has in
// total. 400 rather than 413 because the body is not too large, the request
// is; and like every 4xx but 429, clients do not retry it, which is right
// since it can never succeed. Code "request_too_large", param "max_tokens".
ApiError capacity_exceeded(int64_t needed_tokens, int64_t capacity_tokens);
// The waiting queue is full (429, type "rate_limit_error", code
// "rate_limit_exceeded", as OpenAI-compatible providers send); clients retry.
ApiError queue_full(int64_t queue_limit);
// The engine is not running (starting, stopping, or failed): 503, type
// "server_error"; clients retry.
ApiError engine_unavailable(std::string_view why);
// 503: more connections than the server works on and lets wait.
ApiError connections_exhausted(int64_t workers, int64_t max_queued);
// Missing or wrong API key (401, code "invalid_api_key", as OpenAI sends).
ApiError unauthorized();
// No such route (404) and a body over the server's size limit (413).
ApiError route_not_found(std::string_view method, std::string_view path);
ApiError payload_too_large(int64_t limit_bytes);
// A bug or an engine failure while serving the request (500).
ApiError internal_error(std::string_view what);

}  // namespace tandem::server
