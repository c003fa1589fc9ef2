"""Drives a shoal gateway with the official `openai` Python client.

Usage: python openai_client.py BASE_URL MODEL [--fake IDLE_MODEL]

The first part is model-agnostic and meant for any node, fake or real (SmolLM2 at integration):
listing, whole and streamed chat agreeing on a greedy answer, stop strings cut at the first
match, max_tokens, seed reproducibility, error statuses. With `--fake`, the exact checks that
need the scripted fake backend (gateway/src/fake.rs: `echo: TEXT`, `params`, `fail after N`)
run too. Exits non-zero on the first failure.
"""

import json
import sys

import openai
from checks import check

base_url, model = sys.argv[1], sys.argv[2]
fake = len(sys.argv) > 3 and sys.argv[3] == "--fake"
idle_model = sys.argv[4] if fake else None
client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)


def chat(content, **kwargs):
    return client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": content}], **kwargs
    )


def stream_text(content, **kwargs):
    chunks = list(chat(content, stream=True, **kwargs))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return chunks, text


# ---- Model-agnostic checks ----
PROMPT = "Tell me a long story about a lighthouse."
ids = [m.id for m in client.models.list()]
check("models.list", model in ids, ids)

greedy = chat(PROMPT, temperature=0, seed=1, max_tokens=24)
answer = greedy.choices[0].message.content
check("greedy answer", isinstance(answer, str) and len(answer) >= 8, greedy)
check("greedy object", greedy.object == "chat.completion" and greedy.id.startswith("chatcmpl-"), greedy)
check("greedy finish", greedy.choices[0].finish_reason in ("stop", "length"), greedy.choices[0])
check(
    "greedy usage",
    0 < greedy.usage.completion_tokens <= 24
    and greedy.usage.prompt_tokens > 0
    and greedy.usage.total_tokens == greedy.usage.prompt_tokens + greedy.usage.completion_tokens,
    greedy.usage,
)

chunks, streamed = stream_text(
    PROMPT, temperature=0, seed=1, max_tokens=24, stream_options={"include_usage": True}
)
check("streamed equals whole", streamed == answer, (streamed, answer))
check("chunk object", all(c.object == "chat.completion.chunk" for c in chunks))
check("role first", chunks[0].choices[0].delta.role == "assistant", chunks[0])
finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
check("one finish", finishes == [greedy.choices[0].finish_reason], finishes)
check(
    "usage chunk",
    chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == greedy.usage.completion_tokens,
    chunks[-1],
)

# A stop string taken from the middle of the greedy answer cuts it right before its first match.
middle = len(answer) // 2
stop = answer[middle : middle + 3]
expected = answer[: answer.find(stop)]
r = chat(PROMPT, temperature=0, seed=1, max_tokens=24, stop=[stop])
check("stop cuts", r.choices[0].message.content == expected, (stop, r.choices[0].message.content, expected))
check("stop finish", r.choices[0].finish_reason == "stop", r.choices[0].finish_reason)
_, text = stream_text(PROMPT, temperature=0, seed=1, max_tokens=24, stop=stop)
check("stop streaming", text == expected, (stop, text, expected))

