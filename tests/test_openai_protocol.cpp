// The OpenAI-compatible request/response layer: every request field parsed
// and mapped into SamplingParams, every kind of bad input answered with the
// right status, type, param and code, unknown fields ignored, response JSON
// compared whole against OpenAI's shapes, the error helpers, and a fuzz test
// of the parsers over 20k deterministic mutations of valid bodies.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "jinja_cases.h"
#include "server/api_error.h"
#include "server/chat_template.h"
#include "server/openai_protocol.h"

namespace tandem::server {
namespace {

using json = nlohmann::json;

constexpr int64_t kVocab = 1000;

template <class T>
T parsed_ok(Parsed<T> r) {
  if (const auto* err = std::get_if<ApiError>(&r)) {
    ADD_FAILURE() << "unexpected error " << err->status << ": " << err->message;
    return T{};
  }
  return std::get<T>(std::move(r));
}

template <class T>
ApiError parsed_error(Parsed<T> r) {
  if (auto* err = std::get_if<ApiError>(&r)) return *err;
  ADD_FAILURE() << "parsed although an error was expected";
  return ApiError{};
}

CompletionRequest completion(const std::string& body) {
  return parsed_ok(parse_completion_request(body, kVocab));
}
ApiError completion_error(const std::string& body) {
  return parsed_error(parse_completion_request(body, kVocab));
}
ChatRequest chat(const std::string& body) { return parsed_ok(parse_chat_request(body, kVocab)); }
ApiError chat_error(const std::string& body) {
  return parsed_error(parse_chat_request(body, kVocab));
}

// A completion body with `extra` (a JSON fragment like "\"n\": 2") added.
std::string cbody(const std::string& extra) {
  return "{\"prompt\": \"Hello\"" + (extra.empty() ? "" : ", " + extra) + "}";
}
std::string chbody(const std::string& extra) {
  return R"({"messages": [{"role": "user", "content": "Hi"}])" +
         (extra.empty() ? "" : ", " + extra) + "}";
}

void expect_error(const ApiError& err, int status, const std::string& param,
                  const std::string& code, const std::string& context) {
  EXPECT_EQ(err.status, status) << context << ": " << err.message;
  EXPECT_EQ(err.type, status == 429 ? "rate_limit_error" : "invalid_request_error") << context;
  EXPECT_EQ(err.param, param) << context << ": " << err.message;
  if (!code.empty()) {
    EXPECT_EQ(err.code, code) << context << ": " << err.message;
  }
  EXPECT_FALSE(err.message.empty()) << context;
}

// ---------------------------------------------------------------------------
// Completions: fields

TEST(OpenAICompletionRequest, Defaults) {
  const CompletionRequest r = completion(R"({"prompt": "Hello"})");
  EXPECT_EQ(r.model, "");
  EXPECT_EQ(r.prompt_text, "Hello");
  EXPECT_FALSE(r.prompt_is_tokens);
  ASSERT_TRUE(r.max_tokens.has_value());
  EXPECT_EQ(*r.max_tokens, 16);  // OpenAI's default for completions
  const SamplingParams d;
  const SamplingParams& s = r.sampling;
  EXPECT_EQ(s.max_tokens, 16);
  EXPECT_EQ(s.temperature, d.temperature);
  EXPECT_EQ(s.top_p, d.top_p);
  EXPECT_EQ(s.top_k, d.top_k);
  EXPECT_EQ(s.min_p, d.min_p);
  EXPECT_EQ(s.n, 1);
  EXPECT_EQ(s.best_of, 1);
  EXPECT_EQ(s.logprobs, -1);
  EXPECT_FALSE(s.seed.has_value());
  EXPECT_TRUE(s.stop.empty());
  EXPECT_TRUE(s.logit_bias.empty());
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.include_usage);
  EXPECT_FALSE(r.echo);
}

TEST(OpenAICompletionRequest, EveryFieldMapped) {
  const CompletionRequest r = completion(R"({
    "model": "tiny", "prompt": "Once", "max_tokens": 40, "temperature": 0.5, "top_p": 0.9,
    "top_k": 40, "min_p": 0.05, "n": 2, "best_of": 3, "stop": ["\n\n", "END"],
    "stop_token_ids": [7, 9], "seed": 1234, "logprobs": 5, "echo": false,
    "presence_penalty": 0.25, "frequency_penalty": -0.5, "repetition_penalty": 1.1,
    "logit_bias": {"42": -100, "7": 2.5}, "ignore_eos": true,
    "include_stop_str_in_output": true, "user": "someone", "suffix": null})");
  EXPECT_EQ(r.model, "tiny");
  EXPECT_EQ(r.prompt_text, "Once");
  EXPECT_EQ(*r.max_tokens, 40);
  const SamplingParams& s = r.sampling;
  EXPECT_EQ(s.max_tokens, 40);
  EXPECT_FLOAT_EQ(s.temperature, 0.5f);
  EXPECT_FLOAT_EQ(s.top_p, 0.9f);
  EXPECT_EQ(s.top_k, 40);
  EXPECT_FLOAT_EQ(s.min_p, 0.05f);
  EXPECT_EQ(s.n, 2);
  EXPECT_EQ(s.best_of, 3);
  EXPECT_EQ(s.stop, (std::vector<std::string>{"\n\n", "END"}));
  EXPECT_EQ(s.stop_token_ids, (std::vector<int32_t>{7, 9}));
  EXPECT_EQ(s.seed, 1234u);
  EXPECT_EQ(s.logprobs, 5);
  EXPECT_FLOAT_EQ(s.presence_penalty, 0.25f);
  EXPECT_FLOAT_EQ(s.frequency_penalty, -0.5f);
  EXPECT_FLOAT_EQ(s.repetition_penalty, 1.1f);
  ASSERT_EQ(s.logit_bias.size(), 2u);
  // Object keys come out sorted: "42" < "7".
  EXPECT_EQ(s.logit_bias[0], (std::pair<int32_t, float>{42, -100.0f}));
  EXPECT_EQ(s.logit_bias[1], (std::pair<int32_t, float>{7, 2.5f}));
  EXPECT_TRUE(s.ignore_eos);
  EXPECT_TRUE(s.include_stop_str_in_output);
}

TEST(OpenAICompletionRequest, StreamAndOptions) {
  CompletionRequest r =
      completion(cbody(R"("stream": true, "stream_options": {"include_usage": true})"));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  r = completion(cbody(R"("stream": true, "stream_options": {"continuous_usage_stats": true})"));
  EXPECT_TRUE(r.stream);
  EXPECT_FALSE(r.include_usage);
  r = completion(cbody(R"("stream": true, "stream_options": null)"));
  EXPECT_FALSE(r.include_usage);
}

