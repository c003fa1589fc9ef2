"""Each dialect model's own tool call and thought, read through a real node by every API's
official client (tests/family_dialects.rs starts the node; the models and what each writes
come from xtask/scripts/dialect_fixtures.py).

Args: OPENAI_BASE_URL (…/v1) ROOT (http://host:port) CASES_JSON, a list of
{"dialect", "model", "kind": "auto"|"thinking"|"named", "tool": {openai tool}, "thought",
"call": [name, arguments] or null, "prompt_tokens"}. Every client must get exactly the case's
typed call (none when null), its thought in the reasoning field ("" when none), and as the
prompt's token count the length of the prompt transformers' `apply_chat_template` renders for
the route (recorded by the fixture script): a node that dropped the tools or rendered other
template variables would count another prompt. Where the template renders no tools at all
(DeepSeek V3.1's), the node describes them in the system message itself, as llama.cpp and
Ollama do (prompt/src/tools_prompt.rs): its prompt must then be longer than the template's. A named case forces the call
with each API's tool_choice; Ollama's API has none, so it is left out there. Each dialect model
is also asked with `tool_choice: "required"` and two tools (see `required_of_two`). Every check runs;
the failures are listed at the end and the exit status is 1 if any.
"""

import json
import sys

import anthropic
import jsonschema
import ollama
import openai

base, root, cases = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
failures = []
MAX = 64
# The dialects whose calls carry JSON arguments.
JSON_ARGUMENTS = ("harmony", "deepseek", "kimi")


def check(case, what, ok, seen):
    label = f"{case['dialect']} {case['kind']}: {what}"
    if ok:
        print(f"ok: {label}", flush=True)
    else:
        print(f"FAILED: {label}: {seen}", flush=True)
        failures.append(label)


def prompt_counted(got, case):
    """Whether `got` is the prompt's token count the route's template makes (see above). A
    named call of a JSON dialect is forced up to its arguments' `{`, which the grammar then
    writes (dialects/src/tools/call_grammar.rs): the route's tail holds it, the prompt not."""
    want = case["prompt_tokens"]
    if case["kind"] == "named" and case["dialect"].startswith(JSON_ARGUMENTS):
        want -= 1
    if case["template_renders_tools"]:
        return got == want
    return got > want


def same(calls, case):
    """Whether `calls` are exactly the case's: names and arguments, compared as JSON text so
    that a number must come back a number of the same kind (3, not "3" nor 3.0)."""
    want = [tuple(case["call"])] if case["call"] else []
    return json.dumps(calls, sort_keys=True) == json.dumps(want, sort_keys=True)