r = chat(PROMPT, max_tokens=3)
check("max_tokens", r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length", r)
r = chat(PROMPT, max_completion_tokens=2)
check("max_completion_tokens", r.usage.completion_tokens == 2, r.usage)

a = chat(PROMPT, temperature=0.9, seed=1234, max_tokens=16).choices[0].message.content
b = chat(PROMPT, temperature=0.9, seed=1234, max_tokens=16).choices[0].message.content
c = chat(PROMPT, temperature=0.9, seed=4321, max_tokens=16).choices[0].message.content
check("same seed, same answer", a == b, (a, b))
check("other seed, other answer", a != c, (a, c))

try:
    client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    check("unknown model raises", False)
except openai.NotFoundError as e:
    check("unknown model is 404 listing models", model in str(e.message) and e.code == "model_not_found", e)
try:
    client.chat.completions.create(model=model, messages=[])
    check("empty messages raises", False)
except openai.BadRequestError as e:
    check("empty messages is 400", e.status_code == 400 and e.param == "messages", e)
try:
    chat("x", n=2)
    check("n=2 raises", False)
except openai.BadRequestError as e:
    check("n=2 is 400", e.param == "n", e)
try:
    chat("x", temperature=5)
    check("bad temperature raises", False)
except openai.BadRequestError as e:
    check("bad temperature is 400", e.param == "temperature", e)

# Tools: a request with tools gets a valid answer; an assistant's call and the tool's result
# reach the prompt through the model's chat template, so they make it longer.
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
tooled = chat("What is the weather in Paris?", tools=[WEATHER], max_tokens=24, temperature=0)
check("tools: a valid answer", tooled.choices[0].finish_reason in ("stop", "length", "tool_calls")
      and tooled.usage.completion_tokens > 0, tooled)
with_result = client.chat.completions.create(model=model, tools=[WEATHER], max_tokens=24, temperature=0, messages=[
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "a1B2c3D4e", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "a1B2c3D4e", "content": "Sunny and 24 degrees, light wind from the west."},
])
check("tools: a tool result turn gets a valid answer",
      with_result.usage.prompt_tokens > tooled.usage.prompt_tokens, (with_result.usage, tooled.usage))

# A forced call: `tool_choice` names get_weather, so the node opens the answer with the call
# (dialects/src/tools/forced.rs) and the model writes its arguments. A typed call must come
# back, named right, its arguments JSON that fits the schema: whole, streamed (deltas joined)
# and through the client's stream helper. Real models whose template does not render `tools`
# (SmolLM2's) learn of the tool from the system message, as their clients must tell them.
FORCED = dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}})
TOOL_SYSTEM = ('You can call the function get_weather(city: string). To call it, write '
               '<tool_call>{"name": "get_weather", "arguments": {"city": ...}}</tool_call>.')
FORCED_MESSAGES = [{"role": "system", "content": TOOL_SYSTEM},
                   {"role": "user", "content": "What is the weather in Paris?"}]


def fits_weather(arguments):
    try:
        args = json.loads(arguments)
    except (TypeError, ValueError):
        return False
    return isinstance(args, dict) and isinstance(args.get("city"), str) and args["city"] != ""


def joined_calls(chunks):
    """Streamed `tool_calls` deltas put together per index, as clients accumulate them."""
    calls = {}
    for c in chunks:
        for d in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            if d.index not in calls:
                calls[d.index] = {"id": d.id, "type": d.type, "name": d.function.name, "arguments": "",
                                  "deltas": 0}
            calls[d.index]["arguments"] += d.function.arguments or ""
            calls[d.index]["deltas"] += 1
    return [calls[i] for i in sorted(calls)]


if not fake:
    r = client.chat.completions.create(model=model, messages=FORCED_MESSAGES, temperature=0, max_tokens=24,
                                       **FORCED)
    calls = r.choices[0].message.tool_calls or []
    check("forced: a typed call comes back", len(calls) >= 1 and calls[0].type == "function"
          and calls[0].function.name == "get_weather" and fits_weather(calls[0].function.arguments), r)
    whole_args = json.loads(calls[0].function.arguments)
    chunks = list(client.chat.completions.create(model=model, messages=FORCED_MESSAGES, temperature=0,
                                                 max_tokens=24, stream=True, **FORCED))
    streamed = joined_calls(chunks)
    check("forced, streamed: the same typed call", len(streamed) >= 1 and streamed[0]["name"] == "get_weather"
          and streamed[0]["id"] and fits_weather(streamed[0]["arguments"])
          and json.loads(streamed[0]["arguments"]) == whole_args, (streamed, whole_args))
    with client.chat.completions.stream(model=model, messages=FORCED_MESSAGES, temperature=0, max_tokens=24,
                                        **FORCED) as s:
        final = s.get_final_completion()
    helper = final.choices[0].message.tool_calls or []
    check("forced, stream helper: the typed call", len(helper) >= 1 and helper[0].function.name == "get_weather"
          and json.loads(helper[0].function.arguments) == whole_args, final)
    # No system message: SmolLM2's template ignores `tools`, so the node describes them
    # itself (src/chat/tools_prompt.rs); a named choice and `required` both get a typed call.
    bare = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.chat.completions.create(model=model, messages=bare, temperature=0, max_tokens=24, **FORCED)
    calls = r.choices[0].message.tool_calls or []
    check("forced, tools described by the node: a typed call", len(calls) >= 1
          and calls[0].function.name == "get_weather" and fits_weather(calls[0].function.arguments), r)
    r = client.chat.completions.create(model=model, messages=bare, temperature=0, max_tokens=24,
                                       tools=[WEATHER], tool_choice="required")
    calls = r.choices[0].message.tool_calls or []
    check("required: a typed call", len(calls) >= 1 and calls[0].type == "function"
          and calls[0].function.name == "get_weather" and fits_weather(calls[0].function.arguments), r)
    required_args = json.loads(calls[0].function.arguments)
    print(json.dumps({"forced_call": whole_args, "required_call": required_args}), flush=True)
    print("all passed", flush=True)
    sys.exit(0)

