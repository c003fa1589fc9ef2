"""Models that speak each tool-call dialect through their own token stream: for every family
whose calls shoal parses (gpt-oss harmony, Qwen3-Coder, GLM-4.6/4.7, DeepSeek V3.1, Kimi K2,
MiniMax M2), a tiny model with

- a tokenizer carrying the family's special tokens as its real `tokenizer_config.json`
  declares them (the strings and `special` flags; SmolLM2's byte-level BPE underneath, the
  added tokens at ids past SmolLM2's 49152, or at SmolLM2's own id when it has that string),
- the family's real chat template (from the pinned llama-cpp-python sdist), and
- weights that make greedy decoding write the family's call (and thought) after the prompt.

A route is the text the model writes after a prompt tail: the template's own generation prompt
(`auto`, the call or thought the model makes unasked) or the opening shoal appends for a named
`tool_choice` (`named`). Most families get their own architecture (the family fixture's
config) with random weights plus a "bigram" path: the embedding of each token on a route is a
large unit direction and the head row of the token that follows it points along that
direction, so greedy decoding writes the route token after token whatever the prompt (every
architecture here is pre-norm, so the residual stream stays dominated by the current token's
embedding). A bigram has one successor per token, so routes whose tokens would need two cannot
be written this way. The XML dialects (Qwen3-Coder, MiniMax M2) need that everywhere (`>`,
`</`, line breaks), so their models are trained (`train`): a gpt-oss architecture with
sliding-window attention (`LOCAL`), fine-tuned on the rendered prompt's last tokens and each
route. Every route is checked here with mlx-lm: the chat template applied by transformers,
greedy generation, exactly the route's tokens.

    python dialect_fixtures.py OUT_ROOT --tokenizer DIR --templates DIR

writes OUT_ROOT/<dialect>/{config.json, model.safetensors, tokenizer.json,
tokenizer_config.json, routes.json, openai_request.json, openai_request_prompt.json} and
OUT_ROOT/manifest.json.
"""

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_flatten, tree_unflatten

sys.path.insert(0, str(Path(__file__).resolve().parent))
import family_fixtures as ff  # noqa: E402  (the same directory; its configs and layouts)

BASE_VOCAB = 49152
VOCAB = BASE_VOCAB + 64  # room for each family's added tokens, padded as real vocabularies are
EMBED_SCALE = 40.0  # route tokens' embedding norm over sqrt(hidden): far above what layers add
HEAD_SCALE = 6.0  # a successor's logit is about HEAD_SCALE * sqrt(hidden): ~48 against ~10
THOUGHT = "Let me check"
# The trained models (see `train`): steps of Adam over all routes at once and its rate, the
# prompt tokens a route can see, what the head rows of the tokens no route writes are scaled by
# (random, near zero), and the logit that stands for them in the loss (above theirs).
TRAIN_STEPS = 80
TRAIN_LR = 3e-3
WINDOW = 32  # the layers' receptive field: 2 sliding layers x a window of 16 (`LOCAL`)
BACKGROUND = 0.05
OTHERS = 2.0
# The trained models' architecture: gpt-oss (a Mixture-of-Experts family shoal runs) whose layers
# attend to a sliding window, but for the one full-attention layer mlx-lm requires, whose output
# projection is zero (`train`): a route sees at most the last `WINDOW` prompt tokens, and
# training on those is training on what the node will see, whatever comes before.
LOCAL = {"layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
         "sliding_window": 16}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]

