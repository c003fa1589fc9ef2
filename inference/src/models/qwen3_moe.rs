//! Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder-480B-A35B): Qwen3's attention (an RMS
//! norm on each head's queries and keys, no biases) with a Mixture-of-Experts feed-forward on
//! every `decoder_sparse_step`-th layer not in `mlp_only_layers` (the others keep a dense
//! MLP). The router (`mlp.gate`) takes a softmax over every expert, keeps the top k and, with
//! `norm_topk_prob`, renormalizes their weights, as mlx-lm's `qwen3_moe.py`.

use super::base::{
    gguf_part_in, layer_tensor, Attention, DecoderLayer, Family, FeedForward, HeadNorms, Mlp,
    LAYER_TENSORS,
};
use super::config_keys::family_keys;
use super::gguf_moe::{gguf_experts, EXPERT_TENSORS};
use super::moe::MoeBlock;
use crate::config::{ModelConfig, MoeConfig, RouterKind};
use crate::error::{InferenceError, Result};
use crate::weights::FormatOnMlx;
use crate::weights::{GgufNames, TensorSource, WeightFormat};

/// Qwen3's per-head norms, with their GGUF names.
const HEAD_NORMS: &[(&str, &str)] = &[
    ("self_attn.q_norm", "attn_q_norm"),
    ("self_attn.k_norm", "attn_k_norm"),
];

/// The attention and norm tensors every layer has (the dense MLP's are in [`LAYER_TENSORS`]
/// too, and only dense layers have them).
const ATTENTION_AND_NORMS: &[&str] = &[
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "input_layernorm",
    "post_attention_layernorm",
    "self_attn.q_norm",
    "self_attn.k_norm",
];

/// The Qwen3-MoE family.
pub struct Qwen3Moe;

/// The keys of a `qwen3_moe` config.json beyond the shared ones.
#[derive(serde::Deserialize)]
struct Qwen3MoeKeys {
    num_experts: usize,
    num_experts_per_tok: usize,
    moe_intermediate_size: usize,
    #[serde(default)]
    norm_topk_prob: bool,
    #[serde(default)]
    mlp_only_layers: Vec<usize>,
    #[serde(default = "one")]
    decoder_sparse_step: usize,
}

fn one() -> usize {
    1
}

impl Family for Qwen3Moe {
    fn hf_names(&self) -> (&'static str, &'static str) {
        ("qwen3_moe", "Qwen3MoeForCausalLM")
    }

    fn gguf_architectures(&self) -> &'static [&'static str] {
        &["qwen3moe"]
    }

    fn configure(&self, json: &serde_json::Value, config: &mut ModelConfig) -> Result<()> {
        let keys: Qwen3MoeKeys = family_keys(json, "qwen3_moe")?;
        config.moe = Some(MoeConfig {
            num_experts: keys.num_experts,
            experts_per_token: keys.num_experts_per_tok,
            expert_width: keys.moe_intermediate_size,
            router: RouterKind::SoftmaxTopK {
                normalize: keys.norm_topk_prob,
            },
            dense_layers: keys.mlp_only_layers,
            sparse_step: keys.decoder_sparse_step,
            first_dense: 0,
            shared_width: 0,
            latent_width: 0,
        });
        Ok(())
    }

    /// llama.cpp's `qwen3moe`: every layer has experts, and its graph always renormalizes the
    /// top k weights (`build_moe_ffn(..., norm_w = true, ...)`, whatever `norm_topk_prob` was).
    fn configure_gguf(
        &self,
        file: &crate::gguf::GgufFile,
        arch: &str,
        config: &mut ModelConfig,
    ) -> Result<()> {
        let experts = gguf_experts(file, arch)?;
        config.moe = Some(experts.on_every_layer(RouterKind::SoftmaxTopK { normalize: true }));
        Ok(())
    }

    fn block(
        &self,
        config: &ModelConfig,
        source: &mut dyn TensorSource,
        layer: usize,
        format: WeightFormat,
    ) -> Result<DecoderLayer> {
        let moe = config.moe.as_ref().ok_or_else(|| {
            InferenceError::BadConfig("a qwen3_moe configuration without its experts".into())
        })?;
        let dtype = format.compute_dtype();
        let mut norm =
            |part: &str| source.dense(&layer_tensor(layer, &format!("{part}.weight")), dtype);
        let head_norms = HeadNorms::each_head(norm(HEAD_NORMS[0].0)?, norm(HEAD_NORMS[1].0)?);
        let attention = Attention::load(config, source, layer, format, Some(head_norms))?;
        let ffn = if moe.is_moe_layer(layer) {
            FeedForward::Experts(MoeBlock::load(config, moe, source, layer, format)?)
        } else {
            FeedForward::Dense(Mlp::load(config, source, layer, format)?)
        };
        DecoderLayer::assemble(config, source, layer, format, attention, ffn)
    }

    fn layer_tensor_names(&self, config: &ModelConfig, layer: usize) -> Vec<String> {
        let mut names: Vec<String> = ATTENTION_AND_NORMS
            .iter()
            .map(|part| layer_tensor(layer, &format!("{part}.weight")))
            .collect();
        match config.moe.as_ref().filter(|m| m.is_moe_layer(layer)) {
            Some(moe) => {
                names.push(layer_tensor(layer, "mlp.gate.weight"));
                for e in 0..moe.num_experts {
                    for proj in ["gate_proj", "up_proj", "down_proj"] {
                        names.push(layer_tensor(
                            layer,
                            &format!("mlp.experts.{e}.{proj}.weight"),
                        ));
                    }
                }
            }
            None => {
                for proj in ["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"] {
                    names.push(layer_tensor(layer, &format!("{proj}.weight")));
                }
            }
        }
        names
    }
}

impl GgufNames for Qwen3Moe {
    fn gguf_part(&self, hf_part: &str) -> Option<&'static str> {
        gguf_part_in(
            LAYER_TENSORS.iter().chain(HEAD_NORMS).chain(EXPERT_TENSORS),
            hf_part,
        )
    }
}