TEST(OpenAICompletionRequest, StopAsStringAndEcho) {
  const CompletionRequest r = completion(cbody(R"("stop": "###", "echo": true)"));
  EXPECT_EQ(r.sampling.stop, std::vector<std::string>{"###"});
  EXPECT_TRUE(r.echo);
}

TEST(OpenAICompletionRequest, SeedTakesAny64BitInteger) {
  EXPECT_EQ(completion(cbody(R"("seed": -1)")).sampling.seed, UINT64_MAX);
  EXPECT_EQ(completion(cbody(R"("seed": 18446744073709551615)")).sampling.seed, UINT64_MAX);
  EXPECT_EQ(completion(cbody(R"("seed": 0)")).sampling.seed, 0u);
  expect_error(completion_error(cbody(R"("seed": 1.5)")), 400, "seed", "invalid_type", "seed");
  expect_error(completion_error(cbody(R"("seed": "1")")), 400, "seed", "invalid_type", "seed");
}

TEST(OpenAICompletionRequest, PromptForms) {
  CompletionRequest r = completion(R"({"prompt": [1, 2, 999]})");
  EXPECT_TRUE(r.prompt_is_tokens);
  EXPECT_EQ(r.prompt_tokens, (std::vector<int32_t>{1, 2, 999}));
  r = completion(R"({"prompt": ["just one"]})");
  EXPECT_FALSE(r.prompt_is_tokens);
  EXPECT_EQ(r.prompt_text, "just one");
  r = completion(R"({"prompt": [[5, 6]]})");
  EXPECT_TRUE(r.prompt_is_tokens);
  EXPECT_EQ(r.prompt_tokens, (std::vector<int32_t>{5, 6}));
  r = completion(R"({"prompt": [3.0]})");  // integral floats are integers
  EXPECT_EQ(r.prompt_tokens, std::vector<int32_t>{3});
  // An empty string is a valid body; fit_to_context rejects it once tokenized
  // (with BOS it is not empty).
  EXPECT_EQ(completion(R"({"prompt": ""})").prompt_text, "");

  struct Case {
    const char* body;
    const char* code;
  };
  for (const Case& c :
       {Case{R"({})", "missing_required_parameter"},
        Case{R"({"prompt": null})", "missing_required_parameter"},
        Case{R"({"prompt": 5})", "invalid_type"},
        Case{R"({"prompt": {"text": "x"}})", "invalid_type"},
        Case{R"({"prompt": []})", "invalid_value"}, Case{R"({"prompt": [[]]})", "invalid_value"},
        Case{R"({"prompt": ["a", "b"]})", "unsupported_parameter"},
        Case{R"({"prompt": [[1], [2]]})", "unsupported_parameter"},
        Case{R"({"prompt": [1, "a"]})", "invalid_type"},
        Case{R"({"prompt": [1, 1000]})", "invalid_value"},
        Case{R"({"prompt": [-1]})", "invalid_value"}, Case{R"({"prompt": [1.5]})", "invalid_type"},
        Case{R"({"prompt": [true]})", "invalid_type"},
        Case{R"({"prompt": [99999999999]})", "invalid_value"}}) {
    expect_error(completion_error(c.body), 400, "prompt", c.code, c.body);
  }
}

TEST(OpenAICompletionRequest, NullMeansNotGiven) {
  const CompletionRequest r = completion(cbody(
      R"("max_tokens": null, "temperature": null, "stop": null, "n": null, "seed": null,
         "logprobs": null, "stream": null, "logit_bias": null, "model": null)"));
  EXPECT_EQ(*r.max_tokens, 16);
  EXPECT_EQ(r.sampling.temperature, SamplingParams{}.temperature);
  EXPECT_EQ(r.sampling.n, 1);
  EXPECT_FALSE(r.sampling.seed.has_value());
  EXPECT_EQ(r.sampling.logprobs, -1);
}

TEST(OpenAICompletionRequest, UnknownFieldsIgnored) {
  const CompletionRequest r = completion(cbody(
      R"("metadata": {"a": [1, {"b": null}]}, "service_tier": "auto", "store": true,
         "min_tokens": 3, "user": 42, "max_tokens": 8)"));
  EXPECT_EQ(*r.max_tokens, 8);
}

TEST(OpenAICompletionRequest, IntegralFloatsAreIntegers) {
  EXPECT_EQ(*completion(cbody(R"("max_tokens": 32.0)")).max_tokens, 32);
  EXPECT_EQ(completion(cbody(R"("n": 2e0)")).sampling.n, 2);
}

// ---------------------------------------------------------------------------
// Completions: errors

TEST(OpenAICompletionRequest, WrongTypesName400WithTheField) {
  struct Case {
    const char* field;
    const char* value;
  };
  for (const Case& c : {Case{"model", "5"},
                        Case{"max_tokens", "\"16\""},
                        Case{"max_tokens", "1.5"},
                        Case{"temperature", "\"hot\""},
                        Case{"temperature", "true"},
                        Case{"top_p", "[]"},
                        Case{"top_k", "0.5"},
                        Case{"min_p", "{}"},
                        Case{"n", "\"2\""},
                        Case{"best_of", "false"},
                        Case{"stream", "1"},
                        Case{"stop", "5"},
                        Case{"stop", "[1]"},
                        Case{"stop", "{}"},
                        Case{"stop_token_ids", "\"1\""},
                        Case{"stop_token_ids", "[\"1\"]"},
                        Case{"logprobs", "true"},
                        Case{"logprobs", "\"5\""},
                        Case{"echo", "\"yes\""},
                        Case{"presence_penalty", "\"0\""},
                        Case{"frequency_penalty", "[0]"},
                        Case{"repetition_penalty", "{}"},
                        Case{"logit_bias", "[1]"},
                        Case{"logit_bias", "{\"1\": \"x\"}"},
                        Case{"ignore_eos", "0"},
                        Case{"include_stop_str_in_output", "\"true\""},
                        Case{"suffix", "3"},
                        Case{"stream_options", "true"}}) {
    // stream is on in every body so that stream_options may be given.
    const std::string field = c.field, value = c.value;
    const std::string body =
        cbody(field == "stream" ? "\"stream\": " + value
                                : "\"stream\": true, \"" + field + "\": " + value);
    const ApiError err = completion_error(body);
    expect_error(err, 400, field, "invalid_type", body);
    EXPECT_NE(err.message.find("'" + field + "'"), std::string::npos) << err.message;
  }
  expect_error(completion_error(cbody(R"("stream": true, "stream_options": {"include_usage": 1})")),
               400, "stream_options.include_usage", "invalid_type", "include_usage");
}

TEST(OpenAICompletionRequest, OutOfRangeValues) {
  struct Case {
    const char* extra;
    const char* param;
  };
  for (const Case& c : {Case{R"("temperature": -0.1)", "temperature"},
                        Case{R"("temperature": 1e300)", "temperature"},
                        Case{R"("top_p": 0)", "top_p"},
                        Case{R"("top_p": 1.5)", "top_p"},
                        Case{R"("top_k": -2)", "top_k"},
                        Case{R"("min_p": 2)", "min_p"},
                        Case{R"("presence_penalty": 2.5)", "presence_penalty"},
                        Case{R"("frequency_penalty": -3)", "frequency_penalty"},
                        Case{R"("repetition_penalty": 0)", "repetition_penalty"},
                        Case{R"("max_tokens": 0)", "max_tokens"},
                        Case{R"("max_tokens": 1e12)", "max_tokens"},
                        Case{R"("max_tokens": -5)", "max_tokens"},
                        Case{R"("n": 0)", "n"},
                        Case{R"("n": 129)", "n"},
                        Case{R"("n": 3, "best_of": 2)", "best_of"},
                        Case{R"("logprobs": 21)", "logprobs"},
                        Case{R"("logprobs": -2)", "logprobs"},
                        Case{R"("stop": [""])", "stop"},
                        Case{R"("stop_token_ids": [1000])", "stop_token_ids"},
                        Case{R"("stop_token_ids": [-1])", "stop_token_ids"},
                        Case{R"("logit_bias": {"1000": 1})", "logit_bias"},
                        Case{R"("logit_bias": {"1": 101})", "logit_bias"},
                        Case{R"("logit_bias": {"-1": 1})", "logit_bias"},
                        Case{R"("logit_bias": {"abc": 1})", "logit_bias"},
                        Case{R"("logit_bias": {"": 1})", "logit_bias"},
                        Case{R"("logit_bias": {"99999999999999999999": 1})", "logit_bias"}}) {
    const std::string body = cbody(c.extra);
    const ApiError err = completion_error(body);
    EXPECT_EQ(err.status, 400) << body;
    EXPECT_EQ(err.type, "invalid_request_error") << body;
    EXPECT_EQ(err.param, c.param) << body << ": " << err.message;
    EXPECT_EQ(err.code, "invalid_value") << body;
  }
}

TEST(OpenAICompletionRequest, UnsupportedCombinations) {
  expect_error(completion_error(cbody(R"("suffix": "tail")")), 400, "suffix",
               "unsupported_parameter", "suffix");
  // An empty suffix asks for nothing.
  completion(cbody(R"("suffix": "")"));
  expect_error(completion_error(cbody(R"("echo": true, "logprobs": 1)")), 400, "echo",
               "unsupported_parameter", "echo+logprobs");
  expect_error(completion_error(cbody(R"("stream_options": {"include_usage": true})")), 400,
               "stream_options", "invalid_value", "stream_options without stream");
  expect_error(completion_error(cbody(R"("stream_options": {}, "stream": false)")), 400,
               "stream_options", "invalid_value", "stream_options with stream false");
  expect_error(completion_error(cbody(R"("stream": true, "n": 1, "best_of": 2)")), 400, "best_of",
               "invalid_value", "best_of with stream");
  completion(cbody(R"("stream": true, "n": 2, "best_of": 2)"));
}

TEST(OpenAICompletionRequest, BadJson) {
  for (const char* body : {"", "{", "{\"prompt\": }", "nul", "{\"prompt\": \"a\",}", "[1, 2]",
                           "\"text\"", "42", "null", "{\"prompt\": \"\xFF\"}", "{} {}"}) {
    const ApiError err = completion_error(body);
    EXPECT_EQ(err.status, 400) << body;
    EXPECT_EQ(err.type, "invalid_request_error") << body;
    EXPECT_EQ(err.param, "") << body;
    EXPECT_NE(err.message.find("JSON body"), std::string::npos) << err.message;
    EXPECT_NO_THROW((void)err.to_json().dump()) << body;
  }
  const ApiError arr = completion_error("[1]");
  EXPECT_NE(arr.message.find("expected a JSON object, got an array"), std::string::npos)
      << arr.message;
  // nlohmann's internal tag is dropped, the position kept.
  const ApiError pos = completion_error("{\"prompt\": }");
  EXPECT_EQ(pos.message.find("[json.exception"), std::string::npos) << pos.message;
  EXPECT_NE(pos.message.find("column 12"), std::string::npos) << pos.message;
}

// ---------------------------------------------------------------------------
// Chat: fields

TEST(OpenAIChatRequest, Defaults) {
  const ChatRequest r = chat(chbody(""));
  const auto& msgs = r.conversation.messages;
  ASSERT_EQ(msgs.size(), 1u);
  EXPECT_EQ(msgs[0]["role"], "user");
  EXPECT_EQ(msgs[0]["content"], "Hi");
  EXPECT_FALSE(r.max_tokens.has_value());  // the rest of the context
  EXPECT_EQ(r.sampling.logprobs, -1);
  EXPECT_FALSE(r.stream);
  EXPECT_TRUE(r.conversation.add_generation_prompt);
  EXPECT_TRUE(r.conversation.tools.is_null());
  EXPECT_TRUE(r.conversation.documents.is_null());
  EXPECT_TRUE(r.conversation.template_kwargs.empty());
}

TEST(OpenAIChatRequest, MessagesAndRoles) {
  const ChatRequest r = chat(R"({"messages": [
      {"role": "developer", "content": "Be brief."},
      {"role": "system", "content": "S", "name": "ignored"},
      {"role": "user", "content": [{"type": "text", "text": "part one"},
                                   {"type": "text", "text": "part two"}]},
      {"role": "assistant", "content": null},
      {"role": "assistant", "content": "A", "tool_calls": []},
      {"role": "user", "content": []}]})");
  const auto& m = r.conversation.messages;
  ASSERT_EQ(m.size(), 6u);
  EXPECT_EQ(m[0]["role"], "system");  // developer is OpenAI's newer name
  EXPECT_EQ(m[0]["content"], "Be brief.");
  EXPECT_EQ(m[1]["role"], "system");
  EXPECT_EQ(m[1]["name"], "ignored");  // other keys reach the template as sent
  EXPECT_EQ(m[2]["content"], "part one\npart two");
  EXPECT_EQ(m[3]["role"], "assistant");
  EXPECT_TRUE(m[3]["content"].is_null());  // templates test "content is none"
  EXPECT_EQ(m[4]["content"], "A");
  EXPECT_EQ(m[5]["content"], "");
}

TEST(OpenAIChatRequest, ToolsToolCallsAndToolResultsReachTheTemplate) {
  const ChatRequest r = chat(R"({"messages": [
      {"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
          "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 2}"}}]},
      {"role": "tool", "content": "21C", "tool_call_id": "c1"}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "b": 1, "a": 2}}}],
    "tool_choice": "none", "documents": [{"text": "d"}], "chat_template_kwargs": {"enable_thinking": false}})");
  const auto& m = r.conversation.messages;
  ASSERT_EQ(m.size(), 3u);
  // arguments arrive as the object the JSON string held (vLLM does the same for templates).
  EXPECT_EQ(m[1]["tool_calls"][0]["function"]["arguments"]["city"], "Paris");
  EXPECT_EQ(m[1]["tool_calls"][0]["function"]["arguments"]["days"], 2);
  EXPECT_EQ(m[2]["role"], "tool");
  EXPECT_EQ(m[2]["tool_call_id"], "c1");
  // the client's key order is kept, for the template's tojson
  EXPECT_EQ(r.conversation.tools.dump(), R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","b":1,"a":2}}}])");
  EXPECT_EQ(r.conversation.documents.size(), 1u);
  EXPECT_EQ(r.conversation.template_kwargs["enable_thinking"], false);
}

