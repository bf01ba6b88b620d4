#include "engine/stop_checker.h"

#include <algorithm>
#include <utility>

#include "util/error.h"

namespace tandem {

StopChecker::StopChecker(std::vector<std::string> stops, bool include_stop_in_output)
    : stops_(std::move(stops)), include_stop_(include_stop_in_output) {
  for (const auto& s : stops_) {
    // SamplingParams::validate rejects empty and non-UTF-8 stop strings; a
    // stop string starting with a continuation byte could split a character.
    TANDEM_ASSERT(!s.empty(), "empty stop string");
    TANDEM_ASSERT((static_cast<unsigned char>(s[0]) & 0xC0) != 0x80, "stop string is not UTF-8");
    max_stop_len_ = std::max(max_stop_len_, s.size());
  }
}

StopChecker::Result StopChecker::push(std::string_view text) {
  Result result;
  if (stopped_) {
    result.stopped = true;
    return result;
  }
  if (stops_.empty()) {
    result.text = text;
    return result;
  }

  const size_t old_size = held_.size();
  held_.append(text);

  // The held text had no match, so a new one ends in the new text. Of several,
  // the one that ends first wins (then the one starting first): that is the
  // one a token-by-token stream would have completed first, so the outcome
  // does not depend on how the text was split into chunks. Everything from
  // its start is still held, because it was a stop-string prefix all along.
  const std::string* match = nullptr;
  size_t match_start = 0;
  size_t match_end = std::string::npos;
  for (const auto& s : stops_) {
    const size_t from = old_size >= s.size() ? old_size - s.size() + 1 : 0;
    const size_t pos = held_.find(s, from);
    if (pos == std::string::npos) continue;
    const size_t end = pos + s.size();
    if (end < match_end || (end == match_end && pos < match_start)) {
      match = &s;
      match_start = pos;
      match_end = end;
    }
  }
  if (match != nullptr) {
    result.text = held_.substr(0, include_stop_ ? match_end : match_start);
    result.stopped = true;
    result.matched = *match;
    stopped_ = true;
    held_.clear();
    return result;
  }

  // Hold back the longest suffix that could still grow into a stop string.
  // Such a suffix starts with a stop string's first byte, never a UTF-8
  // continuation byte, so in text of whole characters it starts a character.
  size_t hold = 0;
  for (size_t k = std::min(held_.size(), max_stop_len_ - 1); k > 0 && hold == 0; --k) {
    const std::string_view suffix(held_.data() + held_.size() - k, k);
    for (const auto& s : stops_) {
      if (s.size() > k && std::string_view(s).starts_with(suffix)) {
        hold = k;
        break;
      }
    }
  }
  const size_t release = held_.size() - hold;
  result.text = held_.substr(0, release);
  held_.erase(0, release);
  return result;
}

std::string StopChecker::flush() {
  std::string out = std::move(held_);
  held_.clear();
  return out;
}

}  // namespace tandem
