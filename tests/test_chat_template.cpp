// The server's chat template: which template it takes (--chat-template
// file or text, the GGUF's, ChatML for a file with none), the context it
// renders with (messages, tools, add_generation_prompt, bos/eos tokens,
// chat_template_kwargs, strftime_now's date), BOS handling, and each
// failure as a 400 that names it. The interpreter's own correctness is
// tests/test_jinja.cpp's differential tests against Jinja2.

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <variant>

#include "server/chat_template.h"
#include "util/error.h"

namespace tandem::server {
namespace {

using oj = nlohmann::ordered_json;

ChatConversation conversation(const char* messages_json) {
  ChatConversation c;
  c.messages = oj::parse(messages_json);
  return c;
}

RenderedPrompt render_ok(const ChatTemplate& t, const ChatConversation& c) {
  auto r = t.render(c);
  if (const auto* err = std::get_if<ApiError>(&r)) {
    ADD_FAILURE() << "render failed: " << err->message;
    return {};
  }
  return std::get<RenderedPrompt>(r);
}

ApiError render_error(const ChatTemplate& t, const ChatConversation& c) {
  auto r = t.render(c);
  if (const auto* err = std::get_if<ApiError>(&r)) return *err;
  ADD_FAILURE() << "rendered: " << std::get<RenderedPrompt>(r).text;
  return {};
}

const char* kHiThere = R"([{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi!"}])";

TEST(ChatTemplate, TheModelsOwnTemplateRendersWithBosAndEosTokens) {
  const ChatTemplate t = ChatTemplate::from_options(
      "", "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{{ eos_token }}{% endfor %}"
          "{% if add_generation_prompt %}[assistant]{% endif %}",
      "<s>", "</s>");
  ASSERT_TRUE(t.usable());
  EXPECT_NE(t.describe().find("tokenizer.chat_template"), std::string::npos);
  ChatConversation c = conversation(kHiThere);
  RenderedPrompt p = render_ok(t, c);
  EXPECT_EQ(p.text, "<s>[system]Be terse.</s>[user]Hi!</s>[assistant]");
  EXPECT_FALSE(p.add_special);  // the template wrote BOS itself
  EXPECT_TRUE(p.parse_special);
  c.add_generation_prompt = false;
  EXPECT_EQ(render_ok(t, c).text, "<s>[system]Be terse.</s>[user]Hi!</s>");
}

TEST(ChatTemplate, ATemplateWithoutBosLeavesBosToTheTokenizer) {
  const ChatTemplate t = ChatTemplate::from_options("", "{% for m in messages %}{{ m.content }}{% endfor %}", "<s>", "</s>");
  EXPECT_TRUE(render_ok(t, conversation(kHiThere)).add_special);
  const ChatTemplate no_bos = ChatTemplate::from_options("", "{{ bos_token }}x", "", "");
  EXPECT_TRUE(render_ok(no_bos, conversation(kHiThere)).add_special);  // no BOS text: the tokenizer decides
}

