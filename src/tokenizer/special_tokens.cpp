#include "tokenizer/special_tokens.h"

#include <algorithm>
#include <array>
#include <span>

namespace tandem::tok {

namespace {

using Texts = std::span<const std::string_view>;

bool one_of(std::string_view text, Texts candidates) {
  return std::find(candidates.begin(), candidates.end(), text) != candidates.end();
}

// Token texts by which llama.cpp (llama-vocab.cpp) recognises tokens that the
// converter did not name in the metadata. "\xEF\xBD\x9C" is U+FF5C (fullwidth
// vertical bar) and "\xE2\x96\x81" U+2581, as in DeepSeek's special tokens.
#define TANDEM_DEEPSEEK(name) "<\xEF\xBD\x9C" name "\xEF\xBD\x9C>"
constexpr std::string_view kEotTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", TANDEM_DEEPSEEK("end\xE2\x96\x81of\xE2\x96\x81sentence"),
    "<end_of_utterance>"};
constexpr std::string_view kEomTexts[] = {"<|eom_id|>"};
constexpr std::string_view kFimPreTexts[] = {
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", TANDEM_DEEPSEEK("fim\xE2\x96\x81" "begin"),
    "<PRE>", "\xE2\x96\x81<PRE>", "<|code_prefix|>", "<|prefix|>"};
constexpr std::string_view kFimSufTexts[] = {
    "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", TANDEM_DEEPSEEK("fim\xE2\x96\x81hole"),
    "<SUF>", "\xE2\x96\x81<SUF>", "<|code_suffix|>", "<|suffix|>"};
constexpr std::string_view kFimMidTexts[] = {
    "<|fim_middle|>", "<fim-middle>", "<fim_middle>", TANDEM_DEEPSEEK("fim\xE2\x96\x81" "end"),
    "<MID>", "\xE2\x96\x81<MID>", "<|code_middle|>", "<|middle|>"};
constexpr std::string_view kFimPadTexts[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>",
                                             "[PAD]"};
constexpr std::string_view kFimRepTexts[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>",
                                             "<REPO>", "<reponame>"};
constexpr std::string_view kFimSepTexts[] = {"<|file_sep|>"};
// Every token with one of these texts ends generation.
constexpr std::string_view kEogTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    TANDEM_DEEPSEEK("end\xE2\x96\x81of\xE2\x96\x81sentence"), "[e~["};
#undef TANDEM_DEEPSEEK
// gpt-oss formatting tokens that llama.cpp always renders.
constexpr std::string_view kAlwaysRenderedTexts[] = {"<|channel|>", "<|message|>", "<|start|>",
                                                     "<|constrain|>"};

}  // namespace

uint32_t attr_from_type(TokenType type) {
  switch (type) {
    case TokenType::NORMAL: return kAttrNormal;
    case TokenType::UNKNOWN: return kAttrUnknown;
    case TokenType::CONTROL: return kAttrControl;
    case TokenType::USER_DEFINED: return kAttrUserDefined;
    case TokenType::UNUSED: return kAttrUnused;
    case TokenType::BYTE: return kAttrByte;
    case TokenType::UNDEFINED: break;
  }
  return 0;
}

TokenType type_from_attr(uint32_t attr) {
  // The first matching flag decides, CONTROL before the rest because it is
  // the one llama.cpp adds on top of a token's own type.
  if (attr & kAttrControl) return TokenType::CONTROL;
  if (attr & kAttrUserDefined) return TokenType::USER_DEFINED;
  if (attr & kAttrUnknown) return TokenType::UNKNOWN;
  if (attr & kAttrByte) return TokenType::BYTE;
  if (attr & kAttrUnused) return TokenType::UNUSED;
  if (attr & kAttrNormal) return TokenType::NORMAL;
  return TokenType::UNDEFINED;
}

