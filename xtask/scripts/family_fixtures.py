"""Reference fixtures of every model family shoal runs, made by mlx-lm itself.

`cargo xtask setup` runs this with the pinned mlx / mlx-lm venv (see xtask/src/family_fixtures.rs):

    python family_fixtures.py OUT_ROOT [--tokenizer DIR] [--families a,b]

For each family it builds a tiny model with mlx-lm's own classes, randomizes every parameter
(seeded), writes it in the Hugging Face layout (each model's `sanitize` inverted) to
OUT_ROOT/<family>/hf/, checks that mlx-lm loads that folder back to the same logits, quantizes it
the way `mlx_lm.convert` does (q4, q8, and mxfp4 where it matters) into sibling folders, and
writes in every folder `reference.safetensors` (mlx-lm's logits on that folder) and
`reference.json`. Every file is a pure function of this script, the seed and the versions.
"""

import argparse
import contextlib
import hashlib
import importlib.metadata
import io
import json
import shutil
import sys
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import _get_classes, load_model, quantize_model, save_config, save_model

# mlx-lm 0.32.2 passes `global_scale=` to every `mx.gather_qmm` (QuantizedSwitchLinear), an
# argument mlx 0.32.2 does not have yet (it came with 0.32.4, for nvfp4 experts). Every quantized
# MoE would fail with "gather_qmm() got an unexpected keyword argument 'global_scale'". None of
# these fixtures uses a global scale, so a None one is dropped; any other value is refused.
_gather_qmm = mx.gather_qmm


def _gather_qmm_without_global_scale(*args, global_scale=None, **kwargs):
    if global_scale is not None:
        raise ValueError("mlx 0.32.2 has no gather_qmm global_scale (nvfp4 experts)")
    return _gather_qmm(*args, **kwargs)


mx.gather_qmm = _gather_qmm_without_global_scale

SEED = 20261204
VOCAB = 49152  # SmolLM2's tokenizer, copied into every folder
# Fixed, spread-out prompt ids (the same recipe as `cargo xtask bench inference`).
PROMPT = [(i * 7919) % 48000 + 100 for i in range(12)]
DECODE_STEPS = 6
# The chat every folder's `chat_reference.json` answers (greedy, through the folder's own chat
# template): what a real node must answer token for token through the OpenAI API.
CHAT = [{"role": "user", "content": "What is the capital of France?"}]
CHAT_TOKENS = 10
# SmolLM2's special tokens, as the project's export of it writes them: <|im_start|> = 1 (bos);
# <|endoftext|> = 0 and <|im_end|> = 2 (the chat's end of turn) both end a generation.
TOKENS = {"bos_token_id": 1, "eos_token_id": [0, 2], "pad_token_id": 2}
# The router layers' names (the last component of their path).
ROUTERS = {"gate", "router"}
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json"]

YARN_DEEPSEEK = {
    "type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
    "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.8,
}
YARN_GPT_OSS = {
    "rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096,
    "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
}

# DeepSeek V3.2's and GLM-5's shared tiny shape: 8 indexer heads of 64 (each rotating its first
# 32), a dense first layer, then 8 sigmoid-routed experts with a shared one.
DSA_TINY = {
    "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
    "num_key_value_heads": 4, "intermediate_size": 256, "moe_intermediate_size": 128,
    "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1,
    "topk_group": 1, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
    "topk_method": "noaux_tc", "norm_topk_prob": True, "first_k_dense_replace": 1,
    "moe_layer_freq": 1, "q_lora_rank": 64, "kv_lora_rank": 64, "qk_rope_head_dim": 32,
    "qk_nope_head_dim": 64, "index_n_heads": 8, "index_head_dim": 64,
    "num_nextn_predict_layers": 1, "attention_bias": False, "tie_word_embeddings": False,
}