# ---- Exact checks against the scripted fake backend ----
check("models.list has the idle model", idle_model in ids, ids)

# Non-streaming.
r = chat("echo: Paris is the capital")
check("non-streaming content", r.choices[0].message.content == "Paris is the capital", r)
check("non-streaming object", r.object == "chat.completion", r.object)
check("non-streaming finish", r.choices[0].finish_reason == "stop", r.choices[0].finish_reason)
check(
    "non-streaming usage",
    r.usage.completion_tokens == 7 and r.usage.total_tokens == r.usage.prompt_tokens + 7,
    r.usage,
)

# Text parts.
r = client.chat.completions.create(
    model=model,
    messages=[
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "echo: "}, {"type": "text", "text": "parts"}]},
    ],
)
check("text parts", r.choices[0].message.content == "parts", r.choices[0].message.content)

# Streaming, with usage.
chunks, text = stream_text("echo: streamed words", stream_options={"include_usage": True})
check("streaming text", text == "streamed words", text)
check("streaming object", all(c.object == "chat.completion.chunk" for c in chunks))
check("streaming role first", chunks[0].choices[0].delta.role == "assistant", chunks[0])
finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
check("streaming finish", finishes == ["stop"], finishes)
check(
    "streaming usage chunk",
    chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5,
    chunks[-1],
)
_, plain = stream_text("echo: no usage")
check("streaming without usage", plain == "no usage", plain)

# Stop strings.
r = chat("echo: one two three four", stop="three")
check("stop string", r.choices[0].message.content == "one two ", repr(r.choices[0].message.content))
check("stop finish", r.choices[0].finish_reason == "stop", r.choices[0].finish_reason)
r = chat("echo: one two three four", stop=["four", "two"])
check("stop list", r.choices[0].message.content == "one ", repr(r.choices[0].message.content))
_, text = stream_text("echo: alpha beta gamma", stop=["ta g"])
check("stop streaming", text == "alpha be", repr(text))

# max_tokens / max_completion_tokens.
r = chat("tell me a story", max_tokens=4, seed=3)
check("max_tokens finish", r.choices[0].finish_reason == "length", r.choices[0].finish_reason)
check("max_tokens usage", r.usage.completion_tokens == 4, r.usage)
r = chat("tell me a story", max_completion_tokens=2, seed=3)
check("max_completion_tokens", r.usage.completion_tokens == 2 and len(r.choices[0].message.content.split()) == 2, r)
chunks, text = stream_text("tell me a story", max_tokens=5, seed=3)
check("max_tokens streaming", len(text.split()) == 5, text)

# Sampling settings reach the backend.
r = chat(
    "params",
    temperature=0.25,
    top_p=0.5,
    seed=77,
    presence_penalty=0.5,
    frequency_penalty=-1.0,
    stop=["\n\n"],
    max_tokens=300,
    user="tester",
    extra_body={"top_k": 12, "min_p": 0.0625, "ignore_eos": True},
)
seen = json.loads(r.choices[0].message.content)
expected = {
    "max_tokens": 300, "temperature": 0.25, "top_p": 0.5, "top_k": 12, "min_p": 0.0625,
    "seed": 77, "stop": [[10, 10]], "presence_penalty": 0.5, "frequency_penalty": -1.0,
    "logprobs": None, "ignore_eos": True,
}
check("sampling passthrough", seen == expected, seen)

