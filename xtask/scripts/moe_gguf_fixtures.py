"""MoE GGUF fixtures made by llama.cpp's own tools, for shoal's GGUF MoE tests.

    python moe_gguf_fixtures.py OUT_ROOT --tokenizer DIR --llama-cpp SRC \
        --quantize LLAMA_QUANTIZE --logits LLAMA_LOGITS

Runs in the venv `cargo xtask setup` makes for llama.cpp's converter (torch, transformers,
numpy, sentencepiece at the versions its requirements name), with SRC/gguf-py first on the path.

1. A tiny Qwen3-MoE (4 layers of 8 experts, top 2, every layer sparse as llama.cpp's qwen3moe
   graph has it) with seeded random weights, written as a Hugging Face folder (`hf/`) with
   SmolLM2's tokenizer. Widths are multiples of 256 so the experts take K-quants.
2. `convert_hf_to_gguf.py --outtype f32` (llama.cpp's converter: its tensor layout and
   metadata are what this fixture is about), then `llama-quantize` to Q8_0 and Q4_K_M.
3. For each file, llama.cpp's logits on PROMPT (every position) and its greedy answer to CHAT,
   from `llama_logits` (xtask/scripts/llama_logits.cpp, linked against libllama):
   `<name>.logits.f32` (len(PROMPT) x vocab f32) and `reference.json`.
"""

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

SEED = 20261207
VOCAB = 49152  # SmolLM2's tokenizer
PROMPT = [(i * 7919) % 48000 + 100 for i in range(12)]
CHAT = [{"role": "user", "content": "What is the capital of France?"}]
CHAT_TOKENS = 10
EOS = [0, 2]
CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
    "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 512,
    "moe_intermediate_size": 256, "num_experts": 8, "num_experts_per_tok": 2,
    "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 4096,
    "tie_word_embeddings": False, "rope_scaling": None, "attention_bias": False,
    "vocab_size": VOCAB, "torch_dtype": "float32",
    "bos_token_id": 1, "eos_token_id": EOS, "pad_token_id": 2,
}
# (name, llama-quantize type or None for the converter's f32 output)
FILES = [("F32", None), ("Q8_0", "Q8_0"), ("Q4_K_M", "Q4_K_M")]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def weights(cfg):
    """Every parameter of the HF checkpoint, seeded: norms near one, a decisive router, an
    embedding as large as what the layers add (routing differs per token)."""
    rng = np.random.default_rng(SEED)
    h, hd = cfg["hidden_size"], cfg["head_dim"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    e, f = cfg["num_experts"], cfg["moe_intermediate_size"]

    def mat(rows, cols, std=None):
        std = std if std is not None else min(0.1, max(0.02, cols ** -0.5))
        return (std * rng.standard_normal((rows, cols))).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = {"model.embed_tokens.weight": mat(VOCAB, h, 1.0)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        w[f"{p}.input_layernorm.weight"] = norm(h)
        w[f"{p}.post_attention_layernorm.weight"] = norm(h)
        w[f"{p}.self_attn.q_proj.weight"] = mat(nh * hd, h)
        w[f"{p}.self_attn.k_proj.weight"] = mat(nkv * hd, h)
        w[f"{p}.self_attn.v_proj.weight"] = mat(nkv * hd, h)
        w[f"{p}.self_attn.o_proj.weight"] = mat(h, nh * hd)
        w[f"{p}.self_attn.q_norm.weight"] = norm(hd)
        w[f"{p}.self_attn.k_norm.weight"] = norm(hd)
        w[f"{p}.mlp.gate.weight"] = mat(e, h, 0.3)
        for x in range(e):
            w[f"{p}.mlp.experts.{x}.gate_proj.weight"] = mat(f, h)
            w[f"{p}.mlp.experts.{x}.up_proj.weight"] = mat(f, h)
            w[f"{p}.mlp.experts.{x}.down_proj.weight"] = mat(h, f)
    w["model.norm.weight"] = norm(h)
    w["lm_head.weight"] = mat(VOCAB, h, 0.3)
    return w


def hf_folder(out, tokenizer):
    from safetensors.numpy import save_file

    hf = out / "hf"
    hf.mkdir(parents=True)
    (hf / "config.json").write_text(json.dumps(CONFIG, indent=2) + "\n")
    save_file(weights(CONFIG), str(hf / "model.safetensors"), metadata={"format": "pt"})
    for name in ["tokenizer.json", "tokenizer_config.json"]:
        shutil.copyfile(tokenizer / name, hf / name)
    return hf


def chat_prompt(hf):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(hf))
    ids = tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True)
    return [int(t) for t in ids], tok


def llama_run(logits_bin, model, out_f32, n_gen, tokens):
    done = subprocess.run(
        [str(logits_bin), str(model), str(out_f32), str(n_gen), *map(str, tokens)],
        check=True, capture_output=True, text=True,
    )
    return [int(t) for t in done.stdout.split()]


def until_eos(tokens):
    for i, t in enumerate(tokens):
        if t in EOS:
            return tokens[:i]
    return tokens


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("root", type=Path)
    ap.add_argument("--tokenizer", type=Path, required=True)
    ap.add_argument("--llama-cpp", type=Path, required=True)
    ap.add_argument("--quantize", type=Path, required=True)
    ap.add_argument("--logits", type=Path, required=True)
    args = ap.parse_args()
    out = args.root.with_name(args.root.name + ".partial")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    hf = hf_folder(out, args.tokenizer)
    name = "qwen3moe"
    f32 = out / f"{name}.F32.gguf"
    log("convert_hf_to_gguf.py --outtype f32")
    subprocess.run(
        [sys.executable, str(args.llama_cpp / "convert_hf_to_gguf.py"), str(hf),
         "--outtype", "f32", "--outfile", str(f32)],
        check=True, stdout=subprocess.DEVNULL,
    )
    chat_ids, tok = chat_prompt(hf)
    reference = {"seed": SEED, "config": CONFIG, "prompt": PROMPT, "chat": CHAT,
                 "chat_prompt": chat_ids, "files": {}}
    for label, qtype in FILES:
        path = out / f"{name}.{label}.gguf"
        if qtype is not None:
            log(f"llama-quantize {qtype}")
            subprocess.run([str(args.quantize), str(f32), str(path), qtype],
                           check=True, capture_output=True)
        logits = out / f"{name}.{label}.logits.f32"
        greedy = llama_run(args.logits, path, logits, 6, PROMPT)
        chat = until_eos(llama_run(args.logits, path, out / "chat.tmp", CHAT_TOKENS, chat_ids))
        (out / "chat.tmp").unlink()
        reference["files"][label] = {
            "gguf": path.name,
            "logits": logits.name,
            "prompt_greedy": greedy,
            "chat_tokens": chat,
            "chat_text": tok.decode(chat),
        }
        log(f"{label}: greedy {greedy}, chat {chat}")
    shutil.rmtree(hf)
    (out / "reference.json").write_text(json.dumps(reference, indent=2) + "\n")
    shutil.rmtree(args.root, ignore_errors=True)
    out.rename(args.root)


if __name__ == "__main__":
    main()
