"""Time to first token for one image, shoal against mlx-vlm, on the same model folder and the
same image file (`cargo xtask bench vision`, issue 47). Run with the pinned mlx-vlm venv's
Python inside the node's network namespace.

Usage: python bench_vision.py URL MODEL FOLDER IMAGE QUESTION ROUNDS

- IMAGE is made here first when it is missing: a 1024×1024 RGB PNG (a smooth pattern with
  fine detail, from a fixed formula), written once.
- shoal: a streamed OpenAI chat completion (`POST URL/chat/completions`, greedy, the image as a
  data URL read from the file for each request), timed from just before the request to the
  first content delta.
- mlx-vlm: the model loaded once; each round opens the image file, renders the chat with the
  folder's template, runs mlx-vlm's processor and its generation loop to its first token,
  timed from opening the file.

Each round runs shoal then mlx-vlm; after one untimed warm-up of each, ROUNDS rounds. Prints a
JSON line `{"shoal": [...], "mlx_vlm": [...], "prompt_tokens": ..., ...}` (seconds) and
"all passed".
"""

import base64
import contextlib
import io
import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import mlx.core as mx
import numpy as np
from PIL import Image

url, model_id, folder, image_path, question, rounds = sys.argv[1:7]
rounds = int(rounds)
image_path = Path(image_path)


def make_image(path):
    y, x = np.mgrid[0:1024, 0:1024].astype(np.float32)
    r = 127.5 + 127.5 * np.sin(x / 37.0) * np.cos(y / 53.0)
    g = (x * 0.25 + y * 0.125) % 256
    b = ((x.astype(np.int64) ^ y.astype(np.int64)) * 7) % 256
    pixels = np.stack([r, g, b], axis=-1).astype(np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels, "RGB").save(path)


if not image_path.exists():
    make_image(image_path)
size = Image.open(image_path).size
assert size == (1024, 1024), size


def shoal_ttft():
    data = base64.b64encode(image_path.read_bytes()).decode()
    body = json.dumps({
        "model": model_id, "stream": True, "max_tokens": 2, "temperature": 0,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}},
            {"type": "text", "text": question}]}]}).encode()
    request = urllib.request.Request(f"{url}/chat/completions", data=body, method="POST",
                                     headers={"content-type": "application/json"})
    start = time.perf_counter()
    first, prompt_tokens = None, None
    try:
        answer = urllib.request.urlopen(request, timeout=600)
    except urllib.error.HTTPError as e:
        raise SystemExit(f"FAILED: shoal answered {e.code}: {e.read().decode(errors='replace')}")
    with answer:
        for line in answer:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                prompt_tokens = chunk["usage"]["prompt_tokens"]
            for choice in chunk.get("choices", []):
                if first is None and choice.get("delta", {}).get("content"):
                    first = time.perf_counter() - start
    if first is None:
        raise SystemExit("FAILED: shoal streamed no content")
    return first, prompt_tokens


from mlx_vlm.generate import generate_step  # noqa: E402
from mlx_vlm.utils import load  # noqa: E402

with contextlib.redirect_stdout(io.StringIO()):
    model, processor = load(folder)


def mlx_vlm_ttft():
    start = time.perf_counter()
    image = Image.open(image_path)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
    text = processor.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False)
    inputs = processor(images=[image], text=[text], return_tensors="np")
    ids = mx.array(np.asarray(inputs["input_ids"]))
    pixels = mx.array(np.asarray(inputs["pixel_values"]))
    for token, _ in generate_step(ids, model, pixels, mx.ones(ids.shape), max_tokens=1,
                                  temperature=0.0):
        mx.eval(token)
        break
    return time.perf_counter() - start, ids.shape[-1]


shoal_ttft()
mlx_vlm_ttft()
figures = {"shoal": [], "mlx_vlm": [], "image": str(image_path), "size": list(size)}
for n in range(rounds):
    s, figures["prompt_tokens"] = shoal_ttft()
    m, figures["mlx_vlm_prompt_tokens"] = mlx_vlm_ttft()
    figures["shoal"].append(s)
    figures["mlx_vlm"].append(m)
    print(f"round {n + 1}: shoal {s * 1000:.1f} ms, mlx-vlm {m * 1000:.1f} ms", flush=True)
print(json.dumps(figures))
print("all passed")