# Reasoning goes to reasoning_content, the answer to content.
r = chat("think: two and two | 4")
check("reasoning_content", r.choices[0].message.content == "4"
      and r.choices[0].message.model_extra.get("reasoning_content") == "two and two", r)
chunks = list(chat("think: two and two | 4", stream=True))
thought = "".join(c.choices[0].delta.model_extra.get("reasoning_content") or "" for c in chunks if c.choices)
said = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
check("reasoning_content streamed", (thought, said) == ("two and two", "4"), (thought, said))
# The template opened the thought (DeepSeek-R1 distills): the output starts in reasoning.
r = chat("opened: two and two | 4")
check("reasoning opened by the prompt", r.choices[0].message.content == "4"
      and r.choices[0].message.model_extra.get("reasoning_content") == "two and two", r)
chunks = list(chat("opened: two and two | 4", stream=True))
thought = "".join(c.choices[0].delta.model_extra.get("reasoning_content") or "" for c in chunks if c.choices)
said = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
check("reasoning opened by the prompt, streamed", (thought, said) == ("two and two", "4"), (thought, said))

# Logprobs.
r = chat("echo: abcdef", logprobs=True, top_logprobs=2)
content = r.choices[0].logprobs.content
check("logprobs", len(content) == 2 and len(content[0].top_logprobs) == 2 and content[0].logprob < 0, content)

# Tool calls: the scripted model writes Hermes `<tool_call>`s; the client reads `tool_calls`.
CALLS = 'echo: Let me look. && call: get_weather {"city": "Paris"} && call: get_weather {"city": "Rome"}'
r = chat(CALLS, tools=[WEATHER])
m = r.choices[0].message
check("tool_calls", r.choices[0].finish_reason == "tool_calls" and m.content == "Let me look."
      and [(c.type, c.function.name, json.loads(c.function.arguments)) for c in m.tool_calls]
      == [("function", "get_weather", {"city": "Paris"}), ("function", "get_weather", {"city": "Rome"})], r)
check("tool call ids", len({c.id for c in m.tool_calls}) == 2 and all(len(c.id) == 9 for c in m.tool_calls), m)
r = chat('call: get_weather {"city": "Paris"}', tools=[WEATHER])
check("tool_calls only: content null", r.choices[0].message.content is None
      and r.choices[0].message.tool_calls[0].function.name == "get_weather", r)
chunks = list(chat(CALLS, tools=[WEATHER], stream=True))
deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
streamed = joined_calls(chunks)
check("tool_calls streamed", [(c["name"], json.loads(c["arguments"])) for c in streamed]
      == [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})]
      and all(len(c["id"]) == 9 and c["type"] == "function" for c in streamed), deltas)
# The arguments stream as they are generated: the first delta names the call, later ones
# carry only the index and a piece of the arguments.
check("tool_call arguments streamed in pieces", all(c["deltas"] > 3 for c in streamed)
      and all((d.id is None and d.function.name is None) == (i > 0)
              for i, d in enumerate(d for d in deltas if d.index == 0)), deltas)
with client.chat.completions.stream(model=model, messages=[{"role": "user", "content": CALLS}],
                                    tools=[WEATHER]) as s:
    final = s.get_final_completion()
check("tool_calls through the stream helper", [(c.function.name, json.loads(c.function.arguments))
      for c in final.choices[0].message.tool_calls] == [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})]
      and final.choices[0].finish_reason == "tool_calls", final)
said = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
check("tool_calls streamed: text and finish", said == "Let me look." and finishes == ["tool_calls"], (said, finishes))
r = chat(CALLS, tools=[WEATHER], tool_choice="none")
check("tool_choice none keeps text", r.choices[0].message.tool_calls is None
      and "<tool_call>" in r.choices[0].message.content and r.choices[0].finish_reason == "stop", r)