# Each family: its config.json (before the common keys), the quantized layouts made from its hf
# folder, and the base value of its norm weights (Gemma's norms compute x * (1 + w)).
FAMILIES = {
    "qwen3_moe": {
        "config": {
            "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
            "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 256,
            "moe_intermediate_size": 128, "num_experts": 8, "num_experts_per_tok": 2,
            "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [1],
            "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 40960,
            "tie_word_embeddings": False, "rope_scaling": None, "attention_bias": False,
        },
        "layouts": ["q4", "q8", "mxfp4", "mxfp8"],
    },
    "deepseek_v3": {
        "config": {
            "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
            "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
            "num_key_value_heads": 4, "intermediate_size": 256, "moe_intermediate_size": 128,
            "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1,
            "n_group": 2, "topk_group": 1, "routed_scaling_factor": 2.5,
            "scoring_func": "sigmoid", "topk_method": "noaux_tc", "norm_topk_prob": True,
            "first_k_dense_replace": 1, "moe_layer_freq": 1,
            "q_lora_rank": 64, "kv_lora_rank": 64, "qk_rope_head_dim": 32,
            "qk_nope_head_dim": 64, "v_head_dim": 32, "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0, "rope_scaling": YARN_DEEPSEEK,
            "max_position_embeddings": 163840, "attention_bias": False,
            "tie_word_embeddings": False,
        },
        "layouts": ["q4", "q8"],
    },
    "glm4_moe_lite": {
        # GLM-4.7-Flash: DeepSeek V3's block; its bottleneck norms take rms_norm_eps (large
        # here, so that reading them with DeepSeek's fixed 1e-6 would change the logits).
        "config": {
            "architectures": ["Glm4MoeLiteForCausalLM"], "model_type": "glm4_moe_lite",
            "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
            "num_key_value_heads": 4, "intermediate_size": 256, "moe_intermediate_size": 128,
            "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1,
            "n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.8,
            "norm_topk_prob": True, "first_k_dense_replace": 1, "moe_layer_freq": 1,
            "q_lora_rank": 64, "kv_lora_rank": 64, "qk_rope_head_dim": 32,
            "qk_nope_head_dim": 64, "v_head_dim": 64, "rms_norm_eps": 0.05,
            "rope_theta": 1000000.0, "rope_scaling": None, "partial_rotary_factor": 1.0,
            "num_nextn_predict_layers": 1, "max_position_embeddings": 202752,
            "attention_bias": False, "tie_word_embeddings": False,
        },
        "layouts": ["q4"],
    },
    "gpt_oss": {
        # The released layout: experts in mxfp4 (`*_blocks`, `*_scales`, gate/up interleaved),
        # everything else dense; mlx-lm reads it through `quantization_config`.
        "config": {
            "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
            "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 128,
            "num_local_experts": 8, "num_experts_per_tok": 2, "experts_per_token": 2,
            "sliding_window": 8, "swiglu_limit": 7.0, "attention_bias": True,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
            "rms_norm_eps": 1e-5, "rope_theta": 150000, "rope_scaling": YARN_GPT_OSS,
            "initial_context_length": 4096, "max_position_embeddings": 131072,
            "tie_word_embeddings": False,
            "quantization_config": {
                "quant_method": "mxfp4",
                "modules_to_not_convert": [
                    "model.layers.*.self_attn", "model.layers.*.mlp.router",
                    "model.embed_tokens", "lm_head",
                ],
            },
        },
        "layouts": ["q4", "q8", "mxfp4"],
        # Gate/up wide enough that the clamped SwiGLU (limit 7) clips some values.
        "std": [("experts.gate_proj.weight", 0.4), ("experts.up_proj.weight", 0.4)],
        "experts_mxfp4": True,
    },
    "glm4_moe": {
        "config": {
            "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe",
            "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 64, "partial_rotary_factor": 0.5,
            "use_qk_norm": True, "attention_bias": True, "intermediate_size": 256,
            "moe_intermediate_size": 128, "n_routed_experts": 8, "num_experts_per_tok": 2,
            "n_shared_experts": 1, "n_group": 1, "topk_group": 1,
            "routed_scaling_factor": 2.5, "norm_topk_prob": True, "first_k_dense_replace": 1,
            "num_nextn_predict_layers": 1, "rms_norm_eps": 1e-5, "rope_theta": 1000000.0,
            "rope_scaling": None, "max_position_embeddings": 131072,
            "tie_word_embeddings": False,
        },
        "layouts": ["q4", "q8"],
    },
    "minimax": {
        "config": {
            "architectures": ["MiniMaxM2ForCausalLM"], "model_type": "minimax_m2",
            "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 64, "rotary_dim": 32, "use_qk_norm": True,
            "qk_norm_type": "per_layer", "intermediate_size": 128,
            "shared_intermediate_size": 0, "num_local_experts": 8, "num_experts_per_tok": 2,
            "scoring_func": "sigmoid", "use_routing_bias": True, "rms_norm_eps": 1e-6,
            "rope_theta": 5000000.0, "max_position_embeddings": 196608,
            "tie_word_embeddings": False,
        },
        "layouts": ["q4", "q8"],
    },
    "gemma3_text": {
        "config": {
            "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
            "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 64, "query_pre_attn_scalar": 64,
            "intermediate_size": 256, "hidden_activation": "gelu_pytorch_tanh",
            "sliding_window": 8, "sliding_window_pattern": 2,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
            "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
            "rope_scaling": {"rope_type": "linear", "factor": 8.0},
            "rms_norm_eps": 1e-6, "max_position_embeddings": 32768,
            "final_logit_softcapping": None, "attn_logit_softcapping": None,
            "tie_word_embeddings": True,
        },
        "layouts": ["q4", "q8"],
        "norm_base": 0.0,  # Gemma's norms scale by (1 + w)
        "std": [("embed_tokens", 0.1)],  # x sqrt(hidden) in; tied: larger echoes the input token
        "tied": True,
    },
    "qwen3_5": {
        # Qwen3.5 as released (Qwen3_5ForConditionalGeneration): the text model under
        # `text_config`, Gated DeltaNet layers with gated attention every second layer (a
        # 2-stage split at layer 1 leaves rank 0 only a linear layer), more value heads than
        # key heads, a quarter of each attention head rotated.
        "config": {
            "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
            "tie_word_embeddings": False,
            "text_config": {
                "model_type": "qwen3_5_text", "hidden_size": 64, "num_hidden_layers": 4,
                "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
                "intermediate_size": 128, "linear_num_value_heads": 4,
                "linear_num_key_heads": 2, "linear_key_head_dim": 32,
                "linear_value_head_dim": 32, "linear_conv_kernel_dim": 4,
                "full_attention_interval": 2, "rms_norm_eps": 1e-6,
                "max_position_embeddings": 262144, "tie_word_embeddings": False,
                "attention_bias": False, "attn_output_gate": True,
                "layer_types": ["linear_attention", "full_attention"] * 2,
                "rope_parameters": {
                    "rope_type": "default", "rope_theta": 10000000.0,
                    "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10],
                    "mrope_interleaved": True,
                },
            },
            "vision_config": {"model_type": "qwen3_5", "depth": 1, "hidden_size": 64},
        },
        "layouts": ["q4"],
        # Decays and write strengths spread over heads; a convolution that passes its input.
        "std": [("A_log", 1.0), ("dt_bias", 1.0), ("conv1d", 0.5)],
    },
    "qwen3_5_moe": {
        # Qwen3.5-35B-A3B as released: Qwen3.5's layers with Qwen3-Next's sparse block on every
        # layer (softmax top-k over 8 experts, a shared expert scaled by
        # sigmoid(shared_expert_gate(x))), experts stored fused as `experts.gate_up_proj`.
        # mlx-lm's quant_predicate keeps the routers and shared-expert gates at 8 bits in q4.
        # Experts 128 wide: two groups of 64 at 4 bits, so a 2-rank tensor ring cuts them.
        "config": {
            "architectures": ["Qwen3_5MoeForConditionalGeneration"],
            "model_type": "qwen3_5_moe", "tie_word_embeddings": False,
            "text_config": {
                "model_type": "qwen3_5_moe_text", "hidden_size": 64, "num_hidden_layers": 4,
                "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
                "linear_num_value_heads": 4, "linear_num_key_heads": 2,
                "linear_key_head_dim": 32, "linear_value_head_dim": 32,
                "linear_conv_kernel_dim": 4, "full_attention_interval": 2,
                "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
                "shared_expert_intermediate_size": 128, "norm_topk_prob": True,
                "rms_norm_eps": 1e-6, "max_position_embeddings": 262144,
                "tie_word_embeddings": False, "attention_bias": False, "attn_output_gate": True,
                "layer_types": ["linear_attention", "full_attention"] * 2,
                "rope_parameters": {
                    "rope_type": "default", "rope_theta": 10000000.0,
                    "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10],
                    "mrope_interleaved": True,
                },
            },
            "vision_config": {"model_type": "qwen3_5_moe", "depth": 1, "hidden_size": 64},
        },
        "layouts": ["q4"],
        "std": [("A_log", 1.0), ("dt_bias", 1.0), ("conv1d", 0.5),
                ("shared_expert_gate", 0.3)],
    },
    "qwen3_next": {
        # Qwen3-Next-80B-A3B's shape: the keys at the top level, Gated DeltaNet's projections
        # fused per key head, the sparse block on every layer but `mlp_only_layers` (layer 2
        # here, a dense MLP, to run that path too), norm_topk_prob as released.
        "config": {
            "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
            "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 128,
            "linear_num_value_heads": 4, "linear_num_key_heads": 2,
            "linear_key_head_dim": 32, "linear_value_head_dim": 32,
            "linear_conv_kernel_dim": 4, "full_attention_interval": 2,
            "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
            "shared_expert_intermediate_size": 128, "norm_topk_prob": True,
            "decoder_sparse_step": 1, "mlp_only_layers": [2],
            "rms_norm_eps": 1e-6, "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
            "rope_scaling": None, "max_position_embeddings": 262144,
            "tie_word_embeddings": False, "attention_bias": False,
        },
        "layouts": ["q4"],
        "std": [("A_log", 1.0), ("dt_bias", 1.0), ("conv1d", 0.5),
                ("shared_expert_gate", 0.3)],
    },
    "llama4_text": {
        # Llama 4's dense text model: NoPE layers among interleaved-RoPE ones (layer 1 has no
        # rotation), weightless per-head Q/K norms, the MLP `intermediate_size_mlp` wide under
        # `feed_forward`, the head named `output`.
        "config": {
            "architectures": ["Llama4ForCausalLM"], "model_type": "llama4_text",
            "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 256,
            "intermediate_size_mlp": 128, "no_rope_layers": [1, 0, 1], "use_qk_norm": True,
            "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 32768,
            "tie_word_embeddings": False,
        },
        "layouts": ["q4"],
        "std": [("output", 0.3)],
    },
    "gemma4_text": {
        # Gemma 4 in the 26B-A4B shape: sliding and full layers (full ones twice as wide, with
        # proportional RoPE over a quarter of the head, keys as values), a GELU MLP beside 8
        # experts, layer scalars, soft-capped logits (a cap of 2 bends them), tied embeddings.
        "config": {
            "architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text",
            "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
            "num_key_value_heads": 2, "num_global_key_value_heads": 2, "head_dim": 32,
            "global_head_dim": 64, "intermediate_size": 128, "attention_k_eq_v": True,
            "enable_moe_block": True, "num_experts": 8, "top_k_experts": 2,
            "moe_intermediate_size": 128, "hidden_size_per_layer_input": 0,
            "num_kv_shared_layers": 0, "vocab_size_per_layer_input": VOCAB,
            "use_double_wide_mlp": False, "sliding_window": 8,
            "layer_types": ["sliding_attention", "full_attention"] * 2,
            "rope_parameters": {
                "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                                   "rope_type": "proportional"},
                "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
            },
            "final_logit_softcapping": 2.0, "rms_norm_eps": 1e-6,
            "max_position_embeddings": 131072, "tie_word_embeddings": True,
        },
        "layouts": ["q4"],
        "std": [("embed_tokens", 0.1), ("router.scale", 1.0), ("router.proj", 1.0),
                ("per_expert_scale", 1.0)],
    },
    "gemma4_text_e2b": {
        # Gemma 4 E2B's shape scaled down: per-layer inputs (64 per layer and token, from their
        # own table and a projection of the embedding), 6 layers (sliding, sliding, full, ...)
        # of which the last 3 share keys and values (layers 3 and 4 read sliding layer 1's,
        # layer 5 full layer 2's) and have double-wide MLPs, windows of 4 (below the 12-token
        # prompt), full layers twice as wide with proportional RoPE, tied embeddings, logits
        # soft-capped at 10. Two key/value heads (E2B has one) so a 2-rank ring can cut them.
        "config": {
            "architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text",
            "hidden_size": 64, "num_hidden_layers": 6, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 32, "global_head_dim": 64,
            "intermediate_size": 128, "attention_k_eq_v": False, "enable_moe_block": False,
            "hidden_size_per_layer_input": 64, "vocab_size_per_layer_input": VOCAB,
            "num_kv_shared_layers": 3, "use_double_wide_mlp": True, "sliding_window": 4,
            "layer_types": ["sliding_attention", "sliding_attention", "full_attention"] * 2,
            "rope_parameters": {
                "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                                   "rope_type": "proportional"},
                "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
            },
            "final_logit_softcapping": 10.0, "rms_norm_eps": 1e-6,
            "max_position_embeddings": 131072, "tie_word_embeddings": True,
        },
        "layouts": ["q4"],
        "std": [("embed_tokens", 0.1), ("embed_tokens_per_layer", 0.5)],
    },
    "step3p5": {
        # Step 3.5 Flash's shape: sliding layers with their own head counts, per-layer RoPE
        # bases and rotated fractions, YaRN on the full layers only, head-wise gates, the
        # sigmoid-routed experts from layer 1 with a shared expert, SwiGLUs clamped at 0.5 on
        # some layers (small enough to clip).
        "config": {
            "architectures": ["Step3p5ForCausalLM"], "model_type": "step3p5",
            "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
            "num_attention_groups": 2, "head_dim": 32, "intermediate_size": 128,
            "layer_types": ["sliding_attention", "full_attention"] * 2, "sliding_window": 8,
            "attention_other_setting": {"num_attention_heads": 8, "num_attention_groups": 2},
            "rope_theta": [10000.0, 500000.0, 10000.0, 500000.0],
            "partial_rotary_factors": [1.0, 0.5, 1.0, 0.5],
            "yarn_only_types": ["full_attention"],
            "rope_scaling": {"rope_type": "yarn", "factor": 2.0,
                             "original_max_position_embeddings": 131072, "beta_fast": 32,
                             "beta_slow": 1},
            "use_head_wise_attn_gate": True, "moe_num_experts": 8, "moe_top_k": 2,
            "moe_intermediate_size": 128, "share_expert_dim": 128, "moe_layers_enum": "1,2,3",
            "moe_router_scaling_factor": 2.5, "norm_expert_weight": True,
            "swiglu_limits": [None, 0.5, 0, 0.5], "swiglu_limits_shared": [0.5, 0, 0.5, 0],
            "rms_norm_eps": 1e-5, "max_position_embeddings": 262144,
            "tie_word_embeddings": False,
        },
        "layouts": ["q4"],
    },
    "deepseek_v32": {
        # DeepSeek V3.2: DeepSeek V3's block with the DSA indexer. index_topk (4) is below the
        # prompt (12), so prefill's later rows and every decode step read only the chosen
        # positions; YaRN's magnitude factor (mscale / mscale_all_dim != 1) scales the
        # indexer's rotated part too. The released layout: kv_b_proj, experts one matrix
        # each, an MTP layer.
        "config": {
            **DSA_TINY,
            "architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32",
            "n_group": 2, "v_head_dim": 32, "rms_norm_eps": 1e-6, "index_topk": 4,
            "rope_theta": 10000.0, "rope_scaling": YARN_DEEPSEEK,
            "max_position_embeddings": 163840,
        },
        "layouts": ["q4"],
    },
    "glm_moe_dsa": {
        # GLM-5: DeepSeek V3.2's model under GLM's keys (RoPE from rope_parameters, the
        # indexer's RoPE interleaved), index_topk below the prompt.
        "config": {
            **DSA_TINY,
            "architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa",
            "n_group": 1, "v_head_dim": 64, "rms_norm_eps": 1e-5, "index_topk": 5,
            "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
            "max_position_embeddings": 202752,
        },
        "layouts": ["q4"],
    },
    "mistral4": {
        # Mistral Small 4 as released (Mistral3ForConditionalGeneration): the text model under
        # `text_config` (model_type mistral4): latent attention with YaRN from
        # rope_parameters, Llama 4's attention scale on the queries (its
        # original_max_position_embeddings of 8 makes positions 8.. of the prompt scale by
        # 1 + beta log 2), softmax-routed grouped experts with a shared expert, a dense
        # first layer; experts one matrix each, a vision tower the text model never reads.
        "config": {
            "architectures": ["Mistral3ForConditionalGeneration"], "model_type": "mistral3",
            "tie_word_embeddings": False,
            "text_config": {
                "model_type": "mistral4", "hidden_size": 64, "num_hidden_layers": 3,
                "num_attention_heads": 4, "num_key_value_heads": 4,
                "intermediate_size": 256, "moe_intermediate_size": 128,
                "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1,
                "n_group": 2, "topk_group": 1, "routed_scaling_factor": 1.5,
                "norm_topk_prob": True, "first_k_dense_replace": 1,
                "q_lora_rank": 64, "kv_lora_rank": 64, "qk_rope_head_dim": 32,
                "qk_nope_head_dim": 64, "v_head_dim": 64, "rms_norm_eps": 1e-5,
                "max_position_embeddings": 131072, "tie_word_embeddings": False,
                "attention_bias": False,
                "rope_parameters": {
                    "rope_type": "yarn", "rope_theta": 10000.0, "factor": 16.0,
                    "original_max_position_embeddings": 8, "beta_fast": 32.0,
                    "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.7,
                    "llama_4_scaling_beta": 0.4,
                },
            },
            "vision_config": {"model_type": "pixtral", "hidden_size": 64},
        },
        "layouts": ["q4"],
    },
    "nemotron_h": {
        # Nemotron-H / Nemotron 3 Nano's shape: the pattern M-M*E (Mamba-2, MLP, Mamba-2,
        # attention without positions, experts): a 3-stage split leaves rank 1 only an MLP
        # layer; relu^2 MLPs, sigmoid-routed experts with a shared expert; Hugging Face's
        # layout (backbone.*, convolutions [channels, 1, kernel], experts one matrix each).
        # Every width a 2-rank tensor ring cuts (Mamba-2 heads, attention heads, experts) is
        # 128: two groups of 64 at 4 bits.
        "config": {
            "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h",
            "hidden_size": 64, "num_hidden_layers": 5, "hybrid_override_pattern": "M-M*E",
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
            "attention_bias": False, "intermediate_size": 128, "mlp_bias": False,
            "mamba_num_heads": 4, "mamba_head_dim": 32, "ssm_state_size": 16, "n_groups": 2,
            "conv_kernel": 4, "use_conv_bias": True, "mamba_proj_bias": False,
            "use_bias": False, "layer_norm_epsilon": 1e-5, "n_routed_experts": 8,
            "num_experts_per_tok": 2, "moe_intermediate_size": 128,
            "moe_shared_expert_intermediate_size": 128, "n_shared_experts": 1, "n_group": 1,
            "topk_group": 1, "norm_topk_prob": True, "routed_scaling_factor": 2.5,
            "max_position_embeddings": 4096, "tie_word_embeddings": False,
        },
        "layouts": ["q4"],
        "std": [("A_log", 1.0), ("dt_bias", 1.0), ("conv1d", 0.5), ("embeddings", 1.0)],
    },
    "nemotron_h_latent": {
        # Nemotron 3 Super's shape: the pattern MEM*E (Mamba-2, latent experts, Mamba-2,
        # attention without positions, latent experts; a 2-stage split at 1 leaves rank 0 only
        # a Mamba-2 layer), experts on a latent projection (moe_latent_size 64 of hidden 128:
        # fc1_latent_proj before them, fc2_latent_proj after their weighted sum; the router and
        # the shared expert read the hidden state), sigmoid routing in 2 groups of which 1 is
        # kept. Every width a 2-rank tensor ring cuts is 128 and every input width a multiple
        # of 64, so q4 quantizes every matrix.
        "config": {
            "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h",
            "hidden_size": 128, "num_hidden_layers": 5, "hybrid_override_pattern": "MEM*E",
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
            "attention_bias": False, "intermediate_size": 128, "mlp_bias": False,
            "mamba_num_heads": 4, "mamba_head_dim": 32, "ssm_state_size": 16, "n_groups": 2,
            "conv_kernel": 4, "use_conv_bias": True, "mamba_proj_bias": False,
            "use_bias": False, "layer_norm_epsilon": 1e-5, "n_routed_experts": 8,
            "num_experts_per_tok": 2, "moe_intermediate_size": 128, "moe_latent_size": 64,
            "moe_shared_expert_intermediate_size": 128, "n_shared_experts": 1, "n_group": 2,
            "topk_group": 1, "norm_topk_prob": True, "routed_scaling_factor": 2.5,
            "max_position_embeddings": 4096, "tie_word_embeddings": False,
        },
        "layouts": ["q4"],
        "std": [("A_log", 1.0), ("dt_bias", 1.0), ("conv1d", 0.5), ("embeddings", 1.0)],
    },
    "kimi_linear": {
        # Kimi Linear (48B-A3B's shape): Kimi Delta Attention on layers 1, 2 and 4 (1-based
        # `kda_layers`; a 2-stage split at layer 1 leaves rank 0 only a linear layer), NoPE
        # latent attention on layer 3, a dense first layer, then sigmoid-routed experts with a
        # correction and a shared expert. Moonshot's layout: `block_sparse_moe.*` with
        # w1/w2/w3 experts, `q_conv1d` etc. `[channels, 1, kernel]`, `kv_b_proj`.
        "config": {
            "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear",
            "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
            "num_key_value_heads": 4, "head_dim": 64, "intermediate_size": 256,
            "moe_intermediate_size": 128, "num_experts": 8, "num_experts_per_token": 2,
            "num_shared_experts": 1, "moe_router_activation_func": "sigmoid",
            "moe_renormalize": True, "routed_scaling_factor": 2.5,
            "first_k_dense_replace": 1, "moe_layer_freq": 1, "use_grouped_topk": True,
            "num_expert_group": 2, "topk_group": 1,
            "kv_lora_rank": 64, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32,
            "v_head_dim": 64, "mla_use_nope": True, "q_lora_rank": None,
            "linear_attn_config": {
                "kda_layers": [1, 2, 4], "full_attn_layers": [3], "num_heads": 2,
                "head_dim": 64, "short_conv_kernel_size": 4,
            },
            "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "model_max_length": 1048576,
            "max_position_embeddings": 1048576, "tie_word_embeddings": False,
        },
        "layouts": ["q4"],
        "std": [("A_log", 1.0), ("dt_bias", 1.0), ("conv", 0.5)],
    },
    "kimi_k3": {
        # Kimi K3 as released (a vision-language checkpoint): the text model under
        # `text_config`, `language_model.*` weights. KDA on layers 1, 2 and 4 (1-based; its
        # fused q/k/v, a full-rank output gate and the decay's lower bound), NoPE latent
        # attention with a query bottleneck and an output gate on layer 3. Attention residuals
        # in blocks of 2 layers: layers 0 and 2 start blocks, so a 2-stage cut at 1 or 3 must
        # carry the earlier blocks to the next rank. A dense SiTU first layer, then
        # sigmoid-routed SiTU experts on a latent width of 64 (with its norm) and a shared
        # expert. Moonshot's layout: `block_sparse_moe.*` with w1/w2/w3 experts, `q_proj` ...
        # and `q_conv1d` ... `[channels, 1, kernel]`, `kv_b_proj`, `*_res.proj_weight`. Every
        # width a 2-rank tensor ring cuts is 128 and every input width a multiple of 64.
        "config": {
            "architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3",
            "tie_word_embeddings": False,
            "text_config": {
                "model_type": "kimi_k3", "hidden_size": 128, "num_hidden_layers": 4,
                "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 256,
                "rms_norm_eps": 1e-5, "hidden_act": "situ", "activation_situ_beta": 2.0,
                "activation_situ_linear_beta": 1.5, "attn_res_block_size": 2,
                "q_lora_rank": 64, "kv_lora_rank": 64, "qk_nope_head_dim": 64,
                "qk_rope_head_dim": 32, "v_head_dim": 32, "mla_use_nope": True,
                "mla_use_output_gate": True, "num_experts": 8, "num_experts_per_token": 2,
                "num_shared_experts": 1, "moe_intermediate_size": 128,
                "moe_router_activation_func": "sigmoid", "moe_renormalize": True,
                "routed_scaling_factor": 2.5, "first_k_dense_replace": 1, "moe_layer_freq": 1,
                "use_grouped_topk": True, "num_expert_group": 2, "topk_group": 1,
                "routed_expert_hidden_size": 64, "latent_moe_use_norm": True,
                "linear_attn_config": {
                    "kda_layers": [1, 2, 4], "full_attn_layers": [3], "num_heads": 2,
                    "head_dim": 64, "short_conv_kernel_size": 4, "gate_lower_bound": -5.0,
                    "use_full_rank_gate": True,
                },
                "max_position_embeddings": 1048576, "tie_word_embeddings": False,
            },
            "vision_config": {"model_type": "kimi_k3_vision", "hidden_size": 64},
        },
        "layouts": ["q4"],
        "std": [("A_log", 1.0), ("dt_bias", 1.0), ("conv", 0.5), ("res_proj", 0.15)],
        # mlx-lm's quant_predicate keeps the attention residuals' projections in floats.
        "float_layers": ("res_proj",),
    },
    "minimax_m3_vl": {
        # MiniMax M3 as released (a vision-language checkpoint, `minimax_m3_vl`): the text
        # model under `text_config` and `language_model.*` weights; block-sparse attention on
        # layers 0, 2 and 3 (an indexer picks 2 key blocks of 4 positions per query, its own
        # block always among them: the 12-token prompt has 3 blocks, so prefill and decode
        # both drop blocks), a dense first layer, then sigmoid-routed experts with a
        # correction bias and a shared expert, gpt-oss's clamped SwiGLU, (1 + w) norms, RoPE
        # on half of each head. MiniMax's layout: experts w1/w2/w3 one matrix each, a vision
        # tower the text model never reads. Widths of two 4-bit groups: a 2-rank tensor ring
        # cuts them.
        "config": {
            "architectures": ["MiniMaxM3VLForConditionalGeneration"],
            "model_type": "minimax_m3_vl", "tie_word_embeddings": False,
            "text_config": {
                "model_type": "minimax_m3", "hidden_size": 64, "num_hidden_layers": 4,
                "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
                "intermediate_size": 128, "dense_intermediate_size": 128,
                "shared_intermediate_size": 128, "num_local_experts": 8,
                "num_experts_per_tok": 2, "routed_scaling_factor": 2.0, "use_qk_norm": True,
                "use_gemma_norm": True, "swiglu_alpha": 1.702, "swiglu_limit": 7.0,
                "moe_layer_freq": [0, 1, 1, 1], "rms_norm_eps": 1e-6,
                "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0,
                                    "partial_rotary_factor": 0.5},
                "sparse_attention_config": {
                    "sparse_num_index_heads": 2, "sparse_index_dim": 32,
                    "sparse_block_size": 4, "sparse_topk_blocks": 2, "sparse_local_block": 1,
                    "sparse_attention_freq": [1, 0, 1, 1],
                },
                "max_position_embeddings": 1048576, "tie_word_embeddings": False,
            },
            "vision_config": {"model_type": "minimax_m3_vision", "hidden_size": 64},
        },
        "layouts": ["q4"],
        "norm_base": 0.0,  # (1 + w) norms
    },
}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def key_for(family, name):
    """A PRNG key per (family, parameter): independent of the order parameters are visited."""
    digest = hashlib.sha256(f"{SEED}/{family}/{name}".encode()).digest()
    return mx.random.key(int.from_bytes(digest[:4], "little"))


