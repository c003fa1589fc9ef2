"""A real shoal node serving the tiny Gemma 3 vision fixture answers images as mlx-vlm does,
through the official clients: the same image in each API's own form gives mlx-vlm's greedy
answer token for token; each test image gets its own answer; a second turn with the same image
comes from the prompt cache (`cached_tokens`) with the answer it has without the cache, and
the same turn with another image (the same token ids) does not reuse the first image's state.

Usage: python image_answers_checks.py ROOT_URL MODEL REFERENCE_JSON IMAGES_DIR [no-cache]

With `no-cache` (an instance without a prompt cache: a pipeline, whose caches live across its
ranks) the checks that need a cache are left out: each image's answer is still checked.

REFERENCE_JSON is mlx-vlm's `reference.json` (its greedy answer per image, the question, the
image span's positions); beside it `reference.safetensors` holds mlx-vlm's prompt ids, whose
length its header tells. Prints "ok: ..." or
"FAILED: ..." per check and "all passed"; exits non-zero when a check failed.
"""

import base64
import json
import struct
import sys
from pathlib import Path

import anthropic
import ollama
import openai

root, model, reference_path, images_dir = sys.argv[1:5]
with_cache = sys.argv[5:6] != ["no-cache"]
reference = json.loads(Path(reference_path).read_text())


def prompt_length():
    """mlx-vlm's prompt ids' length, from the safetensors header ([1, n])."""
    with open(Path(reference_path).with_suffix(".safetensors"), "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(size))["input_ids"]["shape"][-1]


prompt_tokens = prompt_length()
QUESTION = reference["question"]
ANSWERS = reference["answers"]
FIRST_IMAGE = reference["image_positions"][0]
LAST_IMAGE = reference["image_positions"][-1]
oa = openai.OpenAI(base_url=f"{root}/v1", api_key="none", timeout=300, max_retries=0)
an = anthropic.Anthropic(base_url=root, api_key="none", timeout=300, max_retries=0)
ol = ollama.Client(host=root, timeout=300)
failures = []


def image(name):
    return (Path(images_dir) / name).read_bytes()


def b64(name):
    return base64.b64encode(image(name)).decode()


def mime(name):
    return "image/jpeg" if name.endswith(".jpg") else "image/png"


def data_url(name):
    return f"data:{mime(name)};base64,{b64(name)}"


def want(name):
    return ANSWERS[name]["text"], len(ANSWERS[name]["tokens"])


def check(name, ok, detail):
    if ok:
        print(f"ok: {name}: {detail}")
    else:
        failures.append(name)
        print(f"FAILED: {name}: {detail}")


def openai_chat(name, history=(), n=None):
    """The chat with `name`'s image first in the user turn (as mlx-vlm renders it), then
    `history`, greedy, `n` tokens (as many as mlx-vlm's answer by default): (text, tokens,
    prompt tokens, cached tokens)."""
    n = n or want(name)[1]
    r = oa.chat.completions.create(
        model=model, max_tokens=n, temperature=0, logprobs=True, messages=[
            {"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": data_url(name)}},
                {"type": "text", "text": QUESTION}]}, *history])
    tokens = [t.token for t in r.choices[0].logprobs.content]
    cached = r.usage.prompt_tokens_details.cached_tokens
    return r.choices[0].message.content, tokens, r.usage.prompt_tokens, cached


def responses(name):
    _, n = want(name)
    r = oa.responses.create(model=model, max_output_tokens=n, temperature=0, input=[
        {"role": "user", "content": [
            {"type": "input_image", "image_url": data_url(name), "detail": "auto"},
            {"type": "input_text", "text": QUESTION}]}])
    return r.output_text, r.usage.input_tokens


def messages(name):
    _, n = want(name)
    # The pinned client takes no `temperature` argument; the API field is sent as is.
    r = an.messages.create(model=model, max_tokens=n, extra_body={"temperature": 0}, messages=[
        {"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": mime(name),
                                         "data": b64(name)}},
            {"type": "text", "text": QUESTION}]}])
    return "".join(b.text for b in r.content if b.type == "text"), r.usage.input_tokens


def ollama_chat(name):
    _, n = want(name)
    r = ol.chat(model=model, options={"num_predict": n, "temperature": 0}, messages=[
        {"role": "user", "content": QUESTION, "images": [image(name)]}])
    return r.message.content, r.prompt_eval_count


