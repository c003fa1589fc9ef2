"""Drives a shoal gateway's Responses API with the official `openai` Python client.

Usage: python responses_client.py BASE_URL MODEL [--fake]

BASE_URL ends in /v1. Model-agnostic part, for any node (the fake backend, or SmolLM2 in a
namespace): create, a stream whose text equals the whole greedy answer with its events in
order, instructions, input items, max_output_tokens giving status "incomplete", usage, and
errors (previous_response_id refused). With `--fake`, exact checks against the scripted fake
backend too. Prints one JSON line {"responses": ...} with the greedy answer, and "all passed"
at the end; exits non-zero on the first failure.
"""

import json
import sys

import openai
from checks import check

base_url, model = sys.argv[1], sys.argv[2]
fake = "--fake" in sys.argv[3:]
client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)


PROMPT = "Tell me a long story about a lighthouse."
GREEDY = dict(model=model, temperature=0, max_output_tokens=24)

whole = client.responses.create(input=PROMPT, **GREEDY)
answer = whole.output_text
check("create: output_text", whole.object == "response" and len(answer) >= 8, whole)
check("create: id", whole.id.startswith("resp_"), whole.id)
check("create: status", whole.status in ("completed", "incomplete"), whole.status)
check("create: usage", whole.usage.input_tokens > 0 and 0 < whole.usage.output_tokens <= 24
      and whole.usage.total_tokens == whole.usage.input_tokens + whole.usage.output_tokens, whole.usage)
check("create: one message item", len(whole.output) == 1 and whole.output[0].type == "message"
      and whole.output[0].role == "assistant", whole.output)

# The stream helper accumulates the same response.
# (A response cut by max_output_tokens ends with response.incomplete, which the helper's
# get_final_response refuses; the last event carries the response either way.)
with client.responses.stream(input=PROMPT, **GREEDY) as s:
    streamed_events = list(s)
deltas = [e.delta for e in streamed_events if e.type == "response.output_text.delta"]
final = streamed_events[-1].response
check("stream text equals whole", "".join(deltas) == answer, ("".join(deltas), answer))
check("stream final response", final.output_text == answer and final.status == whole.status
      and final.usage.output_tokens == whole.usage.output_tokens, final)

events = list(client.responses.create(input=PROMPT, stream=True, **GREEDY))
kinds = [e.type for e in events]
last = "response.incomplete" if whole.status == "incomplete" else "response.completed"
check("stream starts", kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                                     "response.content_part.added"], kinds)
check("stream ends", kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                                    "response.output_item.done", last], kinds)
check("stream deltas", all(k == "response.output_text.delta" for k in kinds[4:-4]) and len(kinds) > 8, kinds)
check("sequence numbers", [e.sequence_number for e in events] == list(range(len(events))))
check("text.done has the text", events[-4].text == answer, events[-4])

# max_output_tokens cuts: status incomplete, with the reason.
short = client.responses.create(model=model, input=PROMPT, max_output_tokens=3)
check("incomplete", short.status == "incomplete" and short.incomplete_details.reason == "max_output_tokens"
      and short.usage.output_tokens == 3, short)

# Instructions are the system prompt.
instructed = client.responses.create(input=PROMPT, instructions="Answer in one word.", **GREEDY)
check("instructions change the prompt", instructed.usage.input_tokens != whole.usage.input_tokens, instructed.usage)
check("instructions echoed", instructed.instructions == "Answer in one word.", instructed.instructions)
as_items = client.responses.create(
    input=[{"role": "system", "content": "Answer in one word."},
           {"role": "user", "content": [{"type": "input_text", "text": PROMPT}]}], **GREEDY)
check("items = instructions", as_items.output_text == instructed.output_text
      and as_items.usage.input_tokens == instructed.usage.input_tokens, as_items)

# A request with function tools gets a valid response; a function_call and its output reach
# the prompt through the model's chat template, so they make it longer.
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather of a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
tooled = client.responses.create(input="What is the weather in Paris?", tools=[WEATHER], **GREEDY)
check("tools: a valid response", tooled.output[-1].type in ("message", "function_call")
      and tooled.usage.output_tokens > 0, tooled)
with_result = client.responses.create(tools=[WEATHER], **GREEDY, input=[
    {"role": "user", "content": "What is the weather in Paris?"},
    {"type": "function_call", "call_id": "a1B2c3D4e", "name": "get_weather", "arguments": '{"city": "Paris"}'},
    {"type": "function_call_output", "call_id": "a1B2c3D4e", "output": "Sunny and 24 degrees, light wind from the west."},
])
check("tools: a function_call_output gets a valid response", with_result.status in ("completed", "incomplete")
      and with_result.usage.input_tokens > tooled.usage.input_tokens, (with_result.usage, tooled.usage))

# Errors.
try:
    client.responses.create(model=model, input="x", previous_response_id="resp_123")
    check("previous_response_id raises", False)
except openai.BadRequestError as e:
    check("previous_response_id refused clearly", e.param == "previous_response_id" and "input" in e.message, e)
try:
    client.responses.create(model="no-such-model", input="x")
    check("unknown model raises", False)
except openai.NotFoundError as e:
    check("unknown model is 404", e.code == "model_not_found", e)
try:
    client.responses.create(model=model, input="x", temperature=7)
    check("bad temperature raises", False)
except openai.BadRequestError as e:
    check("bad temperature is 400 naming it", e.param == "temperature", e)

