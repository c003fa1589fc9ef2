"""Checks of a real shoal node serving SmolLM2, driven with the official `openai` client.

Usage: python node_checks.py BASE_URL MODEL COMMAND
  paris          a greedy answer to "What is the capital of France?" mentions Paris
  load N TOKENS  N concurrent streaming requests of at most TOKENS tokens all complete;
                 prints one JSON line {"ttft": [...seconds], "total": [...], "wall": s}
  limit N TOKENS N concurrent streaming requests against a node with small limits: each one
                 completes or is refused with 429, Retry-After and OpenAI's error shape;
                 none hangs; prints one JSON line {"completed": n, "refused": n}
  answer REF     the greedy answer to REF's messages (a `chat_reference.json` that mlx-lm
                 wrote for the model's folder) is REF's text, and its token count REF's, both
                 in one answer and streamed
  lost PID       a stream whose runner (process PID) is killed mid-way ends with an error
                 (never a hang), and the model then reports no ready instance (503)
Prints "all passed" at the end; exits non-zero on the first failure.
"""

import json
import os
import signal
import sys
import threading
import time

import openai

base_url, model, command = sys.argv[1], sys.argv[2], sys.argv[3]
client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=300)


def check(name, condition, detail=""):
    if not condition:
        print(f"FAILED: {name}: {detail}", flush=True)
        sys.exit(1)
    print(f"ok: {name}", flush=True)


def messages(content):
    return [{"role": "user", "content": content}]


if command == "paris":
    r = client.chat.completions.create(
        model=model, messages=messages("What is the capital of France?"), temperature=0, max_tokens=30
    )
    answer = r.choices[0].message.content
    check("greedy answer mentions Paris", "Paris" in answer, answer)
    print(json.dumps({"answer": answer}), flush=True)

elif command == "answer":
    with open(sys.argv[4]) as f:
        ref = json.load(f)
    r = client.chat.completions.create(
        model=model, messages=ref["messages"], temperature=0, max_tokens=ref["max_tokens"]
    )
    answer = r.choices[0].message.content
    check("the answer is mlx-lm's", answer == ref["text"], f"{answer!r} != {ref['text']!r}")
    check("as many tokens as mlx-lm's", r.usage.completion_tokens == len(ref["tokens"]),
          f"{r.usage.completion_tokens} != {len(ref['tokens'])}")
    check("the prompt as mlx-lm's template made it", r.usage.prompt_tokens == ref["prompt_tokens"],
          f"{r.usage.prompt_tokens} != {ref['prompt_tokens']}")
    stream = client.chat.completions.create(
        model=model, messages=ref["messages"], temperature=0, max_tokens=ref["max_tokens"],
        stream=True,
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    check("streamed, the same answer", streamed == ref["text"], f"{streamed!r}")
    print(json.dumps({"answer": answer}), flush=True)

elif command == "load":
    n, tokens = int(sys.argv[4]), int(sys.argv[5])
    results = [None] * n
    start_gate = threading.Barrier(n)

    def one(i):
        try:
            start_gate.wait()
            t0 = time.monotonic()
            ttft = None
            finish = None
            text = ""
            stream = client.chat.completions.create(
                model=model,
                messages=messages(f"Request {i}: name a colour."),
                max_tokens=tokens,
                temperature=0,
                stream=True,
            )
            for chunk in stream:
                if not chunk.choices:
                    continue
                delta = chunk.choices[0].delta.content or ""
                if delta and ttft is None:
                    ttft = time.monotonic() - t0
                text += delta
                finish = chunk.choices[0].finish_reason or finish
            results[i] = {"ttft": ttft, "total": time.monotonic() - t0, "finish": finish, "text": text}
        except Exception as e:  # reported below as a failure of this request
            results[i] = {"error": repr(e)}

    t0 = time.monotonic()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    wall = time.monotonic() - t0
    check("no request hung", all(not t.is_alive() for t in threads))
    failed = [r for r in results if r is None or "error" in r]
    check(f"all {n} requests completed", not failed, failed[:3])
    check(
        "every request finished with a reason",
        all(r["finish"] in ("stop", "length") for r in results),
        [r["finish"] for r in results],
    )
    check("every request produced text", all(r["ttft"] is not None for r in results), results[:3])
    print(
        json.dumps({"ttft": sorted(r["ttft"] for r in results), "total": sorted(r["total"] for r in results), "wall": wall}),
        flush=True,
    )

elif command == "limit":
    n, tokens = int(sys.argv[4]), int(sys.argv[5])
    results = [None] * n
    start_gate = threading.Barrier(n)

    def one(i):
        try:
            start_gate.wait()
            finish = None
            stream = client.chat.completions.create(
                model=model,
                messages=messages(f"Request {i}: name a colour."),
                max_tokens=tokens,
                temperature=0,
                stream=True,
            )
            for chunk in stream:
                if chunk.choices:
                    finish = chunk.choices[0].finish_reason or finish
            results[i] = {"finish": finish}
        except openai.RateLimitError as e:
            body = e.body if isinstance(e.body, dict) else {}
            results[i] = {
                "refused": True,
                "retry_after": e.response.headers.get("retry-after"),
                "type": body.get("type"),
                "code": body.get("code"),
                "message": body.get("message"),
            }
        except Exception as e:  # reported below as a failure of this request
            results[i] = {"error": repr(e)}

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    check("no request hung", all(not t.is_alive() for t in threads))
    other = [r for r in results if r is None or "error" in r]
    check("every request completed or was refused with 429", not other, other[:3])
    done = [r for r in results if "finish" in r]
    refused = [r for r in results if r.get("refused")]
    check(
        "completed requests finished with a reason",
        all(r["finish"] in ("stop", "length") for r in done),
        [r["finish"] for r in done],
    )
    check(
        "refusals carry Retry-After and the OpenAI error shape",
        all(
            r["retry_after"] and int(r["retry_after"]) >= 1 and r["type"] == "rate_limit_error"
            and r["code"] == "rate_limit_exceeded" and "limit" in (r["message"] or "")
            for r in refused
        ),
        refused[:3],
    )
    print(json.dumps({"completed": len(done), "refused": len(refused)}), flush=True)

elif command == "lost":
    pid = int(sys.argv[4])
    stream = client.chat.completions.create(
        model=model,
        messages=messages("Tell me a long story about a lighthouse."),
        max_tokens=400,
        temperature=0,
        stream=True,
    )
    got_text = False
    killed_at = None
    error = None
    try:
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content and killed_at is None:
                got_text = True
                os.kill(pid, signal.SIGKILL)
                killed_at = time.monotonic()
    except openai.APIError as e:
        error = e
    check("text streamed before the kill", got_text)
    check("the stream ends with an error", error is not None, "the stream ended normally")
    check("the error says the instance was lost", "instance" in str(error.message), error.message)
    check("the error came within seconds", time.monotonic() - killed_at < 30, time.monotonic() - killed_at)
    ready = {m.id: getattr(m, "ready", None) for m in client.models.list()}
    print(json.dumps({"models_after_loss": ready}), flush=True)
    try:
        client.chat.completions.create(model=model, messages=messages("hi"), max_tokens=2)
        check("chat after the loss raises", False)
    except openai.APIStatusError as e:
        check("chat after the loss is 503 no_instance", e.status_code == 503 and e.code == "no_instance", e)

else:
    print(f"unknown command {command}", flush=True)
    sys.exit(2)

print("all passed", flush=True)
