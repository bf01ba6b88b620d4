#include "router/request_shape.h"

#include <algorithm>

#include "pd/types.h"
#include "util/block_budget.h"

namespace tandem::router {

using json = nlohmann::json;

namespace {

int64_t text_bytes(const json& content) {
  if (content.is_string()) return static_cast<int64_t>(content.get_ref<const std::string&>().size());
  int64_t n = 0;
  if (content.is_array())
    for (const json& part : content) {
      if (part.is_string()) n += static_cast<int64_t>(part.get_ref<const std::string&>().size());
      else if (part.is_number_integer()) n += 1;  // a token id
      else if (part.is_object() && part.contains("text")) n += text_bytes(part["text"]);
    }
  return n;
}

int64_t positive_int(const json& body, const char* key, int64_t fallback) {
  auto it = body.find(key);
  if (it == body.end() || !it->is_number_integer()) return fallback;
  return std::clamp<int64_t>(it->get<int64_t>(), 1, int64_t{1} << 31);
}

}  // namespace

RequestShape estimate_shape(const json& body, bool chat) {
  RequestShape s;
  if (chat) {
    int64_t tokens = kChatTokensPerRequest;
    auto messages = body.find("messages");
    if (messages != body.end() && messages->is_array())
      for (const json& m : *messages) {
        tokens += kChatTokensPerMessage + (m.is_object() && m.contains("content") ? text_bytes(m["content"]) : 0);
        // A template writes tool calls out too (as JSON, about as long as sent).
        if (m.is_object() && m.contains("tool_calls")) tokens += static_cast<int64_t>(m["tool_calls"].dump().size());
      }
    // Tools and documents are rendered into the prompt by the chat template.
    for (const char* key : {"tools", "documents"})
      if (auto it = body.find(key); it != body.end() && it->is_array() && !it->empty())
        tokens += static_cast<int64_t>(it->dump().size());
    s.prompt_tokens = tokens;
    s.max_tokens = positive_int(body, "max_completion_tokens", positive_int(body, "max_tokens", 0));
  } else {
    auto prompt = body.find("prompt");
    s.prompt_tokens = prompt == body.end() ? 1 : std::max<int64_t>(1, text_bytes(*prompt) + 2);  // + BOS, a space prefix
    s.max_tokens = positive_int(body, "max_tokens", 16);  // the completions API's default
  }
  const int64_t n = positive_int(body, "n", 1);
  s.n_sequences = std::max(n, positive_int(body, "best_of", n));
  return s;
}

int64_t prefill_credits(const RequestShape& s, int64_t block_size, int64_t max_model_len) {
  const auto prompt = static_cast<int32_t>(std::min(s.prompt_tokens, max_model_len));
  return std::max(1, pd::moved_blocks(prompt, static_cast<int32_t>(block_size)));
}

int64_t decode_credits(const RequestShape& s, int64_t block_size, int64_t max_model_len) {
  const int64_t prompt = std::min(s.prompt_tokens, max_model_len);
  if (s.max_tokens > 0) return worst_case_request_blocks(prompt, s.n_sequences, s.max_tokens, block_size);
  // No max_tokens: each sequence may run to the end of the context, whatever
  // the prompt turns out to be (its estimate bounds it from above, so the
  // rest of the context is no bound on the output).
  return worst_case_request_blocks(1, s.n_sequences, std::max<int64_t>(1, max_model_len - 1), block_size);
}

}  // namespace tandem::router
