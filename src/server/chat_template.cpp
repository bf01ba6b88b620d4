#include "server/chat_template.h"

#include <array>
#include <cstdint>
#include <utility>

#include "util/error.h"

namespace tandem::server {

namespace {

constexpr std::array<std::pair<ChatFamily, std::string_view>, 4> kFamilies = {{
    {ChatFamily::kChatML, "chatml"},
    {ChatFamily::kLlama3, "llama3"},
    {ChatFamily::kLlama2, "llama2"},
    {ChatFamily::kMistral, "mistral"},
}};

// What Llama 3.1+ templates print when the caller does not set date_string.
constexpr std::string_view kLlama3DefaultDate = "26 Jul 2024";

bool contains(std::string_view haystack, std::string_view needle) {
  return haystack.find(needle) != std::string_view::npos;
}

// A Jinja string literal with exactly this text, in either quote style.
bool has_literal(std::string_view jinja, std::string_view text) {
  for (char q : {'\'', '"'}) {
    std::string lit;
    lit += q;
    lit += text;
    lit += q;
    if (contains(jinja, lit)) return true;
  }
  return false;
}

// The template with whitespace removed, one quote style and one way to read
// the message content, so that code patterns can be matched whatever the
// author's formatting: `" " + message.content | trim` -> `''+message['content']|trim`.
std::string normalize_code(std::string_view jinja) {
  std::string out;
  out.reserve(jinja.size());
  for (char c : jinja) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') continue;
    out += c == '"' ? '\'' : c;
  }
  const std::string_view attr = "message.content", item = "message['content']";
  for (size_t pos = 0; (pos = out.find(attr, pos)) != std::string::npos; pos += item.size())
    out.replace(pos, attr.size(), item);
  return out;
}

// Decodes Jinja's backslash escapes in a literal's text.
std::string unescape_literal(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out += s[i];
      continue;
    }
    const char c = s[++i];
    out += c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c;
  }
  return out;
}

// Qwen's ChatML templates write a default system turn when the conversation
// has none, as one literal: '<|im_start|>system\nYou are ...<|im_end|>\n'.
// Occurrences whose text runs into a quote or a brace are code that inserts
// the caller's system message, not a default.
std::string chatml_default_system(std::string_view jinja) {
  const std::string_view start = "<|im_start|>system";
  for (size_t pos = jinja.find(start); pos != std::string_view::npos;
       pos = jinja.find(start, pos + 1)) {
    std::string_view rest = jinja.substr(pos + start.size());
    if (rest.starts_with("\\n")) {
      rest.remove_prefix(2);
    } else if (rest.starts_with("\n")) {
      rest.remove_prefix(1);
    } else {
      continue;
    }
    const size_t end = rest.find("<|im_end|>");
    if (end == std::string_view::npos || end == 0) continue;
    const std::string_view text = rest.substr(0, end);
    if (text.find_first_of("'\"{}") != std::string_view::npos) continue;
    return unescape_literal(text);
  }
  return {};
}

// Not a code point: what decode_at returns for a byte that starts no
// well-formed character (it is then skipped alone).
constexpr uint32_t kBadByte = 0x110000;

// Reads one UTF-8 code point at s[i]; sets len to its length in bytes.
uint32_t decode_at(std::string_view s, size_t i, size_t& len) {
  const auto b = static_cast<unsigned char>(s[i]);
  len = 1;
  if (b < 0x80) return b;
  const size_t n = (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 0;
  if (n == 0 || i + n > s.size()) return kBadByte;
  uint32_t cp = b & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) {
    const auto c = static_cast<unsigned char>(s[i + k]);
    if ((c & 0xC0) != 0x80) return kBadByte;
    cp = (cp << 6) | (c & 0x3F);
  }
  static constexpr uint32_t kMinForLen[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMinForLen[n]) return kBadByte;  // overlong
  len = n;
  return cp;
}

