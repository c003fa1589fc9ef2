"""Drives a shoal gateway with the official `openai` Python client.

Run by tests/openai_python.rs against a gateway over the scripted fake backend (see
gateway/src/fake.rs for the scripts: `echo: TEXT`, `params`, `fail after N`, seeded words).
Usage: python openai_client.py BASE_URL MODEL IDLE_MODEL. Exits non-zero on the first failure.
"""

import json
import sys

import openai

base_url, model, idle_model = sys.argv[1], sys.argv[2], sys.argv[3]
client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=20)


def check(name, condition, detail=""):
    if not condition:
        print(f"FAILED: {name}: {detail}", flush=True)
        sys.exit(1)
    print(f"ok: {name}", flush=True)


def chat(content, **kwargs):
    return client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": content}], **kwargs
    )


def stream_text(content, **kwargs):
    chunks = list(chat(content, stream=True, **kwargs))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return chunks, text


# Model listing.
ids = [m.id for m in client.models.list()]
check("models.list", model in ids and idle_model in ids, ids)

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

# Seed reproducibility.
a = chat("tell me a story", seed=1234).choices[0].message.content
b = chat("tell me a story", seed=1234).choices[0].message.content
c = chat("tell me a story", seed=4321).choices[0].message.content
check("same seed, same answer", a == b, (a, b))
check("other seed, other answer", a != c, (a, c))
_, streamed = stream_text("tell me a story", seed=1234)
check("seed streaming matches", streamed == a, (streamed, a))

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
    extra_body={"top_k": 12, "min_p": 0.0625},
)
seen = json.loads(r.choices[0].message.content)
expected = {
    "max_tokens": 300, "temperature": 0.25, "top_p": 0.5, "top_k": 12, "min_p": 0.0625,
    "seed": 77, "stop": [[10, 10]], "presence_penalty": 0.5, "frequency_penalty": -1.0,
    "logprobs": None,
}
check("sampling passthrough", seen == expected, seen)

# Logprobs.
r = chat("echo: abcdef", logprobs=True, top_logprobs=2)
content = r.choices[0].logprobs.content
check("logprobs", len(content) == 2 and len(content[0].top_logprobs) == 2 and content[0].logprob < 0, content)

# Errors.
try:
    client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    check("unknown model raises", False)
except openai.NotFoundError as e:
    check("unknown model is 404", e.status_code == 404, e)
    check("404 lists models", model in str(e.message) and e.code == "model_not_found", e.message)
try:
    client.chat.completions.create(model=idle_model, messages=[{"role": "user", "content": "x"}])
    check("no instance raises", False)
except openai.APIStatusError as e:
    check("no instance is 503", e.status_code == 503 and e.code == "no_instance", e)
    check("503 says what to do", "place_instance" in e.message, e.message)
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
