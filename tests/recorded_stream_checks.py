"""A recorded token stream, replayed by the gateway's fake backend (`pieces: ...`), read
through every API with its official client: the pieces are what a real tokenizer's
detokenizer produced for a model's answer (tests/recorded_streams.rs makes them). Each client
must get the thought in its reasoning field and the typed call.

Args: OPENAI_BASE_URL (…/v1) ROOT (http://host:port) CASE_JSON, the case as
{"ask": the user message (the `pieces:` script), "thought": "" for none,
 "tool": {"name", "description", "parameters"}, "call": [NAME, ARGUMENTS]}.
"""

import json
import sys

import anthropic
import ollama
import openai

base, root, case = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
MODEL = "fake/model"
ASK, thought, tool = case["ask"], case["thought"], case["tool"]
TOOL = {"type": "function", "function": tool}
EXPECTED = (case["call"][0], case["call"][1])


def check(what, ok, seen):
    if not ok:
        print(f"FAILED: {what}: {seen}", flush=True)
        sys.exit(1)
    print(f"ok: {what}", flush=True)


client = openai.OpenAI(base_url=base, api_key="none")
messages = [{"role": "user", "content": ASK}]
r = client.chat.completions.create(model=MODEL, messages=messages, tools=[TOOL])
m = r.choices[0].message
calls = [(c.function.name, json.loads(c.function.arguments)) for c in m.tool_calls or []]
check("openai chat: a typed call", calls == [EXPECTED] and r.choices[0].finish_reason == "tool_calls", r)
check("openai chat: the thought in reasoning_content",
      (m.model_extra.get("reasoning_content") or "") == thought, m)
chunks = list(client.chat.completions.create(model=MODEL, messages=messages, tools=[TOOL], stream=True))
args, names, deltas = {}, {}, []
for c in chunks:
    for d in (c.choices[0].delta.tool_calls or []) if c.choices else []:
        names.setdefault(d.index, d.function.name)
        args[d.index] = args.get(d.index, "") + (d.function.arguments or "")
        if d.function.arguments:
            deltas.append(d.function.arguments)
streamed = [(names[i], json.loads(args[i])) for i in sorted(args)]
said = "".join(c.choices[0].delta.model_extra.get("reasoning_content") or "" for c in chunks if c.choices)
check("openai chat streamed: the same call and thought", streamed == [EXPECTED] and said == thought,
      (streamed, said))
# The arguments stream as they are written (an XML dialect's, parameter by parameter).
check("openai chat streamed: the arguments in several deltas", len(deltas) >= 2, deltas)

r = client.responses.create(model=MODEL, input=ASK, tools=[dict(tool, type="function")])
fc = [(o.name, json.loads(o.arguments)) for o in r.output if o.type == "function_call"]
reasoning = "".join(c.text for o in r.output if o.type == "reasoning" for c in (o.content or []))
check("responses: a function_call item and the reasoning item", fc == [EXPECTED] and reasoning == thought,
      r.output)

a = anthropic.Anthropic(base_url=root, api_key="none")
anthropic_tool = {"name": tool["name"], "description": tool["description"],
                  "input_schema": tool["parameters"]}
r = a.messages.create(model=MODEL, max_tokens=256, messages=messages, tools=[anthropic_tool])
uses = [(b.name, b.input) for b in r.content if b.type == "tool_use"]
thinking = "".join(b.thinking for b in r.content if b.type == "thinking")
check("anthropic: a tool_use block and the thinking block", uses == [EXPECTED] and thinking == thought
      and r.stop_reason == "tool_use", r.content)
with a.messages.stream(model=MODEL, max_tokens=256, messages=messages, tools=[anthropic_tool]) as s:
    final = s.get_final_message()
uses = [(b.name, b.input) for b in final.content if b.type == "tool_use"]
thinking = "".join(b.thinking for b in final.content if b.type == "thinking")
check("anthropic streamed: the same tool_use and thinking", uses == [EXPECTED] and thinking == thought,
      final.content)

o = ollama.Client(host=root)
r = o.chat(model=MODEL, messages=messages, tools=[TOOL], stream=False)
calls = [(c.function.name, dict(c.function.arguments)) for c in r.message.tool_calls or []]
check("ollama: a typed call and the thinking", calls == [EXPECTED] and (r.message.thinking or "") == thought,
      r.message)
print("all passed", flush=True)