// Python's str.isspace(): the characters str.strip() removes.
bool is_python_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// The first ~80 characters of a template, on one line, for error messages.
std::string excerpt(std::string_view jinja) {
  std::string out;
  size_t i = 0, chars = 0;
  for (; i < jinja.size() && chars < 80; ++chars) {
    size_t len = 0;
    decode_at(jinja, i, len);
    const std::string_view ch = jinja.substr(i, len);
    out += ch == "\n" ? "\\n" : std::string(ch);
    i += len;
  }
  if (i < jinja.size()) out += "...";
  return valid_utf8(out);
}

ApiError template_error(std::string message) {
  return ApiError{400, "invalid_request_error", std::move(message), "messages",
                  "chat_template_error"};
}

// Llama-2 and Mistral templates raise unless the messages are an optional
// system message followed by user, assistant, user, ... turns.
std::optional<ApiError> check_alternation(std::span<const ChatMessage> messages,
                                          std::string_view family) {
  const size_t first = !messages.empty() && messages[0].role == "system" ? 1 : 0;
  for (size_t i = first; i < messages.size(); ++i) {
    const std::string_view want = (i - first) % 2 == 0 ? "user" : "assistant";
    if (messages[i].role == want) continue;
    return template_error("The " + std::string(family) +
                          " chat template needs an optional first system message, then user and "
                          "assistant messages alternating, starting with user; message " +
                          std::to_string(i) + " has role '" + messages[i].role + "' where '" +
                          std::string(want) + "' was expected.");
  }
  return std::nullopt;
}

}  // namespace

std::string_view chat_family_name(ChatFamily family) {
  for (const auto& [f, name] : kFamilies)
    if (f == family) return name;
  return "unknown";
}

std::optional<ChatFamily> chat_family_from_name(std::string_view name) {
  for (const auto& [f, n] : kFamilies)
    if (n == name) return f;
  return std::nullopt;
}

std::string chat_family_list() {
  std::string out;
  for (const auto& [f, name] : kFamilies) {
    if (!out.empty()) out += ", ";
    out += name;
  }
  return out;
}

std::string python_strip(std::string_view s) {
  size_t begin = 0;
  while (begin < s.size()) {
    size_t len = 0;
    if (!is_python_space(decode_at(s, begin, len))) break;
    begin += len;
  }
  size_t end = begin;  // one past the last non-space character
  for (size_t i = begin; i < s.size();) {
    size_t len = 0;
    if (!is_python_space(decode_at(s, i, len))) end = i + len;
    i += len;
  }
  return std::string(s.substr(begin, end - begin));
}

ChatTemplate ChatTemplate::for_family(ChatFamily family, std::string bos_text,
                                      std::string eos_text) {
  ChatTemplate t;
  t.family_ = family;
  t.source_ = "--chat-template";
  t.bos_ = std::move(bos_text);
  t.eos_ = std::move(eos_text);
  // The canonical templates: Qwen2-style ChatML without BOS or default system
  // prompt, Llama 3.0, the Llama-2-chat template, Mistral-7B-Instruct-v0.2's.
  t.writes_bos_ = family != ChatFamily::kChatML;
  if (family == ChatFamily::kMistral) {
    t.mistral_open_ = " [INST] ";
    t.mistral_close_ = " [/INST]";
    t.mistral_space_before_answer_ = true;
  }
  return t;
}

