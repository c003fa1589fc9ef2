"""A Qwen3-MoE model of realistic proportions, scaled to one small machine, for
`cargo xtask bench concurrency --moe`: made by mlx-lm's own classes with random weights and
quantized by mlx-lm (4-bit affine, groups of 64, routers at 8 bits as `mlx_lm.convert` keeps
them), in the MLX-community layout both servers read.

Shape: Qwen3-30B-A3B's proportions (every layer MoE, 64 experts of which 8 run per token (Qwen3-30B-A3B has 128),
experts 3/8 of the hidden width, 4x grouped-query attention) at 24 layers of width 1024:
about 1.9 B parameters, about 0.3 B active per token, about 1.2 GB at 4 bits (routers at 8).

Usage: python moe_bench_model.py OUT_DIR TOKENIZER_DIR
"""

import shutil
import sys
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.utils import _get_classes, quantize_model, save_config, save_model

SEED = 20261204
CONFIG = {
    "model_type": "qwen3_moe",
    "architectures": ["Qwen3MoeForCausalLM"],
    "hidden_size": 1024,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "intermediate_size": 3072,
    "moe_intermediate_size": 384,
    "num_experts": 64,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 40960,
    "rope_scaling": None,
    "attention_bias": False,
    "tie_word_embeddings": False,
    "vocab_size": 49152,
    "bos_token_id": 1,
    "eos_token_id": [0, 2],
    "pad_token_id": 2,
    "torch_dtype": "float32",
}


def main():
    out, tokenizer = Path(sys.argv[1]), Path(sys.argv[2])
    mx.set_default_device(mx.cpu)
    mx.random.seed(SEED)
    model_class, args_class = _get_classes(CONFIG)
    model = model_class(args_class.from_dict(CONFIG))
    # Every parameter random (mlx-lm starts routers at zero: every token would tie), one
    # tensor at a time so memory holds one f32 copy of the model at most.
    params = []
    for name, p in tree_flatten(model.parameters()):
        if name.endswith("norm.weight"):
            value = 1.0 + 0.1 * mx.random.normal(p.shape)
        else:
            fan_in = p.shape[-1]
            std = 0.3 if name.endswith("mlp.gate.weight") else min(0.1, max(0.02, fan_in ** -0.5))
            value = std * mx.random.normal(p.shape)
        mx.eval(value)
        params.append((name, value))
    model.update(tree_unflatten(params))
    del params
    model, config = quantize_model(model, dict(CONFIG), 64, 4, mode="affine")
    partial = out.with_suffix(".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    save_model(partial, model, donate_model=True)
    save_config(config, config_path=partial / "config.json")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(tokenizer / name, partial / name)
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    size = sum(f.stat().st_size for f in out.iterdir())
    print(f"bench model: {out} ({size / 1e9:.2f} GB)", flush=True)


if __name__ == "__main__":
    main()
