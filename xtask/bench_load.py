"""The load client of `cargo xtask bench concurrency` and `cargo xtask bench prompt-cache`:
plain HTTP (the standard library only), so it measures the servers, not a client library.

Usage: python bench_load.py streams URL MODEL N TOKENS EXTRA_JSON
    N streaming chat completions of TOKENS tokens each, started together (distinct
    prompts), greedy; EXTRA_JSON is merged into every request body (shoal: ignore_eos;
    mlx-lm: a logit_bias against the end tokens, so both generate exactly TOKENS).
    Prints one JSON line: wall seconds, generated tokens, per-stream time to first token.
  python bench_load.py wait URL SECONDS
    Waits until GET URL/models answers 200 (a peer server starting).
  python bench_load.py turns URL MODEL CONTEXT_WORDS TOKENS SALT
    A two-turn chat whose first turn is about CONTEXT_WORDS words long (its notes vary with
    SALT, so that rounds do not share a prefix beyond the chat template): the first turn,
    then the second (the first turn, its answer and a new question). Prints one JSON line:
    time to first token of each turn, prompt and cached tokens of the second.
"""

import http.client
import json
import sys
import threading
import time
from urllib.parse import urlparse

TOPICS = ["a lighthouse keeper", "a baker in Lyon", "a lost robot", "a mountain village",
          "a jazz musician", "a sea turtle", "an old clockmaker", "a desert caravan"]


# A connection the server resets or refuses before it answers is tried again, up to this many
# times, as the official clients do (the openai client retries connection errors twice):
# mlx_lm.server listens with Python's default backlog of 5 and resets some of 16 or 32
# connections opened at once. The time to first token still counts from the first try.
CONNECT_TRIES = 6
RETRIED = [0]


def open_stream(url, body, timeout):
    """POSTs a chat and returns (connection, response), retrying a refused connection."""
    u = urlparse(url)
    for attempt in range(CONNECT_TRIES):
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
        try:
            conn.request("POST", u.path.rstrip("/") + "/chat/completions", json.dumps(body),
                         {"Content-Type": "application/json"})
            return conn, conn.getresponse()
        except (ConnectionResetError, ConnectionRefusedError, BrokenPipeError,
                http.client.RemoteDisconnected):
            conn.close()
            if attempt + 1 == CONNECT_TRIES:
                raise
            RETRIED[0] += 1
            time.sleep(0.1 * 2 ** attempt)


def stream_chat(url, body, timeout=900):
    """One streaming chat: (seconds to first text, content chunks, usage or None, seconds)."""
    started = time.monotonic()
    conn, r = open_stream(url, body, timeout)
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
    first, chunks, usage = None, 0, None
    for raw in r:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        event = json.loads(data)
        if event.get("usage"):
            usage = event["usage"]
        for choice in event.get("choices") or []:
            if (choice.get("delta") or {}).get("content"):
                chunks += 1
                if first is None:
                    first = time.monotonic() - started
    conn.close()
    return first, chunks, usage, time.monotonic() - started


def streams(url, model, n, tokens, extra):
    results = [None] * n
    errors = []
    barrier = threading.Barrier(n)

    def one(i):
        body = {
            "model": model,
            "messages": [{"role": "user", "content":
                          f"Story {i}: write a long story about {TOPICS[i % len(TOPICS)]}."}],
            "max_tokens": tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True},
        }
        body.update(extra)
        barrier.wait()
        try:
            results[i] = stream_chat(url, body)
        except Exception as e:  # a failed stream fails the run, with its reason
            errors.append(f"stream {i}: {e!r}")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - started
    if errors:
        print("FAILED: " + "; ".join(errors[:3]), flush=True)
        sys.exit(1)
    generated, prompt_tokens = 0, 0
    for first, chunks, usage, _ in results:
        generated += (usage or {}).get("completion_tokens") or chunks
        prompt_tokens += (usage or {}).get("prompt_tokens") or 0
    ttft = sorted(r[0] if r[0] is not None else r[3] for r in results)
    print(json.dumps({"streams": n, "wall": wall, "generated": generated, "ttft": ttft,
                      "prompt_tokens": prompt_tokens, "retried": RETRIED[0]}), flush=True)


def turns(url, model, words, tokens, salt):
    notes = f"Harbour log {salt}. " + " ".join(
        f"Note {i}: the tide at pier {(i * salt) % 17} rose by {(i + salt) % 5} feet at dawn."
        for i in range(words // 14 + 1))
    first_messages = [{"role": "user", "content": notes + " Summarise these notes briefly."}]
    body = {"model": model, "max_tokens": tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    # The first turn: its answer, whole, for the second.
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=900)
    whole = dict(body, stream=False, messages=first_messages)
    conn.request("POST", u.path.rstrip("/") + "/chat/completions", json.dumps(whole),
                 {"Content-Type": "application/json"})
    started = time.monotonic()
    answer = json.loads(conn.getresponse().read())
    first_seconds = time.monotonic() - started
    conn.close()
    reply = answer["choices"][0]["message"]["content"]
    second = first_messages + [{"role": "assistant", "content": reply},
                               {"role": "user", "content": "Which pier rose the most?"}]
    ttft, _, usage, _ = stream_chat(url, dict(body, messages=second))
    usage = usage or {}
    print(json.dumps({
        "first_turn_seconds": first_seconds,
        "first_prompt_tokens": answer.get("usage", {}).get("prompt_tokens"),
        "second_ttft": ttft,
        "second_prompt_tokens": usage.get("prompt_tokens"),
        "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
    }), flush=True)


def wait(url, seconds):
    u = urlparse(url)
    deadline = time.monotonic() + seconds
    while True:
        try:
            conn = http.client.HTTPConnection(u.hostname, u.port, timeout=5)
            conn.request("GET", u.path.rstrip("/") + "/models")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            print(f"FAILED: {url} did not answer within {seconds} s", flush=True)
            sys.exit(1)
        time.sleep(0.5)


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "wait":
        wait(sys.argv[2], float(sys.argv[3]))
    elif command == "streams":
        streams(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]),
                json.loads(sys.argv[6]))
    elif command == "turns":
        turns(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]))
    else:
        print(f"FAILED: unknown command {command!r}", flush=True)
        sys.exit(2)
    print("all passed", flush=True)