# Each family's added tokens with their `special` flags, as the family's published
# tokenizer_config.json declares them (gpt-oss's o200k_harmony: its named tokens, not the
# reserved ones); only the ids differ.
T, F = True, False
QWEN_TOKENS = [
    ("<|endoftext|>", T), ("<|im_start|>", T), ("<|im_end|>", T), ("<|object_ref_start|>", T),
    ("<|object_ref_end|>", T), ("<|box_start|>", T), ("<|box_end|>", T), ("<|quad_start|>", T),
    ("<|quad_end|>", T), ("<|vision_start|>", T), ("<|vision_end|>", T), ("<|vision_pad|>", T),
    ("<|image_pad|>", T), ("<|video_pad|>", T), ("<tool_call>", F), ("</tool_call>", F),
    ("<|fim_prefix|>", F), ("<|fim_middle|>", F), ("<|fim_suffix|>", F), ("<|fim_pad|>", F),
    ("<|repo_name|>", F), ("<|file_sep|>", F), ("<tool_response>", F), ("</tool_response>", F),
    ("<think>", F), ("</think>", F),
]
GLM_TOKENS = [(t, T) for t in [
    "<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
    "<|assistant|>", "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>",
    "<|begin_of_video|>", "<|end_of_video|>", "<|begin_of_audio|>", "<|end_of_audio|>",
    "<|begin_of_transcription|>", "<|end_of_transcription|>", "<|code_prefix|>",
    "<|code_middle|>", "<|code_suffix|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
    "<tool_response>", "</tool_response>", "<arg_key>", "</arg_key>", "<arg_value>",
    "</arg_value>", "/nothink", "<|begin_of_box|>", "<|end_of_box|>", "<|image|>", "<|video|>",
]]
DEEPSEEK_TOKENS = [
    ("<｜begin▁of▁sentence｜>", T), ("<｜end▁of▁sentence｜>", T), ("<｜▁pad▁｜>", T),
    ("<｜fim▁hole｜>", F), ("<｜fim▁begin｜>", F), ("<｜fim▁end｜>", F), ("<｜User｜>", F),
    ("<｜Assistant｜>", F), ("<think>", F), ("</think>", F), ("<｜tool▁calls▁begin｜>", F),
    ("<｜tool▁calls▁end｜>", F), ("<｜tool▁call▁begin｜>", F), ("<｜tool▁call▁end｜>", F),
    ("<｜tool▁outputs▁begin｜>", F), ("<｜tool▁outputs▁end｜>", F), ("<｜tool▁output▁begin｜>", F),
    ("<｜tool▁output▁end｜>", F), ("<｜tool▁sep｜>", F), ("<｜search▁begin｜>", F),
    ("<｜search▁end｜>", F),
]
KIMI_TOKENS = [(t, T) for t in [
    "[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|start_header_id|>",
    "<|end_header_id|>", "[EOT]", "<|im_system|>", "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>",
    "<|tool_call_end|>", "<|im_middle|>", "<think>", "</think>",
]]
HARMONY_TOKENS = [(t, T) for t in [
    "<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>", "<|channel|>",
    "<|start|>", "<|end|>", "<|message|>", "<|call|>", "<|endofprompt|>",
]]
MINIMAX_TOKENS = [
    ("]~!b[", T), ("]~b]", T), ("[e~[", T), ("]!d~[", T), ("]!p~[", T), ("<think>", F),
    ("</think>", F), ("<minimax:tool_call>", F), ("</minimax:tool_call>", F),
]

GLM_CALL = ("<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
            "</tool_call><|observation|>")
# The XML dialects' calls, written by trained models (a bigram cannot: their `>`, `</` and line
# breaks recur with different successors): two parameters, the second an integer that the
# model writes as text and shoal types by the tool's schema.
FORECAST = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city", "days"]}}}
FORECAST_CALL = ["get_weather", {"city": "Paris", "days": 3}]
QWEN3_CODER_CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>")
MINIMAX_CALL = ('<minimax:tool_call>\n<invoke name="get_weather">\n'
                '<parameter name="city">Paris</parameter>\n<parameter name="days">3</parameter>\n'
                "</invoke>\n</minimax:tool_call>")
DEEPSEEK_CALL = ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
                 '{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>')

