//! DeepSeek V3.2 (`deepseek_v32`), as mlx-lm's `deepseek_v32.py`: DeepSeek V3's block
//! ([`super::latent_moe`]: latent attention with interleaved RoPE and YaRN, a dense SwiGLU on
//! the first `first_k_dense_replace` layers, then sigmoid-routed experts with a shared expert),
//! with DeepSeek Sparse Attention: a lightning indexer per layer ([`super::dsa_indexer`])
//! picks the `index_topk` past positions each query reads, its RoPE over halves unless
//! `indexer_rope_interleave`. The bottleneck norms keep the reference's fixed 1e-6. The
//! released checkpoints carry a multi-token-prediction layer at index `num_hidden_layers`; only
//! layers below it are read.

use super::base::{gguf_part_in, DecoderLayer, Family, LAYER_TENSORS};
use super::config_keys::family_keys;
use super::dsa_indexer::IndexerShape;
use super::latent_moe::{latent_moe_block, latent_moe_tensor_names};
use crate::config::ModelConfig;
use crate::error::Result;
use crate::weights::{GgufNames, TensorSource, WeightFormat};
use serde_json::Value;

/// The DeepSeek V3.2 family.
pub struct DeepseekV32;

/// The reference normalizes both bottlenecks with this epsilon, whatever `rms_norm_eps` says.
const LATENT_NORM_EPS: f32 = 1e-6;

/// The keys of a `deepseek_v32` config.json this file reads itself (the latent widths and the
/// experts are read by the library pieces), with the reference's defaults.
#[derive(serde::Deserialize)]
struct DeepseekV32Keys {
    #[serde(default = "defaults::index_n_heads")]
    index_n_heads: usize,
    #[serde(default = "defaults::index_head_dim")]
    index_head_dim: usize,
    #[serde(default = "defaults::index_topk")]
    index_topk: usize,
    #[serde(default)]
    indexer_rope_interleave: bool,
    #[serde(default = "defaults::one")]
    moe_layer_freq: usize,
}

mod defaults {
    pub fn index_n_heads() -> usize {
        64
    }
    pub fn index_head_dim() -> usize {
        128
    }
    pub fn index_topk() -> usize {
        2048
    }
    pub fn one() -> usize {
        1
    }
}

impl Family for DeepseekV32 {
    fn hf_names(&self) -> (&'static str, &'static str) {
        ("deepseek_v32", "DeepseekV32ForCausalLM")
    }

    fn configure(&self, v: &Value, config: &mut ModelConfig) -> Result<()> {
        let keys: DeepseekV32Keys = family_keys(v, "deepseek_v32")?;
        let indexer = IndexerShape {
            heads: keys.index_n_heads,
            head_dim: keys.index_head_dim,
            topk: keys.index_topk,
            interleaved: keys.indexer_rope_interleave,
        };
        indexer.configure(
            v,
            config,
            "deepseek_v32",
            keys.moe_layer_freq,
            LATENT_NORM_EPS,
        )
    }

    fn block(
        &self,
        config: &ModelConfig,
        source: &mut dyn TensorSource,
        layer: usize,
        format: WeightFormat,
    ) -> Result<DecoderLayer> {
        latent_moe_block("deepseek_v32", config, source, layer, format)
    }

    fn layer_tensor_names(&self, config: &ModelConfig, layer: usize) -> Vec<String> {
        latent_moe_tensor_names(config, layer)
    }
}

impl GgufNames for DeepseekV32 {
    fn gguf_part(&self, hf_part: &str) -> Option<&'static str> {
        gguf_part_in(LAYER_TENSORS, hf_part)
    }
}