def randomize(model, family, norm_base=1.0, std_overrides=()):
    """Replaces every parameter: mlx-lm initializes routers, e_score_correction_bias and sinks
    to zero (every routing score would tie) and norms to exactly one."""
    new = []
    for name, p in tree_flatten(model.parameters()):
        key = key_for(family, name)
        noise = mx.random.normal(p.shape, dtype=mx.float32, key=key)
        leaf = name.rsplit(".", 1)[-1]
        std = None
        for pattern, override in std_overrides:
            if pattern in name:
                std = override
        if "norm" in name and p.ndim == 1:
            value = norm_base + 0.1 * noise
        elif leaf == "e_score_correction_bias":
            value = 0.1 * noise
        elif leaf == "sinks":
            value = noise
        elif leaf == "layer_scalar":
            value = 1.0 + 0.1 * noise  # Gemma 4 scales each block's output
        elif leaf == "bias":
            value = 0.05 * noise
        elif "embed_tokens" in name:
            # As large as what the layers add, so the residual keeps each token's identity
            # and routing differs per token.
            value = (std or 1.0) * noise
        elif leaf == "weight" and name.split(".")[-2] in ROUTERS:
            value = (std or 0.3) * noise  # decisive routing, scores far from ties
        elif name.startswith("lm_head"):
            value = (std or 0.3) * noise  # logits std ~2: clear greedy choices
        else:
            fan_in = p.shape[-1]
            value = (std or min(0.1, max(0.02, fan_in**-0.5))) * noise
        new.append((name, value.astype(mx.float32)))
    model.update(tree_unflatten(new))
    mx.eval(model.parameters())