# Each dialect: the family fixture it is built on (with `config`'s changes; `trained`: trained,
# not a bigram), its real template, its added tokens, the tokenizer_config's bos/eos/pad and
# the generation's end tokens, and its routes: (kind, tool, the prompt's tail, what the model
# writes, the thought in it, the call it makes). Kinds:
# `auto` (the template's generation prompt, no switch set), `thinking` (the same with the
# template's thinking switch on), `named` (the tail is what shoal appends for a named
# `tool_choice`).
DIALECTS = {
    "harmony": {
        "family": "gpt_oss", "template": "openai-gpt-oss-120b", "tokens": HARMONY_TOKENS,
        "bos": "<|startoftext|>", "eos": "<|return|>", "pad": "<|endoftext|>",
        "ends": ["<|return|>", "<|endoftext|>", "<|call|>"],
        "routes": [
            ("auto", WEATHER, "<|start|>assistant",
             f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|return|>", THOUGHT, None),
            ("named", WEATHER,
             " to=functions.get_weather<|channel|>commentary json<|message|>{",
             '"city": "Paris"}<|call|>', "", ["get_weather", {"city": "Paris"}]),
        ],
    },
    "qwen3_coder": {
        "family": "gpt_oss", "config": LOCAL, "template": "Qwen3-Coder", "tokens": QWEN_TOKENS,
        "bos": None, "eos": "<|im_end|>", "pad": "<|endoftext|>",
        "ends": ["<|im_end|>", "<|endoftext|>"], "trained": True,
        "routes": [
            ("auto", FORECAST, "<|im_start|>assistant\n", f"{QWEN3_CODER_CALL}<|im_end|>", "",
             FORECAST_CALL),
            ("named", FORECAST, "<tool_call>\n<function=get_weather>\n",
             QWEN3_CODER_CALL.split("<function=get_weather>\n")[1] + "<|im_end|>", "",
             FORECAST_CALL),
        ],
    },
    "glm": {
        "family": "glm4_moe", "template": "GLM-4.7-Flash", "tokens": GLM_TOKENS,
        "bos": None, "eos": "<|endoftext|>", "pad": "<|endoftext|>",
        "ends": ["<|endoftext|>", "<|user|>", "<|observation|>"],
        "routes": [
            ("auto", WEATHER, "<|assistant|><think>", f"{THOUGHT}</think>{GLM_CALL}",
             THOUGHT, ["get_weather", {"city": "Paris"}]),
        ],
    },
    "deepseek_v31": {
        "family": "deepseek_v3", "template": "deepseek-ai-DeepSeek-V3.1",
        "tokens": DEEPSEEK_TOKENS, "bos": "<｜begin▁of▁sentence｜>",
        "eos": "<｜end▁of▁sentence｜>", "pad": "<｜▁pad▁｜>", "ends": ["<｜end▁of▁sentence｜>"],
        "routes": [
            ("auto", WEATHER, "<｜Assistant｜><think></think>", DEEPSEEK_CALL,
             "", ["get_weather", {"city": "Paris"}]),
            # With the template's thinking switch on (`enable_thinking`, which this template
            # reads as `thinking`), the prompt opens the thought.
            ("thinking", WEATHER, "<｜Assistant｜><think>", f"{THOUGHT}</think>{DEEPSEEK_CALL}",
             THOUGHT, ["get_weather", {"city": "Paris"}]),
        ],
    },
    "kimi_k2": {
        "family": "deepseek_v3", "template": "Kimi-K2-Thinking", "tokens": KIMI_TOKENS,
        "bos": "[BOS]", "eos": "[EOS]", "pad": "[EOS]", "ends": ["<|im_end|>", "[EOS]"],
        "routes": [
            ("auto", WEATHER, "<|im_assistant|>assistant<|im_middle|>",
             f"<think>{THOUGHT}</think><|tool_calls_section_begin|><|tool_call_begin|>"
             "functions.get_weather:0<|tool_call_argument_begin|>"
             '{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>',
             THOUGHT, ["get_weather", {"city": "Paris"}]),
        ],
    },
    "minimax_m2": {
        "family": "gpt_oss", "config": LOCAL, "template": "MiniMax-M2",
        "tokens": MINIMAX_TOKENS, "bos": "]~!b[", "eos": "[e~[", "pad": None, "ends": ["[e~["],
        "trained": True,
        "routes": [
            ("auto", FORECAST, "]~b]ai\n<think>\n",
             f"{THOUGHT}</think>\n\n{MINIMAX_CALL}[e~[", THOUGHT, FORECAST_CALL),
            ("named", FORECAST,
             '</think>\n\n<minimax:tool_call>\n<invoke name="get_weather">\n',
             MINIMAX_CALL.split('<invoke name="get_weather">\n')[1] + "[e~[", "",
             FORECAST_CALL),
        ],
    },
}


# The families' other real templates, on the same models' tokens: GLM-4.6 (whose prompt does
# not open the thought: the model writes `<think>`; it writes no line breaks here, which a
# bigram could not repeat) and Kimi K2 Instruct (no thought).
DIALECTS["glm46"] = dict(DIALECTS["glm"], template="GLM-4.6", routes=[
    ("auto", WEATHER, "<|assistant|>", f"<think>{THOUGHT}</think>{GLM_CALL}", THOUGHT,
     ["get_weather", {"city": "Paris"}]),
])
DIALECTS["kimi_k2_instruct"] = dict(DIALECTS["kimi_k2"], template="moonshotai-Kimi-K2", routes=[
    ("auto", WEATHER, "<|im_assistant|>assistant<|im_middle|>",
     "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
     '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>'
     "<|im_end|>", "", ["get_weather", {"city": "Paris"}]),
])

# A bigram writes one route per prompt tail, so a family whose thought and call cannot share
# one route (harmony's second header repeats the first's tokens) gets a second model for the
# other: the same family, tokenizer and template, another route.
DIALECTS["harmony_unasked"] = dict(DIALECTS["harmony"], routes=[
    ("auto", WEATHER, "<|start|>assistant",
     "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
     '{"city": "Paris"}<|call|>', "", ["get_weather", {"city": "Paris"}]),
])



def log(msg):
    print(msg, file=sys.stderr, flush=True)


def added_ids(tokens, vocab):
    """Each added token's id: SmolLM2's own when it has that string, else the next past it."""
    ids, next_id = {}, BASE_VOCAB
    for content, _ in tokens:
        if content in vocab:
            ids[content] = vocab[content]
        else:
            ids[content], next_id = next_id, next_id + 1
    assert next_id <= VOCAB, next_id
    return ids


def write_tokenizer(spec, base_dir, template_dir, folder):
    """tokenizer.json (SmolLM2's BPE, the family's added tokens only) and tokenizer_config.json
    (the family's special flags, bos/eos/pad and its real chat template)."""
    tok = json.loads((base_dir / "tokenizer.json").read_text())
    ids = added_ids(spec["tokens"], tok["model"]["vocab"])
    entry = lambda c, s: {"content": c, "lstrip": False, "normalized": False,  # noqa: E731
                          "rstrip": False, "single_word": False, "special": s}
    tok["added_tokens"] = [dict(id=ids[c], **entry(c, s)) for c, s in spec["tokens"]]
    (folder / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False) + "\n")
    template = (template_dir / f"{spec['template']}.jinja").read_text()
    config = {
        "added_tokens_decoder": {str(ids[c]): entry(c, s) for c, s in spec["tokens"]},
        "bos_token": spec["bos"], "eos_token": spec["eos"], "pad_token": spec["pad"],
        "add_bos_token": False, "clean_up_tokenization_spaces": False,
        "model_max_length": 131072, "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": template,
    }
    (folder / "tokenizer_config.json").write_text(
        json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    return ids


def route_tokens(tokenizer, spec, bigram=True):
    """Each route as (tail's last token, the tokens written), and the successor table of all
    routes together; for a bigram, a token that would need two successors is refused."""
    routes, after = [], {}
    for kind, tool, tail, written, thought, call in spec["routes"]:
        last = tokenizer.encode(tail, add_special_tokens=False).ids[-1]
        tokens = tokenizer.encode(written, add_special_tokens=False).ids
        for a, b in zip([last] + tokens, tokens):
            if after.setdefault(a, b) != b and bigram:
                raise SystemExit(f"{spec['template']}: token {tokenizer.decode([a])!r} would be "
                                 f"followed by two tokens; a bigram cannot write these routes")
        routes.append((kind, tool, tail, last, tokens, thought, call))
    return routes, after


def bigram(model, after, family):
    """Route tokens' embeddings become large orthogonal directions; each successor's head row
    points along its predecessors' directions (over the final norm's weight)."""
    params = dict(tree_flatten(model.parameters()))
    embed, head = params["model.embed_tokens.weight"], params["lm_head.weight"]
    hidden = embed.shape[1]
    assert len(after) <= hidden, f"{len(after)} route tokens, hidden {hidden}"
    q, _ = mx.linalg.qr(mx.random.normal((hidden, hidden), key=ff.key_for(family, "bigram")),
                        stream=mx.cpu)
    directions = {t: q[:, i] for i, t in enumerate(sorted(after))}
    norm = params["model.norm.weight"]
    rows = {}
    for token, next_token in after.items():
        rows.setdefault(next_token, []).append(directions[token])
    embed_updates = [(t, EMBED_SCALE * hidden**0.5 * d) for t, d in directions.items()]
    for t, v in embed_updates:
        embed[t] = v
    for t, ds in rows.items():
        head[t] = HEAD_SCALE * sum(ds) / norm
    model.update(tree_unflatten([("model.embed_tokens.weight", embed),
                                 ("lm_head.weight", head)]))
    mx.eval(model.parameters())


def train(model, tokenizer, routes, ends, name):
    """Fine-tunes every layer, the final norm and the head rows of the written tokens (Adam,
    `TRAIN_STEPS` steps over all routes at once) until greedy decoding writes each route. A
    route sees only the last `WINDOW` tokens of its prompt (`LOCAL`), so each sample is those
    tokens of the real prompt (the template rendered by transformers, as `check_routes` renders
    it) followed by the route: a step costs tens of milliseconds on a CPU, where the whole
    prompt would cost seconds. The head rows of the tokens no route writes are shrunk to near
    zero and stand in the loss as one column of logit `OTHERS`, which each written token must
    beat; the embedding stays random (its gradient and the whole head's product would cost
    seconds a step). The one full-attention layer's output projection is zeroed and frozen,
    so the prompt before the window adds nothing. Deterministic: no sampling, every initial
    value drawn from a seeded key."""
    targets = sorted({t for r in routes for t in r[4]} | set(ends))
    column = {t: i for i, t in enumerate(targets)}
    windows = []
    for kind, tool, tail, _, tokens, _, _ in routes:
        prompt = tokenizer.encode(render(tokenizer, kind, tool, tail), add_special_tokens=False)
        windows.append((prompt[-WINDOW:], tokens))
    head = model.lm_head.weight

    class Trained(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = model.model
            self.head = head[mx.array(targets)]

    trained = Trained()
    trained.body.embed_tokens.freeze()
    for kind, layer in zip(model.args.layer_types, trained.body.layers):
        if kind == "full_attention":
            o_proj = layer.self_attn.o_proj
            zero = [(k, mx.zeros_like(v)) for k, v in tree_flatten(o_proj.parameters())]
            o_proj.update(tree_unflatten(zero))
            o_proj.freeze()

    length = max(len(c) + len(w) for c, w in windows) - 1
    inputs, rows, cols, labels = [], [], [], []
    for i, (context, written) in enumerate(windows):
        seq = context + written
        inputs.append(seq[:-1] + [0] * (length + 1 - len(seq)))
        for p in range(len(context), len(seq)):
            rows.append(i)
            cols.append(p - 1)
            labels.append(column[seq[p]])
    batch = [mx.array(x) for x in (inputs, rows, cols, labels)]

    def loss_fn(trained, inputs, rows, cols, labels):
        logits = trained.body(inputs)[rows, cols] @ trained.head.T
        others = mx.full((logits.shape[0], 1), OTHERS)
        return nn.losses.cross_entropy(mx.concatenate([logits, others], axis=1), labels).mean()

    step = nn.value_and_grad(trained, loss_fn)
    opt = optim.Adam(learning_rate=TRAIN_LR)
    for _ in range(TRAIN_STEPS):
        loss, grads = step(trained, *batch)
        opt.update(trained, grads)
        mx.eval(trained.parameters(), opt.state, loss)
    others = head * BACKGROUND
    others[mx.array(targets)] = trained.head
    model.lm_head.weight = others
    model.unfreeze()
    mx.eval(model.parameters())
    return float(loss)


def render(tokenizer, kind, tool, tail):
    """The route's prompt as transformers renders it (`tool` None: offered no tools)."""
    switch = {"enable_thinking": True} if kind == "thinking" else {}
    tools = {"tools": [tool]} if tool is not None else {}
    text = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=False,
                                         **tools, **switch)
    return text + tail if kind == "named" else text


def check_routes(folder, routes, ends):
    """mlx-lm, from the folder: the template applied by transformers with the route's tool,
    the tail appended for a named route, greedy decoding writes exactly the route. Returns each
    route's prompt length in tokens (what every API must report as the prompt's tokens) and
    whether the template renders the tools at all (a node describes them itself where not)."""
    from mlx_lm.generate import generate_step
    from mlx_lm.utils import load_model, load_tokenizer

    model, _ = load_model(folder)
    # transformers' own tokenizer: mlx-lm's wrapper sets the thinking switch when none is
    # given, and shoal passes none unless the client does.
    tokenizer = load_tokenizer(folder)._tokenizer
    lengths = []
    for kind, tool, tail, _, tokens, _, _ in routes:
        text = render(tokenizer, kind, tool, tail)
        if kind != "named" and not text.endswith(tail):
            raise SystemExit(f"{folder.name}: the prompt ends {text[-60:]!r}, not {tail!r}")
        prompt = tokenizer.encode(text, add_special_tokens=False)
        lengths.append((len(prompt), text != render(tokenizer, kind, None, tail)))
        got = []
        for token, _ in generate_step(mx.array(prompt), model, max_tokens=len(tokens) + 2):
            got.append(int(token))
            if int(token) in ends:
                break
        if got != tokens:
            raise SystemExit(f"{folder.name} {kind}: mlx-lm wrote {tokenizer.decode(got)!r}, "
                             f"not {tokenizer.decode(tokens)!r}")
    return lengths


# A conversation as an OpenAI client sends it (issue 49 item 3): a system prompt, a question,
# the assistant's call (content null, arguments a JSON string), the tool's result, the answer,
# and a next question, with two tools offered. The key order of the arguments and of the second
# tool's schema is not alphabetical.
OPENAI_REQUEST = {
    "model": "dialect",
    "messages": [
        {"role": "system", "content": "You answer with the tools."},
        {"role": "user", "content": "What is the weather in Zürich?"},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "a1B2c3D4e", "type": "function",
            "function": {"name": "get_weather",
                         "arguments": "{\"city\": \"Zürich\", \"unit\": \"celsius\"}"}}]},
        {"role": "tool", "tool_call_id": "a1B2c3D4e",
         "content": "{\"temperature\": 21.5, \"sky\": \"clear\"}"},
        {"role": "assistant", "content": "It is 21.5 °C and clear."},
        {"role": "user", "content": "And the time there?"},
    ],
    "tools": [WEATHER, {"type": "function", "function": {
        "name": "get_time", "description": "Local time, offset in hours",
        "parameters": {"type": "object", "required": [],
                       "properties": {"offset": {"type": "number", "default": 0.5}}}}}],
}