TEST(ChatTemplate, AFileWithoutATemplateGetsChatML) {
  const ChatTemplate t = ChatTemplate::from_options("", "", "", "<|im_end|>");
  ASSERT_TRUE(t.usable());
  EXPECT_NE(t.describe().find("chatml"), std::string::npos);
  EXPECT_EQ(render_ok(t, conversation(kHiThere)).text,
            "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, ChatTemplateKwargsAndToolsReachTheTemplate) {
  // The shape of a thinking switch and a tool list, as Qwen3-style templates read them.
  const ChatTemplate t = ChatTemplate::from_options(
      "",
      "{% if tools %}{% for tool in tools %}{{ tool.function.name }};{% endfor %}{% endif %}"
      "{{ messages[-1].content }}"
      "{% if add_generation_prompt %}<a>{% if enable_thinking is defined and enable_thinking is false %}"
      "<think></think>{% endif %}{% endif %}",
      "", "");
  ChatConversation c = conversation(kHiThere);
  EXPECT_EQ(render_ok(t, c).text, "Hi!<a>");
  c.template_kwargs = oj{{"enable_thinking", false}};
  EXPECT_EQ(render_ok(t, c).text, "Hi!<a><think></think>");
  c.tools = oj::parse(R"([{"type": "function", "function": {"name": "get_weather"}}, {"type": "function", "function": {"name": "search"}}])");
  EXPECT_EQ(render_ok(t, c).text, "get_weather;search;Hi!<a><think></think>");
}

TEST(ChatTemplate, StrftimeNowPrintsTodaysDate) {
  // Llama-3.2-style: the system turn carries today's date.
  ChatTemplate t = ChatTemplate::from_options("", "Today Date: {{ strftime_now('%d %b %Y') }}", "", "");
  t.set_clock([] {
    std::tm tm{};
    tm.tm_year = 2026 - 1900;
    tm.tm_mon = 11;
    tm.tm_mday = 3;
    return tm;
  });
  EXPECT_EQ(render_ok(t, conversation(kHiThere)).text, "Today Date: 03 Dec 2026");
}

TEST(ChatTemplate, RaiseExceptionIsA400WithTheTemplatesMessage) {
  const ChatTemplate t = ChatTemplate::from_options(
      "", "{% if messages[0].role != 'user' %}\n{{ raise_exception('Conversation must start with a user message') }}{% endif %}", "", "");
  const ApiError e = render_error(t, conversation(kHiThere));
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "messages");
  EXPECT_EQ(e.code, "chat_template_error");
  EXPECT_NE(e.message.find("refused the conversation: Conversation must start with a user message (line 2)"), std::string::npos) << e.message;
}

TEST(ChatTemplate, AnUnsupportedFeatureOrALimitIsA400NamingIt) {
  const ChatTemplate t = ChatTemplate::from_options("", "{{ messages|wordcount }}", "", "");
  const ApiError e = render_error(t, conversation(kHiThere));
  EXPECT_NE(e.message.find("does not implement: no filter named 'wordcount'"), std::string::npos) << e.message;
  // The output limit (16 MiB) is reached after some 17,000 iterations; the
  // step limit, the same path, is tested at a lower setting in test_jinja
  // (20 M steps take over a minute under ASan).
  const ChatTemplate loop =
      ChatTemplate::from_options("", "{% for a in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", "", "");
  const std::string message = render_error(loop, conversation(kHiThere)).message;
  EXPECT_NE(message.find("sandbox limit"), std::string::npos) << message;
  EXPECT_NE(message.find("would exceed 16777216 bytes"), std::string::npos) << message;
}

TEST(ChatTemplate, AGgufTemplateThatDoesNotParseLeavesTheServerUpAndChatsA400) {
  const ChatTemplate t = ChatTemplate::from_options("", "{% for m in messages %}never closed", "", "");
  EXPECT_FALSE(t.usable());
  EXPECT_NE(t.error().find("does not parse"), std::string::npos);
  const ApiError e = render_error(t, conversation(kHiThere));
  EXPECT_EQ(e.status, 400);
  EXPECT_NE(e.message.find("--chat-template"), std::string::npos) << e.message;
}

TEST(ChatTemplate, ChatTemplateFlagTakesAFileOrTheTextAndRefusesWhatItCannotUse) {
  char path[] = "/tmp/tandem-chat-template-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  { std::ofstream(path) << "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"; }
  const ChatTemplate from_file = ChatTemplate::from_options(path, "{{ 'gguf' }}", "", "");
  EXPECT_EQ(render_ok(from_file, conversation(kHiThere)).text, "<system>Be terse.<user>Hi!");
  EXPECT_NE(from_file.describe().find(path), std::string::npos);
  const ChatTemplate inline_text = ChatTemplate::from_options("{{ messages|length }}", "{{ 'gguf' }}", "", "");
  EXPECT_EQ(render_ok(inline_text, conversation(kHiThere)).text, "2");
  EXPECT_THROW(ChatTemplate::from_options("/no/such/template.jinja", "", "", ""), Error);
  { std::ofstream(path) << "{% if %}"; }
  EXPECT_THROW(ChatTemplate::from_options(path, "", "", ""), Error);
  std::remove(path);
}

}  // namespace
}  // namespace tandem::server
