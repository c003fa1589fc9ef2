"""Token log-probabilities in every API of a real shoal node that has them, each driven by its
official client: OpenAI chat completions and Responses (`openai`), Ollama's /api/chat and
/api/generate (`ollama`), whole and streamed.

Usage: python logprob_checks.py ROOT_URL MODEL API_KEY

Under greedy decoding each token must be the first of its K alternatives with the greatest
log-probability (its own), all log-probabilities <= 0, K entries; a token's bytes are its
text's UTF-8 unless it is part of a character (text U+FFFD), and the tokens' bytes joined
are the answer's text. Prints one JSON line with what it saw and "all passed" at the end;
exits non-zero on the first failure.
"""

import json
import sys

import ollama
import openai

root, model, key = sys.argv[1], sys.argv[2], sys.argv[3]
K = 5
# An answer with characters beyond ASCII, so that some tokens may hold part of one.
QUESTION = "Write the word 'café' and the Japanese word for Japan (日本)."
MAX_TOKENS = 16


def check(name, condition, detail=""):
    if not condition:
        print(f"FAILED: {name}: {detail}", flush=True)
        sys.exit(1)
    print(f"ok: {name}", flush=True)


def entries_ok(api, entries, text, k=K):
    """Checks a list of {token, logprob, bytes, top_logprobs} entries against `text`."""
    check(f"{api}: an entry per token", 1 <= len(entries) <= MAX_TOKENS, entries)
    split = 0
    for i, e in enumerate(entries):
        top = e["top_logprobs"]
        lps = [t["logprob"] for t in top]
        check(f"{api}: token {i}: {k} alternatives", len(top) == k, top)
        check(f"{api}: token {i}: log probabilities <= 0", e["logprob"] <= 0 and all(lp <= 0 for lp in lps), e)
        check(f"{api}: token {i}: most likely first", lps == sorted(lps, reverse=True), lps)
        check(f"{api}: token {i}: the greedy token is the most likely, with its own logprob",
              top[0]["token"] == e["token"] and abs(top[0]["logprob"] - e["logprob"]) < 1e-5
              and top[0]["bytes"] == e["bytes"], (e["token"], top[0]))
        for t in [e] + top:
            if "\ufffd" in t["token"]:
                split += t is e
                check(f"{api}: token {i}: a piece of a character has its real bytes",
                      t["bytes"] and t["bytes"] != list("\ufffd".encode()), t)
            else:
                check(f"{api}: token {i}: bytes are the text's", t["bytes"] == list(t["token"].encode()), t)
    joined = bytes(b for e in entries for b in e["bytes"]).decode("utf-8", errors="replace")
    check(f"{api}: the tokens' bytes spell the answer", joined == text, (joined, text))
    return split


def plain(obj):
    """A client object (pydantic model) as plain data."""
    return json.loads(obj.model_dump_json()) if hasattr(obj, "model_dump_json") else obj


seen = {}
oa = openai.OpenAI(base_url=root + "/v1", api_key=key, max_retries=0, timeout=120)
question = [{"role": "user", "content": QUESTION}]

# Chat completions: the reference every other API is compared with.
r = oa.chat.completions.create(model=model, messages=question, temperature=0, max_tokens=MAX_TOKENS,
                               logprobs=True, top_logprobs=K)
answer = r.choices[0].message.content
chat = [plain(c) for c in r.choices[0].logprobs.content]
seen["chat_split_tokens"] = entries_ok("chat", chat, answer)
# The question asks for 日本, which SmolLM2's byte-level vocabulary spells in pieces of
# characters: without one, the bytes check above would have checked nothing of them.
check("chat: some tokens are pieces of a character", seen["chat_split_tokens"] > 0,
      (answer, [e["token"] for e in chat]))
reference = [(e["token"], [t["token"] for t in e["top_logprobs"]]) for e in chat]
shape = lambda entries: [(e["token"], [t["token"] for t in e["top_logprobs"]]) for e in entries]

