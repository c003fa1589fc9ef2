"""MoE GGUF fixtures made by llama.cpp's own tools, for shoal's GGUF MoE tests.

    python moe_gguf_fixtures.py OUT_ROOT --tokenizer DIR --llama-cpp SRC \
        --quantize LLAMA_QUANTIZE --logits LLAMA_LOGITS

Runs in the venv `cargo xtask setup` makes for llama.cpp's converter (torch, transformers,
numpy, sentencepiece at the versions its requirements name), with SRC/gguf-py first on the path.

1. Per model of MODELS (a tiny Qwen3-MoE, every layer sparse as llama.cpp's qwen3moe graph has
   it; a tiny GLM-4.5 with its dense first layer, shared expert and sigmoid router): seeded
   random weights, written as a Hugging Face folder with SmolLM2's tokenizer (plus the special
   tokens the converter asks for). Widths are multiples of 256 so the experts take K-quants.
2. `convert_hf_to_gguf.py --outtype f32` (llama.cpp's converter: its tensor layout and
   metadata are what this fixture is about), then `llama-quantize` to Q8_0 and Q4_K_M.
3. For each file, llama.cpp's logits on PROMPT (every position) and its greedy answer to CHAT,
   from `llama_logits` (xtask/scripts/llama_logits.cpp, linked against libllama):
   `<arch>.<type>.logits.f32` (len(PROMPT) x vocab f32) and `reference.json`
   (`models.<arch>.files.<type>`).
"""

