#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace tandem {

namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";

// Moves the longest prefix of `pending` that can already be printed into the
// result, replacing ill-formed bytes; keeps an unfinished character unless
// `final`, which replaces it too.
std::string take_printable(std::string& pending, bool final) {
  std::string out;
  size_t i = 0;
  while (i < pending.size()) {
    const int len = tok::utf8_valid_char_len(std::string_view(pending).substr(i));
    if (len > 0) {
      out.append(pending, i, static_cast<size_t>(len));
      i += static_cast<size_t>(len);
    } else if (len < 0) {
      out += kReplacement;
      i += static_cast<size_t>(-len);
    } else if (final) {
      out += kReplacement;
      i = pending.size();
    } else {
      break;
    }
  }
  pending.erase(0, i);
  return out;
}

}  // namespace

std::string IncrementalDetokenizer::push(int32_t id) {
  pending_ += tokenizer_->token_to_piece(id, render_special_);
  return take_printable(pending_, /*final=*/false);
}

std::string IncrementalDetokenizer::flush() { return take_printable(pending_, /*final=*/true); }

}  // namespace tandem
