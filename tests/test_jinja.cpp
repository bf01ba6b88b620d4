// The Jinja interpreter: differential tests against Jinja2 (Debian's
// python3-jinja2, run by tests/jinja_oracle.py as transformers configures
// it), byte for byte, over feature templates and seeded random
// conversations through chat-shaped templates; and the sandbox's limits.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "jinja/template.h"
#include "jinja_cases.h"

namespace tandem::test {
namespace {

using jinja::ErrorKind;
using jinja::Template;
using jinja::TemplateError;
using oj = nlohmann::ordered_json;

constexpr const char* kPython = "/usr/bin/python3";

std::string oracle_script() { return std::string(TANDEM_TEST_DATA_DIR) + "/../jinja_oracle.py"; }

bool oracle_available() {
  const std::string cmd = std::string("timeout 30 ") + kPython + " -c 'import jinja2' >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}

// The oracle is a test requirement in CI (scripts/install-deps.sh installs
// python3-jinja2); elsewhere a machine without it skips these tests.
#define REQUIRE_ORACLE()                                                                       \
  do {                                                                                         \
    if (!oracle_available()) {                                                                 \
      if (std::getenv("CI")) FAIL() << "python3-jinja2 is missing: run scripts/install-deps.sh"; \
      GTEST_SKIP() << "python3-jinja2 not installed (scripts/install-deps.sh installs it)";     \
    }                                                                                          \
  } while (0)

// One oracle process for a whole batch, bounded in time.
oj run_oracle(const std::vector<JinjaCase>& cases) {
  oj input = oj::array();
  for (const auto& c : cases) input.push_back(oj{{"template", c.source}, {"context", c.context}, {"now", {2024, 7, 26, 9, 30, 0}}});
  char in_path[] = "/tmp/tandem-jinja-in-XXXXXX";
  const int fd = mkstemp(in_path);
  if (fd < 0) return nullptr;
  close(fd);
  const std::string out_path = std::string(in_path) + ".out";
  { std::ofstream(in_path) << input.dump(); }
  const std::string cmd = "timeout -k 5 300 " + std::string(kPython) + " " + oracle_script() + " < " + in_path + " > " + out_path;
  const int rc = std::system(cmd.c_str());
  std::stringstream text;
  text << std::ifstream(out_path).rdbuf();
  std::remove(in_path);
  std::remove(out_path.c_str());
  if (rc != 0) return nullptr;
  return oj::parse(text.str(), nullptr, false);
}

jinja::RenderOptions fixed_clock() {
  jinja::RenderOptions o;
  o.now = [] {
    std::tm tm{};
    tm.tm_year = 2024 - 1900;
    tm.tm_mon = 6;
    tm.tm_mday = 26;
    tm.tm_hour = 9;
    tm.tm_min = 30;
    tm.tm_wday = 5;   // a Friday
    tm.tm_yday = 207;
    return tm;
  };
  return o;
}

jinja::Dict context_of(const oj& ctx) { return jinja::Value::from_json(ctx).dict_items(); }

// Renders every case with tandem and compares with the oracle's results.
// Returns the number of cases that matched, for the caller's own checks.
size_t compare_with_oracle(const std::vector<JinjaCase>& cases, size_t* errors_matched = nullptr) {
  const oj expected = run_oracle(cases);
  EXPECT_TRUE(expected.is_array() && expected.size() == cases.size()) << "the oracle did not answer";
  if (!expected.is_array() || expected.size() != cases.size()) return 0;
  size_t matched = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const JinjaCase& c = cases[i];
    const oj& want = expected[i];
    std::string got;
    std::optional<TemplateError> err;
    try {
      got = Template::parse(c.source).render(context_of(c.context), fixed_clock());
    } catch (const TemplateError& e) {
      err = e;
    }
    const std::string where = c.name + "\ncontext: " + c.context.dump();
    if (want["ok"].get<bool>()) {
      if (err) {
        ADD_FAILURE() << where << "\nJinja2 rendered:\n" << want["text"].get<std::string>() << "\ntandem failed: " << err->describe();
        continue;
      }
      if (got != want["text"].get<std::string>()) {
        ADD_FAILURE() << where << "\nJinja2:\n[" << want["text"].get<std::string>() << "]\ntandem:\n[" << got << "]";
        continue;
      }
    } else {
      const std::string kind = want["kind"].get<std::string>();
      if (!err) {
        ADD_FAILURE() << where << "\nJinja2 failed (" << want["message"].get<std::string>() << ") but tandem rendered:\n" << got;
        continue;
      }
      if (kind == "raised" && (err->kind() != ErrorKind::kRaised || err->what() != want["message"].get<std::string>())) {
        ADD_FAILURE() << where << "\nJinja2 raised '" << want["message"].get<std::string>() << "', tandem: " << err->describe();
        continue;
      }
      if (kind == "error" && (err->kind() == ErrorKind::kRaised || err->kind() == ErrorKind::kUnsupported)) {
        ADD_FAILURE() << where << "\nJinja2: " << want["message"].get<std::string>() << "\ntandem: " << jinja::error_kind_name(err->kind()) << ": " << err->describe();
        continue;
      }
      if (errors_matched) ++*errors_matched;
    }
    ++matched;
  }
  return matched;
}

TEST(JinjaDifferential, EveryFeatureTemplateRendersByteIdenticalToJinja2) {
  REQUIRE_ORACLE();
  const std::vector<JinjaCase> cases = jinja_feature_cases();
  ASSERT_GT(cases.size(), 90u);
  size_t errors = 0;
  EXPECT_EQ(compare_with_oracle(cases, &errors), cases.size());
  EXPECT_GE(errors, 15u) << "the error cases must fail in Jinja2 too";
}

TEST(JinjaDifferential, ChatTemplatesOverSeededRandomConversationsMatchJinja2) {
  REQUIRE_ORACLE();
  std::vector<JinjaCase> cases;
  for (const auto& [name, source] : jinja_chat_templates()) {
    std::mt19937_64 rng(0x5eed0000 + name.size());
    for (int i = 0; i < 150; ++i) cases.push_back({name + " seed " + std::to_string(i), source, random_chat_context(rng)});
  }
  size_t errors = 0;
  EXPECT_EQ(compare_with_oracle(cases, &errors), cases.size());
  // The conversations must exercise both paths: renderings and the templates' own raise_exception.
  EXPECT_GT(errors, 20u);
  EXPECT_LT(errors, cases.size() / 2);
}

TEST(JinjaDifferential, EachChatTemplateRendersTheSameWhateverTheSeedScheduleHits) {
  // Not random: one hand-made conversation per template that every branch
  // the fuzz might miss (tools + tool calls + tool results + reasoning) goes through.
  REQUIRE_ORACLE();
  oj ctx = oj::parse(R"({"messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
      {"role": "tool", "content": "21C", "tool_call_id": "call1"},
      {"role": "assistant", "content": "<think>\nok\n</think>\n\nIt is 21C."},
      {"role": "user", "content": "Thanks"}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
    "documents": null, "add_generation_prompt": true, "enable_thinking": false, "bos_token": "<s>", "eos_token": "</s>"})");
  std::vector<JinjaCase> cases;
  for (const auto& [name, source] : jinja_chat_templates()) cases.push_back({name, source, ctx});
  EXPECT_EQ(compare_with_oracle(cases), cases.size());
}

// Real chat templates are not in the repository (they belong to their
// models); to check a set of them, point TANDEM_JINJA_TEMPLATES at a folder
// of *.jinja files (docs/COMPATIBILITY.md records such a run).
TEST(JinjaDifferential, TemplatesInTheFolderNamedByTheEnvironmentMatchJinja2) {
  const char* dir = std::getenv("TANDEM_JINJA_TEMPLATES");
  if (!dir) GTEST_SKIP() << "set TANDEM_JINJA_TEMPLATES to a folder of .jinja files";
  REQUIRE_ORACLE();
  std::vector<JinjaCase> cases;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".jinja") continue;
    std::stringstream text;
    text << std::ifstream(entry.path()).rdbuf();
    std::mt19937_64 rng(0x5eed);
    for (int i = 0; i < 100; ++i)
      cases.push_back({entry.path().filename().string() + " seed " + std::to_string(i), text.str(), random_chat_context(rng)});
  }
  ASSERT_FALSE(cases.empty()) << "no .jinja files in " << dir;
  size_t errors = 0;
  const size_t matched = compare_with_oracle(cases, &errors);
  EXPECT_EQ(matched, cases.size());
  std::printf("%zu of %zu renderings matched Jinja2 (%zu of them failing in both)\n", matched, cases.size(), errors);
}

