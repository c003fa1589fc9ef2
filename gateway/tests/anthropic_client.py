"""Drives a shoal gateway's Messages API with the official `anthropic` Python client.

Usage: python anthropic_client.py BASE_URL MODEL [--fake]

BASE_URL is the node's root (http://host:port). The first part is model-agnostic, for any node
(the fake backend, or SmolLM2 in a namespace): create, a stream whose text equals the whole
greedy answer with the full event sequence, system prompts, stop sequences, max_tokens,
count_tokens equal to usage.input_tokens, errors in Anthropic's shape. With `--fake`, exact
checks against the scripted fake backend (gateway/src/fake.rs) run too. Prints one JSON line
{"anthropic": ...} with the greedy answer, and "all passed" at the end; exits non-zero on the
first failure.
"""

import json
import sys

import anthropic
from checks import check

base_url, model = sys.argv[1], sys.argv[2]
fake = "--fake" in sys.argv[3:]
client = anthropic.Anthropic(base_url=base_url, api_key="unused", max_retries=0, timeout=120)


def user(content):
    return [{"role": "user", "content": content}]


PROMPT = "Tell me a long story about a lighthouse."
# This client version has no sampling arguments; they go in the body as older clients sent them.
GREEDY = dict(model=model, max_tokens=24, extra_body={"temperature": 0})

whole = client.messages.create(messages=user(PROMPT), **GREEDY)
answer = whole.content[0].text
check("create: a text block", whole.type == "message" and whole.role == "assistant" and len(answer) >= 8, whole)
check("create: id", whole.id.startswith("msg_"), whole.id)
check("create: stop_reason", whole.stop_reason in ("end_turn", "max_tokens"), whole.stop_reason)
check(
    "create: usage",
    whole.usage.input_tokens > 0 and 0 < whole.usage.output_tokens <= 24,
    whole.usage,
)

# The stream helper accumulates the same message.
with client.messages.stream(messages=user(PROMPT), **GREEDY) as s:
    streamed = "".join(s.text_stream)
    final = s.get_final_message()
check("stream text equals whole", streamed == answer, (streamed, answer))
check("stream final message", final.content[0].text == answer and final.stop_reason == whole.stop_reason, final)
check("stream usage", final.usage.output_tokens == whole.usage.output_tokens
      and final.usage.input_tokens == whole.usage.input_tokens, final.usage)

# The raw event sequence.
events = list(client.messages.create(messages=user(PROMPT), stream=True, **GREEDY))
kinds = [e.type for e in events]
check("stream starts", kinds[:2] == ["message_start", "content_block_start"], kinds)
check("stream ends", kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"], kinds)
check("stream deltas", all(k == "content_block_delta" for k in kinds[2:-3]) and len(kinds) > 5, kinds)
check("stream delta type", all(e.delta.type == "text_delta" for e in events if e.type == "content_block_delta"))
delta = [e for e in events if e.type == "message_delta"][0]
check("message_delta stop reason", delta.delta.stop_reason == whole.stop_reason, delta)
check("message_delta usage", delta.usage.output_tokens == whole.usage.output_tokens, delta)
check("message_start usage", events[0].message.usage.input_tokens == whole.usage.input_tokens, events[0])

# System prompts, as a string and as blocks, are part of the prompt.
with_system = client.messages.create(messages=user(PROMPT), system="You answer in one word.", **GREEDY)
# (SmolLM2's template puts in a default system prompt of its own when none is given.)
check("system changes the prompt", with_system.usage.input_tokens != whole.usage.input_tokens, with_system.usage)
blocks = client.messages.create(
    messages=user(PROMPT), system=[{"type": "text", "text": "You answer in one word."}], **GREEDY
)
check("system blocks = system string", blocks.usage.input_tokens == with_system.usage.input_tokens
      and blocks.content[0].text == with_system.content[0].text, blocks)

# count_tokens is usage.input_tokens.
counted = client.messages.count_tokens(model=model, messages=user(PROMPT))
check("count_tokens", counted.input_tokens == whole.usage.input_tokens, (counted, whole.usage))
counted = client.messages.count_tokens(model=model, messages=user(PROMPT), system="You answer in one word.")
check("count_tokens with system", counted.input_tokens == with_system.usage.input_tokens, counted)

# A stop sequence from the middle of the greedy answer cuts it before its first match.
middle = len(answer) // 2
stop = answer[middle : middle + 3]
expected = answer[: answer.find(stop)]
cut = client.messages.create(messages=user(PROMPT), stop_sequences=[stop], **GREEDY)
check("stop sequence cuts", cut.content[0].text == expected, (stop, cut.content[0].text, expected))
check("stop_reason stop_sequence", cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop, cut)
with client.messages.stream(messages=user(PROMPT), stop_sequences=[stop], **GREEDY) as s:
    text = "".join(s.text_stream)
    final = s.get_final_message()
check("stop sequence streamed", text == expected and final.stop_sequence == stop, (text, final))

short = client.messages.create(model=model, max_tokens=3, messages=user(PROMPT))
check("max_tokens", short.stop_reason == "max_tokens" and short.usage.output_tokens == 3, short)

# A request with tools gets a valid message; a tool_use turn and its tool_result reach the
# prompt (through the model's chat template), so they make it longer.
WEATHER = {"name": "get_weather", "description": "Weather of a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
tooled = client.messages.create(
    messages=user("What is the weather in Paris?"), tools=[WEATHER], tool_choice={"type": "auto"}, **GREEDY)
check("tools: a valid message", tooled.type == "message" and len(tooled.content) >= 1
      and tooled.usage.output_tokens > 0 and tooled.stop_reason in ("end_turn", "max_tokens", "tool_use"), tooled)
with_result = client.messages.create(tools=[WEATHER], **GREEDY, messages=[
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "a1B2c3D4e", "name": "get_weather",
                                       "input": {"city": "Paris"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a1B2c3D4e",
                                  "content": "Sunny and 24 degrees, light wind from the west."}]},
])
check("tools: a tool result turn gets a valid message", with_result.type == "message"
      and with_result.usage.input_tokens > tooled.usage.input_tokens, (with_result.usage, tooled.usage))