# ---- Hugging Face layouts: each model's `sanitize` inverted -------------------------------


def unstack_experts(weights, stacked, per_expert, names=None):
    """`<stacked>.<proj>.weight` [E, out, in] -> `<per_expert>.<e>.<name>.weight`."""
    names = names or {"gate_proj": "gate_proj", "up_proj": "up_proj", "down_proj": "down_proj"}
    for key in [k for k in weights if f".{stacked}." in k]:
        prefix, rest = key.split(f".{stacked}.")
        proj, leaf = rest.split(".")
        w = weights.pop(key)
        for e in range(w.shape[0]):
            weights[f"{prefix}.{per_expert}.{e}.{names[proj]}.{leaf}"] = w[e]
    return weights


def hf_qwen3_moe(weights, cfg):
    return unstack_experts(weights, "mlp.switch_mlp", "mlp.experts")


def hf_deepseek_v3(weights, cfg):
    weights = unstack_experts(weights, "mlp.switch_mlp", "mlp.experts")
    heads, nope = cfg["num_attention_heads"], cfg["qk_nope_head_dim"]
    for key in [k for k in weights if k.endswith("self_attn.embed_q.weight")]:
        prefix = key[: -len("embed_q.weight")]
        wk = weights.pop(key)  # [heads, kv_lora, nope]
        wv = weights.pop(prefix + "unembed_out.weight")  # [heads, v_head, kv_lora]
        kv_b = mx.concatenate([wk.swapaxes(-1, -2), wv], axis=1)
        assert kv_b.shape[1] == nope + cfg["v_head_dim"], kv_b.shape
        weights[prefix + "kv_b_proj.weight"] = kv_b.reshape(heads * kv_b.shape[1], -1)
    return weights