// ---- without the oracle: what tandem adds (limits, errors, the clock) ----

std::string render(const std::string& src, const oj& ctx = oj::object(), jinja::RenderOptions opt = fixed_clock()) {
  return Template::parse(src).render(context_of(ctx), opt);
}

ErrorKind error_of(const std::string& src, jinja::RenderOptions opt = fixed_clock(), int* line = nullptr) {
  try {
    render(src, oj::object(), std::move(opt));
  } catch (const TemplateError& e) {
    if (line) *line = e.line();
    return e.kind();
  }
  ADD_FAILURE() << "rendered without an error: " << src;
  return ErrorKind::kRuntime;
}

TEST(JinjaSandbox, AnEndlessLoopStopsAtTheStepLimit) {
  jinja::RenderOptions opt = fixed_clock();
  opt.limits.max_steps = 100'000;
  EXPECT_EQ(error_of("{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}", opt), ErrorKind::kLimit);
}

TEST(JinjaSandbox, OutputPastTheByteLimitStops) {
  jinja::RenderOptions opt = fixed_clock();
  opt.limits.max_output_bytes = 1000;
  EXPECT_EQ(error_of("{% for i in range(2000) %}ab{% endfor %}", opt), ErrorKind::kLimit);
  EXPECT_EQ(error_of("{% set s %}{% for i in range(2000) %}ab{% endfor %}{% endset %}", opt), ErrorKind::kLimit);
  EXPECT_EQ(render("{% for i in range(400) %}ab{% endfor %}", oj::object(), opt).size(), 800u);
}