# Errors, in Anthropic's shape.
try:
    client.post("/v1/messages", cast_to=anthropic.types.Message, body={"model": model, "messages": user("x")})
    check("missing max_tokens raises", False)
except anthropic.BadRequestError as e:
    check("missing max_tokens is 400 naming it", e.status_code == 400 and "max_tokens" in e.message, e)
    check("error shape", e.body["type"] == "error" and e.body["error"]["type"] == "invalid_request_error", e.body)
try:
    client.messages.create(model="no-such-model", max_tokens=4, messages=user("x"))
    check("unknown model raises", False)
except anthropic.NotFoundError as e:
    check("unknown model is 404 not_found_error", e.body["error"]["type"] == "not_found_error", e.body)
try:
    client.messages.create(model=model, max_tokens=4, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}])
    check("image raises", False)
except anthropic.BadRequestError as e:
    # "AAAA" is three zero bytes: not an image at all.
    check("a broken image is refused clearly",
          "not a PNG, JPEG, WebP or GIF image" in e.message
          and e.body["error"]["type"] == "invalid_request_error", e.message)
try:
    client.messages.create(model=model, max_tokens=4, messages=user("x"), extra_body={"temperature": 3})
    check("bad temperature raises", False)
except anthropic.BadRequestError as e:
    check("bad temperature is 400", "temperature" in e.message, e.message)

print(json.dumps({"anthropic": answer}), flush=True)
# A forced call (`tool_choice` names the tool): a typed `tool_use` block must come back, its
# input fitting the schema, whole and through the stream helper (input_json_delta joined).
# SmolLM2's template does not render `tools`: the system prompt describes the tool.
TOOL_SYSTEM = ('You can call the function get_weather(city: string). To call it, write '
               '<tool_call>{"name": "get_weather", "arguments": {"city": ...}}</tool_call>.')
FORCED = dict(tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"}, system=TOOL_SYSTEM,
              messages=user("What is the weather in Paris?"))
if not fake:
    r = client.messages.create(**GREEDY, **FORCED)
    uses = [b for b in r.content if b.type == "tool_use"]
    check("forced: a typed tool_use comes back", len(uses) >= 1 and uses[0].name == "get_weather"
          and isinstance(uses[0].input.get("city"), str) and uses[0].input["city"] != "", r)
    with client.messages.stream(**GREEDY, **FORCED) as s:
        events = list(s)
        final = s.get_final_message()
    streamed = [b for b in final.content if b.type == "tool_use"]
    check("forced, streamed: the same tool_use", len(streamed) >= 1 and streamed[0].name == "get_weather"
          and streamed[0].input == uses[0].input, (final, uses))
    check("forced, streamed: input_json_delta", any(
        e.type == "content_block_delta" and e.delta.type == "input_json_delta" for e in events),
        [e.type for e in events])
    print(json.dumps({"forced_tool_use": uses[0].input}), flush=True)
    print("all passed", flush=True)
    sys.exit(0)

# ---- Exact checks against the scripted fake backend ----
r = client.messages.create(model=model, max_tokens=100, messages=user("echo: Paris is the capital"))
check("fake: text", r.content[0].text == "Paris is the capital" and r.stop_reason == "end_turn", r)
check("fake: output tokens", r.usage.output_tokens == 7, r.usage)
r = client.messages.create(
    model=model, max_tokens=100, messages=user("echo: one two three four"), stop_sequences=["three"]
)
check("fake: stop", r.content[0].text == "one two " and r.stop_sequence == "three", r)
r = client.messages.create(
    model=model, max_tokens=300, messages=user("params"), extra_body={"temperature": 0.25, "top_p": 0.5, "top_k": 7}
)
seen = json.loads(r.content[0].text)
check("fake: sampling passthrough", seen["temperature"] == 0.25 and seen["top_p"] == 0.5
      and seen["top_k"] == 7 and seen["max_tokens"] == 300, seen)
