"""Structured outputs on a real shoal node, through the official clients: every answer is
checked with the `jsonschema` package against the schema sent.

Usage: python structured_checks.py ROOT_URL MODEL [--unconstrained | --bounded]

- The OpenAI SDK's `client.chat.completions.parse(response_format=PydanticModel)` returns a
  parsed object.
- SCHEMAS (nested objects, arrays, enums, anyOf, number bounds, string patterns and formats,
  $ref) each give a valid answer through chat completions, Responses `text.format`, Ollama's
  /api/chat `format`, and a streamed chat.
- `json_object` (chat) and `format: "json"` (Ollama /api/generate) give a JSON object.
- `tool_choice` "required" and a named function (OpenAI), `any` and a named tool
  (Anthropic) give a typed call whose arguments validate against the tool's schema.
- `strict` tools under `auto`: prose or typed calls that validate, at least one call.
- A schema keyword the engine cannot enforce (`uniqueItems`) is a 400 naming it, in chat and
  Ollama.

Prints "ok: ..." or "FAILED: ..." per check, a JSON summary line, and "all passed"; exits
non-zero after it when a check failed. With --unconstrained (a node started with SHOAL_UNCONSTRAINED=1) nothing must pass:
it counts the answers that validate and prints {"valid": V, "invalid": I, ...} instead, which
the Rust test reads to show that the checks fail without the constraint.

With --bounded (a random-weight model, whose answers mean nothing): only the checks that no
model judgement can pass or fail, the schemas whose every answer is bounded (strings with a
`maxLength` or a bounded pattern, integers with both bounds, enums, arrays with `maxItems`) and
the forced calls. An unbounded leaf (an integer without bounds, a number's fraction, free JSON)
lets such a model write until its token budget ends, which says nothing about the constraint.
"""

import json
import sys
from concurrent.futures import ThreadPoolExecutor

import anthropic
import jsonschema
import ollama
import openai
from pydantic import BaseModel

root, model = sys.argv[1], sys.argv[2]
UNCONSTRAINED = "--unconstrained" in sys.argv[3:]
BOUNDED = "--bounded" in sys.argv[3:]
# A bounded answer of a random-weight model may take a token per character.
MAX_TOKENS = 400 if BOUNDED else 160
oa = openai.OpenAI(base_url=f"{root}/v1", api_key="none", timeout=600, max_retries=0)
ol = ollama.Client(host=root, timeout=600)
an = anthropic.Anthropic(base_url=root, api_key="none", timeout=600, max_retries=0)
FORMATS = jsonschema.Draft202012Validator.FORMAT_CHECKER


def obj(properties, required=None, **extra):
    """An object schema as strict clients send it (every key required, no others)."""
    return {"type": "object", "properties": properties,
            "required": list(properties) if required is None else required,
            "additionalProperties": False, **extra}


STR = {"type": "string", "maxLength": 24}
INT = {"type": "integer", "minimum": 0, "maximum": 1000}
# (what to ask, the schema): roots are objects, as OpenAI's strict mode requires.
SCHEMAS = [
    ("Describe a person.", obj({"name": STR, "age": {"type": "integer", "minimum": 0, "maximum": 120}})),
    ("Where does Ann live?", obj({"name": STR, "address": obj({
        "street": STR, "city": STR, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}})})),
    ("List some fruits.", obj({"fruits": {"type": "array", "items": STR, "minItems": 2, "maxItems": 4}})),
    ("What colour is the sky?", obj({"color": {"enum": ["red", "green", "blue"]}})),
    ("Give me a value.", obj({"value": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 10}]}})),
    ("How warm is it in Paris?", obj({"celsius": {"type": "number", "minimum": -50, "maximum": 50}})),
    ("Is the task done?", obj({"done": {"type": "boolean"}, "count": {"type": "integer", "minimum": 1, "maximum": 9}})),
    ("Give a product code.", obj({"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"}})),
    ("When is the meeting?", obj({"date": {"type": "string", "format": "date"}})),
    ("What is in the basket?", obj({"items": {"type": "array", "maxItems": 3, "items": obj(
        {"name": STR, "qty": {"type": "integer", "minimum": 1, "maximum": 100}}, additionalProperties=False)}})),
    ("Which version?", obj({"version": {"const": 2}, "name": STR})),
    ("Rate the film.", obj({"stars": {"enum": [1, 2, 3, 4, 5]}, "review": STR})),
    ("Write a small matrix.", obj({"matrix": {"type": "array", "maxItems": 3, "items": {
        "type": "array", "maxItems": 3, "items": {"type": "integer", "minimum": -9, "maximum": 9}}}})),
    ("Title a book.", obj({"title": STR, "subtitle": STR}, required=["title"], additionalProperties=False)),
    ("Say one word.", obj({"word": {"type": "string", "minLength": 3, "maxLength": 8, "pattern": "^[a-z]+$"}})),
    ("What is Bob's email?", obj({"email": {"type": "string", "format": "email", "maxLength": 40}})),
    ("Pick an even number.", obj({"n": {"type": "integer", "multipleOf": 2, "exclusiveMinimum": 0, "exclusiveMaximum": 100}})),
    ("Two points, please.", {
        "$defs": {"pt": obj({"x": INT, "y": INT}, additionalProperties=False)},
        "type": "object", "properties": {"a": {"$ref": "#/$defs/pt"}, "b": {"$ref": "#/$defs/pt"}},
        "required": ["a", "b"], "additionalProperties": False}),
    ("Will it rain?", obj({"answer": {"enum": ["yes", "no", "maybe"]},
                           "confidence": {"type": "number", "minimum": 0, "maximum": 1}})),
    ("Describe the weather.", obj({"summary": STR, "wind": obj({
        "speed": {"type": "number", "minimum": 0, "maximum": 200},
        "direction": {"enum": ["N", "E", "S", "W"]}}), "alerts": {"type": "array", "maxItems": 2, "items": STR}})),
]
SYSTEM = "You answer with JSON."
# The SCHEMAS with a leaf no bound holds (an integer in anyOf, numbers' fractions): left out
# under --bounded.
UNBOUNDED = {4, 5, 18, 19}