def openai_chat(case, client):
    tool, name = case["tool"], case["tool"]["function"]["name"]
    extra = {}
    if case["kind"] == "named":
        extra["tool_choice"] = {"type": "function", "function": {"name": name}}
    body = {"chat_template_kwargs": {"enable_thinking": True}} if case["kind"] == "thinking" else {}
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.chat.completions.create(model=case["model"], messages=messages, tools=[tool],
                                       temperature=0, max_tokens=MAX, extra_body=body, **extra)
    m = r.choices[0].message
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in m.tool_calls or []]
    reasoning = (m.model_extra or {}).get("reasoning_content") or ""
    want_finish = "tool_calls" if case["call"] else "stop"
    check(case, "openai chat: the typed call, finish_reason and the thought",
          same(calls, case) and r.choices[0].finish_reason == want_finish
          and reasoning == case["thought"] and not (m.content or "").strip(), r)
    check(case, "openai chat: prompt_tokens as transformers renders the prompt",
          prompt_counted(r.usage.prompt_tokens, case),
          (r.usage.prompt_tokens, case["prompt_tokens"]))
    chunks = list(client.chat.completions.create(
        model=case["model"], messages=messages, tools=[tool], temperature=0, max_tokens=MAX,
        extra_body=body, stream=True, **extra))
    args, names, pieces = {}, {}, 0
    for c in chunks:
        for d in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            if d.function.name:
                names.setdefault(d.index, d.function.name)
            args[d.index] = args.get(d.index, "") + (d.function.arguments or "")
            pieces += bool(d.function.arguments)
    streamed = [(names.get(i), json.loads(args[i])) for i in sorted(args)]
    said = "".join((c.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
                   for c in chunks if c.choices)
    check(case, "openai chat streamed: the same call and thought",
          same(streamed, case) and said == case["thought"], (streamed, said))
    # JSON arguments stream as the model writes them: several deltas for a call with
    # arguments (the XML dialects' come whole as each parameter closes).
    if case["call"] and case["call"][1] and case["dialect"].startswith(JSON_ARGUMENTS):
        check(case, "openai chat streamed: the arguments in several deltas", pieces >= 3, pieces)


def responses(case, client):
    tool = case["tool"]["function"]
    extra = {}
    if case["kind"] == "named":
        extra["tool_choice"] = {"type": "function", "name": tool["name"]}
    r = client.responses.create(model=case["model"], input="What is the weather in Paris?",
                                temperature=0, max_output_tokens=MAX, tools=[{
                                    "type": "function", "name": tool["name"],
                                    "description": tool["description"],
                                    "parameters": tool["parameters"]}], **extra)
    calls = [(o.name, json.loads(o.arguments)) for o in r.output if o.type == "function_call"]
    reasoning = "".join(c.text for o in r.output if o.type == "reasoning"
                        for c in (o.content or []))
    check(case, "responses: the function_call item and the reasoning item",
          same(calls, case) and reasoning == case["thought"], r.output)
    check(case, "responses: input_tokens as transformers renders the prompt",
          prompt_counted(r.usage.input_tokens, case),
          (r.usage.input_tokens, case["prompt_tokens"]))


def anthropic_messages(case, client):
    tool = case["tool"]["function"]
    extra = {}
    if case["kind"] == "named":
        extra["tool_choice"] = {"type": "tool", "name": tool["name"]}
    if case["kind"] == "thinking":
        extra["thinking"] = {"type": "enabled", "budget_tokens": 1024}
    tools = [{"name": tool["name"], "description": tool["description"],
              "input_schema": tool["parameters"]}]
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    # The pinned client takes no `temperature` argument; the API field is sent as is.
    greedy = {"temperature": 0}
    r = client.messages.create(model=case["model"], max_tokens=2048, messages=messages,
                               tools=tools, extra_body=greedy, **extra)
    uses = [(b.name, b.input) for b in r.content if b.type == "tool_use"]
    thinking = "".join(b.thinking for b in r.content if b.type == "thinking")
    want_stop = "tool_use" if case["call"] else "end_turn"
    check(case, "anthropic: the tool_use block, stop_reason and the thinking block",
          same(uses, case) and thinking == case["thought"] and r.stop_reason == want_stop,
          r)
    check(case, "anthropic: input_tokens as transformers renders the prompt",
          prompt_counted(r.usage.input_tokens, case),
          (r.usage.input_tokens, case["prompt_tokens"]))
    with client.messages.stream(model=case["model"], max_tokens=2048, messages=messages,
                                tools=tools, extra_body=greedy, **extra) as s:
        final = s.get_final_message()
    uses = [(b.name, b.input) for b in final.content if b.type == "tool_use"]
    thinking = "".join(b.thinking for b in final.content if b.type == "thinking")
    check(case, "anthropic streamed: the same tool_use and thinking",
          same(uses, case) and thinking == case["thought"], final.content)


def ollama_chat(case, client):
    think = True if case["kind"] == "thinking" else None
    r = client.chat(model=case["model"], messages=[
        {"role": "user", "content": "What is the weather in Paris?"}], tools=[case["tool"]],
        stream=False, think=think, options={"temperature": 0, "num_predict": MAX})
    calls = [(c.function.name, dict(c.function.arguments)) for c in r.message.tool_calls or []]
    check(case, "ollama: the typed call and the thinking",
          same(calls, case) and (r.message.thinking or "") == case["thought"], r.message)
    check(case, "ollama: prompt_eval_count as transformers renders the prompt",
          prompt_counted(r.prompt_eval_count, case),
          (r.prompt_eval_count, case["prompt_tokens"]))


TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Local time, offset in hours",
    "parameters": {"type": "object", "properties": {"offset": {"type": "number"}},
                   "required": []}}}


def required_of_two(case, client):
    """`tool_choice: "required"` with two tools offered: the answer is a typed call of one of
    them whose arguments validate against its schema (issue 49 item 6). The JSON dialects
    decode the rest of the call under a grammar (dialects/src/tools/call_grammar.rs); the XML
    ones get the opening and the model writes the rest."""
    tools = [case["tool"], TIME]
    r = client.chat.completions.create(
        model=case["model"], messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=tools, tool_choice="required", temperature=0, max_tokens=MAX)
    m = r.choices[0].message
    calls = [(c.function.name, c.function.arguments) for c in m.tool_calls or []]
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    valid = bool(calls) and all(
        name in schemas and not list(jsonschema.Draft202012Validator(schemas[name])
                                     .iter_errors(json.loads(arguments)))
        for name, arguments in calls)
    check(case, "openai chat, required of two tools: a call of one, arguments valid",
          valid and r.choices[0].finish_reason == "tool_calls", (r.choices[0].finish_reason, m))


oa = openai.OpenAI(base_url=base, api_key="none")
an = anthropic.Anthropic(base_url=root, api_key="none")
ol = ollama.Client(host=root)
required_checked = set()
for case in cases:
    if case["dialect"] not in required_checked:
        required_checked.add(case["dialect"])
        try:
            required_of_two(case, oa)
        except Exception as e:  # a client that raises is a failed check, not a crash
            check(case, "required_of_two", False, repr(e))
    for run in (openai_chat, responses, anthropic_messages, ollama_chat):
        if run is ollama_chat and case["kind"] == "named":
            continue  # Ollama's API has no tool_choice
        if run is responses and case["kind"] == "thinking":
            continue  # the Responses API has no thinking switch (only reasoning.effort)
        try:
            run(case, {openai_chat: oa, responses: oa, anthropic_messages: an,
                       ollama_chat: ol}[run])
        except Exception as e:  # a client that raises is a failed check, not a crash
            check(case, run.__name__, False, repr(e))
if failures:
    print(f"{len(failures)} failed: {failures}", flush=True)
    sys.exit(1)
print("all passed", flush=True)
