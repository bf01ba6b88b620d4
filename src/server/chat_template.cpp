#include "server/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "jinja/template.h"
#include "util/error.h"

namespace tandem::server {

std::string_view builtin_chatml_template() {
  return "{%- for message in messages %}"
         "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] if message['content'] is string else '') + '<|im_end|>\\n' }}"
         "{%- endfor %}"
         "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";
}

namespace {

std::shared_ptr<const jinja::Template> parse_or_null(std::string_view text, std::string& error) {
  try {
    return std::make_shared<const jinja::Template>(jinja::Template::parse(text));
  } catch (const jinja::TemplateError& e) {
    error = e.describe();
    return nullptr;
  }
}

}  // namespace

ChatTemplate ChatTemplate::from_options(std::string_view override_value, std::string_view gguf_jinja,
                                        std::string bos_text, std::string eos_text) {
  ChatTemplate t;
  t.bos_ = std::move(bos_text);
  t.eos_ = std::move(eos_text);
  if (!override_value.empty()) {
    const std::string value(override_value);
    std::string text;
    std::error_code ec;
    if (std::filesystem::is_regular_file(value, ec)) {
      std::ifstream in(value, std::ios::binary);
      std::stringstream ss;
      ss << in.rdbuf();
      if (!in) throw Error("--chat-template: cannot read " + value);
      text = ss.str();
      t.source_ = "from " + value;
    } else if (value.find("{%") != std::string::npos || value.find("{{") != std::string::npos) {
      text = value;
      t.source_ = "from --chat-template (inline)";
    } else {
      throw Error("--chat-template: no such file: " + value +
                  " (give the path of a Jinja chat template file, or the template text itself)");
    }
    std::string error;
    t.template_ = parse_or_null(text, error);
    if (!t.template_) throw Error("--chat-template " + value + " does not parse: " + error);
    t.source_ += " (" + std::to_string(text.size()) + " bytes)";
    return t;
  }
  if (gguf_jinja.empty()) {
    std::string error;
    t.template_ = parse_or_null(builtin_chatml_template(), error);
    t.source_ = "chatml (built in: the model file has no tokenizer.chat_template; pass --chat-template FILE for another)";
    return t;
  }
  t.template_ = parse_or_null(gguf_jinja, t.error_);
  if (!t.template_) {
    t.error_ = "the model's chat template (tokenizer.chat_template) does not parse: " + t.error_ +
               "; pass --chat-template FILE with one that does";
    t.source_ = "none usable: " + t.error_;
    return t;
  }
  t.source_ = "from tokenizer.chat_template (" + std::to_string(gguf_jinja.size()) + " bytes)";
  return t;
}

std::string ChatTemplate::describe() const { return source_; }

std::variant<RenderedPrompt, ApiError> ChatTemplate::render(const ChatConversation& c) const {
  auto failed = [](const std::string& message) {
    ApiError e = invalid_value("messages", valid_utf8(message));
    e.code = "chat_template_error";
    return e;
  };
  if (!template_) return failed(error_);
  jinja::RenderOptions options;
  options.now = now_;
  RenderedPrompt p;
  try {
    jinja::Dict ctx;  // the request's JSON becomes values in here: it can be too deep (kLimit)
    ctx.set(jinja::Value("messages"), jinja::Value::from_json(c.messages));
    ctx.set(jinja::Value("tools"), jinja::Value::from_json(c.tools));
    ctx.set(jinja::Value("documents"), jinja::Value::from_json(c.documents));
    ctx.set(jinja::Value("add_generation_prompt"), jinja::Value(c.add_generation_prompt));
    ctx.set(jinja::Value("bos_token"), jinja::Value(bos_));
    ctx.set(jinja::Value("eos_token"), jinja::Value(eos_));
    for (const auto& [k, v] : c.template_kwargs.items()) ctx.set(jinja::Value(k), jinja::Value::from_json(v));
    p.text = template_->render(ctx, options);
  } catch (const jinja::TemplateError& err) {
    switch (err.kind()) {
      case jinja::ErrorKind::kRaised: return failed("the chat template refused the conversation: " + err.describe());
      case jinja::ErrorKind::kUnsupported:
        return failed("the chat template uses a Jinja feature tandem does not implement: " + err.describe());
      case jinja::ErrorKind::kLimit: return failed("the chat template hit a sandbox limit: " + err.describe());
      default: return failed("the chat template failed: " + err.describe());
    }
  } catch (const std::exception& err) {  // memory: a value too large to build
    return failed(std::string("the chat template hit a sandbox limit: ") + err.what());
  }
  p.add_special = bos_.empty() || p.text.compare(0, bos_.size(), bos_) != 0;
  return p;
}

}  // namespace tandem::server
