// Chat prompts rendered by the model's own Jinja chat template (the GGUF's
// tokenizer.chat_template, or --chat-template FILE), through tandem's Jinja
// interpreter (src/jinja), with the context transformers and vLLM give it:
// messages, tools, documents, add_generation_prompt, bos_token, eos_token
// and the request's chat_template_kwargs.
//
// A template that does not parse does not stop the server (unless it came
// from --chat-template, which stops start-up): chat requests then fail with
// a 400 that names the problem, and /v1/completions keeps working. A file
// with no template at all gets ChatML, as llama.cpp does, and says so.
#pragma once

#include <ctime>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include <nlohmann/json.hpp>

#include "server/api_error.h"

namespace tandem::jinja {
class Template;
}

namespace tandem::server {

// What a chat request gives the template, validated by the request parser:
// messages (roles system/user/assistant/tool, content a string or null,
// tool_calls with their arguments as objects), tools and documents (null
// when absent), and chat_template_kwargs (an object). Key order is the
// client's, as the template's tojson prints it.
struct ChatConversation {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;      // null or an array
  nlohmann::ordered_json documents;  // null or an array
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();
  bool add_generation_prompt = true;
};

struct RenderedPrompt {
  std::string text;
  // What to pass to Tokenizer::encode. add_special is false when the text
  // already starts with the BOS text (templates that write bos_token), so the
  // tokenizer must not add a second one; true otherwise (the tokenizer adds
  // BOS only if the model's metadata asks). parse_special is always true:
  // the template's markers must become control tokens.
  bool add_special = true;
  bool parse_special = true;
};

class ChatTemplate {
 public:
  // The server's template: `override_value` (--chat-template: a file path,
  // or the template text itself when it is not a file and holds "{%" or
  // "{{", as vLLM accepts) wins over `gguf_jinja` (tokenizer.chat_template,
  // empty when absent). Throws tandem::Error when the override cannot be
  // read or does not parse, so a bad flag stops the server at start-up.
  static ChatTemplate from_options(std::string_view override_value, std::string_view gguf_jinja,
                                   std::string bos_text, std::string eos_text);

  bool usable() const { return template_ != nullptr; }
  // Why the template is not usable (empty when it is).
  const std::string& error() const { return error_; }
  // One line for the start-up log, e.g. "from tokenizer.chat_template (1432 bytes)".
  std::string describe() const;

  // 400 when the template is not usable or fails on this conversation
  // (raise_exception, a type error, an unsupported feature, a sandbox
  // limit), with the template's own message and line.
  std::variant<RenderedPrompt, ApiError> render(const ChatConversation& conversation) const;

  // strftime_now's clock, for tests; unset: the system's local time.
  void set_clock(std::function<std::tm()> now) { now_ = std::move(now); }

 private:
  ChatTemplate() = default;

  std::shared_ptr<const jinja::Template> template_;
  std::string error_;
  std::string source_;  // for describe()
  std::string bos_;
  std::string eos_;
  std::function<std::tm()> now_;
};

// The template tandem uses for a model file that carries none: ChatML.
std::string_view builtin_chatml_template();

}  // namespace tandem::server