ChatTemplate ChatTemplate::detect(std::string_view jinja, std::string bos_text,
                                  std::string eos_text) {
  ChatTemplate t;
  t.bos_ = std::move(bos_text);
  t.eos_ = std::move(eos_text);
  t.source_ = "detected from tokenizer.chat_template";
  const std::string how_to_fix = " Restart the server with --chat-template <family>, one of " +
                                 chat_family_list() +
                                 ", or send a prompt you formatted yourself to /v1/completions.";
  if (jinja.empty()) {
    t.error_ =
        "This model has no chat template (its GGUF file has no tokenizer.chat_template), so "
        "messages cannot be turned into a prompt." +
        how_to_fix;
    return t;
  }
  // Llama-2 templates also contain [INST], so <<SYS>> is tested first.
  if (contains(jinja, "<|im_start|>")) {
    t.family_ = ChatFamily::kChatML;
  } else if (contains(jinja, "<|start_header_id|>")) {
    t.family_ = ChatFamily::kLlama3;
  } else if (contains(jinja, "<<SYS>>")) {
    t.family_ = ChatFamily::kLlama2;
  } else if (contains(jinja, "[INST]")) {
    t.family_ = ChatFamily::kMistral;
  } else {
    t.error_ = "This model's chat template is not one tandem can render: \"" + excerpt(jinja) +
               "\". tandem renders the chatml (<|im_start|>), llama3 (<|start_header_id|>), "
               "llama2 (<<SYS>>) and mistral ([INST]) families." +
               how_to_fix;
    return t;
  }
  t.writes_bos_ = contains(jinja, "bos_token");
  switch (*t.family_) {
    case ChatFamily::kChatML:
      t.default_system_ = chatml_default_system(jinja);
      break;
    case ChatFamily::kLlama3:
      t.llama3_date_header_ = contains(jinja, "Cutting Knowledge Date");
      t.llama3_today_ = contains(jinja, "strftime_now");
      break;
    case ChatFamily::kLlama2:
      break;
    case ChatFamily::kMistral: {
      for (std::string_view open : {" [INST] ", "[INST] ", "[INST]"}) {
        if (has_literal(jinja, open)) {
          t.mistral_open_ = open;
          break;
        }
      }
      for (std::string_view close : {" [/INST]", "[/INST]"}) {
        if (has_literal(jinja, close)) {
          t.mistral_close_ = close;
          break;
        }
      }
      const std::string code = normalize_code(jinja);
      if (contains(jinja, "[SYSTEM_PROMPT]")) {
        t.mistral_system_ = MistralSystem::kSystemPromptTokens;
      } else if (contains(code, "loop.lastandsystem_message")) {
        t.mistral_system_ = MistralSystem::kLastUser;
      }
      t.mistral_space_before_answer_ = contains(code, "''+message['content']");
      t.mistral_trim_answer_ = contains(code, "message['content']|trim+eos_token");
      break;
    }
  }
  return t;
}

ChatTemplate ChatTemplate::from_options(std::string_view override_name, std::string_view jinja,
                                        std::string bos_text, std::string eos_text) {
  if (override_name.empty()) return detect(jinja, std::move(bos_text), std::move(eos_text));
  const auto family = chat_family_from_name(override_name);
  if (!family) {
    throw Error("unknown --chat-template '" + std::string(override_name) + "': expected one of " +
                chat_family_list());
  }
  return for_family(*family, std::move(bos_text), std::move(eos_text));
}

std::string ChatTemplate::describe() const {
  if (!family_) return "none (" + error_ + ")";
  std::string out = std::string(chat_family_name(*family_)) + " (" + source_;
  if (!default_system_.empty()) out += "; default system prompt";
  if (llama3_date_header_) out += "; Llama 3.1+ date header";
  if (*family_ == ChatFamily::kMistral) {
    out += "; \"" + mistral_open_ + "..." + mistral_close_ + "\"";
    if (mistral_system_ == MistralSystem::kLastUser) out += "; system prompt on the last turn";
    if (mistral_system_ == MistralSystem::kSystemPromptTokens) out += "; [SYSTEM_PROMPT]";
  }
  return out + ")";
}

std::variant<RenderedPrompt, ApiError> ChatTemplate::render(
    std::span<const ChatMessage> messages, const ChatRenderOptions& options) const {
  if (!family_) return template_error(error_);
  switch (*family_) {
    case ChatFamily::kChatML:
      return render_chatml(messages, options);
    case ChatFamily::kLlama3:
      return render_llama3(messages, options);
    case ChatFamily::kLlama2:
      return render_llama2(messages);
    case ChatFamily::kMistral:
      return render_mistral(messages);
  }
  return template_error("unknown chat template family");
}

RenderedPrompt ChatTemplate::render_chatml(std::span<const ChatMessage> messages,
                                           const ChatRenderOptions& options) const {
  RenderedPrompt out;
  if (writes_bos_) out.text += bos_;
  if (!default_system_.empty() && !messages.empty() && messages[0].role != "system")
    out.text += "<|im_start|>system\n" + default_system_ + "<|im_end|>\n";
  for (const ChatMessage& m : messages)
    out.text += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  if (options.add_generation_prompt) out.text += "<|im_start|>assistant\n";
  out.add_special = !(writes_bos_ && !bos_.empty());
  return out;
}

