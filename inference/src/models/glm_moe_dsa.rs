//! GLM-5 (`glm_moe_dsa`), as mlx-lm's `glm_moe_dsa.py`, which runs DeepSeek V3.2's model with
//! GLM's keys: latent attention with DeepSeek Sparse Attention ([`super::dsa_indexer`]) in
//! DeepSeek V3's block ([`super::latent_moe`]). What differs from DeepSeek V3.2: RoPE's base
//! and scaling come from `rope_parameters`, and the indexer's RoPE rotates interleaved pairs
//! unless `indexer_rope_interleave` says otherwise. The bottleneck norms keep the reference's
//! fixed 1e-6. The released checkpoints carry a multi-token-prediction layer at index
//! `num_hidden_layers`; only layers below it are read.

use super::base::{gguf_part_in, DecoderLayer, Family, LAYER_TENSORS};
use super::config_keys::family_keys;
use super::dsa_indexer::IndexerShape;
use super::latent_moe::{latent_moe_block, latent_moe_tensor_names};
use crate::config::{ModelConfig, RopeScaling};
use crate::error::{InferenceError, Result};
use crate::weights::{GgufNames, TensorSource, WeightFormat};
use serde_json::Value;

/// The GLM-5 family.
pub struct GlmMoeDsa;

/// The reference normalizes both bottlenecks with this epsilon (DeepSeek V3.2's).
const LATENT_NORM_EPS: f32 = 1e-6;

/// The keys of a `glm_moe_dsa` config.json this file reads itself (the latent widths and the
/// experts are read by the library pieces). The reference requires all but the interleave.
#[derive(serde::Deserialize)]
struct GlmMoeDsaKeys {
    index_n_heads: usize,
    index_head_dim: usize,
    index_topk: usize,
    #[serde(default = "yes")]
    indexer_rope_interleave: bool,
    moe_layer_freq: usize,
    rope_parameters: RopeParameters,
}

/// `rope_parameters`: GLM-5 keeps RoPE's base here, not in `rope_theta`.
#[derive(serde::Deserialize)]
struct RopeParameters {
    rope_theta: f64,
    #[serde(default, alias = "type")]
    rope_type: Option<String>,
}

fn yes() -> bool {
    true
}

impl Family for GlmMoeDsa {
    fn hf_names(&self) -> (&'static str, &'static str) {
        ("glm_moe_dsa", "GlmMoeDsaForCausalLM")
    }

    fn configure(&self, v: &Value, config: &mut ModelConfig) -> Result<()> {
        let keys: GlmMoeDsaKeys = family_keys(v, "glm_moe_dsa")?;
        match keys.rope_parameters.rope_type.as_deref() {
            None | Some("default") => config.rope_scaling = RopeScaling::None,
            Some(other) => {
                return Err(InferenceError::BadConfig(format!(
                    "a glm_moe_dsa config.json's rope_parameters of type `{other}` is not \
                     supported (default is)"
                )))
            }
        }
        config.rope_theta = keys.rope_parameters.rope_theta as f32;
        let indexer = IndexerShape {
            heads: keys.index_n_heads,
            head_dim: keys.index_head_dim,
            topk: keys.index_topk,
            interleaved: keys.indexer_rope_interleave,
        };
        indexer.configure(
            v,
            config,
            "glm_moe_dsa",
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
        latent_moe_block("glm_moe_dsa", config, source, layer, format)
    }

    fn layer_tensor_names(&self, config: &ModelConfig, layer: usize) -> Vec<String> {
        latent_moe_tensor_names(config, layer)
    }
}

impl GgufNames for GlmMoeDsa {
    fn gguf_part(&self, hf_part: &str) -> Option<&'static str> {
        gguf_part_in(LAYER_TENSORS, hf_part)
    }
}