r = chat('call: get_weather {"city": 5}')
check("no tools: text", r.choices[0].message.tool_calls is None and "<tool_call>" in r.choices[0].message.content, r)
r = chat('call: get_weather {"city": 5}', tools=[WEATHER])
check("a call against the schema is text", r.choices[0].message.tool_calls is None, r)
# Streamed, a call's start has gone out before its arguments end: it stays a call, its
# arguments as the model wrote them (the client validates them, as OpenAI documents).
streamed = joined_calls(list(chat('call: get_weather {"city": 5}', tools=[WEATHER], stream=True)))
check("a streamed call against the schema stays a call", [(c["name"], json.loads(c["arguments"]))
      for c in streamed] == [("get_weather", {"city": 5})], streamed)
# tool_choice naming the function: the node forces the call's opening into the prompt and the
# parser reads it first (the scripted model streams only the rest of its call).
# A named function is called once: the answer ends with that call (the second is not generated).
TWICE = 'call: get_weather {"city": "Paris"} && call: get_weather {"city": "Rome"}'
r = chat(TWICE, **FORCED)
check("forced: the call comes back, and ends the answer", [(c.function.name, json.loads(c.function.arguments))
      for c in r.choices[0].message.tool_calls] == [("get_weather", {"city": "Paris"})]
      and r.choices[0].finish_reason == "tool_calls", r)
chunks = list(chat(TWICE, stream=True, **FORCED))
streamed = joined_calls(chunks)
finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
check("forced, streamed", [(c["name"], json.loads(c["arguments"])) for c in streamed]
      == [("get_weather", {"city": "Paris"})] and finishes == ["tool_calls"], (streamed, finishes))
r = client.chat.completions.create(model=model, max_tokens=2000, tools=[WEATHER],
    tool_choice={"type": "function", "function": {"name": "get_weather"}},
    extra_body={"chat_template_kwargs": {"enable_thinking": False}}, messages=[
    {"role": "user", "content": "weather?"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "a1B2c3D4e", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'}}]},
    {"role": "tool", "tool_call_id": "a1B2c3D4e", "content": "sunny"},
    {"role": "user", "content": "request"},
])
seen = json.loads(r.choices[0].message.content)
check("tools reach the backend", json.loads(seen["tools"][0]["parameters"])["required"] == ["city"]
      and seen["tool_choice"] == {"function": "get_weather"} and seen["enable_thinking"] is False, seen)
check("tool turns reach the backend", seen["messages"][1] == {"role": "assistant", "content": "",
      "tool_calls": [{"id": "a1B2c3D4e", "name": "get_weather", "arguments": '{"city":"Paris","unit":"c"}'}]}
      and seen["messages"][2] == {"role": "tool", "content": "sunny", "tool_call_id": "a1B2c3D4e"}, seen["messages"])
# gpt-oss's reasoning effort reaches the template; anything but the known words is refused.
seen = json.loads(chat("request", max_tokens=2000, reasoning_effort="high").choices[0].message.content)
check("reasoning_effort reaches the backend", seen["reasoning_effort"] == "high", seen)
try:
    chat("request", extra_body={"reasoning_effort": "<|end|>"})
    check("a strange reasoning_effort is refused", False)
except openai.BadRequestError as e:
    check("a strange reasoning_effort is 400", e.status_code == 400 and "reasoning_effort" in e.message, e)

# Errors.
try:
    client.chat.completions.create(model=idle_model, messages=[{"role": "user", "content": "x"}])
    check("no instance raises", False)
except openai.APIStatusError as e:
    check("no instance is 503", e.status_code == 503 and e.code == "no_instance", e)
    check("503 says what to do", "place_instance" in e.message, e.message)
try:
    list(chat("fail after 2", stream=True))
    check("lost instance mid-stream raises", False)
except openai.APIError as e:
    check("lost instance mid-stream", "lost" in str(e), e)
try:
    chat("fail after 2")
    check("lost instance raises", False)
except openai.APIStatusError as e:
    check("lost instance is 503", e.status_code == 503 and e.code == "instance_lost", e)

print("all passed", flush=True)
