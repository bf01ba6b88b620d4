#include "engine/sampling_params.h"

#include <cmath>
#include <cstdio>
#include <string_view>

namespace tandem {

namespace {

// Bounds beyond which a request is almost certainly a mistake (or abuse) rather
// than a meaningful setting; the OpenAI API uses the same or tighter ones.
constexpr float kMaxTemperature = 100.0f;
constexpr float kMaxAbsPenalty = 2.0f;
constexpr float kMaxAbsLogitBias = 100.0f;
constexpr int32_t kMaxLogprobs = 20;
constexpr int32_t kMaxSequences = 128;  // for n and best_of
constexpr size_t kMaxStopStrings = 16;

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::string out_of_range(std::string_view field, const std::string& value,
                         std::string_view allowed) {
  return std::string(field) + " must be " + std::string(allowed) + ", got " + value;
}

// Stop strings are matched bytewise against detokenized text; only valid UTF-8
// guarantees a match (or a held-back prefix) starts on a character boundary.
bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    size_t len;
    uint32_t cp;
    if (b < 0x80) {
      ++i;
      continue;
    } else if ((b & 0xE0) == 0xC0) {
      len = 2;
      cp = b & 0x1F;
    } else if ((b & 0xF0) == 0xE0) {
      len = 3;
      cp = b & 0x0F;
    } else if ((b & 0xF8) == 0xF0) {
      len = 4;
      cp = b & 0x07;
    } else {
      return false;
    }
    if (i + len > s.size()) return false;
    for (size_t j = 1; j < len; ++j) {
      const auto c = static_cast<unsigned char>(s[i + j]);
      if ((c & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (c & 0x3F);
    }
    // Overlong forms, surrogates and values past U+10FFFF are not valid UTF-8.
    static constexpr uint32_t kMinForLen[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMinForLen[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

}  // namespace

std::string SamplingParams::validate(int64_t n_vocab) const {
  // Comparisons are written so that NaN fails them.
  if (!(temperature >= 0.0f && temperature <= kMaxTemperature))
    return out_of_range("temperature", num(temperature), "in [0, " + num(kMaxTemperature) + "]");
  if (!(top_p > 0.0f && top_p <= 1.0f)) return out_of_range("top_p", num(top_p), "in (0, 1]");
  if (top_k < -1) return out_of_range("top_k", std::to_string(top_k), "-1 or 0 (disabled) or >= 1");
  if (!(min_p >= 0.0f && min_p <= 1.0f)) return out_of_range("min_p", num(min_p), "in [0, 1]");
  if (!(repetition_penalty > 0.0f && std::isfinite(repetition_penalty)))
    return out_of_range("repetition_penalty", num(repetition_penalty), "finite and > 0");
  const std::string penalty_range =
      "in [-" + num(kMaxAbsPenalty) + ", " + num(kMaxAbsPenalty) + "]";
  if (!(presence_penalty >= -kMaxAbsPenalty && presence_penalty <= kMaxAbsPenalty))
    return out_of_range("presence_penalty", num(presence_penalty), penalty_range);
  if (!(frequency_penalty >= -kMaxAbsPenalty && frequency_penalty <= kMaxAbsPenalty))
    return out_of_range("frequency_penalty", num(frequency_penalty), penalty_range);
  const std::string vocab_range = "in [0, " + std::to_string(n_vocab) + ")";
  for (const auto& [token, bias] : logit_bias) {
    if (token < 0 || token >= n_vocab)
      return out_of_range("logit_bias token id", std::to_string(token), vocab_range);
    if (!(bias >= -kMaxAbsLogitBias && bias <= kMaxAbsLogitBias))
      return out_of_range("logit_bias value for token " + std::to_string(token), num(bias),
                          "in [-" + num(kMaxAbsLogitBias) + ", " + num(kMaxAbsLogitBias) + "]");
  }
  if (max_tokens < 1) return out_of_range("max_tokens", std::to_string(max_tokens), ">= 1");
  if (n < 1 || n > kMaxSequences)
    return out_of_range("n", std::to_string(n), "in [1, " + std::to_string(kMaxSequences) + "]");
  if (best_of < n || best_of > kMaxSequences)
    return out_of_range(
        "best_of", std::to_string(best_of),
        "in [n, " + std::to_string(kMaxSequences) + "] (n = " + std::to_string(n) + ")");
  if (logprobs < -1 || logprobs > kMaxLogprobs)
    return out_of_range("logprobs", std::to_string(logprobs),
                        "-1 (none) or in [0, " + std::to_string(kMaxLogprobs) + "]");
  if (stop.size() > kMaxStopStrings)
    return "stop must hold at most " + std::to_string(kMaxStopStrings) + " strings, got " +
           std::to_string(stop.size());
  for (size_t i = 0; i < stop.size(); ++i) {
    const std::string where = "stop[" + std::to_string(i) + "]";
    if (stop[i].empty()) return "stop strings must be non-empty, got an empty " + where;
    if (!valid_utf8(stop[i])) return "stop strings must be valid UTF-8, " + where + " is not";
  }
  for (int32_t token : stop_token_ids)
    if (token < 0 || token >= n_vocab)
      return out_of_range("stop_token_ids entry", std::to_string(token), vocab_range);
  return {};
}

}  // namespace tandem
