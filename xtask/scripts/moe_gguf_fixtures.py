"""MoE GGUF fixtures made by llama.cpp's own tools, for shoal's GGUF MoE tests.

    python moe_gguf_fixtures.py OUT_ROOT --tokenizer DIR --llama-cpp SRC \
        --quantize LLAMA_QUANTIZE --logits LLAMA_LOGITS

Runs in the venv `cargo xtask setup` makes for llama.cpp's converter (torch, transformers,
numpy, sentencepiece at the versions its requirements name), with SRC/gguf-py first on the path.

1. Per model of MODELS (a tiny Qwen3-MoE, every layer sparse as llama.cpp's qwen3moe graph has
   it; a tiny GLM-4.5 with its dense first layer, shared expert and sigmoid router; a tiny
   gpt-oss in OpenAI's released layout; a tiny DeepSeek V3 with latent attention): seeded
   random weights, written as a Hugging Face folder with SmolLM2's tokenizer (plus the special
   tokens the converter asks for). Widths are multiples of 256 so the experts take K-quants.
2. `convert_hf_to_gguf.py --outtype f32` (llama.cpp's converter: its tensor layout and
   metadata are what this fixture is about), then `llama-quantize` to Q8_0 and Q4_K_M; gpt-oss
   instead converts two folders of the same weights (`files`): MXFP4 experts as released
   (the converter's MXFP4 path) and the float layout.
3. For each file, llama.cpp's logits on PROMPT (every position) and its greedy answer to CHAT
   (for a quantized file also its logits and greedy tokens on the file's weights expanded to
   f32 by `llama-quantize ... F32`: `<arch>.<type>.dequantized.logits.f32`),
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
    # gpt-oss in OpenAI's released layout: experts in MXFP4 (`*_blocks`, `*_scales`, gate and
    # up rows interleaved), biases everywhere, attention sinks, YaRN, every other layer sliding
    # (a window of 4, so the 12-token prompt meets it). The MXFP4 file is the converter's
    # MXFP4 path; the F32 file the same weights expanded, through its float path.
    "gpt-oss": {
        "config": dict(COMMON, **{
            "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
            "intermediate_size": 256, "num_local_experts": 8, "experts_per_token": 2,
            "sliding_window": 4, "swiglu_limit": 7.0, "attention_bias": True,
            "layer_types": ["sliding_attention", "full_attention"] * 2,
            "rms_norm_eps": 1e-5, "rope_theta": 150000.0, "max_position_embeddings": 131072,
            "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                             "beta_slow": 1.0, "truncate": False,
                             "original_max_position_embeddings": 4096},
            "vocab_size": VOCAB,
        }),
        "added_tokens": [],
        "files": [("F32", "dense"), ("MXFP4", "mxfp4")],
    },
    # DeepSeek V3's shape (llama.cpp's `deepseek2`): latent attention with a query bottleneck,
    # YaRN as V3 has it (mscale 1, mscale_all_dim 1), a dense first layer, sigmoid routing with
    # the correction bias, a shared expert and the routed weights normalized and scaled.
    "deepseek2": {
        "config": dict(COMMON, **{
            "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
            "num_key_value_heads": 4, "q_lora_rank": 256, "kv_lora_rank": 256,
            "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 64,
            "n_routed_experts": 8, "n_shared_experts": 1, "first_k_dense_replace": 1,
            "n_group": 1, "topk_group": 1, "routed_scaling_factor": 2.5, "moe_layer_freq": 1,
            "scoring_func": "sigmoid", "topk_method": "noaux_tc", "num_nextn_predict_layers": 0,
            "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 163840,
            "rope_scaling": {"type": "yarn", "factor": 40.0, "beta_fast": 32.0,
                             "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                             "original_max_position_embeddings": 4096},
            "attention_bias": False, "vocab_size": VOCAB,
        }),
        "added_tokens": [],
    },
}
# The released checkpoint's `quantization_config`: what makes the converter take its MXFP4 path.
MXFP4_QUANT = {"quant_method": "mxfp4",
               "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                          "model.embed_tokens", "lm_head"]}
# E2M1's sixteen values, as OCP's microscaling format and OpenAI's checkpoint code them.
FP4 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)
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


def gpt_oss_weights(arch, cfg, layout):
    """gpt-oss's parameters in OpenAI's released layout (`layout` "mxfp4": experts as random
    E2M1 codes under random exponents, `*_blocks` [experts, rows, groups, 16] with element 2i
    in byte i's low nibble, `*_scales` [experts, rows, groups]) or the same values expanded
    ("dense": transformers' float layout, `gate_up_proj` [experts, in, 2 * width])."""
    rng = np.random.default_rng([SEED, int.from_bytes(hashlib.sha256(arch.encode()).digest()[:4], "little")])
    h, hd = cfg["hidden_size"], cfg["head_dim"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    e, f, vocab = cfg["num_local_experts"], cfg["intermediate_size"], cfg["vocab_size"]

    def mat(rows, cols, std=None):
        std = std if std is not None else min(0.1, max(0.02, cols ** -0.5))
        return (std * rng.standard_normal((rows, cols))).astype(np.float32)

    def vec(n, base=0.0, std=0.1):
        return (base + std * rng.standard_normal(n)).astype(np.float32)

    def mxfp4(rows, cols):
        codes = rng.integers(0, 16, (e, rows, cols), dtype=np.uint8)
        exps = rng.integers(120, 123, (e, rows, cols // 32), dtype=np.uint8)
        floats = FP4[codes] * np.exp2(exps.astype(np.float32) - 127).repeat(32, axis=-1)
        pairs = codes.reshape(e, rows, cols // 32, 16, 2)
        blocks = (pairs[..., 0] | (pairs[..., 1] << 4)).astype(np.uint8)
        return blocks, exps, floats.astype(np.float32)

    w = {"model.embed_tokens.weight": mat(vocab, h, 1.0)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        w[f"{p}.input_layernorm.weight"] = vec(h, 1.0)
        w[f"{p}.post_attention_layernorm.weight"] = vec(h, 1.0)
        for proj, rows, cols in [("q_proj", nh * hd, h), ("k_proj", nkv * hd, h),
                                 ("v_proj", nkv * hd, h), ("o_proj", h, nh * hd)]:
            w[f"{p}.self_attn.{proj}.weight"] = mat(rows, cols)
            w[f"{p}.self_attn.{proj}.bias"] = vec(rows, 0.0, 0.05)
        w[f"{p}.self_attn.sinks"] = vec(nh, 0.0, 1.0)
        w[f"{p}.mlp.router.weight"] = mat(e, h, 0.3)
        w[f"{p}.mlp.router.bias"] = vec(e, 0.0, 0.1)
        x = f"{p}.mlp.experts"
        for proj, rows, cols in [("gate_up_proj", 2 * f, h), ("down_proj", h, f)]:
            blocks, scales, floats = mxfp4(rows, cols)
            if layout == "mxfp4":
                w[f"{x}.{proj}_blocks"], w[f"{x}.{proj}_scales"] = blocks, scales
            else:
                w[f"{x}.{proj}"] = np.ascontiguousarray(floats.transpose(0, 2, 1))
            w[f"{x}.{proj}_bias"] = (0.05 * rng.standard_normal((e, rows))).astype(np.float32)
    w["model.norm.weight"] = vec(h, 1.0)
    w["lm_head.weight"] = mat(vocab, h, 0.3)
    return w


def deepseek_weights(arch, cfg):
    """DeepSeek V3's parameters under Hugging Face's names, seeded as [`weights`]."""
    rng = np.random.default_rng([SEED, int.from_bytes(hashlib.sha256(arch.encode()).digest()[:4], "little")])
    h, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    ql, kvl = cfg["q_lora_rank"], cfg["kv_lora_rank"]
    nope, rope, v = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    e, f, vocab = cfg["n_routed_experts"], cfg["moe_intermediate_size"], cfg["vocab_size"]

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
        a = f"{p}.self_attn"
        w[f"{p}.input_layernorm.weight"] = vec(h, 1.0)
        w[f"{p}.post_attention_layernorm.weight"] = vec(h, 1.0)
        w[f"{a}.q_a_proj.weight"] = mat(ql, h)
        w[f"{a}.q_a_layernorm.weight"] = vec(ql, 1.0)
        w[f"{a}.q_b_proj.weight"] = mat(nh * (nope + rope), ql)
        w[f"{a}.kv_a_proj_with_mqa.weight"] = mat(kvl + rope, h)
        w[f"{a}.kv_a_layernorm.weight"] = vec(kvl, 1.0)
        w[f"{a}.kv_b_proj.weight"] = mat(nh * (nope + v), kvl)
        w[f"{a}.o_proj.weight"] = mat(h, nh * v)
        if i < cfg["first_k_dense_replace"]:
            mlp(f"{p}.mlp", cfg["intermediate_size"])
            continue
        w[f"{p}.mlp.gate.weight"] = mat(e, h, 0.3)
        w[f"{p}.mlp.gate.e_score_correction_bias"] = vec(e, 0.0, 0.1)
        mlp(f"{p}.mlp.shared_experts", f * cfg["n_shared_experts"])
        for x in range(e):
            mlp(f"{p}.mlp.experts.{x}", f)
    w["model.norm.weight"] = vec(h, 1.0)
    w["lm_head.weight"] = mat(vocab, h, 0.3)
    return w


def hf_folder(out, arch, spec, tokenizer, layout=None):
    from safetensors.numpy import save_file

    hf = out / f"hf-{arch}-{layout}" if layout else out / f"hf-{arch}"
    hf.mkdir(parents=True)
    cfg = dict(spec["config"])
    if arch == "deepseek2":
        params = deepseek_weights(arch, cfg)
    elif layout is None:
        params = weights(arch, cfg)
    else:
        params = gpt_oss_weights(arch, cfg, layout)
        if layout == "mxfp4":
            cfg["quantization_config"] = MXFP4_QUANT
    (hf / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    save_file(params, str(hf / "model.safetensors"), metadata={"format": "pt"})
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


def make_converted(out, arch, spec, args):
    """A model whose files each come from the converter (gpt-oss: one HF folder per layout),
    each with llama.cpp's logits and greedy answers."""
    made = {"config": spec["config"], "files": {}}
    for label, layout in spec["files"]:
        hf = hf_folder(out, arch, spec, args.tokenizer, layout)
        path = out / f"{arch}.{label}.gguf"
        log(f"{arch}: convert_hf_to_gguf.py --outtype f32 ({layout})")
        subprocess.run(
            [sys.executable, str(args.llama_cpp / "convert_hf_to_gguf.py"), str(hf),
             "--outtype", "f32", "--outfile", str(path)],
            check=True, stdout=subprocess.DEVNULL,
        )
        chat_ids, tok = chat_prompt(hf)
        made["chat_prompt"] = chat_ids
        made["files"][label] = reference_runs(out, arch, label, path, chat_ids, tok, args)
        shutil.rmtree(hf)
    return made


def reference_runs(out, arch, label, path, chat_ids, tok, args):
    """llama.cpp's logits on PROMPT and its greedy answers on one file."""
    logits = out / f"{arch}.{label}.logits.f32"
    greedy = llama_run(args.logits, path, logits, 6, PROMPT)
    chat = until_eos(llama_run(args.logits, path, out / "chat.tmp", CHAT_TOKENS, chat_ids))
    (out / "chat.tmp").unlink()
    log(f"{arch} {label}: greedy {greedy}, chat {chat}")
    return {
        "gguf": path.name,
        "logits": logits.name,
        "prompt_greedy": greedy,
        "chat_tokens": chat,
        "chat_text": tok.decode(chat),
    }


def dequantized_run(out, arch, label, path, args):
    """llama.cpp's logits and greedy tokens on a quantized file's own weights expanded to f32
    (`llama-quantize --allow-requantize ... F32`): the same weight values without the 8-bit
    rounding of activations its quantized products do. The expanded file is not kept."""
    expanded = out / f"{arch}.{label}.expanded.gguf"
    subprocess.run([str(args.quantize), "--allow-requantize", str(path), str(expanded), "F32"],
                   check=True, capture_output=True)
    logits = out / f"{arch}.{label}.dequantized.logits.f32"
    greedy = llama_run(args.logits, expanded, logits, 6, PROMPT)
    expanded.unlink()
    log(f"{arch} {label} expanded to f32: greedy {greedy}")
    return {"dequantized_logits": logits.name, "dequantized_greedy": greedy}


def make_model(out, arch, spec, args):
    """The model's GGUF files, each with llama.cpp's logits and greedy answers."""
    if "files" in spec:
        return make_converted(out, arch, spec, args)
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
        made["files"][label] = reference_runs(out, arch, label, path, chat_ids, tok, args)
        if qtype is not None:
            made["files"][label].update(dequantized_run(out, arch, label, path, args))
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