# Responses, whole: `include` asks for them, `top_logprobs` for alternatives.
resp = oa.responses.create(model=model, input=QUESTION, temperature=0, max_output_tokens=MAX_TOKENS,
                           top_logprobs=K, include=["message.output_text.logprobs"])
part = plain(resp.output[0].content[0])
check("responses: text", part["text"] == answer, (part["text"], answer))
entries_ok("responses", part["logprobs"], answer)
check("responses: the same tokens as chat", shape(part["logprobs"]) == reference, shape(part["logprobs"]))

# Responses, streamed: each output_text.delta carries its tokens.
streamed, text = [], ""
for event in oa.responses.create(model=model, input=QUESTION, temperature=0, max_output_tokens=MAX_TOKENS,
                                 top_logprobs=K, include=["message.output_text.logprobs"], stream=True):
    if event.type == "response.output_text.delta":
        text += event.delta
        streamed += [plain(l) for l in event.logprobs or []]
check("responses stream: text", text == answer, (text, answer))
entries_ok("responses stream", streamed, answer)
check("responses stream: the same tokens as chat", shape(streamed) == reference, shape(streamed))
# Without `include` (and no alternatives asked) there are none.
resp = oa.responses.create(model=model, input=QUESTION, temperature=0, max_output_tokens=4)
check("responses: none unless asked", plain(resp.output[0].content[0])["logprobs"] == [], resp)

# Ollama: `logprobs: true`, `top_logprobs: K`, in /api/chat and /api/generate.
ol = ollama.Client(host=root, headers={"Authorization": f"Bearer {key}"}, timeout=120)
options = {"temperature": 0, "num_predict": MAX_TOKENS}
r = ol.chat(model=model, messages=question, options=options, logprobs=True, top_logprobs=K)
entries = [plain(l) for l in r.logprobs or []]
check("ollama chat: text", r.message.content == answer, (r.message.content, answer))
# The client's own type has no `bytes`: read them from the raw answer below.
check("ollama chat: the same tokens as chat", shape(entries) == reference, shape(entries))
streamed, text = [], ""
for chunk in ol.chat(model=model, messages=question, options=options, logprobs=True, top_logprobs=K,
                     stream=True):
    text += chunk.message.content or ""
    streamed += [plain(l) for l in chunk.logprobs or []]
check("ollama chat stream: text", text == answer, (text, answer))
check("ollama chat stream: the same tokens as chat", shape(streamed) == reference, shape(streamed))
for e in streamed:
    check("ollama chat stream: logprobs <= 0, K alternatives, the greedy token first",
          e["logprob"] <= 0 and len(e["top_logprobs"]) == K and e["top_logprobs"][0]["token"] == e["token"], e)
r = ol.generate(model=model, prompt=QUESTION, options=options, logprobs=True, top_logprobs=K)
gen = [plain(l) for l in r.logprobs or []]
check("ollama generate: an entry per token, K alternatives, greedy first",
      1 <= len(gen) <= MAX_TOKENS and all(len(e["top_logprobs"]) == K and e["top_logprobs"][0]["token"] == e["token"]
                                          and e["logprob"] <= 0 for e in gen), gen)
r = ol.chat(model=model, messages=question, options={"temperature": 0, "num_predict": 4})
check("ollama: none unless asked", not r.logprobs, r.logprobs)

# Ollama's raw answer, for the bytes its client type leaves out.
import urllib.request
body = json.dumps({"model": model, "messages": question, "options": options, "stream": False,
                   "logprobs": True, "top_logprobs": K}).encode()
req = urllib.request.Request(root + "/api/chat", data=body, headers={"Authorization": f"Bearer {key}",
                                                                     "Content-Type": "application/json"})
raw = json.load(urllib.request.urlopen(req, timeout=120))
entries_ok("ollama raw", raw["logprobs"], raw["message"]["content"])

seen["answer"] = answer
seen["tokens"] = len(chat)
print(json.dumps(seen, ensure_ascii=False), flush=True)
print("all passed", flush=True)