def interleave_rows(a, b):
    """Rows of a and b alternating (a first) along axis 1: gpt-oss's fused gate_up layout."""
    return mx.stack([a, b], axis=2).reshape(a.shape[0], 2 * a.shape[1], *a.shape[2:])


def mxfp4_blocks(packed):
    """MLX's mxfp4 weight (uint32 [E, rows, in/8]) as OpenAI's blocks (uint8 [E, rows, in/32,
    16]): the same bytes, low nibble first, as mlx-lm's sanitize reads them back."""
    e, rows, _ = packed.shape
    return packed.view(mx.uint8).reshape(e, rows, -1, 16)


# OpenAI's FP4 (e2m1) values by 4-bit code, as gpt-oss's reference decodes its blocks.
FP4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
              -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def decode_blocks(blocks, scales):
    """gpt-oss's own reading of `*_blocks`/`*_scales` (numpy, independent of MLX): each byte
    holds two FP4 codes, low nibble first; each group of 32 is scaled by 2^(scale - 127)."""
    blocks, scales = np.array(blocks), np.array(scales).astype(np.int32) - 127
    lut = np.array(FP4_VALUES, dtype=np.float32)
    values = np.empty((*blocks.shape[:-1], 32), dtype=np.float32)
    values[..., 0::2], values[..., 1::2] = lut[blocks & 0x0F], lut[blocks >> 4]
    values = np.ldexp(values, scales[..., None])
    return values.reshape(*blocks.shape[:-2], -1)


def dequantize_mxfp4(packed, scales):
    # MLX gives bfloat16 here; every FP4 value times a power of two is exact in it.
    return mx.dequantize(packed, scales, group_size=32, bits=4, mode="mxfp4").astype(mx.float32)


def check_decodes(decoded, packed, scales, name):
    """The blocks decode, by OpenAI's recipe, to the very experts mlx-lm runs."""
    if not np.array_equal(np.array(dequantize_mxfp4(packed, scales)), decoded):
        raise SystemExit(f"gpt_oss: {name} does not decode as OpenAI's blocks")


