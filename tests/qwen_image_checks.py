"""A real shoal node serving the tiny Qwen3.5 vision fixture answers images as mlx-vlm does,
through the official `openai` client: each test image (its token count following its size, one
of them past the pixel budget) gives mlx-vlm's greedy answer token for token, with mlx-vlm's
prompt length for the reference image.

Usage: python qwen_image_checks.py ROOT_URL MODEL REFERENCE_JSON IMAGES_DIR BIG_IMAGE

Prints "ok: ..." or "FAILED: ..." per check and "all passed"; exits non-zero when one failed.
"""

import base64
import json
import struct
import sys
from pathlib import Path

import openai

root, model, reference_path, images_dir, big_image = sys.argv[1:6]
reference = json.loads(Path(reference_path).read_text())
with open(Path(reference_path).with_suffix(".safetensors"), "rb") as f:
    (size,) = struct.unpack("<Q", f.read(8))
    prompt_tokens = json.loads(f.read(size))["input_ids"]["shape"][-1]
oa = openai.OpenAI(base_url=f"{root}/v1", api_key="none", timeout=300, max_retries=0)
failures = []


def path(name):
    return Path(big_image) if name == Path(big_image).name else Path(images_dir) / name


for name, answer in sorted(reference["answers"].items()):
    kind = "image/jpeg" if name.endswith(".jpg") else "image/png"
    url = f"data:{kind};base64,{base64.b64encode(path(name).read_bytes()).decode()}"
    try:
        r = oa.chat.completions.create(
            model=model, max_tokens=len(answer["tokens"]), temperature=0, messages=[
                {"role": "user", "content": [
                    {"type": "image_url", "image_url": {"url": url}},
                    {"type": "text", "text": reference["question"]}]}])
        text, prompt = r.choices[0].message.content, r.usage.prompt_tokens
        ok = text == answer["text"] and (name != reference["image"] or prompt == prompt_tokens)
        detail = f"{text!r}, {prompt} prompt tokens (mlx-vlm: {answer['text']!r})"
    except Exception as e:  # noqa: BLE001 - any failure is reported, not raised
        ok, detail = False, f"{type(e).__name__}: {e}"
    print(f"{'ok' if ok else 'FAILED'}: openai chat {name}: {detail}")
    if not ok:
        failures.append(name)

if failures:
    print(f"{len(failures)} failed")
    sys.exit(1)
print("all passed")