TEST(JinjaSandbox, UnboundedRecursionStopsAtTheCallDepth) {
  EXPECT_EQ(error_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"), ErrorKind::kLimit);
  // ... and a template nested too deep to parse is refused, not a stack overflow.
  std::string deep;
  for (int i = 0; i < 5000; ++i) deep += "(";
  EXPECT_EQ(error_of("{{ " + deep + "1" + std::string(5000, ')') + " }}"), ErrorKind::kLimit);
  EXPECT_EQ(error_of("{{ " + std::string(5000, '[') + std::string(5000, ']') + " }}"), ErrorKind::kLimit);
}

TEST(JinjaSandbox, RangesAndRepetitionAreBounded) {
  EXPECT_EQ(error_of("{{ range(1000000)|length }}"), ErrorKind::kLimit);
  EXPECT_EQ(error_of("{{ ('x' * 100000000)|length }}"), ErrorKind::kLimit);
  EXPECT_EQ(error_of("{{ 2 ** 64 }}"), ErrorKind::kLimit);
}

TEST(JinjaSandbox, NothingOutsideTheContextIsReachable) {
  // No file, import or environment access: the tags are refused, globals absent, dunders blocked.
  EXPECT_EQ(error_of("{% include 'x' %}"), ErrorKind::kUnsupported);
  EXPECT_EQ(error_of("{% import 'x' as y %}"), ErrorKind::kUnsupported);
  EXPECT_EQ(error_of("{% extends 'x' %}"), ErrorKind::kUnsupported);
  EXPECT_EQ(render("{{ os is defined }}{{ environ is defined }}{{ open is defined }}{{ self is defined }}"), "FalseFalseFalseFalse");
  EXPECT_EQ(render("{{ ''.__class__ is defined }}"), "False");
  EXPECT_EQ(error_of("{% set xs = [] %}{{ xs.append(1) }}"), ErrorKind::kRuntime);  // SecurityError in Jinja2
}

TEST(JinjaSandbox, ValuesNestBoundedlySoNothingRecursesWithoutEnd) {
  // A template wrapping a list in a list 100000 times stops at the depth limit...
  EXPECT_EQ(error_of("{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}"),
            ErrorKind::kLimit);
  // ... and namespaces, the only mutable values, cannot hold each other (no cycles).
  EXPECT_EQ(error_of("{% set a = namespace(v=1) %}{% set b = namespace(v=2) %}{% set a.v = [b] %}"), ErrorKind::kUnsupported);
  // A request's JSON nested too deep becomes an error, not a deep recursion.
  oj deep = oj::array();
  for (int i = 0; i < 1000; ++i) deep = oj::array({deep});
  EXPECT_THROW(jinja::Value::from_json(deep), TemplateError);
  oj ok = oj::array();
  for (int i = 0; i < 100; ++i) ok = oj::array({ok});
  EXPECT_EQ(jinja::Value::from_json(ok).depth(), 101);
}

TEST(JinjaSandbox, HugeCountsSizesAndIndexesAreLimitErrorsNotCrashes) {
  EXPECT_EQ(error_of("{{ 'abc' * 6148914691236517206 }}"), ErrorKind::kLimit);  // would wrap a size check
  EXPECT_EQ(render("{{ ('' * 1000000000000000000)|length }}{{ ([] * 1000000000000000000)|length }}"), "00");
  EXPECT_EQ(error_of("{% set s = 'x' * 10000000 %}{{ s ~ s }}"), ErrorKind::kLimit);
  EXPECT_EQ(error_of("{{ 'x'|indent(1000000000000) }}"), ErrorKind::kLimit);
  EXPECT_EQ(error_of("{{ [1]|tojson(indent=2000000000) }}"), ErrorKind::kLimit);
  EXPECT_EQ(error_of("{% set s = 'x' * 1000000 %}{{ s.replace('', s) }}"), ErrorKind::kLimit);
  EXPECT_EQ(error_of("{{ '{99999999999999999999}'.format(1) }}"), ErrorKind::kRuntime);
  EXPECT_EQ(error_of("{{ [{'a': 1}]|map(attribute='99999999999999999999')|list }}"), ErrorKind::kRuntime);
  EXPECT_EQ(error_of("{{ '%d' % 1e300 }}"), ErrorKind::kUnsupported);
  EXPECT_EQ(error_of("{{ '%-600s' % 'x' }}"), ErrorKind::kUnsupported);
  EXPECT_EQ(error_of("{{ range(0, 10, -9223372036854775807 - 1)|list }}"), ErrorKind::kLimit);
}

TEST(JinjaSandbox, NestingThatMultipliesAcrossLimitsStopsBeforeTheStackDoes) {
  // A 100000-long else-if chain is refused by the parser...
  std::string chain = "{{ ";
  for (int i = 0; i < 100000; ++i) chain += "x if y else ";
  EXPECT_EQ(error_of(chain + "z }}"), ErrorKind::kLimit);
  // ... and a macro whose recursion sits deep in an expression, 64 calls
  // deep, by the frame limit (each limit alone would allow it).
  std::string deep = "{% macro m(n) %}{{ (m(n - 1) if n else '')";
  for (int i = 0; i < 400; ++i) deep += " ~ 'a'";
  deep += " }}{% endmacro %}{{ m(60) }}";
  EXPECT_EQ(error_of(deep), ErrorKind::kLimit);
  // The macro specials tandem does not define are refused, not left undefined.
  EXPECT_EQ(error_of("{% macro m() %}{{ varargs }}{% endmacro %}{{ m() }}"), ErrorKind::kUnsupported);
  EXPECT_EQ(error_of("{% macro m() %}{{ kwargs|length }}{% endmacro %}{{ m() }}"), ErrorKind::kUnsupported);
  // A bound method (which holds its object) cannot go into a namespace: no cycles.
  EXPECT_EQ(error_of("{% set ns = namespace() %}{% set l = [ns] %}{% set ns.f = l.count %}"), ErrorKind::kUnsupported);
}

TEST(JinjaErrors, EachFailureSaysWhatAndWhere) {
  int line = 0;
  EXPECT_EQ(error_of("line one\n{% if %}", fixed_clock(), &line), ErrorKind::kSyntax);
  EXPECT_EQ(line, 2);
  EXPECT_EQ(error_of("a\nb\n{{ raise_exception('bad roles') }}", fixed_clock(), &line), ErrorKind::kRaised);
  EXPECT_EQ(line, 3);
  EXPECT_EQ(error_of("{{ x|wordcount }}"), ErrorKind::kUnsupported);
  EXPECT_EQ(error_of("{% for x in xs recursive %}{% endfor %}"), ErrorKind::kUnsupported);
  try {
    render("{{ raise_exception('Conversation roles must alternate') }}");
    FAIL();
  } catch (const TemplateError& e) {
    EXPECT_STREQ(e.what(), "Conversation roles must alternate");
  }
}

TEST(JinjaGlobals, StrftimeNowReadsTheInjectedClockAndTheSystemOneByDefault) {
  EXPECT_EQ(render("{{ strftime_now('%d %b %Y') }}"), "26 Jul 2024");
  const std::string today = render("{{ strftime_now('%Y') }}", oj::object(), jinja::RenderOptions{});
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  EXPECT_EQ(today, std::to_string(1900 + tm.tm_year));
}

TEST(JinjaValues, FloatsPrintAsPythonPrintsThem) {
  EXPECT_EQ(jinja::python_float_repr(0.1), "0.1");
  EXPECT_EQ(jinja::python_float_repr(1e16), "1e+16");
  EXPECT_EQ(jinja::python_float_repr(1e15), "1000000000000000.0");
  EXPECT_EQ(jinja::python_float_repr(1e-5), "1e-05");
  EXPECT_EQ(jinja::python_float_repr(0.0001), "0.0001");
  EXPECT_EQ(jinja::python_float_repr(-2.5), "-2.5");
  EXPECT_EQ(jinja::python_float_repr(1.0 / 3.0), "0.3333333333333333");
}

}  // namespace
}  // namespace tandem::test