def hf_gpt_oss(weights, cfg):
    for key in [k for k in weights if k.endswith("mlp.experts.gate_proj.weight")]:
        p = key[: -len("gate_proj.weight")]
        gate_w, up_w = weights.pop(p + "gate_proj.weight"), weights.pop(p + "up_proj.weight")
        gate_s, up_s = weights.pop(p + "gate_proj.scales"), weights.pop(p + "up_proj.scales")
        gate_b, up_b = weights.pop(p + "gate_proj.bias"), weights.pop(p + "up_proj.bias")
        weights[p + "gate_up_proj_blocks"] = mxfp4_blocks(interleave_rows(gate_w, up_w))
        weights[p + "gate_up_proj_scales"] = interleave_rows(gate_s, up_s)
        weights[p + "gate_up_proj_bias"] = interleave_rows(gate_b, up_b)
        down_w, down_s = weights.pop(p + "down_proj.weight"), weights.pop(p + "down_proj.scales")
        weights[p + "down_proj_blocks"] = mxfp4_blocks(down_w)
        weights[p + "down_proj_scales"] = down_s
        weights[p + "down_proj_bias"] = weights.pop(p + "down_proj.bias")
        down = decode_blocks(weights[p + "down_proj_blocks"], down_s)
        check_decodes(down, down_w, down_s, p + "down_proj")
        gate_up = decode_blocks(weights[p + "gate_up_proj_blocks"],
                                weights[p + "gate_up_proj_scales"])
        check_decodes(gate_up[:, 0::2], gate_w, gate_s, p + "gate_up_proj (gate rows)")
        check_decodes(gate_up[:, 1::2], up_w, up_s, p + "gate_up_proj (up rows)")
    return weights


def hf_glm4_moe(weights, cfg):
    """Per-expert tensors, plus the multi-token-prediction layer the releases carry."""
    return add_mtp_layer(unstack_experts(weights, "mlp.switch_mlp", "mlp.experts"), cfg,
                         "glm4_moe")


def add_mtp_layer(weights, cfg, family):
    """What the released GLM-4.5/4.6/4.7 files carry and mlx-lm drops: a multi-token-prediction
    layer at index `num_hidden_layers` (a whole decoder layer plus `eh_proj`, `enorm`, `hnorm`,
    `shared_head.norm`), random too."""
    n, hidden = cfg["num_hidden_layers"], cfg["hidden_size"]
    last, mtp = f"model.layers.{n - 1}.", f"model.layers.{n}."
    extra = {mtp + k[len(last):]: v.shape for k, v in weights.items() if k.startswith(last)}
    extra.update({
        mtp + "eh_proj.weight": (hidden, 2 * hidden),
        mtp + "enorm.weight": (hidden,),
        mtp + "hnorm.weight": (hidden,),
        mtp + "shared_head.norm.weight": (hidden,),
    })
    for name, shape in extra.items():
        weights[name] = 0.05 * mx.random.normal(shape, key=key_for(family, name))
    return weights


def hf_glm4_moe_lite(weights, cfg):
    """DeepSeek V3's `kv_b_proj`, plus the multi-token-prediction layer the releases carry."""
    return add_mtp_layer(hf_deepseek_v3(weights, cfg), cfg, "glm4_moe_lite")


def hf_minimax(weights, cfg):
    names = {"gate_proj": "w1", "down_proj": "w2", "up_proj": "w3"}
    return unstack_experts(weights, "block_sparse_moe.switch_mlp", "block_sparse_moe.experts",
                           names)


# Qwen3.5's block norms, which Hugging Face's files store zero-centred (`w` of `1 + w`).
QWEN3_5_NORMS = (".input_layernorm.weight", ".post_attention_layernorm.weight",
                 "model.norm.weight", ".q_norm.weight", ".k_norm.weight")


def hf_minimax_m3(weights, cfg):
    """MiniMax's layout: each expert's w1 (gate), w3 (up) and w2 (down) one matrix each under
    `block_sparse_moe.experts`, and a vision tower (one tensor here) the text model skips."""
    names = {"gate_proj": "w1", "down_proj": "w2", "up_proj": "w3"}
    weights = unstack_experts(weights, "block_sparse_moe.switch_mlp",
                              "block_sparse_moe.experts", names)
    weights["vision_tower.patch_embed.proj.weight"] = 0.05 * mx.random.normal(
        (64, 3, 2, 2), key=key_for("minimax_m3_vl", "vision_tower"))
    return weights


def hf_qwen3_5(weights, cfg):
    """Qwen's own layout: `model.language_model.*` and a top-level `lm_head`, convolutions
    `[channels, 1, kernel]`, block norms zero-centred; plus a vision tower and an MTP layer that
    a text model never reads."""
    out = {}
    for key, value in weights.items():
        if "conv1d.weight" in key:
            value = value.moveaxis(1, 2)
        if key.endswith(QWEN3_5_NORMS) and value.ndim == 1:
            value = value - 1.0
        if key.startswith("language_model.model."):
            key = "model.language_model." + key[len("language_model.model."):]
        elif key.startswith("language_model."):
            key = key[len("language_model."):]
        out[key] = value
    for name, shape in {"model.visual.patch_embed.proj.weight": (64, 3, 2, 16, 16),
                        "mtp.fc.weight": (64, 128)}.items():
        out[name] = 0.05 * mx.random.normal(shape, key=key_for("qwen3_5", name))
    return out


def hf_qwen3_5_moe(weights, cfg):
    """Qwen3.5-MoE's own layout: Qwen3.5's, each layer's experts fused as
    `experts.gate_up_proj` [E, 2 x moe_intermediate, hidden] (gate rows first) and
    `experts.down_proj` [E, hidden, moe_intermediate], no `.weight` suffix."""
    for key in [k for k in weights if k.endswith(".switch_mlp.gate_proj.weight")]:
        prefix = key[: -len(".switch_mlp.gate_proj.weight")]
        gate = weights.pop(key)
        up = weights.pop(f"{prefix}.switch_mlp.up_proj.weight")
        weights[f"{prefix}.experts.gate_up_proj"] = mx.concatenate([gate, up], axis=-2)
        weights[f"{prefix}.experts.down_proj"] = weights.pop(
            f"{prefix}.switch_mlp.down_proj.weight")
    return hf_qwen3_5(weights, cfg)


def hf_qwen3_next(weights, cfg):
    """Qwen's own layout: experts one matrix each, convolutions `[channels, 1, kernel]`, block
    norms zero-centred; plus an MTP layer a text model never reads."""
    weights = unstack_experts(weights, "mlp.switch_mlp", "mlp.experts")
    out = {}
    for key, value in weights.items():
        if "conv1d.weight" in key:
            value = value.moveaxis(1, 2)
        if key.endswith(QWEN3_5_NORMS) and value.ndim == 1:
            value = value - 1.0
        out[key] = value
    out["mtp.fc.weight"] = 0.05 * mx.random.normal((64, 128), key=key_for("qwen3_next", "mtp"))
    return out


def hf_gemma4_text(weights, cfg):
    """Gemma 4's own layout: each layer's experts fused as `experts.gate_up_proj` [E, 2 x width,
    hidden] (gate rows first) and `experts.down_proj`, no `.weight` suffix."""
    for key in [k for k in weights if k.endswith(".experts.switch_glu.gate_proj.weight")]:
        prefix = key[: -len(".switch_glu.gate_proj.weight")]
        gate = weights.pop(key)
        up = weights.pop(f"{prefix}.switch_glu.up_proj.weight")
        weights[f"{prefix}.gate_up_proj"] = mx.concatenate([gate, up], axis=-2)
        weights[f"{prefix}.down_proj"] = weights.pop(f"{prefix}.switch_glu.down_proj.weight")
    return weights


STEP3P5_NAMES = [(".mlp.switch_mlp.", ".moe."), (".mlp.gate.gate.", ".moe.gate."),
                 (".mlp.gate.router_bias", ".moe.router_bias"),
                 (".mlp.share_expert.", ".share_expert.")]


def hf_step3p5(weights, cfg):
    """StepFun's own layout ("vanilla" to mlx-lm's sanitize): experts under `moe.`, the shared
    expert at the layer's level, every norm stored zero-centred."""
    out = {}
    for key, value in weights.items():
        for mine, theirs in STEP3P5_NAMES:
            if mine in key:
                key = key.replace(mine, theirs)
                break
        if key.endswith(".weight") and "norm" in key:
            value = value - 1.0
        out[key] = value
    return out