def ollama_generate(name):
    _, n = want(name)
    r = ol.generate(model=model, prompt=QUESTION, images=[image(name)],
                    options={"num_predict": n, "temperature": 0})
    return r.response, r.prompt_eval_count


def attempt(name, call):
    try:
        return call()
    except Exception as e:  # noqa: BLE001 - any failure is reported, not raised
        failures.append(name)
        print(f"FAILED: {name}: {type(e).__name__}: {e}")
        return None


# 0. A second turn with square.png, before anything is cached: the answer without the cache.
#    (Short answers: the fixture's sliding layers keep 8 positions, so an entry is reusable
#    only up to a few positions short of its end; a real Gemma 3 keeps 1024.)
HISTORY = [{"role": "assistant", "content": "blank"},
           {"role": "user", "content": "And what colour is it?"}]
cold = attempt("second turn, cold", lambda: openai_chat("square.png", HISTORY, 4))
if cold:
    check("a second turn before anything is cached computes every position", cold[3] == 0,
          f"{cold[3]} of {cold[2]} prompt tokens cached, {cold[0]!r}")


# 1. Each image through OpenAI chat as a first turn: mlx-vlm's answer, token for token, and
#    mlx-vlm's prompt length; different images, different answers.
answers = {}


def first_turn(name):
    got = attempt(f"openai chat {name}", lambda: openai_chat(name))
    if got is None:
        return
    text, tokens, prompt, cached = got
    answers[name] = text
    expected, n = want(name)
    check(f"openai chat {name}: mlx-vlm's answer", text == expected and len(tokens) == n,
          f"{text!r} in {len(tokens)} tokens (mlx-vlm: {expected!r}, {n})")
    check(f"openai chat {name}: mlx-vlm's prompt length", prompt == prompt_tokens,
          f"{prompt} prompt tokens (mlx-vlm: {prompt_tokens})")


first_turn("square.png")
# The second turn of 0 with wide.png (never sent before): the same token ids, another
# image. Its image span is keyed by the image's hash, so
# square.png's first turn (cached just now, reusable from its prompt's end on) is not reused;
# keyed by ids alone its 45 positions would be, square.png's state answering for wide.png.
other = attempt("second turn, another image", lambda: openai_chat("wide.png", HISTORY, 4))
if other:
    check("another image does not reuse the first image's state",
          other[3] <= FIRST_IMAGE and cold and other[0] != cold[0],
          f"{other[3]} prompt tokens cached (image span starts at {FIRST_IMAGE}), "
          f"{other[0]!r} (square.png: {cold and cold[0]!r})")

for name in ["checker.jpg", "wide.png"]:
    first_turn(name)
check("different images, different answers", len(set(answers.values())) == len(ANSWERS),
      f"{answers}")

# 2. The same image in every other API's own form: the same answer.
expected, _ = want("square.png")
for api, call in [("responses", responses), ("anthropic messages", messages),
                  ("ollama chat", ollama_chat), ("ollama generate", ollama_generate)]:
    got = attempt(api, lambda call=call: call("square.png"))
    if got is not None:
        text, prompt = got
        check(f"{api} square.png: mlx-vlm's answer", text == expected and prompt == prompt_tokens,
              f"{text!r}, {prompt} prompt tokens (mlx-vlm: {expected!r}, {prompt_tokens})")

# 3. The prompt cache. The first turn's follow-up reuses its prefix, image span included.
history = [{"role": "assistant", "content": expected},
           {"role": "user", "content": "And what colour is it?"}]
got = with_cache and attempt("follow-up turn", lambda: openai_chat("square.png", history))
if got:
    text, _, prompt, cached = got
    check("a follow-up turn reuses the image's prefix", cached > LAST_IMAGE and text,
          f"{cached} of {prompt} prompt tokens cached (image span ends at {LAST_IMAGE}), "
          f"{text!r}")
# The second turn of 0 again: from the cache, the same answer as without it.
got = with_cache and cold and attempt("second turn, cached",
                                      lambda: openai_chat("square.png", HISTORY, 4))
if got:
    text, _, prompt, cached = got
    check("the same second turn again comes from the prompt cache with the same answer",
          cached > LAST_IMAGE and text == cold[0],
          f"{cached} of {prompt} prompt tokens cached, {text!r} (without the cache: "
          f"{cold[0]!r})")

if failures:
    print(f"{len(failures)} failed")
    sys.exit(1)
print("all passed")
