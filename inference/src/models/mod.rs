//! The decoders, laid out as mlx-lm lays out its models: a small shared base ([`base`]:
//! attention, MLP, the pre-norm block), one file per family, each with its own block and tensor
//! names ([`llama`], [`qwen2`], [`qwen3`], [`qwen3_moe`], [`gpt_oss`], [`gemma3`], [`glm4_moe`],
//! [`minimax`], [`deepseek_v3`] with its latent attention [`mla`] (sparse in [`deepseek_v32`] and
//! [`glm_moe_dsa`], through the indexer [`dsa_indexer`]), [`qwen3_5`], [`qwen3_5_moe`],
//! [`qwen3_next`] with their hybrid layers `hybrid` and Gated DeltaNet [`gated_delta`],
//! [`kimi_linear`] with Kimi Delta Attention [`kda`], [`kimi_k3`] with attention residuals
//! [`attn_res`]), the
//! Mixture-of-Experts feed-forward the MoE families share ([`moe`]; Qwen3-Next's sparse block
//! with its gated shared expert in `sparse_moe`), and the shard that runs a layer range of any
//! of them ([`shard`]), cut for tensor parallelism in [`tensor_parallel`].
//!
//! A family ([`base::Family`]) is registered under mlx-lm's module name in [`registry`] (one
//! line per family) and chosen once, from the configuration's [`Architecture`], through
//! [`family`]; the shared code never asks which family it runs. A family reads its own
//! `config.json` keys ([`config_keys`]); the pieces several families share (attention kinds,
//! the MLP, experts and their routers, the sigmoid-routed MoE) are a library they call.

pub mod attention;
pub mod attn_res;
pub mod base;
pub mod block_index;
pub(crate) mod config_keys;
pub mod deepseek_v3;
pub mod deepseek_v32;
mod dense_and_experts;
pub mod dsa_indexer;
mod expert_activation;
mod experts;
pub mod gated_delta;
pub mod gemma3;
pub mod gemma3_vision;
pub mod gemma4_text;
pub(crate) mod gguf_moe;
pub mod glm4_moe;
pub mod glm4_moe_lite;
pub mod glm_moe_dsa;
pub mod gpt_oss;
mod hybrid;
pub mod kda;
pub mod kimi_k3;
pub mod kimi_linear;
mod latent_moe;
pub mod llama;
pub mod llama4_text;
pub mod mamba2;
pub mod minimax;
pub mod minimax_m3;
pub mod mistral4;
pub mod mla;
pub mod mlp;
pub mod moe;
pub mod nemotron_h;
mod parts;
pub mod per_layer_inputs;
pub mod qwen2;
pub mod qwen3;
pub mod qwen3_5;
pub mod qwen3_5_moe;
pub mod qwen3_5_vision;
pub mod qwen3_moe;
pub mod qwen3_next;
mod recurrent_split;
pub mod registry;
pub mod shard;
pub mod shared_kv;
pub mod siglip;
mod sigmoid_moe;
mod sparse_moe;
pub mod step3p5;
mod tensor_parallel;

// The image processors turn an image into pixels and count its tokens without MLX: the node
// counts a prompt's image tokens with them (`text`), the towers here take their pixels.
pub use text::{image_processor, qwen_image_processor};

use crate::config::{Architecture, ModelConfig};
use base::Family;

/// The family of `architecture`.
pub fn family(architecture: Architecture) -> &'static dyn Family {
    registry::by_key(architecture.key())
        .expect("an Architecture is made only from a registered family's key")
}

/// Layers no pipeline stage may begin at: for each layer that reads the keys and values of
/// an earlier one ([`base::Family::kv_source`], Gemma 4's KV-shared layers), every layer after
/// the source up to the reader, so the source and its readers stay on one rank (what
/// [`shard::ModelShard`]'s load refuses otherwise). Sorted; empty for most families.
pub fn no_cut_before(config: &ModelConfig) -> Vec<u32> {
    let family = family(config.architecture);
    let joined: std::collections::BTreeSet<u32> = (0..config.num_layers)
        .filter_map(|layer| family.kv_source(config, layer).map(|s| (s, layer)))
        .flat_map(|(source, layer)| (source + 1..=layer).map(|l| l as u32))
        .collect();
    joined.into_iter().collect()
}

/// Hugging Face names of every tensor of a model with this configuration.
pub fn tensor_names(config: &ModelConfig) -> Vec<String> {
    let family = family(config.architecture);
    let mut names = vec!["model.embed_tokens.weight".to_owned()];
    names.extend(family.model_tensor_names(config));
    for layer in 0..config.num_layers {
        names.extend(family.layer_tensor_names(config, layer));
    }
    names.push("model.norm.weight".to_owned());
    if !config.tie_word_embeddings {
        names.push(format!("{}.weight", family.head_tensor()));
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::gguf_name;

    #[test]
    fn gguf_names_follow_llama_cpp() {
        let llama = family(Architecture::parse("llama").unwrap());
        let qwen3 = family(Architecture::parse("qwen3").unwrap());
        assert_eq!(
            gguf_name(llama, "model.layers.3.self_attn.q_proj.weight").as_deref(),
            Some("blk.3.attn_q.weight")
        );
        assert_eq!(
            gguf_name(llama, "model.embed_tokens.weight").as_deref(),
            Some("token_embd.weight")
        );
        assert_eq!(
            gguf_name(qwen3, "model.layers.0.self_attn.k_norm.weight").as_deref(),
            Some("blk.0.attn_k_norm.weight")
        );
        // Only Qwen3 has per-head norms.
        assert_eq!(
            gguf_name(llama, "model.layers.0.self_attn.k_norm.weight"),
            None
        );
        assert!(llama.gguf_rows_interleaved("model.layers.0.self_attn.k_proj.weight"));
        assert!(!qwen3.gguf_rows_interleaved("model.layers.0.self_attn.k_proj.weight"));
    }

    /// llama.cpp's MoE names: every expert of a projection in one tensor, the router, GLM's
    /// correction, shared expert and pre-FFN norm (`tensor_mapping.py`'s names for them).
    #[test]
    fn moe_gguf_names_follow_llama_cpp() {
        let qwen3_moe = family(Architecture::parse("qwen3moe").unwrap());
        let glm = family(Architecture::parse("glm4moe").unwrap());
        for (names, hf, gguf) in [
            (
                qwen3_moe,
                "mlp.switch_mlp.down_proj.weight",
                "ffn_down_exps.weight",
            ),
            (qwen3_moe, "mlp.gate.weight", "ffn_gate_inp.weight"),
            (
                qwen3_moe,
                "post_attention_layernorm.weight",
                "ffn_norm.weight",
            ),
            (
                glm,
                "mlp.switch_mlp.gate_proj.weight",
                "ffn_gate_exps.weight",
            ),
            (glm, "mlp.gate.e_score_correction_bias", "exp_probs_b.bias"),
            (
                glm,
                "mlp.shared_experts.up_proj.weight",
                "ffn_up_shexp.weight",
            ),
            (
                glm,
                "post_attention_layernorm.weight",
                "post_attention_norm.weight",
            ),
            (glm, "self_attn.q_proj.bias", "attn_q.bias"),
        ] {
            assert_eq!(
                gguf_name(names, &format!("model.layers.2.{hf}")),
                Some(format!("blk.2.{gguf}")),
                "{hf}"
            );
        }
        assert_eq!(
            gguf_name(
                qwen3_moe,
                "model.layers.2.mlp.shared_experts.up_proj.weight"
            ),
            None,
            "Qwen3-MoE has no shared expert"
        );
    }
}