import argparse
import hashlib
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
COMMON = {
    "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 512,
    "moe_intermediate_size": 256, "num_experts_per_tok": 2, "norm_topk_prob": True,
    "max_position_embeddings": 4096, "tie_word_embeddings": False, "rope_scaling": None,
    "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": EOS, "pad_token_id": 2,
}
# Each model: its llama.cpp architecture, config.json, and the tokens its converter asks the
# tokenizer for beyond SmolLM2's (added as special tokens after its vocabulary).
MODELS = {
    "qwen3moe": {
        "config": dict(COMMON, **{
            "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
            "num_experts": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
            "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "attention_bias": False,
            "vocab_size": VOCAB,
        }),
        "added_tokens": [],
    },
    # GLM-4.5's shape: a dense first layer, sigmoid-routed experts with a correction bias and
    # a shared expert, Q/K/V biases, per-head Q/K norms, RoPE on half of each head.
    "glm4moe": {
        "config": dict(COMMON, **{
            "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe",
            "n_routed_experts": 8, "n_shared_experts": 1, "first_k_dense_replace": 1,
            "n_group": 1, "topk_group": 1, "routed_scaling_factor": 2.5,
            "partial_rotary_factor": 0.5, "use_qk_norm": True, "attention_bias": True,
            "num_nextn_predict_layers": 0, "rms_norm_eps": 1e-5, "rope_theta": 1000000.0,
            "vocab_size": VOCAB + 64,
        }),
        # `_set_vocab_glm` names GLM's special tokens.
        "added_tokens": ["[gMASK]", "<|user|>", "<|observation|>"],
    },
}
# (name, llama-quantize type or None for the converter's f32 output)
FILES = [("F32", None), ("Q8_0", "Q8_0"), ("Q4_K_M", "Q4_K_M")]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def weights(arch, cfg):
    """Every parameter of the HF checkpoint, seeded per model: norms near one, a decisive
    router, an embedding as large as what the layers add (routing differs per token)."""
    rng = np.random.default_rng([SEED, int.from_bytes(hashlib.sha256(arch.encode()).digest()[:4], "little")])
    h, hd = cfg["hidden_size"], cfg["head_dim"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    e = cfg.get("num_experts") or cfg["n_routed_experts"]
    f, vocab = cfg["moe_intermediate_size"], cfg["vocab_size"]

    def mat(rows, cols, std=None):
        std = std if std is not None else min(0.1, max(0.02, cols ** -0.5))
        return (std * rng.standard_normal((rows, cols))).astype(np.float32)

    def vec(n, base=0.0, std=0.1):
        return (base + std * rng.standard_normal(n)).astype(np.float32)

    def mlp(prefix, width):
        w[f"{prefix}.gate_proj.weight"] = mat(width, h)
        w[f"{prefix}.up_proj.weight"] = mat(width, h)
        w[f"{prefix}.down_proj.weight"] = mat(h, width)

    w = {"model.embed_tokens.weight": mat(vocab, h, 1.0)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        w[f"{p}.input_layernorm.weight"] = vec(h, 1.0)
        w[f"{p}.post_attention_layernorm.weight"] = vec(h, 1.0)
        w[f"{p}.self_attn.q_proj.weight"] = mat(nh * hd, h)
        w[f"{p}.self_attn.k_proj.weight"] = mat(nkv * hd, h)
        w[f"{p}.self_attn.v_proj.weight"] = mat(nkv * hd, h)
        w[f"{p}.self_attn.o_proj.weight"] = mat(h, nh * hd)
        if cfg["attention_bias"]:
            for proj, rows in [("q_proj", nh * hd), ("k_proj", nkv * hd), ("v_proj", nkv * hd)]:
                w[f"{p}.self_attn.{proj}.bias"] = vec(rows, 0.0, 0.05)
        w[f"{p}.self_attn.q_norm.weight"] = vec(hd, 1.0)
        w[f"{p}.self_attn.k_norm.weight"] = vec(hd, 1.0)
        if i < cfg.get("first_k_dense_replace", 0):
            mlp(f"{p}.mlp", cfg["intermediate_size"])
            continue
        w[f"{p}.mlp.gate.weight"] = mat(e, h, 0.3)
        if "n_shared_experts" in cfg:
            w[f"{p}.mlp.gate.e_score_correction_bias"] = vec(e, 0.0, 0.1)
            mlp(f"{p}.mlp.shared_experts", f * cfg["n_shared_experts"])
        for x in range(e):
            mlp(f"{p}.mlp.experts.{x}", f)
    w["model.norm.weight"] = vec(h, 1.0)
    w["lm_head.weight"] = mat(vocab, h, 0.3)
    return w


def hf_folder(out, arch, spec, tokenizer):
    from safetensors.numpy import save_file

    hf = out / f"hf-{arch}"
    hf.mkdir(parents=True)
    cfg = spec["config"]
    (hf / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    save_file(weights(arch, cfg), str(hf / "model.safetensors"), metadata={"format": "pt"})
    shutil.copyfile(tokenizer / "tokenizer_config.json", hf / "tokenizer_config.json")
    tok = json.loads((tokenizer / "tokenizer.json").read_text())
    for i, content in enumerate(spec["added_tokens"]):
        tok["added_tokens"].append({
            "id": VOCAB + i, "content": content, "single_word": False, "lstrip": False,
            "rstrip": False, "normalized": False, "special": True,
        })
    (hf / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
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


def make_model(out, arch, spec, args):
    """The model's GGUF files, each with llama.cpp's logits and greedy answers."""
    hf = hf_folder(out, arch, spec, args.tokenizer)
    f32 = out / f"{arch}.F32.gguf"
    log(f"{arch}: convert_hf_to_gguf.py --outtype f32")
    subprocess.run(
        [sys.executable, str(args.llama_cpp / "convert_hf_to_gguf.py"), str(hf),
         "--outtype", "f32", "--outfile", str(f32)],
        check=True, stdout=subprocess.DEVNULL,
    )
    chat_ids, tok = chat_prompt(hf)
    made = {"config": spec["config"], "chat_prompt": chat_ids, "files": {}}
    for label, qtype in FILES:
        path = out / f"{arch}.{label}.gguf"
        if qtype is not None:
            log(f"{arch}: llama-quantize {qtype}")
            subprocess.run([str(args.quantize), str(f32), str(path), qtype],
                           check=True, capture_output=True)
        logits = out / f"{arch}.{label}.logits.f32"
        greedy = llama_run(args.logits, path, logits, 6, PROMPT)
        chat = until_eos(llama_run(args.logits, path, out / "chat.tmp", CHAT_TOKENS, chat_ids))
        (out / "chat.tmp").unlink()
        made["files"][label] = {
            "gguf": path.name,
            "logits": logits.name,
            "prompt_greedy": greedy,
            "chat_tokens": chat,
            "chat_text": tok.decode(chat),
        }
        log(f"{arch} {label}: greedy {greedy}, chat {chat}")
    shutil.rmtree(hf)
    return made


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
    reference = {"seed": SEED, "prompt": PROMPT, "chat": CHAT, "models": {}}
    for arch, spec in MODELS.items():
        reference["models"][arch] = make_model(out, arch, spec, args)
    (out / "reference.json").write_text(json.dumps(reference, indent=2) + "\n")
    shutil.rmtree(args.root, ignore_errors=True)
    out.rename(args.root)


if __name__ == "__main__":
    main()