TEST(OpenAIChatRequest, SamplingAndLimits) {
  ChatRequest r = chat(chbody(R"("max_tokens": 50, "temperature": 0, "top_k": 5, "seed": 7,
                                  "stop": "x", "n": 2, "stream": true,
                                  "stream_options": {"include_usage": true},
                                  "add_generation_prompt": false, "logit_bias": {"3": 1})"));
  EXPECT_EQ(r.max_tokens, 50);
  EXPECT_EQ(r.sampling.max_tokens, 50);
  EXPECT_EQ(r.sampling.temperature, 0.0f);
  EXPECT_EQ(r.sampling.top_k, 5);
  EXPECT_EQ(r.sampling.seed, 7u);
  EXPECT_EQ(r.sampling.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(r.sampling.n, 2);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_FALSE(r.conversation.add_generation_prompt);
  EXPECT_EQ(r.sampling.logit_bias.size(), 1u);
  // max_completion_tokens (OpenAI's newer name) wins over max_tokens.
  r = chat(chbody(R"("max_tokens": 50, "max_completion_tokens": 20)"));
  EXPECT_EQ(r.max_tokens, 20);
  r = chat(chbody(R"("max_completion_tokens": 30)"));
  EXPECT_EQ(r.max_tokens, 30);
}

TEST(OpenAIChatRequest, Logprobs) {
  EXPECT_EQ(chat(chbody(R"("logprobs": true)")).sampling.logprobs, 0);
  EXPECT_EQ(chat(chbody(R"("logprobs": true, "top_logprobs": 4)")).sampling.logprobs, 4);
  EXPECT_EQ(chat(chbody(R"("logprobs": false)")).sampling.logprobs, -1);
  EXPECT_EQ(chat(chbody(R"("logprobs": false, "top_logprobs": 0)")).sampling.logprobs, -1);
  expect_error(chat_error(chbody(R"("top_logprobs": 2)")), 400, "top_logprobs", "invalid_value",
               "top_logprobs without logprobs");
  expect_error(chat_error(chbody(R"("logprobs": true, "top_logprobs": 21)")), 400, "top_logprobs",
               "invalid_value", "top_logprobs too large");
  expect_error(chat_error(chbody(R"("logprobs": 3)")), 400, "logprobs", "invalid_type",
               "chat logprobs is a boolean");
  expect_error(chat_error(chbody(R"("logprobs": true, "top_logprobs": "3")")), 400, "top_logprobs",
               "invalid_type", "top_logprobs type");
}

TEST(OpenAIChatRequest, AcceptedNoOpFeatureValues) {
  chat(chbody(R"("tools": [], "tool_choice": "none", "response_format": {"type": "text"},
                 "functions": [], "function_call": "auto", "parallel_tool_calls": false)"));
  chat(chbody(R"("tools": null, "tool_choice": "auto", "response_format": null)"));
}

// ---------------------------------------------------------------------------
// Chat: errors

TEST(OpenAIChatRequest, UnsupportedFeaturesNameTheField) {
  struct Case {
    std::string body;
    const char* param;
  };
  const std::string tool = R"({"type": "function", "function": {"name": "f"}})";
  for (const Case& c : {
           Case{chbody("\"tools\": [" + tool + "]"), "tool_choice"},  // auto by default with tools
           Case{chbody("\"tools\": [" + tool + "], \"tool_choice\": \"auto\""), "tool_choice"},
           Case{chbody("\"functions\": [{\"name\": \"f\"}]"), "functions"},
           Case{chbody(R"("tool_choice": "required")"), "tool_choice"},
           Case{chbody(R"("tool_choice": {"type": "function", "function": {"name": "f"}})"),
                "tool_choice"},
           Case{chbody(R"("function_call": {"name": "f"})"), "function_call"},
           Case{chbody(R"("response_format": {"type": "json_object"})"), "response_format"},
           Case{chbody(R"("response_format": {"type": "json_schema", "json_schema": {}})"),
                "response_format"},
           Case{R"({"messages": [{"role": "function", "content": "r"}]})", "messages[0].role"},
           Case{R"({"messages": [{"role": "user", "content": [
                    {"type": "text", "text": "a"},
                    {"type": "image_url", "image_url": {"url": "http://x"}}]}]})",
                "messages[0].content[1].type"},
       }) {
    const ApiError err = chat_error(c.body);
    expect_error(err, 400, c.param, "unsupported_parameter", c.body);
  }
}