# The moment transformers' `strftime_now` tells while rendering OPENAI_REQUEST (year, month,
# day, midnight UTC): the Rust test pins shoal's template clock to it.
OPENAI_REQUEST_DATE = (2025, 1, 1)


def write_openai_request(folder, tokenizer, renders_tools):
    """OPENAI_REQUEST (without `tools` where the template ignores them: a node describes them
    itself there) and transformers' rendering of it: `apply_chat_template(messages, tools=...,
    add_generation_prompt=True)` over the request's own messages and tools, each call's
    `arguments` string read as the mapping transformers' templates take (what vLLM and
    llama-server do with an OpenAI request). A node given the same body must build this prompt
    token for token."""
    request = json.loads(json.dumps(OPENAI_REQUEST))
    if not renders_tools:
        del request["tools"]
    messages = json.loads(json.dumps(request["messages"]))
    for m in messages:
        for call in m.get("tool_calls", []):
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    tools = {"tools": request["tools"]} if "tools" in request else {}
    from jinja2.exceptions import SecurityError
    from transformers.utils import chat_template_utils

    class PinnedClock(chat_template_utils.datetime):
        """`strftime_now` tells OPENAI_REQUEST_DATE (gpt-oss states the date): the fixture
        stays the same whatever day it is made, and the test pins shoal's clock to it."""

        @classmethod
        def now(cls, tz=None):
            return cls(*OPENAI_REQUEST_DATE)

    chat_template_utils.datetime = PinnedClock
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                             tokenize=False, **tools)
        reference = {"text": text, "ids": tokenizer.encode(text, add_special_tokens=False)}
    except SecurityError as e:
        # transformers renders in jinja2's immutable sandbox: a template that appends to a
        # list (Kimi K2 Thinking's, for each call) cannot be rendered by it at all.
        reference = {"transformers_refuses": f"{type(e).__name__}: {e}"}
    (folder / "openai_request.json").write_text(
        json.dumps(request, indent=2, ensure_ascii=False) + "\n")
    (folder / "openai_request_prompt.json").write_text(
        json.dumps(reference, ensure_ascii=False) + "\n")


