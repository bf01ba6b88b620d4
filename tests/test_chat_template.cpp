// Chat templates: each family rendered against strings worked out by hand
// from its official Jinja template (system, user and assistant turns, with
// and without a generation prompt, BOS handling), detection from short
// templates written to resemble each family's official one, the variants read
// from the template text, unknown and missing templates, and --chat-template.

#include <gtest/gtest.h>

#include <string>
#include <variant>
#include <vector>

#include "server/chat_template.h"
#include "util/error.h"

namespace tandem::server {
namespace {

using Messages = std::vector<ChatMessage>;

// The conversation most tests render: the answer has surrounding spaces and
// the last question a trailing newline, so trimming shows.
const Messages kConversation = {
    {"system", "You are terse."},
    {"user", "Hi!"},
    {"assistant", "  Hello.  "},
    {"user", "Bye\n"},
};
const Messages kNoSystem(kConversation.begin() + 1, kConversation.end());

RenderedPrompt render_ok(const ChatTemplate& t, const Messages& messages,
                         const ChatRenderOptions& options = {}) {
  auto r = t.render(messages, options);
  if (const auto* err = std::get_if<ApiError>(&r)) {
    ADD_FAILURE() << "render failed: " << err->message;
    return {};
  }
  return std::get<RenderedPrompt>(r);
}

ApiError render_error(const ChatTemplate& t, const Messages& messages) {
  auto r = t.render(messages);
  if (const auto* err = std::get_if<ApiError>(&r)) return *err;
  ADD_FAILURE() << "render succeeded: " << std::get<RenderedPrompt>(r).text;
  return {};
}

// ---------------------------------------------------------------------------
// Templates resembling the official ones (the parts detection reads)

// Qwen2-style ChatML with a default system turn in the else branch; the text
// holds "\n" as the two characters Jinja unescapes, as GGUF files store it.
constexpr const char* kQwenTemplate =
    R"({%- if messages[0]['role'] == 'system' %})"
    R"({{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }})"
    R"({%- else %}{{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }})"
    R"({%- endif %}{%- for message in messages %})"
    R"({%- if not (message.role == 'system' and loop.first) %})"
    R"({{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }})"
    R"({%- endif %}{%- endfor %})"
    R"({%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %})";

// Plain ChatML (OpenHermes style): no default system, no BOS.
constexpr const char* kChatMLTemplate =
    R"({% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + )"
    R"(message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %})"
    R"({{ '<|im_start|>assistant\n' }}{% endif %})";

constexpr const char* kLlama30Template =
    R"({% set loop_messages = messages %}{% for message in loop_messages %})"
    R"({% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ )"
    R"(message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %})"
    R"({% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %})"
    R"({% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }})"
    R"({% endif %})";

constexpr const char* kLlama31Template =
    R"({{- bos_token }}{%- if not date_string is defined %}{%- set date_string = "26 Jul 2024" %})"
    R"({%- endif %}{%- if messages[0]['role'] == 'system' %})"
    R"({%- set system_message = messages[0]['content']|trim %}{%- set messages = messages[1:] %})"
    R"({%- else %}{%- set system_message = "" %}{%- endif %})"
    R"({{- "<|start_header_id|>system<|end_header_id|>\n\n" }})"
    R"({{- "Cutting Knowledge Date: December 2023\n" }})"
    R"({{- "Today Date: " + date_string + "\n\n" }}{{- system_message }}{{- "<|eot_id|>" }})"
    R"({%- for message in messages %}{{- '<|start_header_id|>' + message['role'] + )"
    R"('<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}{%- endfor %})"
    R"({%- if add_generation_prompt %})"
    R"({{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %})";

// 3.2 takes today's date when the renderer provides strftime_now.
const std::string kLlama32Template =
    std::string(R"({%- if strftime_now is defined %})"
                R"({%- set date_string = strftime_now("%d %b %Y") %}{%- endif %})") +
    kLlama31Template;

constexpr const char* kLlama2Template =
    R"({% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %})"
    R"({% set system_message = messages[0]['content'] %}{% else %})"
    R"({% set loop_messages = messages %}{% set system_message = false %}{% endif %})"
    R"({% for message in loop_messages %})"
    R"({% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %})"
    R"({{ raise_exception('Conversation roles must alternate user/assistant/...') }})"
    R"({% endif %}{% if loop.index0 == 0 and system_message != false %})"
    R"({% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %})"
    R"({% else %}{% set content = message['content'] %}{% endif %})"
    R"({% if message['role'] == 'user' %})"
    R"({{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }})"
    R"({% elif message['role'] == 'assistant' %})"
    R"({{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %})";

// Mistral-7B-Instruct-v0.2 with system prompt ("v1" spacing).
constexpr const char* kMistralV1Template =
    R"({%- if messages[0]['role'] == 'system' %})"
    R"({%- set system_message = messages[0]['content'] %}{%- set loop_messages = messages[1:] %})"
    R"({%- else %}{%- set loop_messages = messages %}{%- endif %}{{- bos_token }})"
    R"({%- for message in loop_messages %}{%- if message['role'] == 'user' %})"
    R"({%- if loop.first and system_message is defined %})"
    R"({{- ' [INST] ' + system_message + '\n\n' + message['content'] + ' [/INST]' }})"
    R"({%- else %}{{- ' [INST] ' + message['content'] + ' [/INST]' }}{%- endif %})"
    R"({%- elif message['role'] == 'assistant' %}{{- ' ' + message['content'] + eos_token}})"
    R"({%- endif %}{%- endfor %})";

// Mistral-7B-Instruct-v0.3 ("v3"): system prompt on the last user turn.
constexpr const char* kMistralV3Template =
    R"({%- if messages[0]["role"] == "system" %})"
    R"({%- set system_message = messages[0]["content"] %}{%- set loop_messages = messages[1:] %})"
    R"({%- else %}{%- set loop_messages = messages %}{%- endif %}{{- bos_token }})"
    R"({%- for message in loop_messages %}{%- if message["role"] == "user" %})"
    R"({%- if loop.last and system_message is defined %})"
    R"({{- "[INST] " + system_message + "\n\n" + message["content"] + "[/INST]" }})"
    R"({%- else %}{{- "[INST] " + message["content"] + "[/INST]" }}{%- endif %})"
    R"({%- elif message["role"] == "assistant" %})"
    R"({{- " " + message["content"]|trim + eos_token}}{%- endif %}{%- endfor %})";

// Mistral-Nemo ("v3-tekken"): no spaces inside the [INST] markers.
constexpr const char* kMistralTekkenTemplate =
    R"({{- bos_token }}{%- for message in loop_messages %}{%- if message["role"] == "user" %})"
    R"({%- if loop.last and system_message is defined %})"
    R"({{- "[INST]" + system_message + "\n\n" + message["content"] + "[/INST]" }})"
    R"({%- else %}{{- "[INST]" + message["content"] + "[/INST]" }}{%- endif %})"
    R"({%- elif message.role == "assistant" %})"
    R"({{- " " + message.content | trim + eos_token}}{%- endif %}{%- endfor %})";

// The older Mistral template without system support; tandem prepends the
// system prompt to the first user message.
constexpr const char* kMistralOldTemplate =
    R"({{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %})"
    R"({{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %})"
    R"({{ message['content'] + eos_token}}{% endif %}{% endfor %})";

// Mistral Small 3 ("v7"): system prompt in its own tokens.
constexpr const char* kMistralV7Template =
    R"({{- bos_token }}{%- if system_message is defined %})"
    R"({{- '[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]' }}{%- endif %})"
    R"({%- for message in loop_messages %}{%- if message['role'] == 'user' %})"
    R"({{- '[INST]' + message['content'] + '[/INST]' }}{%- elif message['role'] == 'assistant' %})"
    R"({{- message['content'] + eos_token }}{%- endif %}{%- endfor %})";

constexpr const char* kGemmaTemplate =
    R"({{ bos_token }}{% for message in messages %}{{ '<start_of_turn>' + message['role'] )"
    R"(+ '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %})"
    R"({% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %})";

// ---------------------------------------------------------------------------
// Family names

TEST(ChatTemplateFamily, NamesRoundTrip) {
  for (ChatFamily f :
       {ChatFamily::kChatML, ChatFamily::kLlama3, ChatFamily::kLlama2, ChatFamily::kMistral}) {
    EXPECT_EQ(chat_family_from_name(chat_family_name(f)), f);
  }
  EXPECT_EQ(chat_family_name(ChatFamily::kChatML), "chatml");
  EXPECT_EQ(chat_family_name(ChatFamily::kLlama3), "llama3");
  EXPECT_EQ(chat_family_name(ChatFamily::kLlama2), "llama2");
  EXPECT_EQ(chat_family_name(ChatFamily::kMistral), "mistral");
  EXPECT_FALSE(chat_family_from_name("ChatML").has_value());
  EXPECT_FALSE(chat_family_from_name("").has_value());
  EXPECT_EQ(chat_family_list(), "chatml, llama3, llama2, mistral");
}

TEST(ChatTemplateStrip, MatchesPythonStrip) {
  EXPECT_EQ(python_strip("  a b  "), "a b");
  EXPECT_EQ(python_strip("\t\n\r\v\fx\n"), "x");
  EXPECT_EQ(python_strip(""), "");
  EXPECT_EQ(python_strip(" \n "), "");
  // No-break space, ideographic space and U+2028 are whitespace to Python;
  // U+200B (zero width space) is not.
  EXPECT_EQ(python_strip("\xC2\xA0x\xE3\x80\x80"), "x");
  EXPECT_EQ(python_strip("\xE2\x80\xA8x y\xE2\x80\xA9"), "x y");
  EXPECT_EQ(python_strip("\xE2\x80\x8Bx"), "\xE2\x80\x8Bx");
  // Bytes that are not UTF-8 are kept as they are.
  EXPECT_EQ(python_strip(" \xFFx\xC3 "), "\xFFx\xC3");
}

// ---------------------------------------------------------------------------
// ChatML

TEST(ChatTemplateChatML, CanonicalRendering) {
  const auto t = ChatTemplate::for_family(ChatFamily::kChatML, "", "<|im_end|>");
  ASSERT_TRUE(t.usable());
  const RenderedPrompt p = render_ok(t, kConversation);
  EXPECT_EQ(p.text,
            "<|im_start|>system\nYou are terse.<|im_end|>\n"
            "<|im_start|>user\nHi!<|im_end|>\n"
            "<|im_start|>assistant\n  Hello.  <|im_end|>\n"
            "<|im_start|>user\nBye\n<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_TRUE(p.add_special);
  EXPECT_TRUE(p.parse_special);

  ChatRenderOptions no_prompt;
  no_prompt.add_generation_prompt = false;
  EXPECT_EQ(render_ok(t, {{"user", "Hi!"}}, no_prompt).text, "<|im_start|>user\nHi!<|im_end|>\n");
}

TEST(ChatTemplateChatML, DetectedWithoutDefaultSystem) {
  const auto t = ChatTemplate::detect(kChatMLTemplate, "<s>", "</s>");
  ASSERT_TRUE(t.usable());
  EXPECT_EQ(t.family(), ChatFamily::kChatML);
  const RenderedPrompt p = render_ok(t, {{"user", "Hi!"}});
  EXPECT_EQ(p.text, "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n");
  // The template writes no BOS, so the tokenizer adds one if the model wants it.
  EXPECT_TRUE(p.add_special);
}

TEST(ChatTemplateChatML, QwenDefaultSystemPrompt) {
  const auto t = ChatTemplate::detect(kQwenTemplate, "", "<|im_end|>");
  ASSERT_TRUE(t.usable());
  EXPECT_EQ(render_ok(t, kNoSystem).text,
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nHi!<|im_end|>\n"
            "<|im_start|>assistant\n  Hello.  <|im_end|>\n"
            "<|im_start|>user\nBye\n<|im_end|>\n"
            "<|im_start|>assistant\n");
  // A system message of the caller's replaces the default.
  EXPECT_EQ(render_ok(t, {{"system", "S"}, {"user", "U"}}).text,
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_NE(t.describe().find("default system prompt"), std::string::npos);
}

TEST(ChatTemplateChatML, BosWhenTheTemplateWritesIt) {
  const std::string jinja = std::string("{{ bos_token }}") + kChatMLTemplate;
  const auto t = ChatTemplate::detect(jinja, "<s>", "</s>");
  const RenderedPrompt p = render_ok(t, {{"user", "Hi!"}});
  EXPECT_EQ(p.text, "<s><|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_FALSE(p.add_special);
}

// ---------------------------------------------------------------------------
// Llama 3

TEST(ChatTemplateLlama3, Llama30) {
  const auto t = ChatTemplate::detect(kLlama30Template, "<|begin_of_text|>", "<|eot_id|>");
  ASSERT_TRUE(t.usable());
  EXPECT_EQ(t.family(), ChatFamily::kLlama3);
  const RenderedPrompt p = render_ok(t, kConversation);
  EXPECT_EQ(p.text,
            "<|begin_of_text|>"
            "<|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_FALSE(p.add_special);  // BOS is in the text
  EXPECT_TRUE(p.parse_special);

  ChatRenderOptions no_prompt;
  no_prompt.add_generation_prompt = false;
  EXPECT_EQ(render_ok(t, {{"user", "Hi!"}}, no_prompt).text,
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>");
  // The canonical llama3 family is the same template.
  const auto canon = ChatTemplate::for_family(ChatFamily::kLlama3, "<|begin_of_text|>", "");
  EXPECT_EQ(render_ok(canon, kConversation).text, p.text);
}

TEST(ChatTemplateLlama3, Llama31DateHeader) {
  const auto t = ChatTemplate::detect(kLlama31Template, "<|begin_of_text|>", "<|eot_id|>");
  ASSERT_TRUE(t.usable());
  const std::string header =
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
      "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n";
  EXPECT_EQ(render_ok(t, kConversation).text,
            header +
                "You are terse.<|eot_id|>"
                "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
                "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\n");
  // Without a system message the system turn still carries the dates.
  EXPECT_EQ(render_ok(t, {{"user", " Hi! "}}).text,
            header +
                "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\n");
  // 3.1 prints its fixed date whatever today is.
  ChatRenderOptions today;
  today.today = "01 Jan 2030";
  EXPECT_EQ(render_ok(t, {{"user", "x"}}, today).text.find("2030"), std::string::npos);
}

TEST(ChatTemplateLlama3, Llama32TodaysDate) {
  const auto t = ChatTemplate::detect(kLlama32Template, "<|begin_of_text|>", "<|eot_id|>");
  ChatRenderOptions today;
  today.today = "01 Jan 2030";
  EXPECT_EQ(render_ok(t, {{"user", "x"}}, today).text,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            "Cutting Knowledge Date: December 2023\nToday Date: 01 Jan 2030\n\n<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nx<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  // Without a date the template's fallback is used.
  EXPECT_NE(render_ok(t, {{"user", "x"}}).text.find("Today Date: 26 Jul 2024"), std::string::npos);
}

TEST(ChatTemplateLlama3, NoBosTokenInTemplate) {
  const auto t = ChatTemplate::detect(
      "{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>{% endfor %}",
      "<|begin_of_text|>", "<|eot_id|>");
  const RenderedPrompt p = render_ok(t, {{"user", "Hi"}});
  EXPECT_EQ(p.text,
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_TRUE(p.add_special);
}

// ---------------------------------------------------------------------------
// Llama 2

TEST(ChatTemplateLlama2, OfficialTemplate) {
  const auto t = ChatTemplate::detect(kLlama2Template, "<s>", "</s>");
  ASSERT_TRUE(t.usable());
  EXPECT_EQ(t.family(), ChatFamily::kLlama2);
  const RenderedPrompt p = render_ok(t, kConversation);
  EXPECT_EQ(p.text,
            "<s>[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi! [/INST] Hello. </s>"
            "<s>[INST] Bye [/INST]");
  EXPECT_FALSE(p.add_special);
  EXPECT_EQ(render_ok(t, kNoSystem).text, "<s>[INST] Hi! [/INST] Hello. </s><s>[INST] Bye [/INST]");
  // The template has no generation prompt of its own: the text is the same.
  ChatRenderOptions no_prompt;
  no_prompt.add_generation_prompt = false;
  EXPECT_EQ(render_ok(t, kNoSystem, no_prompt).text, render_ok(t, kNoSystem).text);
  // Ending on an answer closes the turn.
  EXPECT_EQ(render_ok(t, {{"user", "Q"}, {"assistant", "A"}}).text, "<s>[INST] Q [/INST] A </s>");
  // The whole first turn is stripped, system block included.
  EXPECT_EQ(render_ok(t, {{"system", " S "}, {"user", "Q "}}).text,
            "<s>[INST] <<SYS>>\n S \n<</SYS>>\n\nQ [/INST]");
  const auto canon = ChatTemplate::for_family(ChatFamily::kLlama2, "<s>", "</s>");
  EXPECT_EQ(render_ok(canon, kConversation).text, p.text);
}

TEST(ChatTemplateLlama2, RolesMustAlternate) {
  const auto t = ChatTemplate::for_family(ChatFamily::kLlama2, "<s>", "</s>");
  for (const Messages& bad :
       {Messages{{"user", "a"}, {"user", "b"}}, Messages{{"assistant", "a"}},
        Messages{{"system", "s"}, {"assistant", "a"}}, Messages{{"user", "a"}, {"system", "s"}}}) {
    const ApiError err = render_error(t, bad);
    EXPECT_EQ(err.status, 400);
    EXPECT_EQ(err.type, "invalid_request_error");
    EXPECT_EQ(err.param, "messages");
    EXPECT_NE(err.message.find("alternating"), std::string::npos) << err.message;
  }
  const ApiError err = render_error(t, {{"user", "a"}, {"user", "b"}});
  EXPECT_NE(err.message.find("message 1 has role 'user' where 'assistant' was expected"),
            std::string::npos)
      << err.message;
}

// ---------------------------------------------------------------------------
// Mistral

TEST(ChatTemplateMistral, CanonicalIsV1WithSystemOnFirstTurn) {
  const auto t = ChatTemplate::for_family(ChatFamily::kMistral, "<s>", "</s>");
  const RenderedPrompt p = render_ok(t, kConversation);
  EXPECT_EQ(p.text, "<s> [INST] You are terse.\n\nHi! [/INST]   Hello.  </s> [INST] Bye\n [/INST]");
  EXPECT_FALSE(p.add_special);
  const auto detected = ChatTemplate::detect(kMistralV1Template, "<s>", "</s>");
  EXPECT_EQ(detected.family(), ChatFamily::kMistral);
  EXPECT_EQ(render_ok(detected, kConversation).text, p.text);
}

TEST(ChatTemplateMistral, V3SystemOnLastTurnAndTrimmedAnswers) {
  const auto t = ChatTemplate::detect(kMistralV3Template, "<s>", "</s>");
  ASSERT_TRUE(t.usable());
  EXPECT_EQ(render_ok(t, kConversation).text,
            "<s>[INST] Hi![/INST] Hello.</s>[INST] You are terse.\n\nBye\n[/INST]");
  // The system prompt rides on the last message only if that is a user turn.
  EXPECT_EQ(render_ok(t, {{"system", "S"}, {"user", "Q"}, {"assistant", "A"}}).text,
            "<s>[INST] Q[/INST] A</s>");
  EXPECT_NE(t.describe().find("last turn"), std::string::npos);
}

TEST(ChatTemplateMistral, TekkenHasNoSpacesInMarkers) {
  const auto t = ChatTemplate::detect(kMistralTekkenTemplate, "<s>", "</s>");
  EXPECT_EQ(render_ok(t, kConversation).text,
            "<s>[INST]Hi![/INST] Hello.</s>[INST]You are terse.\n\nBye\n[/INST]");
}

TEST(ChatTemplateMistral, OldTemplateGetsSystemOnFirstTurn) {
  const auto t = ChatTemplate::detect(kMistralOldTemplate, "<s>", "</s>");
  EXPECT_EQ(render_ok(t, kConversation).text,
            "<s>[INST] You are terse.\n\nHi! [/INST]  Hello.  </s>[INST] Bye\n [/INST]");
}

TEST(ChatTemplateMistral, V7SystemPromptTokens) {
  const auto t = ChatTemplate::detect(kMistralV7Template, "<s>", "</s>");
  EXPECT_EQ(render_ok(t, kConversation).text,
            "<s>[SYSTEM_PROMPT]You are terse.[/SYSTEM_PROMPT][INST]Hi![/INST]  Hello.  </s>"
            "[INST]Bye\n[/INST]");
  EXPECT_EQ(render_ok(t, {{"user", "Q"}}).text, "<s>[INST]Q[/INST]");
}

TEST(ChatTemplateMistral, RolesMustAlternate) {
  const auto t = ChatTemplate::for_family(ChatFamily::kMistral, "<s>", "</s>");
  const ApiError err = render_error(t, {{"user", "a"}, {"assistant", "b"}, {"assistant", "c"}});
  EXPECT_EQ(err.status, 400);
  EXPECT_EQ(err.param, "messages");
  EXPECT_NE(err.message.find("mistral"), std::string::npos);
}

// ---------------------------------------------------------------------------
// Detection, unknown and missing templates, --chat-template

TEST(ChatTemplateDetect, FamiliesByMarkers) {
  EXPECT_EQ(ChatTemplate::detect(kQwenTemplate, "", "").family(), ChatFamily::kChatML);
  EXPECT_EQ(ChatTemplate::detect(kChatMLTemplate, "", "").family(), ChatFamily::kChatML);
  EXPECT_EQ(ChatTemplate::detect(kLlama30Template, "", "").family(), ChatFamily::kLlama3);
  EXPECT_EQ(ChatTemplate::detect(kLlama31Template, "", "").family(), ChatFamily::kLlama3);
  // Llama-2's template contains [INST] too; <<SYS>> decides.
  EXPECT_EQ(ChatTemplate::detect(kLlama2Template, "", "").family(), ChatFamily::kLlama2);
  for (const char* m : {kMistralV1Template, kMistralV3Template, kMistralTekkenTemplate,
                        kMistralOldTemplate, kMistralV7Template}) {
    EXPECT_EQ(ChatTemplate::detect(m, "", "").family(), ChatFamily::kMistral) << m;
  }
  const auto t = ChatTemplate::detect(kLlama31Template, "", "");
  EXPECT_EQ(t.describe(), "llama3 (detected from tokenizer.chat_template; Llama 3.1+ date header)");
  EXPECT_TRUE(t.error().empty());
}

TEST(ChatTemplateDetect, UnknownTemplateIsNamedInA400) {
  const auto t = ChatTemplate::detect(kGemmaTemplate, "<bos>", "<eos>");
  EXPECT_FALSE(t.usable());
  EXPECT_FALSE(t.family().has_value());
  // The first 80 characters, followed by "...", and the known families.
  const std::string first80 = std::string(kGemmaTemplate).substr(0, 80);
  EXPECT_NE(t.error().find("\"" + first80 + "...\""), std::string::npos) << t.error();
  EXPECT_EQ(t.error().find(std::string(kGemmaTemplate).substr(0, 81)), std::string::npos);
  for (const char* name : {"chatml", "llama3", "llama2", "mistral", "--chat-template"})
    EXPECT_NE(t.error().find(name), std::string::npos) << name;
  const ApiError err = render_error(t, {{"user", "Hi"}});
  EXPECT_EQ(err.status, 400);
  EXPECT_EQ(err.type, "invalid_request_error");
  EXPECT_EQ(err.message, t.error());
  EXPECT_EQ(err.code, "chat_template_error");
  EXPECT_NE(t.describe().find("none"), std::string::npos);
}

TEST(ChatTemplateDetect, ShortTemplateAndNewlinesInExcerpt) {
  const auto t = ChatTemplate::detect("<|user|>\n{{ content }}", "", "");
  EXPECT_NE(t.error().find("\"<|user|>\\n{{ content }}\""), std::string::npos) << t.error();
  // Cutting at 80 characters never splits a UTF-8 character.
  std::string wide;
  for (int i = 0; i < 100; ++i) wide += "\xE2\x82\xAC";  // euro signs
  const auto w = ChatTemplate::detect(wide, "", "");
  std::string euro80;
  for (int i = 0; i < 80; ++i) euro80 += "\xE2\x82\xAC";
  EXPECT_NE(w.error().find(euro80 + "...\""), std::string::npos);
}

TEST(ChatTemplateDetect, MissingTemplateSaysToPassChatTemplate) {
  const auto t = ChatTemplate::detect("", "<s>", "</s>");
  EXPECT_FALSE(t.usable());
  EXPECT_NE(t.error().find("no chat template"), std::string::npos);
  EXPECT_NE(t.error().find("--chat-template"), std::string::npos);
  EXPECT_EQ(render_error(t, {{"user", "Hi"}}).status, 400);
}

TEST(ChatTemplateDetect, OverrideWinsAndBadNamesThrow) {
  // An unknown template becomes usable with an override ...
  const auto t = ChatTemplate::from_options("llama2", kGemmaTemplate, "<s>", "</s>");
  ASSERT_TRUE(t.usable());
  EXPECT_EQ(t.family(), ChatFamily::kLlama2);
  EXPECT_EQ(render_ok(t, {{"user", "Q"}}).text, "<s>[INST] Q [/INST]");
  EXPECT_EQ(t.describe(), "llama2 (--chat-template)");
  // ... a recognized one is replaced by the named family ...
  const auto c = ChatTemplate::from_options("chatml", kLlama30Template, "<s>", "</s>");
  EXPECT_EQ(c.family(), ChatFamily::kChatML);
  EXPECT_EQ(render_ok(c, {{"user", "Q"}}).text,
            "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n");
  // ... no override means detection, and a missing template plus an override works.
  EXPECT_EQ(ChatTemplate::from_options("", kLlama30Template, "", "").family(), ChatFamily::kLlama3);
  EXPECT_TRUE(ChatTemplate::from_options("mistral", "", "<s>", "</s>").usable());
  try {
    ChatTemplate::from_options("llama-3", kLlama30Template, "", "");
    ADD_FAILURE() << "no exception for an unknown family";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("llama-3"), std::string::npos) << what;
    EXPECT_NE(what.find("chatml, llama3, llama2, mistral"), std::string::npos) << what;
  }
}

TEST(ChatTemplateDetect, EmptyBosTextMeansTheTokenizerDecides) {
  // A Llama-3 template for a vocabulary without BOS: nothing to write, so the
  // tokenizer is left to its metadata.
  const auto t = ChatTemplate::detect(kLlama30Template, "", "<|eot_id|>");
  const RenderedPrompt p = render_ok(t, {{"user", "Q"}});
  EXPECT_EQ(p.text.rfind("<|start_header_id|>user", 0), 0u);
  EXPECT_TRUE(p.add_special);
}

}  // namespace
}  // namespace tandem::server