TEST(OpenAIChatRequest, BodiesTooDeepOrTooWideAreRefusedBeforeParsing) {
  std::string wide = R"({"messages": [{"role": "user", "content": "q"}], "chat_template_kwargs": {)";
  for (int i = 0; i < 2000; ++i) wide += (i ? "," : "") + std::string("\"k") + std::to_string(i) + "\": 0";
  wide += "}}";
  const ApiError w = chat_error(wide);
  EXPECT_EQ(w.status, 400);
  EXPECT_NE(w.message.find("more than 1024 keys"), std::string::npos) << w.message;
  const ApiError d = chat_error(R"({"messages": )" + std::string(200, '[') + std::string(200, ']') + "}");
  EXPECT_NE(d.message.find("nests deeper than 128"), std::string::npos) << d.message;
  // Brackets and colons inside strings do not count.
  const ChatRequest ok = chat(R"({"messages": [{"role": "user", "content": ")" + std::string(500, '[') + std::string(3000, ':') + R"("}]})");
  EXPECT_EQ(ok.conversation.messages.size(), 1u);
}

TEST(OpenAIChatRequest, BadMessages) {
  struct Case {
    const char* body;
    const char* param;
    const char* code;
  };
  for (const Case& c : {
           Case{R"({})", "messages", "missing_required_parameter"},
           Case{R"({"messages": "hi"})", "messages", "invalid_type"},
           Case{R"({"messages": {}})", "messages", "invalid_type"},
           Case{R"({"messages": []})", "messages", "invalid_value"},
           Case{R"({"messages": ["hi"]})", "messages[0]", "invalid_type"},
           Case{R"({"messages": [{"content": "x"}]})", "messages[0].role",
                "missing_required_parameter"},
           Case{R"({"messages": [{"role": 1, "content": "x"}]})", "messages[0].role",
                "invalid_type"},
           Case{R"({"messages": [{"role": "robot", "content": "x"}]})", "messages[0].role",
                "invalid_value"},
           Case{R"({"messages": [{"role": "user"}]})", "messages[0].content",
                "missing_required_parameter"},
           Case{R"({"messages": [{"role": "user", "content": null}]})", "messages[0].content",
                "missing_required_parameter"},
           Case{R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content",
                "invalid_type"},
           Case{R"({"messages": [{"role": "user", "content": ["x"]}]})", "messages[0].content[0]",
                "invalid_type"},
           Case{R"({"messages": [{"role": "user", "content": [{"text": "x"}]}]})",
                "messages[0].content[0].type", "missing_required_parameter"},
           Case{R"({"messages": [{"role": "user", "content": [{"type": "text"}]}]})",
                "messages[0].content[0].text", "missing_required_parameter"},
           Case{R"({"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]})",
                "messages[0].content[0].text", "invalid_type"},
           Case{R"({"messages": [{"role": "user", "content": "a"}, {"role": "user"}]})",
                "messages[1].content", "missing_required_parameter"},
           Case{R"({"messages": [{"role": "tool"}]})", "messages[0].content", "missing_required_parameter"},
           Case{R"({"messages": [{"role": "assistant", "content": null, "tool_calls": [{"id": "1"}]}]})",
                "messages[0].tool_calls[0].function", "missing_required_parameter"},
           Case{R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}]})",
                "messages[0].tool_calls[0].function.name", "missing_required_parameter"},
           Case{R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{not json"}}]}]})",
                "messages[0].tool_calls[0].function.arguments", "invalid_value"},
           Case{R"({"messages": [{"role": "assistant", "tool_calls": {}}]})", "messages[0].tool_calls", "invalid_type"},
           Case{R"({"messages": [{"role": "user", "content": "q", "tool_calls": []}]})", "messages[0].tool_calls", "invalid_value"},
           Case{R"({"messages": [{"role": "user", "content": "q"}], "chat_template_kwargs": []})", "chat_template_kwargs", "invalid_type"},
           Case{R"({"messages": [{"role": "user", "content": "q"}], "chat_template_kwargs": {"messages": []}})", "chat_template_kwargs", "invalid_value"},
           Case{R"({"messages": [{"role": "user", "content": "q"}], "tools": [{"type": "function"}], "tool_choice": "none"})", "tools[0].function", "missing_required_parameter"},
           Case{R"({"messages": [{"role": "user", "content": "q"}], "documents": {}})", "documents", "invalid_type"},
           Case{R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]"}}]}]})",
                "messages[0].tool_calls[0].function.arguments", "invalid_value"},
       }) {
    expect_error(chat_error(c.body), 400, c.param, c.code, c.body);
  }
}