RenderedPrompt ChatTemplate::render_llama3(std::span<const ChatMessage> messages,
                                           const ChatRenderOptions& options) const {
  RenderedPrompt out;
  auto turn = [&](std::string_view role, std::string_view content) {
    out.text += "<|start_header_id|>";
    out.text += role;
    out.text += "<|end_header_id|>\n\n";
    out.text += content;
    out.text += "<|eot_id|>";
  };
  if (llama3_date_header_) {
    // 3.1+ always open with a system turn that carries the dates, followed by
    // the caller's (trimmed) system message if the first message is one.
    if (writes_bos_) out.text += bos_;
    std::string system;
    if (!messages.empty() && messages[0].role == "system") {
      system = python_strip(messages[0].content);
      messages = messages.subspan(1);
    }
    const std::string_view date =
        llama3_today_ && !options.today.empty() ? options.today : kLlama3DefaultDate;
    turn("system", "Cutting Knowledge Date: December 2023\nToday Date: " + std::string(date) +
                       "\n\n" + system);
  } else if (writes_bos_ && !messages.empty()) {
    out.text += bos_;  // 3.0 prepends it to the first turn
  }
  for (const ChatMessage& m : messages) turn(m.role, python_strip(m.content));
  if (options.add_generation_prompt)
    out.text += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  out.add_special = !(writes_bos_ && !bos_.empty());
  return out;
}

std::variant<RenderedPrompt, ApiError> ChatTemplate::render_llama2(
    std::span<const ChatMessage> messages) const {
  if (auto err = check_alternation(messages, "llama2")) return *std::move(err);
  std::optional<std::string> system;
  if (!messages.empty() && messages[0].role == "system") {
    system = messages[0].content;
    messages = messages.subspan(1);
  }
  RenderedPrompt out;
  for (size_t i = 0; i < messages.size(); ++i) {
    std::string content = messages[i].content;
    // The system block joins the first turn before the whole is stripped.
    if (i == 0 && system) content = "<<SYS>>\n" + *system + "\n<</SYS>>\n\n" + content;
    if (messages[i].role == "user") {
      if (writes_bos_) out.text += bos_;
      out.text += "[INST] " + python_strip(content) + " [/INST]";
    } else {
      // Appended piece by piece: " " + std::string&& trips GCC 12's false
      // -Wrestrict at -O3 (GCC bug 105329).
      out.text += ' ';
      out.text += python_strip(content);
      out.text += ' ';
      out.text += eos_;
    }
  }
  out.add_special = !(writes_bos_ && !bos_.empty());
  return out;
}

std::variant<RenderedPrompt, ApiError> ChatTemplate::render_mistral(
    std::span<const ChatMessage> messages) const {
  if (auto err = check_alternation(messages, "mistral")) return *std::move(err);
  std::optional<std::string> system;
  if (!messages.empty() && messages[0].role == "system") {
    system = messages[0].content;
    messages = messages.subspan(1);
  }
  RenderedPrompt out;
  if (writes_bos_) out.text += bos_;
  if (system && mistral_system_ == MistralSystem::kSystemPromptTokens)
    out.text += "[SYSTEM_PROMPT]" + *system + "[/SYSTEM_PROMPT]";
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user") {
      // v0.3-style templates attach the system prompt only when the last
      // message is a user message; earlier ones attach it to the first.
      const bool with_system =
          system && ((mistral_system_ == MistralSystem::kFirstUser && i == 0) ||
                     (mistral_system_ == MistralSystem::kLastUser && i + 1 == messages.size()));
      out.text += mistral_open_;
      if (with_system) out.text += *system + "\n\n";
      out.text += m.content + mistral_close_;
    } else {
      if (mistral_space_before_answer_) out.text += " ";
      out.text += mistral_trim_answer_ ? python_strip(m.content) : m.content;
      out.text += eos_;
    }
  }
  out.add_special = !(writes_bos_ && !bos_.empty());
  return out;
}

}  // namespace tandem::server
