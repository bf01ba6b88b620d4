// Chat prompts for the template families most GGUF models use, rendered the
// way their official Jinja templates (tokenizer.chat_template) render them.
//
// tandem does not execute Jinja. It recognizes a family by markers in the
// template text ("<|im_start|>", "<|start_header_id|>", "<<SYS>>", "[INST]"),
// reads the few details in which that family's official templates differ
// (default system prompt, BOS, spacing around [INST], ...) from the same text,
// and renders natively. A template it does not recognize does not stop the
// server: chat requests then fail with a 400 that names the template and says
// to pass --chat-template, and /v1/completions keeps working.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>

#include "server/api_error.h"

namespace tandem::server {

// Role is "system", "user" or "assistant" (the request parser maps
// "developer" to "system" and rejects roles no family renders).
struct ChatMessage {
  std::string role;
  std::string content;
};

enum class ChatFamily { kChatML, kLlama3, kLlama2, kMistral };

// "chatml", "llama3", "llama2", "mistral": the names --chat-template accepts.
std::string_view chat_family_name(ChatFamily family);
std::optional<ChatFamily> chat_family_from_name(std::string_view name);
// "chatml, llama3, llama2, mistral", for messages.
std::string chat_family_list();

struct RenderedPrompt {
  std::string text;
  // What to pass to Tokenizer::encode. add_special is false when the text
  // already holds the BOS text (Llama-3, Llama-2 and Mistral templates write
  // bos_token themselves), so the tokenizer must not add a second one; true
  // otherwise (the tokenizer adds BOS only if the model's metadata asks).
  // parse_special is always true: the markers must become control tokens.
  bool add_special = true;
  bool parse_special = true;
};

struct ChatRenderOptions {
  // Append the header of the assistant's turn. Llama-2 and Mistral templates
  // have no separate one (the prompt ends with "[/INST]" either way).
  bool add_generation_prompt = true;
  // "26 Jul 2024" style date for Llama-3.2 templates, which print today's date
  // (strftime_now); empty means the date their template falls back to.
  std::string today;
};

class ChatTemplate {
 public:
  // From the GGUF's tokenizer.chat_template (empty when the key is absent) and
  // the vocabulary's BOS / EOS token texts (empty when there are none). Never
  // fails: an empty or unrecognized template gives one whose render() returns
  // the 400 described above.
  static ChatTemplate detect(std::string_view jinja, std::string bos_text, std::string eos_text);
  // The family's canonical official template (what --chat-template selects).
  static ChatTemplate for_family(ChatFamily family, std::string bos_text, std::string eos_text);
  // The server's choice: `override_name` (--chat-template; empty when not
  // given) wins over detection. Throws tandem::Error for an unknown family
  // name, listing the known ones, so a typo stops the server at start-up.
  static ChatTemplate from_options(std::string_view override_name, std::string_view jinja,
                                   std::string bos_text, std::string eos_text);

  bool usable() const { return family_.has_value(); }
  std::optional<ChatFamily> family() const { return family_; }
  // Why the template is not usable (empty when it is).
  const std::string& error() const { return error_; }
  // One line for the start-up log, e.g. "llama3 (from tokenizer.chat_template)".
  std::string describe() const;

  // 400 when the template is not usable, or the messages break the family's
  // rules (Llama-2 and Mistral: an optional first system message, then user
  // and assistant alternating, starting with user).
  std::variant<RenderedPrompt, ApiError> render(std::span<const ChatMessage> messages,
                                                const ChatRenderOptions& options = {}) const;

 private:
  ChatTemplate() = default;

  // Where Mistral templates put the system prompt: before the first user
  // message (v0.2), before the last one if it ends the conversation (v0.3,
  // Nemo), or in [SYSTEM_PROMPT] tokens (Small 3).
  enum class MistralSystem { kFirstUser, kLastUser, kSystemPromptTokens };

  std::optional<ChatFamily> family_;
  std::string error_;
  std::string source_;  // for describe()
  std::string bos_;
  std::string eos_;
  bool writes_bos_ = false;          // the template emits bos_token itself
  std::string default_system_;       // ChatML (Qwen): system turn used when none is given
  bool llama3_date_header_ = false;  // Llama 3.1+: system turn with knowledge/today dates
  bool llama3_today_ = false;        // Llama 3.2: the date is today's (strftime_now)
  // Mistral templates put " [INST] ", "[INST] " or "[INST]" before a user
  // message, " [/INST]" or "[/INST]" after it, and may write a space before
  // an answer or trim it.
  std::string mistral_open_ = "[INST] ";
  std::string mistral_close_ = " [/INST]";
  MistralSystem mistral_system_ = MistralSystem::kFirstUser;
  bool mistral_space_before_answer_ = false;
  bool mistral_trim_answer_ = false;

  RenderedPrompt render_chatml(std::span<const ChatMessage> messages,
                               const ChatRenderOptions& options) const;
  RenderedPrompt render_llama3(std::span<const ChatMessage> messages,
                               const ChatRenderOptions& options) const;
  std::variant<RenderedPrompt, ApiError> render_llama2(std::span<const ChatMessage> messages) const;
  std::variant<RenderedPrompt, ApiError> render_mistral(
      std::span<const ChatMessage> messages) const;
};

// Python's str.strip(), which Jinja's trim filter and .strip() call: removes
// leading and trailing Unicode whitespace.
std::string python_strip(std::string_view s);

}  // namespace tandem::server