def hf_dsa(family):
    """DeepSeek V3.2's and GLM-5's layout: DeepSeek V3's `kv_b_proj` and per-expert
    tensors (the indexer's keep their names), plus the multi-token-prediction layer."""
    return lambda weights, cfg: add_mtp_layer(hf_deepseek_v3(weights, cfg), cfg, family)


def hf_mistral4(weights, cfg):
    """Mistral's own layout: `model.language_model.*` and a top-level `lm_head`, DeepSeek
    V3's `kv_b_proj`, experts one matrix each; plus a vision tower the text model never
    reads."""
    inner = {k[len("language_model."):]: v for k, v in weights.items()}
    inner = hf_deepseek_v3(inner, cfg["text_config"])
    out = {}
    for key, value in inner.items():
        if key.startswith("model."):
            key = "model.language_model." + key[len("model."):]
        out[key] = value
    name = "model.vision_tower.patch_conv.weight"
    out[name] = 0.05 * mx.random.normal((64, 3, 16, 16), key=key_for("mistral4", name))
    return out


def hf_nemotron_h(weights, cfg):
    """NVIDIA's layout: experts one matrix each (`experts.<e>.up_proj`, `down_proj`),
    convolutions `[channels, 1, kernel]`."""
    names = {"fc1": "up_proj", "fc2": "down_proj"}
    weights = unstack_experts(weights, "mixer.switch_mlp", "mixer.experts", names)
    return {k: (v.moveaxis(1, 2) if "conv1d.weight" in k else v) for k, v in weights.items()}


def hf_kimi_linear(weights, cfg):
    """Moonshot's layout: experts one matrix each as w1/w2/w3 under `block_sparse_moe` with
    its router, correction and shared expert, convolutions `[channels, 1, kernel]` named
    `q_conv1d`/`k_conv1d`/`v_conv1d`, `dt_bias` `[heads, head_dim]`, DeepSeek's `kv_b_proj`."""
    names = {"gate_proj": "w1", "down_proj": "w2", "up_proj": "w3"}
    weights = unstack_experts(weights, "mlp.switch_mlp", "block_sparse_moe.experts", names)
    heads = cfg["linear_attn_config"]["num_heads"]
    out = {}
    for key, value in weights.items():
        moe = key.split(".mlp.")
        if len(moe) == 2 and (moe[1].startswith(("gate.", "shared_experts."))
                              or moe[1] == "e_score_correction_bias"):
            rest = "gate.e_score_correction_bias" if moe[1] == "e_score_correction_bias" else moe[1]
            key = f"{moe[0]}.block_sparse_moe.{rest}"
        for c in ("q", "k", "v"):
            if key.endswith(f".{c}_conv.conv.weight"):
                key = key.replace(f".{c}_conv.conv.weight", f".{c}_conv1d.weight")
                value = value.moveaxis(1, 2)
        if key.endswith(".dt_bias"):
            value = value.reshape(heads, -1)
        out[key] = value
    return hf_deepseek_v3(out, cfg)


# Kimi K3's attention residual weights as Moonshot stores them: `<src>.proj_weight` and
# `<src>.norm_weight` (mlx-lm's `<src>_proj.weight`, `<src>_norm.weight`).
KIMI_K3_RESIDUALS = ("self_attention_res", "mlp_res", "output_attn_res")


def hf_kimi_k3(weights, cfg):
    """Moonshot's layout of the text model under `language_model.`: Kimi Linear's (experts
    w1/w2/w3 under `block_sparse_moe` with the latent projections, `kv_b_proj`, convolutions
    `[channels, 1, kernel]`), the fused `qkv_proj` and `qkv_conv` split into `q/k/v_proj` and
    `q/k/v_conv1d`, the residual weights as `<src>.proj_weight`/`norm_weight`; plus a vision
    tower the text model never reads."""
    text = cfg["text_config"]
    inner = {k[len("language_model."):]: v for k, v in weights.items()}
    out = {}
    for key, value in inner.items():
        if key.endswith(".self_attn.qkv_proj.weight"):
            prefix = key[: -len("qkv_proj.weight")]
            for c, part in zip("qkv", mx.split(value, 3, axis=0)):
                out[f"{prefix}{c}_proj.weight"] = part
            continue
        if key.endswith(".self_attn.qkv_conv.conv.weight"):
            prefix = key[: -len("qkv_conv.conv.weight")]
            for c, part in zip("qkv", mx.split(value, 3, axis=0)):
                out[f"{prefix}{c}_conv.conv.weight"] = part
            continue
        moe = key.split(".mlp.")
        if len(moe) == 2 and moe[1].startswith(("routed_expert_", "switch_mlp.")):
            key = f"{moe[0]}.block_sparse_moe.{moe[1]}"
        for src in KIMI_K3_RESIDUALS:
            for part in ("proj", "norm"):
                if key.endswith(f"{src}_{part}.weight"):
                    key = key[: -len(f"{src}_{part}.weight")] + f"{src}.{part}_weight"
        out[key] = value
    names = {"gate_proj": "w1", "down_proj": "w2", "up_proj": "w3"}
    out = unstack_experts(out, "block_sparse_moe.switch_mlp", "block_sparse_moe.experts",
                          names)
    # The router, its correction and the shared expert move with Kimi Linear's layout.
    out = hf_kimi_linear(out, text)
    out = {f"language_model.{k}": v for k, v in out.items()}
    out["vision_tower.patch_embed.proj.weight"] = 0.05 * mx.random.normal(
        (64, 3, 2, 2), key=key_for("kimi_k3", "vision_tower"))
    return out


HF_LAYOUT = {
    "qwen3_next": hf_qwen3_next,
    "qwen3_5": hf_qwen3_5,
    "qwen3_5_moe": hf_qwen3_5_moe,
    "qwen3_moe": hf_qwen3_moe,
    "deepseek_v3": hf_deepseek_v3,
    "gpt_oss": hf_gpt_oss,
    "glm4_moe": hf_glm4_moe,
    "glm4_moe_lite": hf_glm4_moe_lite,
    "minimax": hf_minimax,
    "gemma3_text": lambda weights, cfg: weights,  # no sanitize; tied, so no lm_head
    "llama4_text": lambda weights, cfg: weights,  # no sanitize
    "gemma4_text": hf_gemma4_text,
    "gemma4_text_e2b": hf_gemma4_text,
    "step3p5": hf_step3p5,
    "nemotron_h": hf_nemotron_h,
    "nemotron_h_latent": hf_nemotron_h,
    "deepseek_v32": hf_dsa("deepseek_v32"),
    "glm_moe_dsa": hf_dsa("glm_moe_dsa"),
    "mistral4": hf_mistral4,
    "kimi_linear": hf_kimi_linear,
    "kimi_k3": hf_kimi_k3,
    "minimax_m3_vl": hf_minimax_m3,
}


# ---- references ---------------------------------------------------------------------------


