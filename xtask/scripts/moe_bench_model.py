"""Mixture-of-Experts models of realistic proportions, scaled to one small machine, for
`cargo xtask bench concurrency --moe` (and `--moe-hybrid`): made by mlx-lm's own classes with
random weights and quantized by mlx-lm (4-bit affine, groups of 64, routers at 8 bits as
`mlx_lm.convert` keeps them), in the MLX-community layout both servers read.

- `qwen3_moe`: Qwen3-30B-A3B's proportions (every layer MoE, 64 experts of which 8 run per
  token (Qwen3-30B-A3B has 128), experts 3/8 of the hidden width, 4x grouped-query attention)
  at 24 layers of width 1024: about 1.9 B parameters, about 0.3 B active per token, about
  1.2 GB at 4 bits (routers at 8).
- `qwen3_5_moe`: Qwen3.5-35B-A3B's (and Qwen3.6-35B-A3B's) pattern: three Gated DeltaNet
  layers to one gated full-attention layer, 128 routed experts of which 8 run per token plus
  a shared expert gated by sigmoid, twice as many value heads as key heads in the linear
  layers, 4x grouped-query attention over a quarter-rotary head, at 24 layers of width 1024
  (the release: 40 of 2048, 256 experts): about 1.4 B parameters, about 0.27 B active, about
  0.8 GB at 4 bits (routers and shared-expert gates at 8, as mlx-lm's predicate keeps them).

Usage: python moe_bench_model.py OUT_DIR TOKENIZER_DIR [qwen3_moe | qwen3_5_moe]
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


HYBRID_TEXT = {
    "model_type": "qwen3_5_moe_text",
    "hidden_size": 1024,
    "num_hidden_layers": 24,
    "full_attention_interval": 4,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "attn_output_gate": True,
    "linear_num_key_heads": 8,
    "linear_num_value_heads": 16,
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "linear_conv_kernel_dim": 4,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 128,
    "shared_expert_intermediate_size": 128,
    "norm_topk_prob": True,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 262144,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "vocab_size": 49152,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10000000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [11, 11, 10],
        "mrope_interleaved": True,
    },
}
HYBRID_TEXT["layer_types"] = HYBRID_TEXT["layer_types"] * (HYBRID_TEXT["num_hidden_layers"] // 4)
HYBRID = {
    "model_type": "qwen3_5_moe",
    "architectures": ["Qwen3_5MoeForConditionalGeneration"],
    "tie_word_embeddings": False,
    "text_config": HYBRID_TEXT,
    "vocab_size": 49152,
    "bos_token_id": 1,
    "eos_token_id": [0, 2],
    "pad_token_id": 2,
    "torch_dtype": "float32",
}
SHAPES = {"qwen3_moe": CONFIG, "qwen3_5_moe": HYBRID}
# Gated DeltaNet's own parameters: A = -exp(A_log) and the step's bias want unit scale, the
# short convolution a visible one (mlx-lm starts A_log from a uniform and dt_bias at one).
STD = {"A_log": 1.0, "dt_bias": 1.0, "conv1d.weight": 0.5, "shared_expert_gate.weight": 0.3}


def main():
    out, tokenizer = Path(sys.argv[1]), Path(sys.argv[2])
    shape = sys.argv[3] if len(sys.argv) > 3 else "qwen3_moe"
    config = SHAPES[shape]
    mx.set_default_device(mx.cpu)
    mx.random.seed(SEED)
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    # Every parameter random (mlx-lm starts routers at zero: every token would tie), one
    # tensor at a time so memory holds one f32 copy of the model at most.
    params = []
    for name, p in tree_flatten(model.parameters()):
        special = [std for suffix, std in STD.items() if name.endswith(suffix)]
        if name.endswith("norm.weight"):
            value = 1.0 + 0.1 * mx.random.normal(p.shape)
        elif special:
            value = special[0] * mx.random.normal(p.shape)
        else:
            fan_in = p.shape[-1]
            std = 0.3 if name.endswith("mlp.gate.weight") else min(0.1, max(0.02, fan_in ** -0.5))
            value = std * mx.random.normal(p.shape)
        mx.eval(value)
        params.append((name, value))
    model.update(tree_unflatten(params))
    del params
    model, config = quantize_model(model, dict(config), 64, 4, mode="affine")
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
