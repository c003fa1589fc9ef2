//! GLM-4.7-Flash (`glm4_moe_lite`), as mlx-lm's `glm4_moe_lite.py`: DeepSeek V3's block
//! ([`super::latent_moe`]: latent attention with interleaved RoPE, a dense SwiGLU on the first
//! `first_k_dense_replace` layers, then sigmoid-routed experts with a shared expert). What
//! differs from DeepSeek V3: the bottleneck norms (`q_a_layernorm`, `kv_a_layernorm`) take
//! `rms_norm_eps` instead of a fixed 1e-6, and the router's renormalization adds 1e-20 to its
//! denominator (below f32's resolution of a sum near 1, so not modelled). The released
//! checkpoints carry a multi-token-prediction layer at index `num_hidden_layers`; only layers
//! below it are read.

use super::base::{gguf_part_in, DecoderLayer, Family, LAYER_TENSORS};
use super::config_keys::family_keys;
use super::latent_moe::{configure_latent, latent_moe_block, latent_moe_tensor_names};
use super::sigmoid_moe::sigmoid_moe_config;
use crate::config::ModelConfig;
use crate::error::{InferenceError, Result};
use crate::weights::{GgufNames, TensorSource, WeightFormat};
use serde_json::Value;

/// The GLM-4.7-Flash family.
pub struct Glm4MoeLite;

/// The keys of a `glm4_moe_lite` config.json this file reads itself (the latent widths and
/// the experts are read by the library pieces).
#[derive(serde::Deserialize)]
struct Glm4MoeLiteKeys {
    #[serde(default = "one")]
    moe_layer_freq: usize,
    #[serde(default = "one_f64")]
    partial_rotary_factor: f64,
}

fn one() -> usize {
    1
}

fn one_f64() -> f64 {
    1.0
}

impl Family for Glm4MoeLite {
    fn hf_names(&self) -> (&'static str, &'static str) {
        ("glm4_moe_lite", "Glm4MoeLiteForCausalLM")
    }

    fn configure(&self, v: &Value, config: &mut ModelConfig) -> Result<()> {
        let keys: Glm4MoeLiteKeys = family_keys(v, "glm4_moe_lite")?;
        if keys.moe_layer_freq != 1 {
            return Err(InferenceError::BadConfig(format!(
                "glm4_moe_lite with moe_layer_freq {} is not supported (1 is)",
                keys.moe_layer_freq
            )));
        }
        // The reference reads `partial_rotary_factor` but rotates the whole rope part.
        let _ = keys.partial_rotary_factor;
        config.moe = Some(sigmoid_moe_config(v)?);
        configure_latent(v, config, config.rms_norm_eps)?;
        Ok(())
    }

    fn block(
        &self,
        config: &ModelConfig,
        source: &mut dyn TensorSource,
        layer: usize,
        format: WeightFormat,
    ) -> Result<DecoderLayer> {
        latent_moe_block("glm4_moe_lite", config, source, layer, format)
    }

    fn layer_tensor_names(&self, config: &ModelConfig, layer: usize) -> Vec<String> {
        latent_moe_tensor_names(config, layer)
    }
}

impl GgufNames for Glm4MoeLite {
    fn gguf_part(&self, hf_part: &str) -> Option<&'static str> {
        gguf_part_in(LAYER_TENSORS, hf_part)
    }
}