std::vector<uint8_t> resolve_special_tokens(VocabData& vocab, const TokenIndex& index,
                                            std::vector<uint32_t>& attrs) {
  const auto n = static_cast<int32_t>(vocab.tokens.size());
  auto for_each_token = [&](auto&& fn) {
    index.for_each([&](std::string_view text, int32_t id) { fn(id, text); });
  };

  struct Search {
    int32_t* id;
    Texts texts;
  };
  const std::array<Search, 8> searches = {{
      {&vocab.eot_id, kEotTexts},
      {&vocab.eom_id, kEomTexts},
      {&vocab.fim_pre_id, kFimPreTexts},
      {&vocab.fim_suf_id, kFimSufTexts},
      {&vocab.fim_mid_id, kFimMidTexts},
      {&vocab.fim_pad_id, kFimPadTexts},
      {&vocab.fim_rep_id, kFimRepTexts},
      {&vocab.fim_sep_id, kFimSepTexts},
  }};
  for_each_token([&](int32_t id, std::string_view text) {
    for (const Search& s : searches) {
      if (*s.id < 0 && one_of(text, s.texts)) {
        *s.id = id;
        attrs[id] |= kAttrControl;
      }
    }
  });

  std::vector<uint8_t> eog(n, 0);
  for (int32_t id : {vocab.fim_pad_id, vocab.fim_rep_id, vocab.fim_sep_id}) {
    if (id >= 0) eog[id] = 1;
  }
  for_each_token([&](int32_t id, std::string_view text) {
    if (one_of(text, kEogTexts)) {
      eog[id] = 1;
      attrs[id] |= kAttrControl;
    }
  });
  for_each_token([&](int32_t id, std::string_view text) {
    if (one_of(text, kAlwaysRenderedTexts)) attrs[id] = kAttrUserDefined;
  });
  for (int32_t id : {vocab.eos_id, vocab.eot_id, vocab.eom_id}) {
    if (id >= 0) eog[id] = 1;
  }

  // Vocabularies that have "<|return|>" and "<|call|>" (gpt-oss), or "<|calls|>"
  // and "<|flush|>" (solar-open), use "<|end|>" between messages, not at the end.
  auto eog_with_text = [&](std::string_view text) {
    for (int32_t id = 0; id < n; ++id) {
      if (eog[id] && vocab.tokens[id] == text) return id;
    }
    return int32_t{-1};
  };
  const bool has_call = eog_with_text("<|call|>") >= 0 || eog_with_text("<|calls|>") >= 0;
  const int32_t end_id = eog_with_text("<|end|>");
  if (end_id >= 0 && has_call &&
      (eog_with_text("<|return|>") >= 0 || eog_with_text("<|flush|>") >= 0)) {
    eog[end_id] = 0;
    attrs[end_id] = kAttrUserDefined;
  }
  // Vocabularies with "<|tool_response>" (Gemma 4) use "</s>" as ordinary text.
  const int32_t s_id = eog_with_text("</s>");
  if (s_id >= 0 && eog_with_text("<|tool_response>") >= 0) {
    eog[s_id] = 0;
    attrs[s_id] = kAttrNormal;
  }
  return eog;
}

void apply_special_rstrip(const std::vector<int32_t>& specials, const TokenIndex& index,
                          std::vector<uint32_t>& attrs) {
  for (int32_t id : specials) attrs[id] |= kAttrRstrip;
  auto set = [&](std::string_view text, bool on) {
    if (const int32_t id = index.find(text); id >= 0) {
      attrs[id] = on ? attrs[id] | kAttrRstrip : attrs[id] & ~kAttrRstrip;
    }
  };
  set("</s>", true);
  for (std::string_view text : {"<unk>", "<s>", "<|endoftext|>"}) set(text, false);
}

std::vector<int32_t> special_match_order(const std::vector<std::string>& tokens,
                                         const std::vector<uint32_t>& attrs) {
  std::vector<int32_t> order;
  for (size_t id = 0; id < tokens.size(); ++id) {
    if (attrs[id] & (kAttrControl | kAttrUserDefined | kAttrUnknown)) {
      order.push_back(static_cast<int32_t>(id));
    }
  }
  // The same (unstable) sort on the same input as llama.cpp, so that tokens of
  // equal length end up in its order too, given the same standard library.
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return tokens[a].size() > tokens[b].size();
  });
  return order;
}

std::vector<Segment> split_on_specials(std::string_view text, const std::vector<int32_t>& order,
                                       const std::vector<std::string>& tokens,
                                       const std::vector<uint32_t>& attrs, bool parse_special) {
  std::vector<Segment> segments;
  if (text.empty()) return segments;
  segments.push_back({-1, 0, text.size()});
  std::vector<Segment> next;
  for (int32_t id : order) {
    if (!parse_special && (attrs[id] & (kAttrControl | kAttrUnknown))) continue;
    const std::string& needle = tokens[id];
    next.clear();
    bool found_any = false;
    for (const Segment& seg : segments) {
      if (seg.token >= 0) {
        next.push_back(seg);
        continue;
      }
      const std::string_view raw = text.substr(0, seg.end);
      size_t pos = seg.begin;
      while (true) {
        const size_t hit = raw.find(needle, pos);
        if (hit == std::string_view::npos) break;
        if (hit > pos) next.push_back({-1, pos, hit});
        next.push_back({id, hit, hit + needle.size()});
        pos = hit + needle.size();
        if (attrs[id] & kAttrRstrip) {
          // Same characters as C isspace(), which llama.cpp uses here.
          while (pos < seg.end && std::string_view(" \t\n\v\f\r").find(raw[pos]) !=
                                      std::string_view::npos) {
            ++pos;
          }
        }
        found_any = true;
      }
      if (pos < seg.end) next.push_back({-1, pos, seg.end});
    }
    if (found_any) segments.swap(next);
  }
  return segments;
}

}  // namespace tandem::tok