TEST(OpenAIChatRequest, WrongTypes) {
  struct Case {
    const char* extra;
    const char* param;
  };
  for (const Case& c :
       {Case{R"("tools": {})", "tools"}, Case{R"("tool_choice": 1)", "tool_choice"},
        Case{R"("response_format": "json")", "response_format"},
        Case{R"("response_format": {"type": 1})", "response_format.type"},
        Case{R"("max_completion_tokens": "9")", "max_completion_tokens"},
        Case{R"("max_tokens": [])", "max_tokens"},
        Case{R"("add_generation_prompt": "yes")", "add_generation_prompt"},
        Case{R"("temperature": "0")", "temperature"}, Case{R"("stream": "true")", "stream"}}) {
    expect_error(chat_error(chbody(c.extra)), 400, c.param, "invalid_type", c.extra);
  }
  expect_error(chat_error(chbody(R"("response_format": {})")), 400, "response_format.type",
               "missing_required_parameter", "response_format without type");
  expect_error(chat_error(chbody(R"("response_format": {"type": "xml"})")), 400,
               "response_format.type", "invalid_value", "response_format xml");
  expect_error(chat_error(chbody(R"("tool_choice": "sometimes")")), 400, "tool_choice",
               "invalid_value", "tool_choice value");
  expect_error(chat_error(chbody(R"("temperature": 101)")), 400, "temperature", "invalid_value",
               "temperature range");
  expect_error(chat_error(chbody(R"("max_tokens": 0)")), 400, "max_tokens", "invalid_value",
               "max_tokens range");
}

// ---------------------------------------------------------------------------
// Tokenize / detokenize, model check, context fitting

TEST(OpenAITokenize, PromptAndMessages) {
  TokenizeRequest r = parsed_ok(parse_tokenize_request(R"({"model": "m", "prompt": "Hi"})"));
  EXPECT_FALSE(r.is_chat);
  EXPECT_EQ(r.prompt, "Hi");
  EXPECT_EQ(r.model, "m");
  EXPECT_FALSE(r.add_special_tokens.has_value());
  EXPECT_FALSE(r.return_token_strs);
  r = parsed_ok(parse_tokenize_request(
      R"({"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": false,
          "add_special_tokens": true, "return_token_strs": true})"));
  EXPECT_TRUE(r.is_chat);
  ASSERT_EQ(r.conversation.messages.size(), 1u);
  EXPECT_FALSE(r.conversation.add_generation_prompt);
  EXPECT_EQ(r.add_special_tokens, true);
  EXPECT_TRUE(r.return_token_strs);

  expect_error(parsed_error(parse_tokenize_request("{}")), 400, "prompt",
               "missing_required_parameter", "neither");
  expect_error(parsed_error(parse_tokenize_request(
                   R"({"prompt": "a", "messages": [{"role": "user", "content": "b"}]})")),
               400, "messages", "invalid_value", "both");
  expect_error(parsed_error(parse_tokenize_request(R"({"prompt": [1, 2]})")), 400, "prompt",
               "invalid_type", "token prompt");
  expect_error(parsed_error(parse_tokenize_request(R"({"prompt": "a", "add_special_tokens": 1})")),
               400, "add_special_tokens", "invalid_type", "add_special_tokens");
  expect_error(parsed_error(parse_tokenize_request(R"({"messages": [{"role": "x"}]})")), 400,
               "messages[0].role", "invalid_value", "bad role");
}

TEST(OpenAITokenize, Detokenize) {
  const DetokenizeRequest r =
      parsed_ok(parse_detokenize_request(R"({"tokens": [0, 5, 999]})", kVocab));
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{0, 5, 999}));
  EXPECT_TRUE(parsed_ok(parse_detokenize_request(R"({"tokens": []})", kVocab)).tokens.empty());
  expect_error(parsed_error(parse_detokenize_request("{}", kVocab)), 400, "tokens",
               "missing_required_parameter", "missing");
  expect_error(parsed_error(parse_detokenize_request(R"({"tokens": "1 2"})", kVocab)), 400,
               "tokens", "invalid_type", "string");
  expect_error(parsed_error(parse_detokenize_request(R"({"tokens": [1000]})", kVocab)), 400,
               "tokens", "invalid_value", "out of vocab");
}

TEST(OpenAIProtocolChecks, ModelNames) {
  const std::vector<std::string> served = {"tiny-llama", "alias"};
  EXPECT_FALSE(check_model("", served).has_value());
  EXPECT_FALSE(check_model("alias", served).has_value());
  const auto err = check_model("gpt-4", served);
  ASSERT_TRUE(err.has_value());
  expect_error(*err, 404, "model", "model_not_found", "unknown model");
  EXPECT_NE(err->message.find("`gpt-4`"), std::string::npos);
}

