"""Bad images sent to a real shoal node serving the tiny Gemma 3 vision fixture, through the
official clients: each corrupt or oversized image answers 400 (`invalid_image`) saying what is
wrong, in every API's own error shape, round after round; and the node still answers an image
chat with mlx-vlm's greedy answer afterwards.

Usage: python image_limits_checks.py ROOT_URL MODEL REFERENCE_JSON IMAGES_DIR (warm | bad ROUNDS)

`warm` sends one good image chat (the answer checked), so that the runner has run its tower
before the test measures its memory; `bad ROUNDS` sends every bad image ROUNDS times through
each API, then the good chat again. The test images are made here (PNG by hand with zlib: the
venv has no imaging library). Prints "ok: ..." or "FAILED: ..." per check and "all passed";
exits non-zero when a check failed.
"""

import base64
import json
import struct
import sys
import zlib
from pathlib import Path

import anthropic
import ollama
import openai

root, model, reference_path, images_dir, phase = sys.argv[1:6]
rounds = int(sys.argv[6]) if phase == "bad" else 0
reference = json.loads(Path(reference_path).read_text())
oa = openai.OpenAI(base_url=f"{root}/v1", api_key="none", timeout=300, max_retries=0)
an = anthropic.Anthropic(base_url=root, api_key="none", timeout=300, max_retries=0)
ol = ollama.Client(host=root, timeout=300)
failures = []


def check(name, ok, detail):
    if ok:
        print(f"ok: {name}: {detail}")
    else:
        failures.append(name)
        print(f"FAILED: {name}: {detail}")


def chunk(kind, data):
    body = kind + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))


def png(width, height, claim=None):
    """An RGB PNG of `height` equal rows (a gradient across); `claim` = (w, h) rewrites the
    header's size (a small file claiming a huge picture)."""
    row = b"\x00" + bytes(v for x in range(width) for v in ((x * 7) % 256, x % 251, 99))
    w, h = claim or (width, height)
    header = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(row * height)) + chunk(b"IEND", b""))


BIG = png(4096, 4096)
JPEG = (Path(images_dir) / "checker.jpg").read_bytes()
# name: (bytes, words the 400's message must hold)
BAD = {
    # 16 Mpx (the most accepted) cut inside its pixel data: the decoder has allocated the
    # picture when the data ends.
    "a 4096x4096 PNG cut in half": (BIG[: len(BIG) // 2], ["could not be decoded"]),
    # (A JPEG cut inside its pixel data is decoded with the rest filled in, as browsers show
    # one: accepted by design, see gateway/src/images_tests.rs.)
    "a JPEG cut in its headers": (JPEG[:120], ["could not be decoded"]),
    "a 4x4 PNG claiming 6000x6000": (png(4, 4, claim=(6000, 6000)), ["6000×6000", "pixels"]),
    "a 16385x1 PNG": (png(16385, 1), ["16385×1", "a side"]),
    "9 MiB": (BIG + bytes(9 << 20), ["bytes", "8388608"]),
    "not an image": (bytes(range(256)) * 4096, ["not a PNG, JPEG, WebP or GIF"]),
}


def b64(data):
    return base64.b64encode(data).decode()


def openai_chat(data, n):
    return oa.chat.completions.create(model=model, max_tokens=n, temperature=0, messages=[
        {"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64(data)}"}},
            {"type": "text", "text": reference["question"]}]}])


def anthropic_message(data, n):
    return an.messages.create(model=model, max_tokens=n, extra_body={"temperature": 0},
                              messages=[{"role": "user", "content": [
                                  {"type": "image", "source": {"type": "base64",
                                                               "media_type": "image/png",
                                                               "data": b64(data)}},
                                  {"type": "text", "text": reference["question"]}]}])


def ollama_chat(data, n):
    return ol.chat(model=model, options={"num_predict": n, "temperature": 0}, messages=[
        {"role": "user", "content": reference["question"], "images": [data]}])


def refused(api, call, name, data, needles):
    """`call` with a bad image must raise the client's 400 error holding every needle."""
    try:
        call(data, 4)
    except (openai.BadRequestError, anthropic.BadRequestError) as e:
        text = str(e)
        ok = e.status_code == 400 and all(n in text for n in needles)
        return ok, f"{api}: {e.status_code} {text[:160]!r}"
    except ollama.ResponseError as e:
        ok = e.status_code == 400 and all(n in e.error for n in needles)
        return ok, f"{api}: {e.status_code} {e.error[:160]!r}"
    except Exception as e:  # noqa: BLE001 - anything else is a failure, reported
        return False, f"{api}: {type(e).__name__}: {e}"
    return False, f"{api}: answered instead of a 400"


def good_chat(label):
    want = reference["answers"]["square.png"]
    data = (Path(images_dir) / "square.png").read_bytes()
    try:
        r = openai_chat(data, len(want["tokens"]))
        got = r.choices[0].message.content
        check(label, got == want["text"], f"{got!r} (mlx-vlm: {want['text']!r})")
    except Exception as e:  # noqa: BLE001
        check(label, False, f"{type(e).__name__}: {e}")


if phase == "warm":
    good_chat("an image chat answers as mlx-vlm does")
else:
    apis = {"openai": openai_chat, "anthropic": anthropic_message, "ollama": ollama_chat}
    for round_ in range(rounds):
        for name, (data, needles) in BAD.items():
            for api, call in apis.items():
                ok, detail = refused(api, call, name, data, needles)
                # Every failure is reported; successes in the first round only.
                if round_ == 0 or not ok:
                    check(f"round {round_ + 1}: {name}", ok, detail)
    print(f"sent {rounds} rounds of {len(BAD)} bad images through {len(apis)} APIs")
    good_chat("after the bad images, an image chat still answers as mlx-vlm does")

if failures:
    print(f"{len(failures)} checks failed: {failures}")
    sys.exit(1)
print("all passed")
