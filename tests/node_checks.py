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
  distinct N     N distinct short chats one after another (each kept by the prompt cache)
                 all finish; prints one JSON line {"distinct": n}
  lost PID       a stream whose runner (process PID) is killed mid-way ends with an error
                 (never a hang), and the model then reports no ready instance (503)
  sampling VOCAB N  `top_logprobs` and `logit_bias` on the real engine: K alternatives per
                 token, most likely first, the greedy token first with its own logprob, all
                 <= 0 and summing to <= 1, streamed as whole; +100 on a token makes a greedy
                 answer of only it, -100 on the greedy first token changes it, two concurrent
                 requests keep their own settings; bad values are 400s. VOCAB is a JSON file
                 {token text: id} of the model's N-token vocabulary
Prints "all passed" at the end; exits non-zero on the first failure.
"""

import json
import math
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

elif command == "distinct":
    n = int(sys.argv[4])
    for i in range(n):
        r = client.chat.completions.create(
            model=model,
            messages=messages(f"Question {i}: name a fruit and a colour."),
            temperature=0,
            max_tokens=16,
        )
        check(f"distinct chat {i} finished", r.choices[0].finish_reason in ("stop", "length"), r)
    print(json.dumps({"distinct": n}), flush=True)

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

elif command == "sampling":
    with open(sys.argv[4]) as f:
        ids = json.load(f)
    vocab_size = int(sys.argv[5])
    question = messages("What is the capital of France?")

    def greedy(**kwargs):
        return client.chat.completions.create(model=model, messages=question, temperature=0, **kwargs)

    def tokens_of(r):
        return [c.token for c in r.choices[0].logprobs.content]

    r = greedy(max_tokens=8, logprobs=True, top_logprobs=5)
    content = r.choices[0].logprobs.content
    check("a logprobs entry per token", 1 <= len(content) <= 8, content)
    for i, c in enumerate(content):
        top = c.top_logprobs
        lps = [t.logprob for t in top]
        check(f"token {i}: 5 alternatives", len(top) == 5, top)
        check(f"token {i}: most likely first", lps == sorted(lps, reverse=True), lps)
        check(f"token {i}: the greedy token first, with its logprob",
              top[0].token == c.token and abs(top[0].logprob - c.logprob) < 1e-6, (c, top[0]))
        check(f"token {i}: log probabilities", all(lp <= 0 for lp in lps)
              and sum(math.exp(lp) for lp in lps) <= 1 + 1e-4, lps)
        # A token's bytes are its text's, unless it is part of a character (text U+FFFD).
        own = lambda t: "\ufffd" in t.token or t.bytes == list(t.token.encode())
        check(f"token {i}: bytes", own(c) and all(own(t) for t in top), c)
    answer = r.choices[0].message.content
    check("the tokens spell the answer", "".join(tokens_of(r)) == answer, (tokens_of(r), answer))
    chunks = list(greedy(max_tokens=8, logprobs=True, top_logprobs=5, stream=True))
    streamed = [c for ch in chunks if ch.choices and ch.choices[0].logprobs
                for c in ch.choices[0].logprobs.content or []]
    alternatives = lambda cs: [(c.token, [t.token for t in c.top_logprobs]) for c in cs]
    check("streamed, the same tokens and alternatives",
          alternatives(streamed) == alternatives(content), alternatives(streamed))
    r = greedy(max_tokens=1, logprobs=True, top_logprobs=20)
    check("top_logprobs 20", len(r.choices[0].logprobs.content[0].top_logprobs) == 20, r)
    try:
        greedy(max_tokens=1, logprobs=True, top_logprobs=21)
        check("top_logprobs 21 is refused", False)
    except openai.BadRequestError as e:
        check("top_logprobs 21 is a 400 naming the cap", "20" in str(e.message), e.message)

    # logit_bias: +100 makes the answer that token; -100 on the greedy first token changes it.
    forced = next(t for t in [" Paris", "Paris", " the"] if t in ids)
    r = greedy(max_tokens=3, logprobs=True, top_logprobs=5, logit_bias={str(ids[forced]): 100})
    check("+100 makes a greedy answer of that token", tokens_of(r) == [forced] * 3
          and r.usage.completion_tokens == 3, tokens_of(r))
    biased = r.choices[0].logprobs.content[0]
    check("logprobs stay the model's own under a bias",
          alternatives([biased])[0][1] == alternatives(content[:1])[0][1]
          and abs(biased.top_logprobs[0].logprob - content[0].logprob) < 1e-4
          and biased.logprob <= biased.top_logprobs[0].logprob, (biased, content[0]))
    first = content[0].token
    check("the greedy first token is in the vocabulary", first in ids, first)
    r = greedy(max_tokens=3, logprobs=True, logit_bias={str(ids[first]): -100})
    check("-100 on the greedy first token changes it", tokens_of(r)[0] != first, tokens_of(r))

    # Two at once, one biased: each keeps its own settings in the batch.
    results = [None, None]

    def run(i):
        bias = {str(ids[forced]): 100} if i == 0 else None
        results[i] = greedy(max_tokens=3, logprobs=True, logit_bias=bias)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    check("concurrent: the biased one is forced", tokens_of(results[0]) == [forced] * 3, tokens_of(results[0]))
    check("concurrent: the other is the plain greedy answer",
          tokens_of(results[1]) == tokens_of(greedy(max_tokens=3, logprobs=True)), tokens_of(results[1]))

    for bias, says in [({"abc": 1}, "token ids"), ({str(vocab_size): 1}, "vocabulary"),
                       ({"5": 101}, "between -100 and 100")]:
        try:
            greedy(max_tokens=1, logit_bias=bias)
            check(f"logit_bias {bias} is refused", False)
        except openai.BadRequestError as e:
            check(f"logit_bias {bias} is a 400 saying {says!r}", says in str(e.message)
                  and e.param == "logit_bias", (e.message, e.param))
    print(json.dumps({"answer": answer, "forced": forced, "banned": first}), flush=True)

else:
    print(f"unknown command {command}", flush=True)
    sys.exit(2)

print("all passed", flush=True)