print(json.dumps({"responses": answer}), flush=True)
# A forced call (`tool_choice` names the function): a typed function_call item must come back,
# its arguments JSON that fits the schema. SmolLM2's template does not render `tools`: the
# system message describes the tool.
TOOL_SYSTEM = ('You can call the function get_weather(city: string). To call it, write '
               '<tool_call>{"name": "get_weather", "arguments": {"city": ...}}</tool_call>.')
if not fake:
    r = client.responses.create(tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"}, **GREEDY,
                                input=[{"role": "system", "content": TOOL_SYSTEM},
                                       {"role": "user", "content": "What is the weather in Paris?"}])
    calls = [o for o in r.output if o.type == "function_call"]
    args = json.loads(calls[0].arguments) if calls else None
    check("forced: a typed function_call comes back", len(calls) >= 1 and calls[0].name == "get_weather"
          and isinstance(args, dict) and isinstance(args.get("city"), str) and args["city"] != "", r.output)
    print("all passed", flush=True)
    sys.exit(0)

# ---- Exact checks against the scripted fake backend ----
r = client.responses.create(model=model, input="echo: Paris is the capital")
check("fake: text", r.output_text == "Paris is the capital" and r.status == "completed", r)
r = client.responses.create(model=model, input="params", temperature=0.25, top_p=0.5, max_output_tokens=300)
seen = json.loads(r.output_text)
check("fake: sampling passthrough", (seen["temperature"], seen["top_p"], seen["max_tokens"]) == (0.25, 0.5, 300), seen)
r = client.responses.create(model=model, input="think: two and two | 4")
check("fake: reasoning item", [o.type for o in r.output] == ["reasoning", "message"]
      and r.output[0].content[0].text == "two and two" and r.output_text == "4", r.output)
with client.responses.stream(model=model, input="think: two and two | 4") as s:
    streamed = list(s)
    final = s.get_final_response()
check("fake: reasoning streamed", final.output_text == "4" and final.output[0].type == "reasoning"
      and "".join(e.delta for e in streamed if e.type == "response.reasoning_text.delta") == "two and two",
      [e.type for e in streamed])
with client.responses.stream(model=model, input="opened: two and two | 4") as s:
    streamed = list(s)
    final = s.get_final_response()
check("fake: reasoning opened by the prompt", final.output_text == "4" and final.output[0].type == "reasoning"
      and final.output[0].content[0].text == "two and two"
      and "".join(e.delta for e in streamed if e.type == "response.reasoning_text.delta") == "two and two",
      [e.type for e in streamed])
# Function calls: the scripted model writes Hermes `<tool_call>`s; the client reads items.
CALL = 'echo: Let me look. && call: get_weather {"city": "Paris"}'
r = client.responses.create(model=model, input=CALL, tools=[WEATHER])
check("fake: function_call item", [o.type for o in r.output] == ["message", "function_call"]
      and r.output_text == "Let me look." and r.output[1].name == "get_weather"
      and json.loads(r.output[1].arguments) == {"city": "Paris"} and r.status == "completed", r.output)
call_id = r.output[1].call_id
with client.responses.stream(model=model, input=CALL, tools=[WEATHER]) as s:
    streamed = list(s)
    final = s.get_final_response()
kinds = [e.type for e in streamed]
check("fake: function_call streamed", [o.type for o in final.output] == ["message", "function_call"]
      and json.loads(final.output[1].arguments) == {"city": "Paris"}
      and "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds, kinds)
pieces = [e.delta for e in streamed if e.type == "response.function_call_arguments.delta"]
done = [e for e in streamed if e.type == "response.function_call_arguments.done"]
check("fake: argument deltas, in pieces, joined as .done says", len(pieces) > 3
      and json.loads("".join(pieces)) == {"city": "Paris"} and done[0].arguments == "".join(pieces), pieces)
# tool_choice naming the function: the node forces the call's opening, the parser reads it first.
r = client.responses.create(model=model, input='call: get_weather {"city": "Paris"}', tools=[WEATHER],
                            tool_choice={"type": "function", "name": "get_weather"})
check("fake: forced function_call", [(o.type, o.name, json.loads(o.arguments)) for o in r.output]
      == [("function_call", "get_weather", {"city": "Paris"})], r.output)
r = client.responses.create(model=model, input=CALL, tools=[WEATHER], tool_choice="none")
check("fake: tool_choice none keeps text", [o.type for o in r.output] == ["message"] and "<tool_call>" in r.output_text, r)
r = client.responses.create(model=model, max_output_tokens=2000, tools=[WEATHER], input=[
    {"role": "user", "content": "weather?"},
    {"type": "function_call", "call_id": call_id, "name": "get_weather", "arguments": '{"city": "Paris"}'},
    {"type": "function_call_output", "call_id": call_id, "output": "sunny"},
    {"role": "user", "content": "request"},
])
seen = json.loads(r.output_text)
check("fake: function turns reach the backend", seen["messages"][1] == {"role": "assistant", "content": "",
      "tool_calls": [{"id": call_id, "name": "get_weather", "arguments": '{"city":"Paris"}'}]}
      and seen["messages"][2] == {"role": "tool", "content": "sunny", "tool_call_id": call_id, "name": "get_weather"},
      seen["messages"])
r = client.responses.create(model=model, max_output_tokens=2000, input="request", reasoning={"effort": "low"})
check("fake: reasoning.effort reaches the backend", json.loads(r.output_text)["reasoning_effort"] == "low", r.output_text)
try:
    list(client.responses.create(model=model, input="fail after 2", stream=True))
    check("fake: lost instance raises", False)
except openai.APIError as e:
    check("fake: lost instance mid-stream", "lost" in str(e), e)

print("all passed", flush=True)
