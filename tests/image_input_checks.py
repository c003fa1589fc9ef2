"""Images in every API on a real shoal node serving a text-only model, through the official
clients: each API's own image form is parsed and reaches the node that renders the prompt,
which answers 400 "model X does not accept images" in that API's own error shape; corrupt,
oversized and fetched (http) images answer 400 saying what is wrong; and the node still answers
a text chat afterwards.

Usage: python image_input_checks.py ROOT_URL MODEL

The test images are made here (PNG by hand with zlib: the test venv has no imaging library).
Prints "ok: ..." or "FAILED: ..." per check and "all passed"; exits non-zero when a check
failed.
"""

import base64
import json
import struct
import sys
import urllib.error
import urllib.request
import zlib

import anthropic
import ollama
import openai

root, model = sys.argv[1], sys.argv[2]
oa = openai.OpenAI(base_url=f"{root}/v1", api_key="none", timeout=120, max_retries=0)
an = anthropic.Anthropic(base_url=root, api_key="none", timeout=120, max_retries=0)
ol = ollama.Client(host=root, timeout=120)
failures = []


def chunk(kind, data):
    body = kind + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))


def png(width, height, claim=None):
    """An RGB gradient PNG; `claim` = (w, h) rewrites the header's size (a decompression
    bomb's first bytes: a small file claiming a huge picture)."""
    rows = b"".join(
        b"\x00" + bytes(v for x in range(width) for v in ((x * 7) % 256, (y * 13) % 256, 99))
        for y in range(height))
    w, h = claim or (width, height)
    header = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


GOOD = png(32, 24)
CORRUPT = GOOD[: len(GOOD) // 2]
HUGE = png(4, 4, claim=(6000, 6000))


def b64(data):
    return base64.b64encode(data).decode()


def data_url(data):
    return f"data:image/png;base64,{b64(data)}"


def check(name, call, *needles):
    """`call` must fail with a 400 in its API's own error shape whose message holds every
    needle."""
    try:
        call()
    except openai.BadRequestError as e:
        # OpenAI's shape: {"error": {"message", "type", "param", "code"}} (the SDK keeps the
        # inner object).
        body = e.body or {}
        message, status = body.get("message", ""), e.status_code
        shaped = body.get("type") == "invalid_request_error" and body.get("code") in (
            "images_not_supported", "invalid_image")
    except anthropic.BadRequestError as e:
        # Anthropic's: {"type": "error", "error": {"type": "invalid_request_error", "message"}}.
        body = e.body or {}
        error = body.get("error") or {}
        message, status = error.get("message", ""), e.status_code
        shaped = body.get("type") == "error" and error.get("type") == "invalid_request_error"
    except ollama.ResponseError as e:
        # Ollama's: {"error": "..."}.
        message, status = e.error, e.status_code
        shaped = isinstance(message, str)
    except Exception as e:  # noqa: BLE001 - any other outcome is a failure, reported
        failures.append(name)
        print(f"FAILED: {name}: {type(e).__name__}: {e}")
        return
    else:
        failures.append(name)
        print(f"FAILED: {name}: answered instead of a 400")
        return
    missing = [n for n in needles if n not in message]
    if status != 400 or missing or not shaped:
        failures.append(name)
        print(f"FAILED: {name}: {status} {message!r} lacks {missing} (API's shape: {shaped})")
    else:
        print(f"ok: {name}: {status} {message}")


def openai_chat(url):
    return lambda: oa.chat.completions.create(model=model, max_tokens=8, messages=[
        {"role": "user", "content": [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image_url", "image_url": {"url": url}}]}])


def responses(url):
    return lambda: oa.responses.create(model=model, max_output_tokens=16, input=[
        {"role": "user", "content": [
            {"type": "input_text", "text": "What is in this picture?"},
            {"type": "input_image", "image_url": url, "detail": "auto"}]}])


def messages(data):
    return lambda: an.messages.create(model=model, max_tokens=8, messages=[
        {"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": b64(data)}},
            {"type": "text", "text": "What is in this picture?"}]}])


def ollama_chat(data):
    return lambda: ol.chat(model=model, options={"num_predict": 8}, messages=[
        {"role": "user", "content": "What is in this picture?", "images": [data]}])


def ollama_generate(data):
    return lambda: ol.generate(model=model, prompt="What is in this picture?", images=[data],
                               options={"num_predict": 8})


REFUSED = f"model `{model}` does not accept images"
FORMS = [
    ("openai chat", lambda d: openai_chat(data_url(d))),
    ("responses", lambda d: responses(data_url(d))),
    ("anthropic messages", messages),
    ("ollama chat", ollama_chat),
    ("ollama generate", ollama_generate),
]
for name, form in FORMS:
    check(f"{name}: a text-only model refuses the image", form(GOOD), REFUSED)
    check(f"{name}: a corrupt image", form(CORRUPT), "could not be decoded")
    check(f"{name}: a 6000x6000 image", form(HUGE), "6000×6000", "16777216 pixels")
check("openai chat: an http URL is not fetched",
      openai_chat("https://example.com/cat.png"), "not fetched", "data URL")
check("responses: an http URL is not fetched",
      responses("https://example.com/cat.png"), "not fetched")
check("openai chat: not an image", openai_chat(data_url(b"GIF87a? no")), "could not be decoded")


def raw_ollama_chat(images):
    """/api/chat by hand: the client itself refuses text that is not base64."""
    def call():
        body = json.dumps({"model": model, "stream": False, "messages": [
            {"role": "user", "content": "hi", "images": images}]}).encode()
        request = urllib.request.Request(f"{root}/api/chat", body,
                                         {"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(request, timeout=60)
        except urllib.error.HTTPError as e:
            raise ollama.ResponseError(json.loads(e.read())["error"], e.code) from None
    return call


check("ollama chat: not base64", raw_ollama_chat(["%%%"]), "not valid base64")
check("ollama chat: not a string", raw_ollama_chat([7]), "base64 string")

# The node is still healthy: a text chat in each API answers.
try:
    text = oa.chat.completions.create(model=model, max_tokens=4, messages=[
        {"role": "user", "content": "Say hi."}]).choices[0].message.content
    reply = ol.chat(model=model, options={"num_predict": 4},
                    messages=[{"role": "user", "content": "Say hi."}]).message.content
    assert text and reply, (text, reply)
    print(f"ok: the node still answers text: {text!r} / {reply!r}")
except Exception as e:  # noqa: BLE001
    failures.append("text after images")
    print(f"FAILED: text after images: {type(e).__name__}: {e}")

if failures:
    print(f"{len(failures)} failed")
    sys.exit(1)
print("all passed")
