//! Qwen3-Next (`qwen3_next`: Qwen3-Next-80B-A3B, Qwen3-Coder-Next), as mlx-lm's
//! `qwen3_next.py` runs it: the hybrid layers Qwen3.5 later took over ([`super::hybrid`]:
//! Gated DeltaNet, gated attention every `full_attention_interval`-th layer), with Gated
//! DeltaNet's projections fused per key head (`in_proj_qkvz`, `in_proj_ba`), its keys at the
//! top level of config.json (RoPE from `rope_theta`, `partial_rotary_factor`, `rope_scaling`),
//! and the sparse block ([`super::sparse_moe`]) on every `decoder_sparse_step`-th layer not in
//! `mlp_only_layers` (the others a dense SwiGLU MLP of `intermediate_size`).
//! `norm_topk_prob` defaults to false, as mlx-lm's.
//!
//! Hugging Face's files store experts one matrix each, the block norms zero-centred and the
//! convolution `[channels, 1, kernel]` (read as mlx-lm's sanitize converts them: the norms
//! whenever experts come one matrix each); mlx-community's store experts stacked, the routers
//! and shared-expert gates at 8 bits when the rest is 4. The MTP layer is never read.

use super::base::{layer_tensor, DecoderLayer, Family, FeedForward, Mlp};
use super::hybrid::{
    configure_hybrid, hybrid_block, hybrid_final_norm, hybrid_tensor_divisors, hybrid_tensor_names,
    QWEN3_NEXT,
};
use super::sparse_moe::{
    load_sparse_block, sparse_block_tensor_names, sparse_moe_config, SparseLayers,
};
use crate::config::ModelConfig;
use crate::error::Result;
use crate::weights::{GgufNames, TensorSource, WeightFormat};
use mlx_rs::{Array, Dtype};
use serde_json::Value;

/// The Qwen3-Next family.
pub struct Qwen3Next;

const FAMILY: &str = "qwen3_next";

impl Family for Qwen3Next {
    fn hf_names(&self) -> (&'static str, &'static str) {
        (FAMILY, "Qwen3NextForCausalLM")
    }

    fn configure(&self, json: &Value, config: &mut ModelConfig) -> Result<()> {
        configure_hybrid(json, config, FAMILY, QWEN3_NEXT)?;
        let moe = sparse_moe_config(json, FAMILY, SparseLayers::BySparseStep, false)?;
        config.moe = Some(moe);
        Ok(())
    }

    fn block(
        &self,
        config: &ModelConfig,
        source: &mut dyn TensorSource,
        layer: usize,
        format: WeightFormat,
    ) -> Result<DecoderLayer> {
        let ffn = match config.moe.as_ref().filter(|m| m.is_moe_layer(layer)) {
            Some(moe) => {
                FeedForward::Experts(load_sparse_block(config, moe, source, layer, format)?)
            }
            None => FeedForward::Dense(Mlp::load(config, source, layer, format)?),
        };
        hybrid_block(config, source, layer, format, ffn, QWEN3_NEXT)
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
        let mut names = hybrid_tensor_names(config, layer, QWEN3_NEXT);
        match config.moe.as_ref().filter(|m| m.is_moe_layer(layer)) {
            Some(moe) => names.extend(sparse_block_tensor_names(moe, layer, false)),
            None => {
                for proj in ["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"] {
                    names.push(layer_tensor(layer, &format!("{proj}.weight")));
                }
            }
        }
        names
    }

    fn tensor_divisors(&self, config: &ModelConfig) -> Vec<crate::tensor_divisors::TensorDivisor> {
        hybrid_tensor_divisors(config)
    }
}

impl GgufNames for Qwen3Next {
    fn gguf_part(&self, _hf_part: &str) -> Option<&'static str> {
        None
    }
}
