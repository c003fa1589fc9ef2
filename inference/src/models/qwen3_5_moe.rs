//! Qwen3.5 / Qwen3.6 MoE (`qwen3_5_moe`: Qwen3.5-35B-A3B, Qwen3.5-397B-A17B), the text model,
//! as mlx-lm's `qwen3_5_moe.py` runs it: Qwen3.5's hybrid layers ([`super::hybrid`]: Gated
//! DeltaNet, gated attention every `full_attention_interval`-th layer) with Qwen3-Next's
//! sparse block ([`super::sparse_moe`]: softmax top-k experts, a shared expert scaled by
//! `sigmoid(shared_expert_gate(x))`) on every layer, whatever `decoder_sparse_step` says (mlx-lm
//! does not read it for this family). `norm_topk_prob` defaults to true, as mlx-lm's.
//!
//! The releases are multimodal (`Qwen3_5MoeForConditionalGeneration`), read as a text model as
//! Qwen3.5 dense is; their Hugging Face files store each layer's experts fused
//! (`experts.gate_up_proj`), mlx-community's stacked (`switch_mlp.*`, the routers and
//! shared-expert gates at 8 bits when the rest is 4).

use super::base::{DecoderLayer, Family, FeedForward};
use super::hybrid::{
    configure_hybrid, hybrid_block, hybrid_final_norm, hybrid_tensor_divisors, hybrid_tensor_names,
    QWEN3_5,
};
use super::sparse_moe::{
    load_sparse_block, sparse_block_tensor_names, sparse_moe_config, SparseLayers,
};
use crate::config::ModelConfig;
use crate::error::{InferenceError, Result};
use crate::weights::{GgufNames, TensorSource, WeightFormat};
use mlx_rs::{Array, Dtype};
use serde_json::Value;

/// The Qwen3.5 MoE family.
pub struct Qwen3_5Moe;

const FAMILY: &str = "qwen3_5_moe";

impl Family for Qwen3_5Moe {
    fn hf_names(&self) -> (&'static str, &'static str) {
        (FAMILY, "Qwen3_5MoeForCausalLM")
    }

    fn configure(&self, json: &Value, config: &mut ModelConfig) -> Result<()> {
        configure_hybrid(json, config, FAMILY, QWEN3_5)?;
        config.moe = Some(sparse_moe_config(json, FAMILY, SparseLayers::All, true)?);
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
            InferenceError::BadConfig(format!("a {FAMILY} configuration without its experts"))
        })?;
        let ffn = FeedForward::Experts(load_sparse_block(config, moe, source, layer, format)?);
        hybrid_block(config, source, layer, format, ffn, QWEN3_5)
    }

    fn final_norm(
        &self,
        config: &ModelConfig,
        source: &mut dyn TensorSource,
        dtype: Dtype,
    ) -> Result<Array> {
        hybrid_final_norm(config, source, dtype)
    }

    fn layer_tensor_names(&self, config: &ModelConfig, layer: usize) -> Vec<String> {
        let mut names = hybrid_tensor_names(config, layer, QWEN3_5);
        if let Some(moe) = &config.moe {
            names.extend(sparse_block_tensor_names(moe, layer, true));
        }
        names
    }

    fn tensor_divisors(&self, config: &ModelConfig) -> Vec<crate::tensor_divisors::TensorDivisor> {
        hybrid_tensor_divisors(config)
    }
}

impl GgufNames for Qwen3_5Moe {
    fn gguf_part(&self, _hf_part: &str) -> Option<&'static str> {
        None
    }
}