def build_dialect(name, root, base_dir, template_dir):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    spec = DIALECTS[name]
    family = ff.FAMILIES[spec["family"]]
    out = root / f"{name}.partial"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    ids = write_tokenizer(spec, base_dir, template_dir, out)
    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    routes, after = route_tokens(tokenizer, spec, bigram=not spec.get("trained"))
    ends = [ids[t] for t in spec["ends"]]
    tokens = {"bos_token_id": ids.get(spec["bos"]), "eos_token_id": ends,
              "pad_token_id": ids.get(spec["pad"])}
    config = dict(family["config"], **spec.get("config", {}), vocab_size=VOCAB,
                  torch_dtype="float32", **tokens)
    model_class, args_class = ff._get_classes(config)
    model = model_class(args_class.from_dict(config))
    ff.randomize(model, f"dialect/{name}", family.get("norm_base", 1.0), family.get("std", ()))
    if spec.get("trained"):
        (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        started = time.monotonic()
        loss = train(model, AutoTokenizer.from_pretrained(out), routes, ends, name)
        log(f"dialect fixtures: {name} trained, loss {loss:.4f}, "
            f"{time.monotonic() - started:.1f} s")
    else:
        bigram(model, after, name)
    if family.get("experts_mxfp4"):
        ff.nn.quantize(model, 32, 4, mode="mxfp4",
                       class_predicate=lambda p, m: ".experts." in p and hasattr(m, "to_quantized"))
    weights = ff.HF_LAYOUT[spec["family"]](dict(tree_flatten(model.parameters())), config)
    mx.save_safetensors(str(out / "model.safetensors"), dict(sorted(weights.items())),
                        metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    lengths = check_routes(out, routes, ends)
    written = [{"kind": kind, "tool": tool, "tail": tail, "tokens": len(tokens),
                "thought": thought, "call": call, "prompt_tokens": length,
                "template_renders_tools": renders}
               for (kind, tool, tail, _, tokens, thought, call), (length, renders)
               in zip(routes, lengths)]
    (out / "routes.json").write_text(json.dumps(written, indent=2, ensure_ascii=False) + "\n")
    write_openai_request(out, AutoTokenizer.from_pretrained(out),
                         all(renders for _, renders in lengths))
    final = root / name
    shutil.rmtree(final, ignore_errors=True)
    out.rename(final)
    log(f"dialect fixtures: {name} ({spec['family']}, {spec['template']}): "
        f"{', '.join(r[0] for r in routes)} routes written as mlx-lm checked them")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--templates", type=Path, required=True)
    parser.add_argument("--dialects", default=",".join(DIALECTS))
    args = parser.parse_args()
    mx.set_default_device(mx.cpu)
    args.root.mkdir(parents=True, exist_ok=True)
    for name in args.dialects.split(","):
        build_dialect(name, args.root, args.tokenizer, args.templates)
    manifest = sorted(d for d in DIALECTS if (args.root / d / "routes.json").exists())
    (args.root / "manifest.json").write_text(json.dumps(manifest) + "\n")


if __name__ == "__main__":
    main()