TEST(OpenAIProtocolChecks, FitToContext) {
  SamplingParams sp;
  EXPECT_FALSE(fit_to_context(100, 20, 2048, "prompt", sp).has_value());
  EXPECT_EQ(sp.max_tokens, 100);
  // Not given: whatever is left.
  EXPECT_FALSE(fit_to_context(std::nullopt, 48, 2048, "messages", sp).has_value());
  EXPECT_EQ(sp.max_tokens, 2000);
  // Exactly full is fine.
  EXPECT_FALSE(fit_to_context(2028, 20, 2048, "prompt", sp).has_value());

  auto err = fit_to_context(2029, 20, 2048, "prompt", sp);
  ASSERT_TRUE(err.has_value());
  expect_error(*err, 400, "prompt", "context_length_exceeded", "too long");
  for (const char* part :
       {"2048", "2049", "20 in the prompt", "2029 in the completion", "max_tokens"})
    EXPECT_NE(err->message.find(part), std::string::npos) << part << " in " << err->message;

  err = fit_to_context(std::nullopt, 2048, 2048, "messages", sp);
  ASSERT_TRUE(err.has_value());
  expect_error(*err, 400, "messages", "context_length_exceeded", "prompt fills the context");
  EXPECT_NE(err->message.find("2048 tokens long"), std::string::npos) << err->message;
  EXPECT_NE(err->message.find("messages"), std::string::npos) << err->message;

  err = fit_to_context(16, 0, 2048, "prompt", sp);
  ASSERT_TRUE(err.has_value());
  expect_error(*err, 400, "prompt", "invalid_value", "empty prompt");
}

// ---------------------------------------------------------------------------
// Errors

TEST(OpenAIApiError, JsonShape) {
  const ApiError e{400, "invalid_request_error", "Bad.", "", ""};
  EXPECT_EQ(e.to_json(), json::parse(R"({"error": {"message": "Bad.",
      "type": "invalid_request_error", "param": null, "code": null}})"));
  const ApiError f{400, "invalid_request_error", "Bad n.", "n", "invalid_value"};
  EXPECT_EQ(f.to_json(), json::parse(R"({"error": {"message": "Bad n.",
      "type": "invalid_request_error", "param": "n", "code": "invalid_value"}})"));
  // Invalid UTF-8 (a quoted template, a partial token) is replaced, never thrown.
  const ApiError g{400, "invalid_request_error", "bad \xE2\x82 byte", "", ""};
  EXPECT_EQ(g.to_json()["error"]["message"], "bad \xEF\xBF\xBD byte");
}

TEST(OpenAIApiError, Helpers) {
  expect_error(invalid_type("n", "an integer"), 400, "n", "invalid_type", "invalid_type");
  expect_error(missing_field("messages"), 400, "messages", "missing_required_parameter", "missing");
  expect_error(unsupported("tools", "no"), 400, "tools", "unsupported_parameter", "unsupported");
  expect_error(model_not_found("x"), 404, "model", "model_not_found", "model");
  expect_error(capacity_exceeded(100000, 4096), 400, "max_tokens", "request_too_large", "capacity");
  EXPECT_NE(capacity_exceeded(100000, 4096).message.find("100000"), std::string::npos);
  expect_error(queue_full(256), 429, "", "rate_limit_exceeded", "queue");

  const ApiError bad = bad_json("oops");
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(bad.param, "");
  const ApiError u = unauthorized();
  EXPECT_EQ(u.status, 401);
  EXPECT_EQ(u.code, "invalid_api_key");
  const ApiError down = engine_unavailable("shutting down");
  EXPECT_EQ(down.status, 503);
  EXPECT_EQ(down.type, "server_error");
  EXPECT_NE(down.message.find("shutting down"), std::string::npos);
  EXPECT_EQ(route_not_found("GET", "/v2/x").status, 404);
  EXPECT_EQ(payload_too_large(1 << 20).status, 413);
  const ApiError internal = internal_error("boom");
  EXPECT_EQ(internal.status, 500);
  EXPECT_EQ(internal.type, "server_error");
}

TEST(OpenAIApiError, ValidUtf8) {
  EXPECT_EQ(valid_utf8("plain"), "plain");
  EXPECT_EQ(valid_utf8("\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80"),
            "\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80");
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(valid_utf8("\xFF"), fffd);
  EXPECT_EQ(valid_utf8("a\xC3"), "a" + fffd);
  EXPECT_EQ(valid_utf8("\xE2\x82"
                       "A"),
            fffd + "A");                                      // truncated sequence: one U+FFFD
  EXPECT_EQ(valid_utf8("\xC0\xAF"), fffd + fffd);             // overlong
  EXPECT_EQ(valid_utf8("\xED\xA0\x80"), fffd + fffd + fffd);  // surrogate
  EXPECT_EQ(valid_utf8("\xF4\x90\x80\x80"), fffd + fffd + fffd + fffd);  // past U+10FFFF
  EXPECT_EQ(valid_utf8(std::string("a\0b", 3)), std::string("a\0b", 3));
}

// ---------------------------------------------------------------------------
// Responses

const ResponseHeader kHeader{"cmpl-0000000000000001", 1700000000, "tiny"};

TEST(OpenAIResponses, Completion) {
  const std::vector<CompletionChoice> choices = {{0, "Hello", std::nullopt, 0, "length"},
                                                 {1, "Hi", std::nullopt, 0, "stop"}};
  EXPECT_EQ(completion_response(kHeader, choices, Usage{5, 7, 2}), json::parse(R"({
      "id": "cmpl-0000000000000001", "object": "text_completion", "created": 1700000000,
      "model": "tiny",
      "choices": [
        {"index": 0, "text": "Hello", "logprobs": null, "finish_reason": "length"},
        {"index": 1, "text": "Hi", "logprobs": null, "finish_reason": "stop"}],
      "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12,
                "prompt_tokens_details": {"cached_tokens": 2}}})"));
}

TEST(OpenAIResponses, CompletionLogprobs) {
  // "é" split over two tokens: each piece alone is not UTF-8; the text
  // offsets count characters of the whole text, as Python would.
  std::vector<OutputLogprob> lps = {
      {"He", -0.25f, {{"He", -0.25f}, {"Hi", -1.5f}}},
      {"llo", -std::numeric_limits<float>::infinity(), {}},
      {" \xC3", -0.5f, {{" \xC3", -0.5f}, {" \xC3", -0.75f}}},
      {"\xA9", 0.0f, {}},
      {"!", -0.1f, {}},
  };
  CompletionChoice c{0, "Hello \xC3\xA9!", lps, 10, ""};
  const json j = completion_chunk(kHeader, std::vector<CompletionChoice>{c}, false);
  EXPECT_EQ(j, json::parse(R"({
      "id": "cmpl-0000000000000001", "object": "text_completion", "created": 1700000000,
      "model": "tiny",
      "choices": [{"index": 0, "text": "Hello é!", "finish_reason": null, "logprobs": {
        "tokens": ["He", "llo", " \ufffd", "\ufffd", "!"],
        "token_logprobs": [-0.25, -9999.0, -0.5, 0.0, -0.1],
        "top_logprobs": [{"He": -0.25, "Hi": -1.5}, {}, {" \ufffd": -0.5}, {}, {}],
        "text_offset": [10, 12, 15, 17, 17]}}]})"));
  // Floats come out as their shortest decimal, not the double expansion.
  EXPECT_NE(j.dump().find("-0.1]"), std::string::npos) << j.dump();
}