# Tools for forced calls.
WEATHER = obj({"city": STR, "unit": {"enum": ["celsius", "fahrenheit"]}}, additionalProperties=False)
TIME = obj({"timezone": {"type": "string", "pattern": "^[A-Z][a-z]{1,15}/[A-Z][a-z]{1,15}$"}},
           additionalProperties=False)
TOOLS = {"get_weather": WEATHER, "get_time": TIME}
OA_TOOLS = [{"type": "function", "function": {"name": n, "description": f"{n} of a place", "parameters": s}}
            for n, s in TOOLS.items()]
AN_TOOLS = [{"name": n, "description": f"{n} of a place", "input_schema": s} for n, s in TOOLS.items()]

# `strict` tools under `auto`: questions that ask for a call, the model decides.
STRICT_SYSTEM = "You are a helpful assistant with tools. Call a tool whenever one can answer."
# An earlier turn that called a tool, so that the model knows how (SmolLM2 writes prose
# otherwise).
STRICT_HISTORY = [
    {"role": "system", "content": STRICT_SYSTEM},
    {"role": "user", "content": "What is the weather in Oslo?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_0", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "unit": "celsius"}'}}]},
    {"role": "tool", "tool_call_id": "call_0", "content": '{"temperature": 4, "sky": "cloudy"}'},
    {"role": "assistant", "content": "It is 4 degrees and cloudy in Oslo."},
]
STRICT_QUESTIONS = ["What is the weather in Paris right now?",
                    "What time is it in Europe/Paris?",
                    "Tell me the weather in Rome in celsius."]

results = []


def check(name, condition, detail=""):
    """Records a check; every failure is printed, and the script fails at its end."""
    results.append((name, bool(condition), detail))
    if not UNCONSTRAINED:
        print(f"ok: {name}" if condition else f"FAILED: {name}: {detail}", flush=True)