def forward_reference(model):
    """mlx-lm's logits: one uncached forward over the prompt, then greedy cached decode."""
    prompt = mx.array(PROMPT, dtype=mx.int32)
    prefill = model(prompt[None]).astype(mx.float32)[0]
    cache = make_prompt_cache(model)
    cached_prefill = model(prompt[None], cache=cache).astype(mx.float32)[0]
    token = mx.argmax(prefill[-1]).astype(mx.int32)
    tokens, logits = [], []
    for _ in range(DECODE_STEPS):
        tokens.append(token)
        out = model(token.reshape(1, 1), cache=cache).astype(mx.float32)[0, -1]
        logits.append(out)
        token = mx.argmax(out).astype(mx.int32)
    ref = {
        "prompt": prompt,
        "prefill_logits": prefill,
        "decode_tokens": mx.stack(tokens),
        "decode_logits": mx.stack(logits),
    }
    # The same positions in one uncached forward over prompt + decode tokens: how far mlx-lm's
    # own cached decode (DeepSeek's absorbed MLA, rotating sliding-window caches) is from it.
    full = model(mx.concatenate([prompt, ref["decode_tokens"]])[None]).astype(mx.float32)[0]
    diffs = {
        "cached_prefill_max_abs_diff": mx.abs(cached_prefill - prefill).max(),
        "decode_vs_uncached_max_abs_diff": mx.abs(full[len(PROMPT):] - ref["decode_logits"]).max(),
    }
    mx.eval(ref, diffs)
    return ref, {k: float(f"{float(v):.3e}") for k, v in diffs.items()}


def chat_reference(model, folder):
    """mlx-lm's greedy answer to CHAT through the folder's tokenizer and chat template, up to
    CHAT_TOKENS tokens or an end-of-sequence token, as `mlx_lm.generate` decodes it."""
    from mlx_lm.generate import generate_step
    from mlx_lm.utils import load_tokenizer

    tokenizer = load_tokenizer(folder)
    prompt = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True)
    tokens = []
    for token, _ in generate_step(mx.array(prompt), model, max_tokens=CHAT_TOKENS):
        token = int(token)
        if token in tokenizer.eos_token_ids:
            break
        tokens.append(token)
    return {
        "messages": CHAT,
        "max_tokens": CHAT_TOKENS,
        "prompt_tokens": len(prompt),
        "tokens": tokens,
        "text": tokenizer.decode(tokens),
    }


def write_reference(folder, family, layout, config, extra=None):
    model, _ = load_model(folder)
    ref, diffs = forward_reference(model)
    mx.save_safetensors(str(folder / "reference.safetensors"), ref)
    if (folder / "tokenizer.json").exists():
        chat = chat_reference(model, folder)
        (folder / "chat_reference.json").write_text(json.dumps(chat, indent=2) + "\n")
    summary = {
        k: v for k, v in sorted(config.items())
        if k not in ("architectures", "quantization_config")
    }
    meta = {
        "family": family,
        "layout": layout,
        "seed": SEED,
        "mlx": importlib.metadata.version("mlx"),
        "mlx_lm": importlib.metadata.version("mlx-lm"),
        "prompt": PROMPT,
        "decode_tokens": ref["decode_tokens"].tolist(),
        "config": summary,
    }
    meta.update(diffs)
    meta.update(extra or {})
    (folder / "reference.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return ref


def copy_tokenizer(tokenizer, folder):
    if tokenizer is None:
        return
    for name in TOKENIZER_FILES:
        shutil.copyfile(tokenizer / name, folder / name)


def unquantized_layers(model, kept=()):
    """Paths of layers that could be quantized but are not (what convert leaves behind when a
    width is not a multiple of the group size), except those the family's own quant_predicate
    keeps in floats (`kept`: patterns of their paths)."""
    return [p for p, m in model.named_modules()
            if hasattr(m, "to_quantized") and not any(k in p for k in kept)]


def quantized_folder(hf, out, layout, tokenizer, kept=()):
    bits, group, mode = {"q4": (4, 64, "affine"), "q8": (8, 64, "affine"),
                         "mxfp4": (4, 32, "mxfp4"), "mxfp8": (8, 32, "mxfp8")}[layout]
    # What mlx_lm.convert does (load lazily, quantize_model with the model's own
    # quant_predicate, save_model + save_config), without re-saving the tokenizer through
    # transformers: the tokenizer files are copied byte for byte instead.
    model, config = load_model(hf, lazy=True)
    with contextlib.redirect_stdout(io.StringIO()):  # its "[INFO] Quantized ..." line
        model, config = quantize_model(model, config, group, bits, mode=mode)
    left = unquantized_layers(model, kept)
    if left:
        raise SystemExit(f"{out}: layers left unquantized: {left}")
    out.mkdir(parents=True)
    save_model(out, model, donate_model=True)
    save_config(config, config_path=out / "config.json")
    copy_tokenizer(tokenizer, out)
    return config


def build_family(family, root, tokenizer):
    spec = FAMILIES[family]
    started = time.perf_counter()
    config = dict(spec["config"], vocab_size=VOCAB, torch_dtype="float32", **TOKENS)
    if "text_config" in config:  # a multimodal release: the text model's numbers are there
        config["text_config"] = dict(config["text_config"], vocab_size=VOCAB)
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    randomize(model, family, spec.get("norm_base", 1.0), spec.get("std", ()))
    if spec.get("tied"):
        # As mlx-lm's sanitize does when the files have no lm_head.
        model.tie_word_embeddings = True
        model.pop("lm_head")
    if spec.get("experts_mxfp4"):
        # gpt-oss ships its experts in mxfp4: the reference is the quantized experts.
        nn.quantize(model, 32, 4, mode="mxfp4",
                    class_predicate=lambda p, m: ".experts." in p and hasattr(m, "to_quantized"))
    prompt = mx.array(PROMPT, dtype=mx.int32)
    in_memory = model(prompt[None]).astype(mx.float32)
    mx.eval(in_memory)

    out = root / f"{family}.partial"
    shutil.rmtree(out, ignore_errors=True)
    hf = out / "hf"
    hf.mkdir(parents=True)
    weights = dict(tree_flatten(model.parameters()))
    weights = HF_LAYOUT[family](weights, config)
    weights = dict(sorted(weights.items()))
    mx.save_safetensors(str(hf / "model.safetensors"), weights, metadata={"format": "pt"})
    (hf / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    copy_tokenizer(tokenizer, hf)

    loaded, _ = load_model(hf)
    again = loaded(prompt[None]).astype(mx.float32)
    roundtrip = float(mx.abs(again - in_memory).max())
    if roundtrip > 1e-5:
        raise SystemExit(f"{family}: mlx-lm reads {hf} back to other logits (max diff {roundtrip})")
    del loaded
    write_reference(hf, family, "hf", config,
                    {"in_memory_max_abs_diff": float(f"{roundtrip:.3e}")})
    done = ["hf"]
    for layout in spec["layouts"]:
        qconfig = quantized_folder(hf, out / layout, layout, tokenizer,
                                   spec.get("float_layers", ()))
        write_reference(out / layout, family, layout, qconfig)
        done.append(layout)
    final = root / family
    shutil.rmtree(final, ignore_errors=True)
    out.rename(final)
    size = sum(f.stat().st_size for f in final.rglob("*") if f.is_file())
    log(f"family fixtures: {family}: {', '.join(done)} in {time.perf_counter() - started:.1f}s "
        f"({size / 1e6:.1f} MB, hf round trip max diff {roundtrip:.1e})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--tokenizer", type=Path, help="folder with SmolLM2's tokenizer files")
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--list", action="store_true", help="print the families and layouts")
    args = parser.parse_args()
    if args.list:
        for name, spec in FAMILIES.items():
            print(name, " ".join(["hf"] + spec["layouts"]))
        return
    mx.set_default_device(mx.cpu)
    args.root.mkdir(parents=True, exist_ok=True)
    families = args.families.split(",")
    for family in families:
        if family not in FAMILIES:
            raise SystemExit(f"unknown family {family!r}; known: {', '.join(FAMILIES)}")
    for family in families:
        build_family(family, args.root, args.tokenizer)
    # What exists, for the xtask's stamp check and for tests that walk every folder.
    manifest = {f: ["hf"] + FAMILIES[f]["layouts"] for f in FAMILIES if (args.root / f).is_dir()}
    (args.root / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


if __name__ == "__main__":
    main()