TEST(OpenAIResponses, CompletionStream) {
  const std::vector<CompletionChoice> choices = {{0, " world", std::nullopt, 0, ""}};
  EXPECT_EQ(completion_chunk(kHeader, choices, true), json::parse(R"({
      "id": "cmpl-0000000000000001", "object": "text_completion", "created": 1700000000,
      "model": "tiny", "usage": null,
      "choices": [{"index": 0, "text": " world", "logprobs": null, "finish_reason": null}]})"));
  EXPECT_FALSE(completion_chunk(kHeader, choices, false).contains("usage"));
  EXPECT_EQ(completion_usage_chunk(kHeader, Usage{3, 4, 0}), json::parse(R"({
      "id": "cmpl-0000000000000001", "object": "text_completion", "created": 1700000000,
      "model": "tiny", "choices": [],
      "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7,
                "prompt_tokens_details": {"cached_tokens": 0}}})"));
}

TEST(OpenAIResponses, Chat) {
  const ResponseHeader h{"chatcmpl-00000000000000ff", 1700000001, "tiny"};
  std::vector<ChatChoice> choices = {{0, "Hello!", std::nullopt, "stop"}};
  EXPECT_EQ(chat_response(h, choices, Usage{9, 2, 0}), json::parse(R"({
      "id": "chatcmpl-00000000000000ff", "object": "chat.completion", "created": 1700000001,
      "model": "tiny",
      "choices": [{"index": 0,
                   "message": {"role": "assistant", "content": "Hello!", "refusal": null},
                   "logprobs": null, "finish_reason": "stop"}],
      "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11,
                "prompt_tokens_details": {"cached_tokens": 0}}})"));

  choices[0].logprobs = std::vector<OutputLogprob>{{"Hi", -0.5f, {{"Hi", -0.5f}, {"\xC3", -2.0f}}}};
  const json j = chat_response(h, choices, Usage{});
  EXPECT_EQ(j["choices"][0]["logprobs"], json::parse(R"({"refusal": null, "content": [
      {"token": "Hi", "logprob": -0.5, "bytes": [72, 105], "top_logprobs": [
        {"token": "Hi", "logprob": -0.5, "bytes": [72, 105]},
        {"token": "\ufffd", "logprob": -2.0, "bytes": [195]}]}]})"));
}

TEST(OpenAIResponses, ChatStream) {
  const ResponseHeader h{"chatcmpl-1", 5, "tiny"};
  const json first =
      chat_chunk(h, std::vector<ChatChunkChoice>{{0, true, "", std::nullopt, ""}}, false);
  EXPECT_EQ(first, json::parse(R"({"id": "chatcmpl-1", "object": "chat.completion.chunk",
      "created": 5, "model": "tiny", "choices": [{"index": 0,
      "delta": {"role": "assistant", "content": ""}, "logprobs": null,
      "finish_reason": null}]})"));
  const json middle = chat_chunk(
      h, std::vector<ChatChunkChoice>{{1, false, "lo", std::vector<OutputLogprob>{}, ""}}, true);
  EXPECT_EQ(middle, json::parse(R"({"id": "chatcmpl-1", "object": "chat.completion.chunk",
      "created": 5, "model": "tiny", "usage": null, "choices": [{"index": 1,
      "delta": {"content": "lo"}, "logprobs": {"content": [], "refusal": null},
      "finish_reason": null}]})"));
  const json last =
      chat_chunk(h, std::vector<ChatChunkChoice>{{0, false, "", std::nullopt, "length"}}, false);
  EXPECT_EQ(last["choices"][0]["delta"], json::object());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(chat_usage_chunk(h, Usage{1, 2, 1}), json::parse(R"({"id": "chatcmpl-1",
      "object": "chat.completion.chunk", "created": 5, "model": "tiny", "choices": [],
      "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3,
                "prompt_tokens_details": {"cached_tokens": 1}}})"));
}

TEST(OpenAIResponses, ModelsTokenizeDetokenize) {
  const std::vector<ModelCard> models = {{"tiny", 1700000000, "tandem", 2048}};
  EXPECT_EQ(models_response(models), json::parse(R"({"object": "list", "data": [
      {"id": "tiny", "object": "model", "created": 1700000000, "owned_by": "tandem",
       "max_model_len": 2048}]})"));
  const std::vector<int32_t> tokens = {1, 15043};
  EXPECT_EQ(tokenize_response(tokens, 4096), json::parse(R"({"count": 2, "max_model_len": 4096,
      "tokens": [1, 15043], "token_strs": null})"));
  const std::vector<std::string> strs = {"<s>", "\xC3"};
  EXPECT_EQ(tokenize_response(tokens, 4096, &strs)["token_strs"],
            json::parse(R"(["<s>", "\ufffd"])"));
  EXPECT_EQ(detokenize_response("Hello"), json::parse(R"({"prompt": "Hello"})"));
}

TEST(OpenAIResponses, IdsAndEvents) {
  EXPECT_EQ(make_response_id("cmpl-", 0xabc), "cmpl-0000000000000abc");
  EXPECT_EQ(make_response_id("chatcmpl-", UINT64_MAX), "chatcmpl-ffffffffffffffff");
  EXPECT_EQ(sse_event(json{{"a", 1}}), "data: {\"a\":1}\n\n");
  EXPECT_EQ(kSseDone, "data: [DONE]\n\n");
  // Even a body with invalid UTF-8 is written (replaced), not thrown.
  json bad = json{{"text", std::string("\xFF")}};
  EXPECT_EQ(dump_body(bad), "{\"text\":\"\xEF\xBF\xBD\"}");
}

// ---------------------------------------------------------------------------
// Fuzzing: mutated bodies must parse or give a 4xx, never throw or crash.

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {  // splitmix64: the same sequence on every platform
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  size_t below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(next() % n); }

 private:
  uint64_t state_;
};

enum FuzzTarget { kCompletions, kChat, kTokenize, kDetokenize, kTargets };

struct FuzzSeed {
  FuzzTarget target;
  const char* body;
};

const std::vector<FuzzSeed> kFuzzSeeds = {
    {kCompletions,
     R"({"model": "tiny", "prompt": "Once upon", "max_tokens": 8, "temperature": 0.7,
        "top_p": 0.9, "top_k": 40, "n": 2, "best_of": 2, "stop": ["\n", "END"], "seed": 5,
        "logprobs": 3, "stream": true, "stream_options": {"include_usage": true},
        "logit_bias": {"12": -5}, "stop_token_ids": [2]})"},
    {kCompletions,
     R"({"prompt": [1, 2, 3], "echo": true, "suffix": "", "presence_penalty": 0.5,
        "frequency_penalty": 0.1, "repetition_penalty": 1.2, "min_p": 0.1, "ignore_eos": true})"},
    {kCompletions,
     R"({"prompt": ["x"], "include_stop_str_in_output": true, "user": "u", "stop": "s"})"},
    {kChat,
     R"({"model": "tiny", "messages": [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
        {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Bye"}],
        "max_completion_tokens": 20, "logprobs": true, "top_logprobs": 2, "stream": true,
        "stream_options": {"include_usage": false}, "tool_choice": "none",
        "response_format": {"type": "text"}, "tools": []})"},
    {kChat,
     R"({"messages": [{"role": "developer", "content": "d"}, {"role": "user", "content": "q"}],
        "max_tokens": 5, "n": 1, "seed": -3, "add_generation_prompt": false})"},
    {kTokenize,
     R"({"prompt": "tokenize me", "add_special_tokens": false, "return_token_strs": true})"},
    {kTokenize,
     R"({"messages": [{"role": "user", "content": "q"}], "add_generation_prompt": true})"},
    {kDetokenize, R"({"tokens": [1, 2, 999, 0]})"},
};