def valid(text, schema):
    """Whether `text` is JSON valid under `schema` (and why not)."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError) as e:
        return False, f"not JSON ({e}): {text!r}"
    try:
        jsonschema.validate(value, schema, format_checker=FORMATS)
    except jsonschema.ValidationError as e:
        return False, f"{e.message}: {text!r}"
    return True, text


def messages(question):
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def chat(question, schema, i):
    r = oa.chat.completions.create(
        model=model, messages=messages(question), temperature=0, max_tokens=MAX_TOKENS,
        response_format={"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}})
    return r.choices[0].message.content


def responses(question, schema, i):
    r = oa.responses.create(
        model=model, instructions=SYSTEM, input=question, temperature=0, max_output_tokens=MAX_TOKENS,
        text={"format": {"type": "json_schema", "name": f"s{i}", "schema": schema, "strict": True}})
    return r.output_text


def ollama_chat(question, schema, _i):
    r = ol.chat(model=model, messages=messages(question), format=schema,
                options={"temperature": 0, "num_predict": MAX_TOKENS})
    return r.message.content


def streamed(question, schema, i):
    stream = oa.chat.completions.create(
        model=model, messages=messages(question), temperature=0, max_tokens=MAX_TOKENS, stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}})
    return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


APIS = {"chat": chat, "responses": responses, "ollama /api/chat": ollama_chat, "streamed chat": streamed}


def schema_checks():
    apis = {"chat": chat} if UNCONSTRAINED else APIS
    jobs = [(api, i, q, s) for api in apis for i, (q, s) in enumerate(SCHEMAS)
            if not (BOUNDED and i in UNBOUNDED)]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda j: apis[j[0]](j[2], j[3], j[1]), jobs))
    for (api, i, _q, schema), text in zip(jobs, answers):
        ok, why = valid(text, schema)
        check(f"{api}: schema {i} validates", ok, why)


class Person(BaseModel):
    name: str
    age: int


def parse_check():
    parse = getattr(oa.chat.completions, "parse", None) or oa.beta.chat.completions.parse
    try:
        r = parse(model=model, messages=messages("Describe a person named Ann."), temperature=0,
                  max_tokens=MAX_TOKENS, response_format=Person)
        parsed = r.choices[0].message.parsed
    except Exception as e:  # the SDK raises on JSON it cannot parse
        parsed = e
    check("chat.completions.parse returns a Person", isinstance(parsed, Person), repr(parsed))


def json_mode_checks():
    r = oa.chat.completions.create(model=model, messages=messages("Describe a cat."), temperature=0,
                                   max_tokens=MAX_TOKENS, response_format={"type": "json_object"})
    ok, why = valid(r.choices[0].message.content, {"type": "object"})
    check("chat json_object gives an object", ok, why)
    g = ol.generate(model=model, prompt="Give a dog's name and age as JSON.", format="json",
                    options={"temperature": 0, "num_predict": MAX_TOKENS})
    ok, why = valid(g.response, {"type": "object"})
    check("ollama /api/generate format json gives an object", ok, why)


def call_ok(api, name, args, want=None):
    schema = TOOLS.get(name)
    if schema is None or (want and name != want):
        return False, f"{api}: called {name!r}"
    text = args if isinstance(args, str) else json.dumps(args)
    return valid(text, schema)


def tool_checks():
    ask = messages("What is the weather and the time in Paris?")
    for choice, want in [("required", None), ({"type": "function", "function": {"name": "get_time"}}, "get_time")]:
        r = oa.chat.completions.create(model=model, messages=ask, temperature=0, max_tokens=MAX_TOKENS,
                                       tools=OA_TOOLS, tool_choice=choice)
        calls = r.choices[0].message.tool_calls or []
        ok, why = (False, f"no typed call: {r.choices[0].message}") if not calls else \
            call_ok("openai", calls[0].function.name, calls[0].function.arguments, want)
        check(f"openai tool_choice {json.dumps(choice)}: a typed call that validates", ok, why)
    for choice, want in [({"type": "any"}, None), ({"type": "tool", "name": "get_weather"}, "get_weather")]:
        m = an.messages.create(model=model, max_tokens=MAX_TOKENS, tools=AN_TOOLS,
                               tool_choice=choice, messages=[{"role": "user", "content": ask[1]["content"]}])
        uses = [b for b in m.content if b.type == "tool_use"]
        ok, why = (False, f"no tool_use: {m.content}") if not uses else \
            call_ok("anthropic", uses[0].name, uses[0].input, want)
        check(f"anthropic tool_choice {json.dumps(choice)}: a tool_use that validates", ok, why)


def strict_auto_checks():
    """`strict` tools under `tool_choice` auto: the model answers in prose or calls, and every
    call it opens is typed and validates (a lazy grammar from the call's marker on). At least
    one of the questions must get a call, so the check cannot pass on prose alone."""
    tools = [{"type": "function", "function": {"name": n, "description": f"{n} of a place",
                                                "parameters": s, "strict": True}}
             for n, s in TOOLS.items()]
    calls_seen = 0
    for i, question in enumerate(STRICT_QUESTIONS):
        r = oa.chat.completions.create(
            model=model, temperature=0, max_tokens=MAX_TOKENS, tools=tools,
            messages=STRICT_HISTORY + [{"role": "user", "content": question}])
        m = r.choices[0].message
        calls = m.tool_calls or []
        calls_seen += len(calls)
        if calls:
            verdicts = [call_ok("openai", c.function.name, c.function.arguments) for c in calls]
            ok = all(v[0] for v in verdicts)
            why = "; ".join(v[1] for v in verdicts if not v[0])
        else:
            ok = "<tool_call>" not in (m.content or "")
            why = f"call markup left in the text: {m.content!r}"
        check(f"openai strict tools, auto, question {i}: prose or typed calls that validate", ok, why)
    if not UNCONSTRAINED:
        print(f"strict tools under auto: {calls_seen} typed calls over {len(STRICT_QUESTIONS)} questions")
    check("openai strict tools, auto: the model called at least once", calls_seen > 0,
          "no question got a call")


def refusal_checks():
    bad = {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}
    try:
        oa.chat.completions.create(model=model, messages=messages("Tags?"), max_tokens=8,
                                   response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": bad}})
        status, text = 200, ""
    except openai.BadRequestError as e:
        status, text = e.status_code, str(e)
    check("chat: an unsupported keyword is a 400 naming it", status == 400 and "uniqueItems" in text, (status, text))
    try:
        ol.chat(model=model, messages=messages("Tags?"), format=bad, options={"num_predict": 8})
        status, text = 200, ""
    except ollama.ResponseError as e:
        status, text = e.status_code, str(e)
    check("ollama: an unsupported keyword is a 400 naming it", status == 400 and "uniqueItems" in text, (status, text))


if not BOUNDED:
    parse_check()
    json_mode_checks()
tool_checks()
if not BOUNDED:
    strict_auto_checks()
schema_checks()
if not UNCONSTRAINED:
    refusal_checks()
passed = sum(1 for _, ok, _ in results if ok)
print(json.dumps({"valid": passed, "invalid": len(results) - passed, "checks": len(results),
                  "failed": [name for name, ok, _ in results if not ok][:40]}), flush=True)
if not UNCONSTRAINED:
    if passed < len(results):
        sys.exit(1)
    print("all passed", flush=True)
