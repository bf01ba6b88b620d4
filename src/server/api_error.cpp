#include "server/api_error.h"

#include <nlohmann/json.hpp>

namespace tandem::server {

namespace {

constexpr const char* kInvalidRequest = "invalid_request_error";

ApiError make(int status, std::string type, std::string message, std::string_view param = {},
              std::string_view code = {}) {
  return ApiError{status, std::move(type), std::move(message), std::string(param),
                  std::string(code)};
}

// Appends rather than "'" + std::string(s): GCC 12 at -O3 reports a false
// -Wrestrict on literal + temporary string (GCC bug 105329).
std::string quoted(std::string_view s) {
  std::string out = "'";
  out += s;
  out += '\'';
  return out;
}

}  // namespace

std::string valid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b < 0x80) {
      out += static_cast<char>(b);
      ++i;
      continue;
    }
    // Allowed range of the second byte per lead byte (Unicode table 3-7):
    // this excludes overlong forms, surrogates and code points past U+10FFFF.
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
      len = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      len = 3;
      if (b == 0xE0) lo = 0xA0;
      if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      len = 4;
      if (b == 0xF0) lo = 0x90;
      if (b == 0xF4) hi = 0x8F;
    }
    size_t good = len == 0 ? 0 : 1;  // bytes of a well-formed prefix
    while (good > 0 && good < len && i + good < s.size()) {
      const auto c = static_cast<unsigned char>(s[i + good]);
      const unsigned char min = good == 1 ? lo : 0x80, max = good == 1 ? hi : 0xBF;
      if (c < min || c > max) break;
      ++good;
    }
    if (len > 0 && good == len) {
      out.append(s.substr(i, len));
      i += len;
    } else {
      // One replacement per maximal ill-formed prefix, as Unicode recommends.
      out += "\xEF\xBF\xBD";
      i += good == 0 ? 1 : good;
    }
  }
  return out;
}

nlohmann::json ApiError::to_json() const {
  auto opt = [](const std::string& s) -> nlohmann::json {
    if (s.empty()) return nullptr;
    return valid_utf8(s);
  };
  return {{"error",
           {{"message", valid_utf8(message)},
            {"type", valid_utf8(type)},
            {"param", opt(param)},
            {"code", opt(code)}}}};
}

ApiError bad_json(std::string_view detail) {
  return make(400, kInvalidRequest,
              "Could not parse the JSON body of the request: " + std::string(detail) +
                  ". The body must be a JSON object (Content-Type: application/json).");
}

ApiError invalid_type(std::string_view param, std::string_view expected) {
  return make(400, kInvalidRequest,
              "Invalid type for " + quoted(param) + ": expected " + std::string(expected) + ".",
              param, "invalid_type");
}

ApiError missing_field(std::string_view param) {
  return make(400, kInvalidRequest, "Missing required parameter: " + quoted(param) + ".", param,
              "missing_required_parameter");
}

ApiError invalid_value(std::string_view param, std::string_view message) {
  return make(400, kInvalidRequest,
              "Invalid value for " + quoted(param) + ": " + std::string(message), param,
              "invalid_value");
}

ApiError unsupported(std::string_view param, std::string_view what) {
  return make(400, kInvalidRequest,
              "Unsupported parameter " + quoted(param) + ": " + std::string(what), param,
              "unsupported_parameter");
}

ApiError model_not_found(std::string_view model) {
  return make(404, kInvalidRequest,
              "The model `" + std::string(model) +
                  "` does not exist. GET /v1/models lists the models this server serves.",
              "model", "model_not_found");
}

ApiError context_length_exceeded(std::string_view param, int64_t max_model_len,
                                 int64_t prompt_tokens, int64_t max_tokens) {
  std::string msg = "This model's maximum context length is " + std::to_string(max_model_len) +
                    " tokens. However, ";
  const std::string where = param == "messages" ? "the messages" : "the prompt";
  if (max_tokens < 0) {
    msg += where + " " + (param == "messages" ? "are " : "is ") + std::to_string(prompt_tokens) +
           " tokens long, which leaves no room for a completion. Please shorten " + where + ".";
  } else {
    msg += "you requested " + std::to_string(prompt_tokens + max_tokens) + " tokens (" +
           std::to_string(prompt_tokens) + " in " + where + ", " + std::to_string(max_tokens) +
           " in the completion). Please reduce the length of " + where + " or lower max_tokens.";
  }
  return make(400, kInvalidRequest, std::move(msg), param, "context_length_exceeded");
}

ApiError capacity_exceeded(int64_t needed_tokens, int64_t capacity_tokens) {
  return make(400, kInvalidRequest,
              "This request needs up to " + std::to_string(needed_tokens) +
                  " tokens of KV cache (all its sequences at prompt + max_tokens), but the "
                  "server's KV cache holds " +
                  std::to_string(capacity_tokens) +
                  " tokens in total, so it could never run. Lower max_tokens, n or best_of.",
              "max_tokens", "request_too_large");
}

ApiError queue_full(int64_t queue_limit) {
  return make(429, "rate_limit_error",
              "The server is at capacity: " + std::to_string(queue_limit) +
                  " requests are already waiting. Retry after a short wait.",
              {}, "rate_limit_exceeded");
}

ApiError engine_unavailable(std::string_view why) {
  return make(503, "server_error",
              "The engine is not available: " + std::string(why) + ". Retry later.");
}

ApiError connections_exhausted(int64_t workers, int64_t max_queued) {
  return make(503, "server_error",
              "The server is at capacity: " + std::to_string(workers) + " connections are being served and " +
                  std::to_string(max_queued) + " are waiting. Retry after a short wait.",
              {}, "server_overloaded");
}

ApiError unauthorized() {
  return make(401, kInvalidRequest,
              "Missing or incorrect API key. Send it as 'Authorization: Bearer <key>'.", {},
              "invalid_api_key");
}

ApiError route_not_found(std::string_view method, std::string_view path) {
  return make(404, kInvalidRequest,
              "Unknown route: " + std::string(method) + " " + std::string(path) + ".", {},
              "not_found");
}

ApiError payload_too_large(int64_t limit_bytes) {
  return make(413, kInvalidRequest,
              "The request body is larger than the server's limit of " +
                  std::to_string(limit_bytes) + " bytes.",
              {}, "payload_too_large");
}

ApiError internal_error(std::string_view what) {
  return make(500, "server_error", "Internal server error: " + std::string(what) + ".");
}

}  // namespace tandem::server
