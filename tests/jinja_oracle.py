#!/usr/bin/python3
"""The reference for tandem's Jinja interpreter: renders test cases with
Debian's python3-jinja2, configured as transformers' apply_chat_template
configures it (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
loopcontrols, a {% generation %} tag, and its tojson / raise_exception /
strftime_now). Test-time only; nothing in tandem runs Python.

stdin: a JSON list of {"template": str, "context": object, "now": [Y, M, D, h, m, s]}
stdout: a JSON list, one per case, of {"ok": true, "text": str} or
        {"ok": false, "kind": "raised" | "error", "message": str}
"""
import datetime
import json
import sys

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class Raised(jinja2.exceptions.TemplateError):
    pass


class Generation(Extension):
    """{% generation %}...{% endgeneration %}: renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def raise_exception(message):
    raise Raised(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


NOW = [datetime.datetime(2024, 7, 26, 9, 30, 0)]


def strftime_now(fmt):
    return NOW[0].strftime(fmt)


def main():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    compiled = {}
    cases = json.load(sys.stdin)
    results = []
    for case in cases:
        NOW[0] = datetime.datetime(*case.get("now", [2024, 7, 26, 9, 30, 0]))
        try:
            source = case["template"]
            if source not in compiled:
                compiled[source] = env.from_string(source)
            text = compiled[source].render(**case["context"])
            results.append({"ok": True, "text": text})
        except Raised as e:
            results.append({"ok": False, "kind": "raised", "message": str(e)})
        except Exception as e:  # every other failure: tandem must fail too
            results.append({"ok": False, "kind": "error", "message": type(e).__name__ + ": " + str(e)})
    json.dump(results, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