r = client.messages.create(model=model, max_tokens=100, messages=user("think: two and two | 4"))
check("fake: thinking block", [b.type for b in r.content] == ["thinking", "text"]
      and r.content[0].thinking == "two and two" and r.content[1].text == "4", r.content)
with client.messages.stream(model=model, max_tokens=100, messages=user("think: two and two | 4")) as s:
    said = "".join(s.text_stream)
    final = s.get_final_message()
check("fake: thinking streamed", said == "4" and final.content[0].thinking == "two and two"
      and [b.type for b in final.content] == ["thinking", "text"], final.content)
# The template opened the thought (DeepSeek-R1 distills): the output starts in reasoning.
with client.messages.stream(model=model, max_tokens=100, messages=user("opened: two and two | 4")) as s:
    said = "".join(s.text_stream)
    final = s.get_final_message()
check("fake: thinking opened by the prompt", said == "4" and final.content[0].thinking == "two and two"
      and [b.type for b in final.content] == ["thinking", "text"], final.content)
try:
    with client.messages.stream(model=model, max_tokens=100, messages=user("fail after 2")) as s:
        "".join(s.text_stream)
    check("fake: lost instance raises", False)
except anthropic.APIError as e:
    check("fake: lost instance mid-stream", "lost" in str(e), e)
# Tool calls: the scripted model writes a Hermes `<tool_call>`; the client reads `tool_use` blocks.
CALL = 'echo: Let me look. && call: get_weather {"city": "Paris"}'
r = client.messages.create(model=model, max_tokens=200, tools=[WEATHER], messages=user(CALL))
check("fake: tool_use blocks", [b.type for b in r.content] == ["text", "tool_use"]
      and r.content[0].text == "Let me look." and r.content[1].name == "get_weather"
      and r.content[1].input == {"city": "Paris"} and r.stop_reason == "tool_use", r)
call_id = r.content[1].id
check("fake: tool_use id", len(call_id) == 9 and call_id.isalnum(), call_id)
with client.messages.stream(model=model, max_tokens=200, tools=[WEATHER], messages=user(CALL)) as s:
    events = list(s)
    final = s.get_final_message()
check("fake: tool_use streamed", [b.type for b in final.content] == ["text", "tool_use"]
      and final.content[1].input == {"city": "Paris"} and final.stop_reason == "tool_use", final)
pieces = [e.delta.partial_json for e in events
          if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
check("fake: input_json_delta streams the input in pieces", len(pieces) > 3
      and json.loads("".join(pieces)) == {"city": "Paris"}, pieces)
# tool_choice naming the tool: the node forces the call's opening, the parser reads it first.
r = client.messages.create(model=model, max_tokens=200, tools=[WEATHER], messages=user('call: get_weather {"city": "Paris"}'),
                           tool_choice={"type": "tool", "name": "get_weather"})
check("fake: forced tool_use", [(b.type, b.name, b.input) for b in r.content] == [("tool_use", "get_weather", {"city": "Paris"})], r)
# Without tools, or with tool_choice none, the same text stays text.
r = client.messages.create(model=model, max_tokens=200, tools=[WEATHER], tool_choice={"type": "none"},
                           messages=user(CALL))
check("fake: tool_choice none keeps text", [b.type for b in r.content] == ["text"]
      and "<tool_call>" in r.content[0].text and r.stop_reason == "end_turn", r)
# A call that does not fit the schema stays text.
r = client.messages.create(model=model, max_tokens=200, tools=[WEATHER],
                           messages=user('call: get_weather {"town": "Paris"}'))
check("fake: a call against the schema is text", [b.type for b in r.content] == ["text"], r)
# The call and its result, sent back, reach the backend as the template's tool turns.
r = client.messages.create(model=model, max_tokens=2000, tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"},
                           thinking={"type": "disabled"}, messages=[
    {"role": "user", "content": "weather?"},
    {"role": "assistant", "content": [{"type": "text", "text": "Let me look."},
                                      {"type": "tool_use", "id": call_id, "name": "get_weather", "input": {"city": "Paris"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id, "content": "sunny"},
                                 {"type": "text", "text": "request"}]},
])
seen = json.loads(r.content[0].text)
check("fake: tools reach the backend", seen["tools"][0]["name"] == "get_weather"
      and json.loads(seen["tools"][0]["parameters"])["required"] == ["city"]
      and seen["tool_choice"] == {"function": "get_weather"} and seen["enable_thinking"] is False, seen)
check("fake: tool turns reach the backend", [m["role"] for m in seen["messages"]] == ["user", "assistant", "tool", "user"]
      and seen["messages"][1]["content"] == "Let me look."
      and seen["messages"][1]["tool_calls"] == [{"id": call_id, "name": "get_weather", "arguments": '{"city":"Paris"}'}]
      and seen["messages"][2] == {"role": "tool", "content": "sunny", "tool_call_id": call_id, "name": "get_weather"},
      seen["messages"])
try:
    client.messages.create(model="fake/idle-model", max_tokens=4, messages=user("x"))
    check("fake: no instance raises", False)
except anthropic.APIStatusError as e:
    check("fake: no instance is 503", e.status_code == 503 and "place_instance" in e.message, e)

print("all passed", flush=True)