const std::vector<std::string> kJsonTokens = {
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "\"",
    "null",
    "true",
    "false",
    "0",
    "-1",
    "1e309",
    "-1e309",
    "1.5",
    "18446744073709551616",
    "99999999999",
    "\"\\ud800\"",
    "\"\\u0000\"",
    "\\",
    "\xFF",
    "\xC3",
    "{\"a\":[",
    "\"messages\"",
    "\"prompt\"",
    "\"role\"",
    "\"content\"",
    "\"type\"",
    "[[",
    "]]",
    "\"text\"",
    " ",
    "\n",
    "-",
    "e",
    ".",
    "\"\xE2\x82\"",
};

const std::vector<json> kReplacements = {
    nullptr,
    true,
    false,
    0,
    -1,
    1.5,
    1e300,
    -1e300,
    4294967296.0,
    "str",
    "",
    json::array(),
    json::object(),
    json::array({1, 2}),
    json{{"type", "text"}},
    json::array({json{{"role", "user"}}}),
    json::array({"a", "b"}),
    json::array({json::array({1})}),
    UINT64_MAX,
    INT64_MIN,
    json{{"type", "image_url"}},
    json{{"include_usage", "x"}},
    json{{"99", 1000}},
    "tool",
    "developer",
};

// Every value's location in a document, as JSON pointers.
void collect_pointers(const json& j, const json::json_pointer& at,
                      std::vector<json::json_pointer>& out) {
  out.push_back(at);
  if (j.is_object()) {
    for (const auto& [key, value] : j.items()) collect_pointers(value, at / key, out);
  } else if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) collect_pointers(j[i], at / i, out);
  }
}

std::string mutate(std::string_view seed, Rng& rng) {
  std::string s(seed);
  const size_t kind = rng.below(6);
  if (kind == 0 || kind == 5) {
    // Swap the type of one value (the root excepted): structure stays valid
    // JSON, so this reaches the field checks rather than the JSON parser.
    json doc = json::parse(seed);
    std::vector<json::json_pointer> ptrs;
    collect_pointers(doc, json::json_pointer(), ptrs);
    const auto& ptr = ptrs[1 + rng.below(ptrs.size() - 1)];
    doc[ptr] = kReplacements[rng.below(kReplacements.size())];
    if (rng.below(3) == 0) doc.erase(doc.begin());  // drop a field too
    s = doc.dump();
    if (kind == 0) return s;
  }
  const size_t rounds = 1 + rng.below(3);
  for (size_t r = 0; r < rounds && !s.empty(); ++r) {
    const size_t pos = rng.below(s.size() + 1);
    switch (rng.below(4)) {
      case 0:  // flip a byte
        if (pos < s.size()) s[pos] = static_cast<char>(rng.next() & 0xFF);
        break;
      case 1:  // truncate
        s.resize(pos);
        break;
      case 2:  // insert a JSON token
        s.insert(pos, kJsonTokens[rng.below(kJsonTokens.size())]);
        break;
      default:  // delete a run
        s.erase(pos, rng.below(8));
        break;
    }
  }
  return s;
}

template <class T>
void check_outcome(const Parsed<T>& r, const std::string& body) {
  if (const auto* err = std::get_if<ApiError>(&r)) {
    ASSERT_GE(err->status, 400) << body;
    ASSERT_LE(err->status, 499) << body;
    ASSERT_FALSE(err->message.empty()) << body;
    (void)err->to_json().dump();  // throws if any string is not UTF-8
  }
}

// Runs one parser on a body and checks the outcome; true when it parsed.
// Parsed requests are used further: chat messages rendered with every family,
// completion limits fitted to a context.
bool fuzz_one(FuzzTarget target, const std::string& body, Rng& rng,
              const std::vector<ChatTemplate>& templates, int& field_errors) {
  auto count = [&](const auto& r) {
    if (const auto* err = std::get_if<ApiError>(&r)) {
      check_outcome(r, body);
      if (!err->param.empty()) ++field_errors;
      return false;
    }
    return true;
  };
  switch (target) {
    case kCompletions: {
      const auto r = parse_completion_request(body, kVocab);
      if (!count(r)) return false;
      SamplingParams sp = std::get<CompletionRequest>(r).sampling;
      (void)fit_to_context(std::get<CompletionRequest>(r).max_tokens,
                           static_cast<int64_t>(rng.below(3000)), 2048, "prompt", sp);
      EXPECT_TRUE(sp.validate(kVocab).empty()) << body;
      return true;
    }
    case kChat: {
      const auto r = parse_chat_request(body, kVocab);
      if (!count(r)) return false;
      const ChatConversation& conversation = std::get<ChatRequest>(r).conversation;
      EXPECT_FALSE(conversation.messages.empty()) << body;
      for (const ChatTemplate& t : templates) {
        const auto rendered = t.render(conversation);
        if (const auto* err = std::get_if<ApiError>(&rendered)) {
          EXPECT_EQ(err->status, 400);
        }
      }
      return true;
    }
    case kTokenize:
      return count(parse_tokenize_request(body));
    default:
      return count(parse_detokenize_request(body, kVocab));
  }
}

TEST(OpenAIProtocolFuzz, MutatedBodiesGiveARequestOrA4xx) {
  // Every mutated conversation that parses goes through the chat-shaped
  // test templates: a render is a prompt or a 400, never a crash.
  std::vector<ChatTemplate> templates;
  for (const auto& [name, source] : test::jinja_chat_templates())
    templates.push_back(ChatTemplate::from_options("", source, "<s>", "</s>"));
  Rng rng(20240611);
  int parsed = 0, rejected = 0, field_errors = 0;
  for (int i = 0; i < 20000; ++i) {
    const FuzzSeed& seed = kFuzzSeeds[rng.below(kFuzzSeeds.size())];
    const std::string body = mutate(seed.body, rng);
    try {
      // The body's own endpoint, and one other: a chat body sent to
      // /v1/completions must be refused just as cleanly.
      (fuzz_one(seed.target, body, rng, templates, field_errors) ? parsed : rejected)++;
      fuzz_one(static_cast<FuzzTarget>(rng.below(kTargets)), body, rng, templates, field_errors);
    } catch (const std::exception& e) {
      FAIL() << "threw " << e.what() << " on body: " << body;
    }
    if (HasFailure()) {
      ADD_FAILURE() << "on body: " << body;
      return;
    }
  }
  // Both outcomes are exercised in quantity, and many rejections come from
  // the field checks rather than the JSON parser.
  EXPECT_GT(parsed, 1000);
  EXPECT_GT(rejected, 1000);
  EXPECT_GT(field_errors, 2000);
  RecordProperty("parsed", parsed);
  RecordProperty("rejected", rejected);
  RecordProperty("field_errors", field_errors);
}

}  // namespace
}  // namespace tandem::server
