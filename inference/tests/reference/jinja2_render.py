"""Renders chat templates with Python's jinja2, configured the way Hugging Face `transformers`
configures it for `apply_chat_template`: a sandboxed environment with trim_blocks,
lstrip_blocks, loop controls and a `{% generation %}` block that renders its body (transformers
uses it to mark assistant tokens); `raise_exception`; `tojson` that keeps non-ASCII text;
`strftime_now` pinned to 1 January 2025 (the tests pin shoal's template clock to the same date).

Reads a JSON list of jobs on stdin, each {"template", "messages", "add_generation_prompt",
"bos_token", "eos_token"} or {"template", "variables"} (every variable the template is rendered
with, as shoal's `template_variables` writes them: messages with tool calls and results, `tools`
as `transformers` passes them, switches such as `enable_thinking`), and writes a JSON list of results, each {"ok": text} or
{"error": message}. The chat-template tests compare these with minijinja's renders.
"""

import datetime
import json
import sys

from jinja2.exceptions import TemplateError
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class GenerationBlock(Extension):
    """`{% generation %}...{% endgeneration %}`: the body, rendered as is."""

    tags = {"generation"}

    def parse(self, parser):
        next(parser.stream)
        return parser.parse_statements(["name:endgeneration"], drop_needle=True)


def raise_exception(message):
    raise TemplateError(message)


def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(
        value,
        ensure_ascii=ensure_ascii,
        indent=indent,
        separators=separators,
        sort_keys=sort_keys,
    )


def strftime_now(fmt):
    return datetime.datetime(2025, 1, 1).strftime(fmt)


def render(job):
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, GenerationBlock]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    template = env.from_string(job["template"])
    if "variables" in job:
        return template.render(**job["variables"])
    return template.render(
        messages=job["messages"],
        add_generation_prompt=job["add_generation_prompt"],
        bos_token=job["bos_token"],
        eos_token=job["eos_token"],
    )


def main():
    results = []
    for job in json.load(sys.stdin):
        try:
            results.append({"ok": render(job)})
        except Exception as e:  # every failure is a result, never a crash
            results.append({"error": f"{type(e).__name__}: {e}"})
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
