#include "jinja_cases.h"

namespace tandem::test {
namespace {

using oj = nlohmann::ordered_json;

void add(std::vector<JinjaCase>& out, const std::string& name, const std::string& source,
         std::vector<oj> contexts = {oj::object()}) {
  for (size_t i = 0; i < contexts.size(); ++i)
    out.push_back({name + "#" + std::to_string(i), source, contexts[i]});
}

}  // namespace

std::vector<JinjaCase> jinja_feature_cases() {
  std::vector<JinjaCase> c;
  // ---- whitespace control: trim_blocks, lstrip_blocks, "-", "+", comments, newlines ----
  add(c, "trim_blocks", "a\n{% if true %}\nyes\n{% endif %}\nb\n");
  add(c, "lstrip_blocks", "x\n    {% if true %}\n    in\n    {% endif %}\ny");
  add(c, "lstrip_not_after_text", "x  {% if true %}y{% endif %}  z");
  add(c, "minus_strips", "a   \n\n  {%- if true -%}  \n\n  b  \n  {%- endif -%}\n\n  c");
  add(c, "plus_keeps", "a\n  {%+ if true +%}\nb\n  {%+ endif %}\nc");
  add(c, "print_minus", "[ {{- 'x' -}} ]\n  {{ 'y' }}  \n{{- 'z' }}");
  add(c, "print_no_trim", "{{ 'a' }}\n{{ 'b' }}\n");
  add(c, "comments", "a {# note #}\n{# own line #}\nb\n   {#- strip -#}   c {#+ keep #}\nd");
  add(c, "crlf_source", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\nc\r\n");
  add(c, "trailing_newlines", "x\n\n");
  add(c, "raw", "{% raw %}{{ not evaluated }} {% if %}{% endraw %}\nafter");
  add(c, "nested_blocks_indent", "{% for i in [1, 2] %}\n  {% if i == 2 %}\n    two\n  {% else %}\n    other\n  {% endif %}\n{% endfor %}\n");
  // ---- literals, printing (Python str()) ----
  add(c, "print_values", "{{ none }} {{ true }} {{ false }} {{ 42 }} {{ -7 }} {{ 1.5 }} {{ 2.0 }} {{ 'str' }}");
  add(c, "print_floats", "{{ 0.1 + 0.2 }}|{{ 1/3 }}|{{ 10/2 }}|{{ 1e20 }}|{{ 1e16 }}|{{ 1e15 }}|{{ 0.0001 }}|{{ 0.00001 }}|{{ -0.0 }}|{{ 123456.789 }}|{{ 2.5e-7 }}");
  add(c, "print_containers", "{{ [1, 'a', none, true, 1.5, [2]] }} {{ {'k': 'v', 'n': 1} }} {{ (1,) }} {{ (1, 2) }} {{ () }} {{ [] }} {{ {} }}");
  add(c, "print_repr_quotes", "{{ [\"it's\", 'say \"hi\"', 'both \\' \"', 'tab\\there', 'nl\\n', 'back\\\\slash'] }}");
  add(c, "print_repr_unicode", "{{ ['é', '中文', '😀', '\\x7f', '\\u00a0', '\\u200b'] }}");
  add(c, "string_escapes", "{{ 'a\\nb\\tc\\\\d\\'e\\\"f' }}|{{ \"\\u00e9\\x41\\101\" }}|{{ 'keep \\d' }}|{{ 'adj' 'acent' }}");
  add(c, "tuple_print", "{% set t = 1, 'two' %}{{ t }} {{ t[1] }}");
  add(c, "integers", "{{ 1_000 }} {{ 12 }} {{ 3.25e2 }} {{ 1E3 }}");
  // ---- operators ----
  add(c, "arithmetic", "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 1 + 2 * 3 - 4 }} {{ (1 + 2) * 3 }} {{ true + 1 }} {{ 3 * 1.5 }} {{ 2 ** 3 ** 2 }}");
  add(c, "concat", "{{ 'a' ~ 1 ~ none ~ true ~ [1] ~ undefined_thing }}|{{ 'ab' + 'cd' }}|{{ '-' * 5 }}|{{ 3 * 'x' }}|{{ [1] + [2, 3] }}|{{ [0] * 3 }}");
  add(c, "compare", "{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 1 == 1.0 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 1 != 2 }} {{ 'abc' >= 'abd' }} {{ none == none }} {{ true == 1 }} {{ {'a': 1} == {'a': 1} }}");
  add(c, "in_operator", "{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'x' not in 'abc' }} {{ 3 not in [1] }} {{ 'a' in missing }} {{ (1, 2) in [(1, 2)] }}");
  add(c, "logic_values", "{{ none or 'x' }} {{ 0 and 1 }} {{ '' or [] or 'last' }} {{ 1 and 'y' }} {{ not none }} {{ not 'a' }} {{ not 1 == 2 }}");
  add(c, "unary", "{{ -x }} {{ +x }} {{ -x|abs }} {{ - 2 ** 2 }}", {oj{{"x", 3}}, oj{{"x", -2.5}}});
  add(c, "condexpr", "{{ 'yes' if x else 'no' }}|{{ 'only' if x }}|{{ 'a' if x > 5 else 'b' if x > 1 else 'c' }}", {oj{{"x", 0}}, oj{{"x", 3}}, oj{{"x", 9}}});
  // ---- variables and undefined ----
  add(c, "undefined", "[{{ missing }}] {{ missing is defined }} {{ missing is undefined }} {{ missing|default('dflt') }} {{ missing|length }} {% for x in missing %}never{% endfor %}{{ d.nokey }}|{{ d.nokey is defined }}|{{ d['nokey']|default('x') }}|{{ missing == missing }}|{{ none.attr }}|{{ missing ~ 'tail' }}", {oj{{"d", oj::object()}}});
  add(c, "undefined_attr_error", "{{ missing.attr }}");
  add(c, "undefined_call_error", "{{ missing() }}");
  add(c, "undefined_arith_error", "{{ missing + 1 }}");
  add(c, "default_boolean", "{{ ''|default('e', true) }} {{ ''|default('e') }} {{ none|default('n') }} {{ 0|d('z', boolean=true) }} {{ false|default('f', true) }}");
  add(c, "attribute_vs_item", "{{ d.items is defined }} {{ d['items'] }} {{ d.get('items') }} {{ d.keys()|list }} {{ d.values()|list }} {{ d.get('zz', 'fallback') }} {{ d.get('zz') }}", {oj{{"d", oj{{"items", "as key"}, {"b", 2}}}}});
  add(c, "indexing", "{{ xs[0] }} {{ xs[-1] }} {{ xs[10] is defined }} {{ s[0] }} {{ s[-2] }} {{ xs.0 }} {{ m['a']['b'] }} {{ m.a.b }} {{ pairs[1][0] }}", {oj{{"xs", {1, 2, 3}}, {"s", "héllo"}, {"m", oj{{"a", oj{{"b", "deep"}}}}}, {"pairs", oj::array({oj::array({"a", 1}), oj::array({"b", 2})})}}});
  add(c, "slicing", "{{ xs[1:] }} {{ xs[:2] }} {{ xs[::-1] }} {{ xs[-2:] }} {{ xs[::2] }} {{ xs[5:] }} {{ s[1:4] }} {{ s[::-1] }} {{ s[:-1] }} {{ xs[3:0:-1] }}", {oj{{"xs", {1, 2, 3, 4, 5}}, {"s", "héllo wörld"}}});
  // ---- statements ----
  add(c, "if_elif_else", "{% if x == 1 %}one{% elif x == 2 %}two{% elif x is string %}str{% else %}other{% endif %}", {oj{{"x", 1}}, oj{{"x", 2}}, oj{{"x", "s"}}, oj{{"x", 3.5}}});
  add(c, "for_loop_vars", "{% for x in xs %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.length }}/{{ loop.first }}/{{ loop.last }}/{{ loop.previtem|default('-') }}/{{ loop.nextitem|default('-') }}/{{ loop.cycle('odd', 'even') }};{% endfor %}", {oj{{"xs", {"a", "b", "c"}}}, oj{{"xs", {"solo"}}}});
  add(c, "for_else", "{% for x in xs %}{{ x }}{% else %}empty{% endfor %}", {oj{{"xs", oj::array()}}, oj{{"xs", {1}}}});
  add(c, "for_filter", "{% for x in xs if x % 2 == 0 %}{{ x }}@{{ loop.index }}/{{ loop.length }} {% endfor %}", {oj{{"xs", {1, 2, 3, 4, 5, 6}}}});
  add(c, "for_unpack", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}[{{ k }}]{% endfor %}{% for a, b in [(1, 2), [3, 4]] %}{{ a + b }}{% endfor %}{% for ch in 'héj' %}<{{ ch }}>{% endfor %}", {oj{{"d", oj{{"z", 1}, {"a", 2}}}}});
  add(c, "break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x > 5 %}{% break %}{% endif %}{{ x }}{% endfor %}");
  add(c, "nested_loops", "{% for i in range(3) %}{% for j in range(i) %}{{ i }}{{ j }}({{ loop.index }}) {% endfor %}|{{ loop.index }}{% endfor %}");
  add(c, "scoping", "{% set x = 'outer' %}{% for i in [1, 2] %}{% set x = 'inner' ~ i %}{{ x }} {% endfor %}{{ x }}{% if true %}{% set y = 'if-set' %}{% endif %} {{ y }}");
  add(c, "namespace", "{% set ns = namespace(count=0, found=false, names=[]) %}{% for m in ms %}{% set ns.count = ns.count + 1 %}{% if m == 'b' %}{% set ns.found = true %}{% endif %}{% set ns.names = ns.names + [m] %}{% endfor %}{{ ns.count }} {{ ns.found }} {{ ns.names }} {{ namespace(a=1).a }} {{ namespace({'k': 2}).k }}", {oj{{"ms", {"a", "b", "c"}}}});
  add(c, "set_forms", "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set (c, d) = ['x', 'y'] %}{{ c }}{{ d }}{% set e = [1, 2] %}{{ e|length }}");
  add(c, "set_block", "{% set body %}\n  inner {{ 1 + 1 }}\n{% endset %}[{{ body }}]{% set up | upper | trim %} shout {% endset %}[{{ up }}]");
  add(c, "filter_block", "{% filter upper %}abc {{ 'def' }}{% endfilter %}{% filter trim|replace('a', 'o') %}  banana  {% endfilter %}");
  add(c, "with_block", "{% set a = 1 %}{% with a = 2, b = a %}{{ a }}{{ b }}{% endwith %}{{ a }}");
  add(c, "macros", "{% macro greet(name, greeting='Hello', punct='!') %}{{ greeting }}, {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', 'Hi') }} {{ greet(punct='?', name='C') }} {{ greet('D', punct='.') }}");
  add(c, "macro_recursion", "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1)|int }}{% endif %}{% endmacro %}{{ fact(6) }}");
  add(c, "macro_scope", "{% set g = 'global' %}{% macro m(x) %}{% set g = 'local' %}{{ x }}-{{ g }}{% endmacro %}{{ m(1) }} {{ g }}{% macro caller_of() %}[{{ m(2) }}]{% endmacro %}{{ caller_of() }}");
  add(c, "macro_missing_arg", "{% macro m(a, b) %}{{ a }}|{{ b }}|{{ b is defined }}{% endmacro %}{{ m(1) }}");
  add(c, "generation_tag", "{% for m in ms %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}!{% endgeneration %}{% else %}{{ m.content }}{% endif %}\n{% endfor %}", {oj{{"ms", oj::array({oj{{"role", "user"}, {"content", "q"}}, oj{{"role", "assistant"}, {"content", "a"}}})}}});
  // ---- filters ----
  add(c, "filter_strings", "{{ '  pad  '|trim }}|{{ 'xxhixx'|trim('x') }}|{{ 'hello world'|title }}|{{ 'hELLO'|capitalize }}|{{ 'MiXed'|lower }}|{{ 'MiXed'|upper }}|{{ 'a-b c(d'|title }}|{{ 'aaa'|replace('a', 'b', 2) }}|{{ 'abc'|replace('', '-') }}|{{ '<a href=\"x\">&\\''|e }}|{{ 'x'|safe }}|{{ 42|string }}|{{ 'abc'|reverse }}|{{ 'abc'|list }}|{{ 'héllo'|length }}");
  add(c, "markup_safe", "{{ \"a '\"|safe + '<b>' + '&'|e + ('x'|safe ~ '<y>') }}|{{ '<b>' + 'q'|safe }}|{{ ('<p>'|e)|length }}|{{ ('<'|e)|e }}|{{ 'x'|safe == 'x' }}");
  add(c, "filter_indent", "{{ text|indent }}|{{ text|indent(2, true) }}|{{ text|indent(width='> ', first=true, blank=true) }}|{{ 'one'|indent(3) }}", {oj{{"text", "l1\nl2\n\nl4\n"}}});
  add(c, "filter_sequences", "{{ xs|first }} {{ xs|last }} {{ xs|length }} {{ xs|count }} {{ xs|join(', ') }} {{ xs|join }} {{ xs|reverse|list }} {{ xs|sort }} {{ xs|sort(reverse=true) }} {{ xs|unique|list }} {{ xs|min }} {{ xs|max }} {{ xs|sum }} {{ xs|list }} {{ []|first is defined }}", {oj{{"xs", {3, 1, 2, 3}}}});
  add(c, "filter_sort_strings", "{{ ws|sort }} {{ ws|sort(case_sensitive=true) }} {{ ws|unique|list }} {{ ws|min }} {{ ws|max(case_sensitive=true) }}", {oj{{"ws", {"b", "A", "a", "C", "B"}}}});
  add(c, "filter_attrs", "{{ us|map(attribute='name')|join(',') }} {{ us|selectattr('admin')|map(attribute='name')|list }} {{ us|rejectattr('admin')|map(attribute='name')|list }} {{ us|selectattr('age', 'gt', 30)|list|length }} {{ us|sort(attribute='age')|map(attribute='name')|join }} {{ us|sum(attribute='age') }} {{ us|map(attribute='missing', default='?')|join }} {{ us|selectattr('name', 'equalto', 'bo')|first }} {{ us|min(attribute='age') }} {{ us|join(', ', attribute='name') }} {{ us|sort(attribute='admin,name')|map(attribute='name')|join }} {{ us|unique(attribute='admin')|map(attribute='name')|join }}",
      {oj{{"us", oj::array({oj{{"name", "al"}, {"age", 40}, {"admin", true}}, oj{{"name", "bo"}, {"age", 25}, {"admin", false}}, oj{{"name", "cy"}, {"age", 33}, {"admin", true}}})}}});
  add(c, "filter_select", "{{ xs|select('odd')|list }} {{ xs|reject('odd')|list }} {{ xs|select|list }} {{ xs|select('greaterthan', 2)|list }} {{ xs|select('in', [1, 4])|list }} {{ xs|map('string')|join('-') }} {{ ['a', 'B']|map('upper')|list }} {{ xs|select('divisibleby', 2)|list }}", {oj{{"xs", {0, 1, 2, 3, 4}}}});
  add(c, "filter_generators", "{{ xs|select('odd') is iterable }} {{ xs|select('odd') is sequence }} {{ []|select|first is defined }} {{ none|selectattr('a')|list }} {{ none|map(attribute='x')|list }} {{ 'yes' if []|select else 'no' }} {{ xs|reverse|first }} {% for x in xs|map('string') %}{{ loop.length }}{{ x }}{% endfor %}", {oj{{"xs", {1, 2, 3}}}});
  add(c, "reverse_generator", "{{ xs|select('odd')|reverse|list }} {{ xs|select|reverse|first }} {{ xs|reverse is sequence }}", {oj{{"xs", {1, 2, 3}}}});
  add(c, "block_scopes", "{% set body %}{% set inner = 1 %}x{% endset %}{{ inner is defined }}{% filter upper %}{% set inner2 = 1 %}y{% endfilter %}{{ inner2 is defined }}{% generation %}{% set g = 1 %}z{% endgeneration %}{{ g is defined }}");
  add(c, "for_else_break", "{% for i in [1, 2, 3] %}{% for j in [] %}{% else %}{% if i == 2 %}{% break %}{% endif %}{% endfor %}{{ i }}{% endfor %}|{% for i in [1, 2, 3] %}{% for j in [] %}{% else %}{% continue %}{% endfor %}{{ i }}{% endfor %}");
  add(c, "big_slice_step", "{{ xs[1::9223372036854775807] }} {{ 'abc'[1::9223372036854775807] }} {{ xs[::-9223372036854775807] }}", {oj{{"xs", {1, 2, 3}}}});
  add(c, "generator_has_no_len", "{{ xs|map('string')|length }}", {oj{{"xs", {1}}}});
  add(c, "generator_has_no_json", "{{ xs|select|tojson }}", {oj{{"xs", {1}}}});
  add(c, "filter_dicts", "{{ d|dictsort }} {{ d|dictsort(reverse=true) }} {{ d|dictsort(by='value') }} {{ d|items|list }} {{ d|list }} {{ d|length }} {% for k, v in d|items %}{{ k }}{{ v }}{% endfor %}", {oj{{"d", oj{{"b", 2}, {"a", 3}, {"C", 1}}}}});
  add(c, "filter_numbers", "{{ -3|abs }} {{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 2.1|round(0, 'ceil') }} {{ 2.9|round(method='floor') }} {{ '42'|int }} {{ '4.7'|int }} {{ 'x'|int }} {{ 'x'|int(-1) }} {{ 3.9|int }} {{ '3.5'|float }} {{ 'nope'|float }} {{ 7|float }} {{ '0x1A'|int(base=16) }} {{ ' 12 '|int }} {{ true|int }}");
  add(c, "filter_format", "{{ '%s and %s'|format('a', 1) }} {{ '%d%%'|format(50) }} {{ '%5.2f|%-4s|%03d'|format(3.14159, 'ab', 7) }} {{ '%r'|format('q') }} {{ 'x=%s' % 5 }} {{ '%s-%s' % ('a', 'b') }}");
  add(c, "filter_tojson", "{{ v|tojson }}\n{{ v|tojson(indent=2) }}\n{{ v|tojson(indent=4, sort_keys=true) }}\n{{ v|tojson(separators=(',', ':')) }}\n{{ v|tojson(ensure_ascii=true) }}\n{{ 'q\"\\\\\\n\\t\\u0001'|tojson }} {{ none|tojson }} {{ 1.0|tojson }} {{ [1e20, 0.5, -3]|tojson }} {{ {}|tojson(indent=2) }} {{ []|tojson(indent=2) }} {{ (1, 'a')|tojson }} {{ {1: 'int key', true: 'b'}|tojson }}",
      {oj{{"v", oj{{"name", "get_weather"}, {"é", "ü 中 😀"}, {"nested", oj{{"list", {1, 2.5, nullptr, true}}, {"empty", oj::object()}}}, {"arr", oj::array()}}}}});
  add(c, "tojson_error", "{{ missing|tojson }}");
  // ---- tests ----
  add(c, "tests", "{{ 1 is odd }} {{ 2 is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} {{ none is none }} {{ 1 is number }} {{ 1.5 is float }} {{ 1 is integer }} {{ true is integer }} {{ true is boolean }} {{ 'x' is string }} {{ {} is mapping }} {{ [] is iterable }} {{ 'x' is sequence }} {{ 1 is iterable }} {{ range is callable }} {{ 'x' is callable }} {{ x is sameas none }} {{ true is sameas true }} {{ 1 is eq 1 }} {{ 1 is ne 2 }} {{ 2 is gt 1 }} {{ 2 is ge 2 }} {{ 1 is lt 2 }} {{ 1 is le 0 }} {{ 'abc' is lower }} {{ 'ABC' is upper }} {{ '123' is lower }} {{ 2 is in [1, 2] }} {{ 'x' is not none }} {{ 'trim' is filter }} {{ 'odd' is test }} {{ 'nope' is filter }} {{ 1 is true }} {{ true is true }} {{ false is false }} {{ x is undefined }}", {oj{{"x", nullptr}}});
  // ---- methods ----
  add(c, "str_methods", "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ s.strip(' \\n') }}|{{ s.split() }}|{{ s.split(' ') }}|{{ s.split(None, 1) }}|{{ s.rsplit(None, 1) }}|{{ 'a,b,,c'.split(',') }}|{{ 'a,b,c'.rsplit(',', 1) }}|{{ 'a,b,c'.split(',', 1) }}|{{ s.upper() }}|{{ s.lower() }}|{{ 'hello wORLD'.title() }}|{{ 'they\\'re'.title() }}|{{ 'abc'.capitalize() }}|{{ s.startswith('  he') }}|{{ s.endswith(('x', 'ld \\n')) }}|{{ s.replace('l', 'L') }}|{{ s.replace('l', 'L', 1) }}|{{ s.find('o') }}|{{ s.rfind('o') }}|{{ s.find('zz') }}|{{ s.count('l') }}|{{ '-'.join(['a', 'b']) }}|{{ 'x1'.isdigit() }}|{{ '12'.isdigit() }}|{{ 'ab'.isalpha() }}|{{ ' \\t'.isspace() }}|{{ 'ab'.islower() }}|{{ 'AB'.isupper() }}|{{ 'prefix_x'.removeprefix('prefix_') }}|{{ 'x.txt'.removesuffix('.txt') }}|{{ 'l1\\nl2\\r\\nl3'.splitlines() }}|{{ '{} and {}'.format('a', 'b') }}|{{ '{0}{name}'.format('z', name='n') }}|{{ 'héllo'.find('l') }}", {oj{{"s", "  hello world \n"}}});
  add(c, "think_split", "{{ c.split('</think>')[-1].lstrip('\\n') }}|{{ c.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}|{{ '</think>' in c }}", {oj{{"c", "<think>\nreasoning here\n</think>\n\nThe answer."}}, oj{{"c", "no markers"}}});
  add(c, "list_methods", "{{ xs.index(2) }} {{ xs.count(1) }}", {oj{{"xs", {1, 2, 1}}}});
  // ---- globals ----
  add(c, "range", "{{ range(3)|list }} {{ range(1, 4)|list }} {{ range(10, 0, -3)|list }} {{ range(0)|list }} {% for i in range(2, 5) %}{{ i }}{% endfor %}");
  add(c, "dict_global", "{{ dict(a=1, b='x') }} {{ dict(a=1).a }}");
  add(c, "raise_exception", "{% if x > 1 %}{{ raise_exception('x must be at most 1, got ' ~ x) }}{% endif %}ok", {oj{{"x", 1}}, oj{{"x", 5}}});
  add(c, "strftime_now", "{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%d %H:%M:%S') }}|{{ strftime_now('%B %d, %Y') }}|{{ strftime_now('%A %j %%') }}");
  // ---- errors CPython raises ----
  add(c, "type_error_add", "{{ 1 + 'a' }}");
  add(c, "zero_division", "{{ 1 / 0 }}");
  add(c, "not_callable", "{{ 'x'() }}");
  add(c, "unsafe_append", "{% set xs = [1] %}{{ xs.append(2) }}");
  add(c, "unsafe_update", "{% set d = {} %}{{ d.update({'a': 1}) }}");
  add(c, "compare_types", "{{ 1 < 'a' }}");
  add(c, "bad_unpack", "{% for a, b in [1, 2] %}{% endfor %}");
  add(c, "syntax_unclosed", "{% if true %}never closed");
  add(c, "syntax_bad_expr", "{{ 1 + }}");
  add(c, "syntax_unknown_tag", "{% frobnicate %}");
  add(c, "syntax_stray_end", "{% endif %}");
  add(c, "syntax_unterminated_string", "{{ 'abc }}");
  add(c, "set_attr_non_namespace", "{% set d = {} %}{% set d.x = 1 %}");
  return c;
}

// ---- chat-shaped templates (written for these tests) ----

std::vector<std::pair<std::string, std::string>> jinja_chat_templates() {
  std::vector<std::pair<std::string, std::string>> t;
  // ChatML with a default system prompt, tools, tool calls and grouped tool results.
  t.emplace_back("chatml_tools", R"J({%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions.\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nReturn a JSON object per call in <tool_call></tool_call> tags.<|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
)J");
  // A thinking switch: the last user query found by a reverse scan, reasoning kept only after it.
  t.emplace_back("thinking", R"J({%- if messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set content = message.content if message.content is string else '' %}
    {%- if message.role == "user" or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' + content + '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %})J");
  // Llama-3-style headers: BOS, a dated system turn, tools in the first user turn, ipython results.
  t.emplace_back("headers_dated", R"J({{- bos_token }}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- if tools_in_user_message and not tools is none %}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
    {%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, respond with a JSON function call.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}
{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
)J");
  // [INST] turns that must alternate, the system prompt folded into the last user turn.
  t.emplace_back("inst_alternating", R"J({%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}
{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.last and system_message is defined %}
            {{- '[INST] ' + system_message + '\n\n' + message['content'] + '[/INST]' }}
        {%- else %}
            {{- '[INST] ' + message['content'] + '[/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content']|trim + eos_token }}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %}
)J");
  // Gemma-style turns: the system prompt merged into the first user turn, "model" for assistant.
  t.emplace_back("turns_merged_system", R"J({{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
)J");
  // DeepSeek-R1-style: systems collected in a namespace, reasoning cut from earlier answers.
  t.emplace_back("reasoning_split", R"J({% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}{% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='') %}{%- for message in messages %}{%- if message['role'] == 'system' %}{% set ns.system_prompt = ns.system_prompt + message['content'] %}{%- endif %}{%- endfor %}{{ bos_token }}{{ ns.system_prompt }}{%- for message in messages %}{%- if message['role'] == 'user' %}{%- set ns.is_tool = false -%}{{'<｜User｜>' + message['content']}}{%- endif %}{%- if message['role'] == 'assistant' and message['content'] is none %}{%- set ns.is_tool = false -%}{%- for tool in message['tool_calls']%}{%- if not ns.is_first %}{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n' + '```json' + '\n' + tool['function']['arguments']|tojson + '\n' + '```' + '<｜tool▁call▁end｜>'}}{%- set ns.is_first = true -%}{%- else %}{{'\n' + '<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n' + '```json' + '\n' + tool['function']['arguments']|tojson + '\n' + '```' + '<｜tool▁call▁end｜>'}}{%- endif %}{%- endfor %}{{'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}}{%- endif %}{%- if message['role'] == 'assistant' and message['content'] is not none %}{%- if ns.is_tool %}{{'<｜tool▁outputs▁end｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}{%- set ns.is_tool = false -%}{%- else %}{% set content = message['content'] %}{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}{%- endif %}{%- endif %}{%- if message['role'] == 'tool' %}{%- set ns.is_tool = true -%}{%- if ns.is_output_first %}{{'<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}{%- set ns.is_output_first = false %}{%- else %}{{'\n<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}{%- endif %}{%- endif %}{%- endfor -%}{% if ns.is_tool %}{{'<｜tool▁outputs▁end｜>'}}{% endif %}{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜><think>\n'}}{% endif %})J");
  // Granite-style: a dated default system prompt, documents and tools listed, a role per turn.
  t.emplace_back("dated_documents", R"J({%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set system_message = "Knowledge Cutoff Date: April 2024.\nToday's Date: " + strftime_now('%B %d, %Y') + ".\nYou are a helpful assistant." %}
    {%- if tools and documents %}
        {%- set system_message = system_message + " You may call tools and use documents." %}
    {%- elif tools %}
        {%- set system_message = system_message + " You may call tools." %}
    {%- elif documents %}
        {%- set system_message = system_message + " Write your answer from the documents." %}
    {%- endif %}
    {%- set loop_messages = messages %}
{%- endif %}
{{- '<|start_of_role|>system<|end_of_role|>' + system_message + '<|end_of_text|>\n' }}
{%- if tools %}
    {{- '<|start_of_role|>tools<|end_of_role|>' }}
    {{- tools | tojson(indent=4) }}
    {{- '<|end_of_text|>\n' }}
{%- endif %}
{%- if documents %}
    {%- for document in documents %}
        {{- '<|start_of_role|>document {"document_id": "' + document['doc_id'] | string + '"}<|end_of_role|>\n' }}
        {{- document['text'] }}
        {{- '<|end_of_text|>\n' }}
    {%- endfor %}
{%- endif %}
{%- for message in loop_messages %}
    {{- '<|start_of_role|>' + message['role'] + '<|end_of_role|>' + (message['content'] if message['content'] is not none else '') + '<|end_of_text|>\n' }}
    {%- if loop.last and add_generation_prompt %}
        {{- '<|start_of_role|>assistant' }}
        {%- if controls %}
            {{- ' ' + controls | tojson() }}
        {%- endif %}
        {{- '<|end_of_role|>' }}
    {%- endif %}
{%- endfor %})J");
  // Zephyr/Phi style: a tag line per role, EOS after each turn, a macro per turn.
  t.emplace_back("tagged_lines", R"J({% macro turn(role, text) %}<|{{ role }}|>
{{ text }}{{ eos_token }}
{% endmacro %}
{% for message in messages %}
{% if message['role'] in ['user', 'system', 'assistant'] %}
{{ turn(message['role'], message['content'] if message['content'] is not none else '') }}
{%- elif message['role'] == 'tool' %}
{{ turn('tool', message['content'] | default('', true)) }}
{%- endif %}
{% if loop.last and add_generation_prompt %}
<|assistant|>
{% endif %}
{% endfor %})J");
  return t;
}

// ---- random conversations ----

nlohmann::ordered_json random_chat_context(std::mt19937_64& rng) {
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  auto chance = [&](int percent) { return static_cast<int>(rng() % 100) < percent; };
  static const char* kFragments[] = {
      "Hello", "what is 2+2?", "  leading spaces", "trailing spaces  ", "\nnewline first", "last newline\n",
      "multi\nline\ntext", "quotes ' and \"", "tab\tseparated", "café ünïcödé", "中文字符", "emoji 😀🚀",
      "<think>\nsome reasoning\n</think>\n\nanswer", "</think>only the end", "{{ not a template }}", "{% neither %}",
      "back\\slash", "<tool_response>\n{\"ok\": true}\n</tool_response>", "", " ", "a", "The weather is 21°C.",
      "JSON: {\"k\": [1, 2]}", "[INST] fake marker", "<|im_end|> fake end"};
  auto content = [&] {
    std::string s;
    const size_t parts = 1 + pick(3);
    for (size_t i = 0; i < parts; ++i) s += kFragments[pick(std::size(kFragments))];
    return s;
  };
  oj messages = oj::array();
  const size_t n = 1 + pick(7);
  const bool system_first = chance(40);
  for (size_t i = 0; i < n; ++i) {
    oj m = oj::object();
    std::string role;
    if (i == 0 && system_first) {
      role = "system";
    } else if (chance(70)) {  // mostly alternating, sometimes not, to exercise the templates' checks
      role = ((i - (system_first ? 1 : 0)) % 2 == 0) ? "user" : "assistant";
    } else {
      static const char* kRoles[] = {"user", "assistant", "tool", "system"};
      role = kRoles[pick(4)];
    }
    m["role"] = role;
    if (role == "assistant" && chance(25)) {
      m["content"] = chance(50) ? oj(nullptr) : oj(content());
      oj calls = oj::array();
      const size_t k = 1 + pick(2);
      for (size_t j = 0; j < k; ++j) {
        oj args = oj::object();
        args["city"] = chance(50) ? "Paris" : "São Paulo";
        if (chance(50)) args["days"] = static_cast<int>(pick(7));
        if (chance(30)) args["units"] = oj::array({"c", 1.5, true, nullptr});
        calls.push_back(oj{{"id", "call" + std::to_string(pick(100000))}, {"type", "function"},
                           {"function", oj{{"name", chance(50) ? "get_weather" : "search"}, {"arguments", args}}}});
      }
      m["tool_calls"] = calls;
    } else {
      m["content"] = content();
      if (role == "assistant" && chance(20)) m["reasoning_content"] = "\nthought " + content() + "\n";
      if (role == "tool") m["tool_call_id"] = "call" + std::to_string(pick(100000));
    }
    messages.push_back(m);
  }
  oj ctx = oj::object();
  ctx["messages"] = messages;
  if (chance(40)) {
    oj tools = oj::array();
    const size_t k = 1 + pick(2);
    for (size_t j = 0; j < k; ++j) {
      tools.push_back(oj{{"type", "function"},
                         {"function", oj{{"name", j == 0 ? "get_weather" : "search"},
                                         {"description", chance(50) ? "Get the weather — in °C" : "Search the web"},
                                         {"parameters", oj{{"type", "object"},
                                                           {"properties", oj{{"city", oj{{"type", "string"}, {"description", "City name"}}},
                                                                             {"days", oj{{"type", "integer"}, {"minimum", 0}, {"maximum", 7.5}}}}},
                                                           {"required", oj::array({"city"})}}}}}});
    }
    ctx["tools"] = tools;
  } else {
    ctx["tools"] = nullptr;
  }
  ctx["documents"] = chance(20) ? oj::array({oj{{"doc_id", static_cast<int>(pick(9))}, {"text", content()}}}) : oj(nullptr);
  ctx["add_generation_prompt"] = chance(70);
  if (chance(50)) ctx["enable_thinking"] = chance(50);
  if (chance(20)) ctx["controls"] = oj{{"length", "short"}};
  ctx["bos_token"] = chance(80) ? "<s>" : "";
  ctx["eos_token"] = "</s>";
  return ctx;
}

}  // namespace tandem::test
