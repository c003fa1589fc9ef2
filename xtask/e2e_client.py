"""The client side of `cargo xtask e2e` and `cargo xtask bench forward`, with the official
`openai` package: what a user's program would do against a shoal cluster.

Usage: python e2e_client.py COMMAND ARGS...
  paris MODEL URL...              greedy "capital of France" through each node's gateway:
                                  every answer mentions Paris and all are the same text
  lost MODEL URL PIDS             a long greedy stream through URL; at its first token the
                                  processes PIDS (comma-separated: a node and its runners)
                                  are killed; the stream must end with an error, not hang
  forward MODEL DIRECT FORWARDED N TOKENS
                                  N rounds of one short greedy stream to each URL,
                                  interleaved; time to first token and total per request
Each command prints progress lines, one JSON line of figures, and "all passed" at the end;
the first failed check prints "FAILED: what: detail" and exits 1.
"""

import json
import os
import signal
import sys
import time

import openai


def check(name, condition, detail=""):
    if not condition:
        print(f"FAILED: {name}: {detail}", flush=True)
        sys.exit(1)
    print(f"ok: {name}", flush=True)


def client(url, timeout=120):
    return openai.OpenAI(base_url=url.rstrip("/") + "/v1", api_key="unused", max_retries=0, timeout=timeout)


def ask(url, model, question, max_tokens):
    started = time.monotonic()
    r = client(url).chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": question}],
        temperature=0,
        max_tokens=max_tokens,
    )
    return r.choices[0].message.content, time.monotonic() - started


def paris(model, urls):
    answers = {}
    seconds = {}
    for url in urls:
        try:
            answers[url], seconds[url] = ask(url, model, "What is the capital of France?", 30)
        except openai.APIError as e:
            check(f"chat through {url}", False, repr(e))
        print(f"{url}: {answers[url]!r} in {seconds[url]:.2f} s", flush=True)
        check(f"the answer through {url} mentions Paris", "Paris" in answers[url], answers[url])
    check("every node gives the same greedy answer", len(set(answers.values())) == 1, answers)
    print(json.dumps({"answers": answers, "seconds": seconds}), flush=True)


def lost(model, url, pids):
    stream = client(url, timeout=60).chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}],
        temperature=0,
        max_tokens=400,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    killed_at = None
    killed_unix = None
    tokens_before = 0
    tokens_after = 0
    error = None
    try:
        for chunk in stream:
            if not (chunk.choices and chunk.choices[0].delta.content):
                continue
            if killed_at is None:
                tokens_before += 1
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                killed_at = time.monotonic()
                killed_unix = time.time()
                print(f"killed {len(pids)} process(es) of the middle rank's node at the first token", flush=True)
            else:
                tokens_after += 1
    except openai.APIError as e:
        error = e
    ended = time.monotonic()
    check("text streamed before the kill", killed_at is not None, "no token came")
    after = ended - killed_at
    print(
        json.dumps(
            {
                "killed_unix": killed_unix,
                "error_after_s": after,
                "tokens_after_kill": tokens_after,
                "error": None if error is None else str(error),
            }
        ),
        flush=True,
    )
    check("the stream ends with an error", error is not None, f"it ended normally after {tokens_after} more tokens")
    check("the error came within 15 s of the kill", after < 15, f"{after:.1f} s")


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, round((len(values) - 1) * p))]


def timed_stream(url, model, tokens, i):
    started = time.monotonic()
    first = None
    stream = client(url).chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": f"Say a colour ({i})."}],
        temperature=0,
        max_tokens=tokens,
        stream=True,
    )
    for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.monotonic() - started
    total = time.monotonic() - started
    if first is None:
        check(f"request {i} to {url} produced text", False, "no text in the stream")
    return first, total


def forward(model, direct, forwarded, n, tokens):
    # One unmeasured round first: connections, caches.
    timed_stream(direct, model, tokens, -1)
    timed_stream(forwarded, model, tokens, -1)
    figures = {"direct": {"ttft": [], "total": []}, "forwarded": {"ttft": [], "total": []}}
    for i in range(n):
        order = [("direct", direct), ("forwarded", forwarded)]
        if i % 2:
            order.reverse()
        for name, url in order:
            ttft, total = timed_stream(url, model, tokens, i)
            figures[name]["ttft"].append(ttft)
            figures[name]["total"].append(total)
    summary = {}
    for name in figures:
        summary[name] = {
            key: {"p50_ms": percentile(v, 0.5) * 1000, "p90_ms": percentile(v, 0.9) * 1000}
            for key, v in figures[name].items()
        }
    summary["added_ms"] = {
        key: {
            p: summary["forwarded"][key][p] - summary["direct"][key][p] for p in ("p50_ms", "p90_ms")
        }
        for key in ("ttft", "total")
    }
    summary["n"] = n
    summary["max_tokens"] = tokens
    print(json.dumps(summary), flush=True)


def main():
    if len(sys.argv) < 3:
        print(__doc__, flush=True)
        sys.exit(2)
    command, model, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    if command == "paris" and args:
        paris(model, args)
    elif command == "lost" and len(args) == 2:
        lost(model, args[0], [int(p) for p in args[1].split(",") if p])
    elif command == "forward" and len(args) == 4:
        forward(model, args[0], args[1], int(args[2]), int(args[3]))
    else:
        print(__doc__, flush=True)
        sys.exit(2)
    print("all passed", flush=True)


if __name__ == "__main__":
    main()
