"""Drives a shoal gateway's Ollama API with the official `ollama` Python client.

Usage: python ollama_client.py HOST MODEL [--fake]

HOST is the node's root (http://host:port); the checks run at /api and, with a second client,
at exo's /ollama/api. Model-agnostic part, for any node (the fake backend, or SmolLM2 in a
namespace): chat and generate, whole and NDJSON-streamed (the stream's text equal to the whole
greedy answer), options (num_predict, temperature, top_p, top_k, seed, stop), done_reason,
counts and durations, list, show, ps, version, errors. With `--fake`, exact checks against the
scripted fake backend (gateway/src/fake.rs) too. Prints one JSON line {"ollama": ...} with the
greedy answer, and "all passed" at the end; exits non-zero on the first failure.
"""

import json
import sys

import ollama
from checks import check

host, model = sys.argv[1], sys.argv[2]
fake = "--fake" in sys.argv[3:]
client = ollama.Client(host=host, timeout=120)


PROMPT = "Tell me a long story about a lighthouse."
GREEDY = {"temperature": 0, "num_predict": 24, "seed": 1}
messages = [{"role": "user", "content": PROMPT}]

whole = client.chat(model=model, messages=messages, options=GREEDY, stream=False)
answer = whole.message.content
check("chat: answer", whole.message.role == "assistant" and len(answer) >= 8, whole)
check("chat: done", whole.done is True and whole.done_reason in ("stop", "length"), whole)
check("chat: counts", whole.prompt_eval_count > 0 and 0 < whole.eval_count <= 24, whole)
check(
    "chat: durations",
    whole.total_duration > 0
    and whole.eval_duration > 0
    and whole.prompt_eval_duration > 0
    and whole.load_duration > 0
    and whole.total_duration >= whole.load_duration + whole.prompt_eval_duration + whole.eval_duration,
    whole,
)
check("chat: model echoed", whole.model == model, whole.model)

parts = list(client.chat(model=model, messages=messages, options=GREEDY, stream=True))
streamed = "".join(p.message.content or "" for p in parts)
check("chat stream equals whole", streamed == answer, (streamed, answer))
check("chat stream: one done, last", [p.done for p in parts].count(True) == 1 and parts[-1].done, parts[-1])
check("chat stream: closing counts", parts[-1].eval_count == whole.eval_count
      and parts[-1].prompt_eval_count == whole.prompt_eval_count
      and parts[-1].done_reason == whole.done_reason, parts[-1])

gen = client.generate(model=model, prompt=PROMPT, options=GREEDY, stream=False)
check("generate: answer", gen.response == answer and gen.done and gen.eval_count == whole.eval_count, (gen, answer))
streamed = "".join(p.response for p in client.generate(model=model, prompt=PROMPT, options=GREEDY, stream=True))
check("generate stream equals whole", streamed == answer, (streamed, answer))
with_system = client.generate(model=model, prompt=PROMPT, system="Answer in one word.", options=GREEDY, stream=False)
check("generate: system changes the prompt", with_system.prompt_eval_count != gen.prompt_eval_count, with_system)
loaded = client.generate(model=model, prompt="", stream=False)
check("generate: empty prompt loads", loaded.done and loaded.done_reason == "load" and loaded.response == "", loaded)

# Options.
middle = len(answer) // 2
stop = answer[middle : middle + 3]
expected = answer[: answer.find(stop)]
cut = client.chat(model=model, messages=messages, options={**GREEDY, "stop": [stop]}, stream=False)
check("stop cuts", cut.message.content == expected and cut.done_reason == "stop", (stop, cut.message.content, expected))
streamed = "".join(
    p.message.content or "" for p in client.chat(model=model, messages=messages, options={**GREEDY, "stop": [stop]},
                                                     stream=True)
)
check("stop streamed", streamed == expected, (streamed, expected))
short = client.chat(model=model, messages=messages, options={"num_predict": 3}, stream=False)
check("num_predict", short.eval_count == 3 and short.done_reason == "length", short)
sampled = dict(temperature=0.9, top_p=0.9, top_k=40, seed=1234, num_predict=16)
a = client.generate(model=model, prompt=PROMPT, options=sampled, stream=False).response
b = client.generate(model=model, prompt=PROMPT, options=sampled, stream=False).response
c = client.generate(model=model, prompt=PROMPT, options={**sampled, "seed": 4321}, stream=False).response
check("same seed, same answer", a == b, (a, b))
check("other seed, other answer", a != c, (a, c))

# A chat with tools gets a valid answer; an assistant's call and the tool's result reach the
# prompt through the model's chat template, so they make it longer.
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
tooled = client.chat(model=model, messages=messages, options=GREEDY, stream=False, tools=[WEATHER])
check("tools: a valid answer", tooled.done and tooled.eval_count > 0, tooled)
with_result = client.chat(model=model, options=GREEDY, stream=False, tools=[WEATHER], messages=messages + [
    {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "content": "Sunny and 24 degrees, light wind from the west.", "tool_name": "get_weather"},
])
check("tools: a tool result turn gets a valid answer", with_result.done
      and with_result.prompt_eval_count > tooled.prompt_eval_count, (with_result, tooled))

# Models.
names = [m.model for m in client.list().models]
check("list", model in names, names)
shown = client.show(model)
check("show", shown.capabilities == ["completion"] and shown.details is not None, shown)
running = [m.model for m in client.ps().models]
check("ps", model in running, running)
version = client._request_raw("GET", "/api/version").json()
check("version", isinstance(version.get("version"), str) and version["version"].count(".") == 2, version)
check("model:latest", client.chat(model=f"{model}:latest", messages=messages, options=GREEDY,
                                  stream=False).message.content == answer)

