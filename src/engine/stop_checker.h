// Stop strings over a stream of detokenized text.
//
// Text is released only when it can no longer be the start of a stop string,
// so a stop string split across tokens (or across streamed chunks) is still
// found and never partly emitted. After a match, nothing more is emitted.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tandem {

class StopChecker {
 public:
  StopChecker(std::vector<std::string> stops, bool include_stop_in_output);

  struct Result {
    std::string text;  // safe to emit now
    bool stopped = false;
    std::string matched;  // the stop string found, when stopped
  };
  // Feeds newly decoded text.
  Result push(std::string_view text);
  // The generation ended for another reason: releases any held-back text.
  std::string flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  bool include_stop_;
  size_t max_stop_len_ = 0;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace tandem
