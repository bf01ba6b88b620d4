// Templates and contexts for the differential tests of the Jinja
// interpreter against Jinja2 (tests/jinja_oracle.py): one small template per
// feature, and chat templates written for these tests in the shapes real
// model files use (ChatML with tools, a thinking switch, Llama-3-style
// headers with a date, Mistral-style [INST] turns, Gemma-style turns, a
// DeepSeek-R1-style reasoning split, Granite-style documents, Zephyr/Phi
// style), rendered over seeded random conversations.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tandem::test {

struct JinjaCase {
  std::string name;
  std::string source;
  nlohmann::ordered_json context = nlohmann::ordered_json::object();
};

// Each feature: a template and the contexts it is rendered with.
std::vector<JinjaCase> jinja_feature_cases();
// The chat-shaped templates, by name.
std::vector<std::pair<std::string, std::string>> jinja_chat_templates();
// A random conversation: messages (roles, contents with whitespace, quotes,
// Unicode and <think> markers, tool calls and tool results), maybe tools,
// add_generation_prompt, enable_thinking, bos/eos tokens.
nlohmann::ordered_json random_chat_context(std::mt19937_64& rng);

}  // namespace tandem::test