# exo's prefix serves the same.
exo = ollama.Client(host=host.rstrip("/") + "/ollama", timeout=120)
check("/ollama/api/chat", exo.chat(model=model, messages=messages, options=GREEDY, stream=False).message.content == answer)
check("/ollama/api/tags", model in [m.model for m in exo.list().models])

# Errors, in Ollama's shape.
for call in (
    lambda: client.chat(model="no-such-model", messages=messages, stream=False),
    lambda: client.show("no-such-model"),
):
    try:
        call()
        check("unknown model raises", False)
    except ollama.ResponseError as e:
        check("unknown model is 404", e.status_code == 404 and "no-such-model" in e.error, e)
try:
    client.chat(model=model, messages=messages, options={"temperature": "hot"}, stream=False)
    check("bad option raises", False)
except ollama.ResponseError as e:
    check("bad option is 400 naming it", e.status_code == 400 and "temperature" in e.error, e)
try:
    client.chat(model=model, messages=[{"role": "user", "content": "x", "images": [b"\x89PNG"]}], stream=False)
    check("image raises", False)
except ollama.ResponseError as e:
    # Half a PNG signature: not an image.
    check("a broken image is refused clearly",
          e.status_code == 400 and "not a PNG, JPEG, WebP or GIF image" in e.error, e)
try:
    client.pull(model)
    check("pull raises", False)
except ollama.ResponseError as e:
    check("pull is refused clearly", e.status_code == 404, e)

print(json.dumps({"ollama": answer}), flush=True)
if not fake:
    print("all passed", flush=True)
    sys.exit(0)

# ---- Exact checks against the scripted fake backend ----
r = client.chat(model=model, messages=[{"role": "user", "content": "echo: Paris is the capital"}], stream=False)
check("fake: text", r.message.content == "Paris is the capital" and r.eval_count == 7, r)
r = client.generate(model=model, prompt="params", options={"temperature": 0.25, "top_p": 0.5, "top_k": 7,
                                                          "seed": 9, "num_predict": 300}, stream=False)
seen = json.loads(r.response)
check("fake: options passthrough", (seen["temperature"], seen["top_p"], seen["top_k"], seen["seed"],
                                   seen["max_tokens"]) == (0.25, 0.5, 7, 9, 300), seen)
think = [{"role": "user", "content": "think: two and two | 4"}]
r = client.chat(model=model, messages=think, stream=False)
check("fake: thinking", r.message.thinking == "two and two" and r.message.content == "4", r.message)
parts = list(client.chat(model=model, messages=think, stream=True))
check("fake: thinking streamed", "".join(p.message.thinking or "" for p in parts) == "two and two"
      and "".join(p.message.content or "" for p in parts) == "4", parts)
opened = [{"role": "user", "content": "opened: two and two | 4"}]
r = client.chat(model=model, messages=opened, stream=False)
check("fake: thinking opened by the prompt", r.message.thinking == "two and two" and r.message.content == "4", r.message)
parts = list(client.chat(model=model, messages=opened, stream=True))
check("fake: thinking opened by the prompt, streamed", "".join(p.message.thinking or "" for p in parts) == "two and two"
      and "".join(p.message.content or "" for p in parts) == "4", parts)
r = client.generate(model=model, prompt="think: two and two | 4", stream=False)
check("fake: generate thinking", r.thinking == "two and two" and r.response == "4", r)
# Tool calls: the scripted model writes Hermes `<tool_call>`s; the client reads message.tool_calls.
CALL = [{"role": "user", "content": 'echo: Let me look. && call: get_weather {"city": "Paris"}'}]
r = client.chat(model=model, messages=CALL, tools=[WEATHER], stream=False)
check("fake: tool_calls", r.message.content == "Let me look." and len(r.message.tool_calls) == 1
      and r.message.tool_calls[0].function.name == "get_weather"
      and dict(r.message.tool_calls[0].function.arguments) == {"city": "Paris"}, r.message)
parts = list(client.chat(model=model, messages=CALL, tools=[WEATHER], stream=True))
calls = [c for p in parts for c in (p.message.tool_calls or [])]
check("fake: tool_calls streamed", "".join(p.message.content or "" for p in parts) == "Let me look."
      and [(c.function.name, dict(c.function.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
      and parts[-1].done, parts)
# Ollama's API has no argument deltas: a call comes in one chunk, whole.
check("fake: a streamed call comes whole", sum(1 for p in parts if p.message.tool_calls) == 1, parts)
r = client.chat(model=model, messages=CALL, stream=False)
check("fake: without tools, text", not r.message.tool_calls and "<tool_call>" in r.message.content, r.message)
r = client.chat(model=model, stream=False, tools=[WEATHER], think=False, messages=[
    {"role": "user", "content": "weather?"},
    {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
    {"role": "user", "content": "request"},
])
seen = json.loads(r.message.content)
call = seen["messages"][1]["tool_calls"][0]
check("fake: tool turns reach the backend", seen["enable_thinking"] is False and call["name"] == "get_weather"
      and call["arguments"] == '{"city":"Paris"}'
      and seen["messages"][2] == {"role": "tool", "content": "sunny", "tool_call_id": call["id"], "name": "get_weather"},
      seen)
try:
    list(client.chat(model=model, messages=[{"role": "user", "content": "fail after 2"}], stream=True))
    check("fake: lost instance raises", False)
except ollama.ResponseError as e:
    check("fake: lost instance mid-stream", "lost" in e.error, e)
try:
    client.chat(model="fake/idle-model", messages=messages, stream=False)
    check("fake: no instance raises", False)
except ollama.ResponseError as e:
    check("fake: no instance is 503", e.status_code == 503 and "place_instance" in e.error, e)
check("fake: ps lists only ready models", [m.model for m in client.ps().models] == [model])

print("all passed", flush=True)
