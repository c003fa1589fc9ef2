//! DeepSeek V3 / R1 / V3.1 and Kimi K2 (`deepseek_v3`), as mlx-lm's `deepseek_v3.py`:
//! multi-head latent attention ([`super::mla`]) with interleaved ("traditional") RoPE, YaRN
//! with its magnitude correction; a dense SwiGLU on the first `first_k_dense_replace` layers
//! and then the sigmoid-routed, group-limited Mixture of Experts with a shared expert that
//! GLM-4.5 also uses ([`super::sigmoid_moe::sigmoid_moe_config`]).
//!
//! Hugging Face checkpoints store the latent's up-projection as one `kv_b_proj`
//! (`[heads·(nope + v), kv_lora]`); it is split here into `embed_q` (`W_uk`, per head
//! `[kv_lora, nope]`) and `unembed_out` (`W_uv`, `[v, kv_lora]`), the form mlx-lm's converted
//! folders store.

use super::base::{gguf_part_in, DecoderLayer, Family, LAYER_TENSORS};
use super::latent_moe::{configure_latent, latent_moe_block, latent_moe_tensor_names};
use super::sigmoid_moe::sigmoid_moe_config;
use crate::config::ModelConfig;
use crate::error::{InferenceError, Result};
use crate::weights::{GgufNames, TensorSource, WeightFormat};
use serde_json::Value;

/// The DeepSeek V3 family.
pub struct DeepseekV3;

/// The reference normalizes both bottlenecks with this epsilon, whatever `rms_norm_eps` says.
const LATENT_NORM_EPS: f32 = 1e-6;

impl Family for DeepseekV3 {
    fn hf_names(&self) -> (&'static str, &'static str) {
        ("deepseek_v3", "DeepseekV3ForCausalLM")
    }

    fn configure(&self, v: &Value, config: &mut ModelConfig) -> Result<()> {
        let moe = sigmoid_moe_config(v)?;
        if v.get("moe_layer_freq").and_then(Value::as_u64).unwrap_or(1) != 1 {
            return Err(InferenceError::BadConfig(
                "deepseek_v3 with moe_layer_freq other than 1 is not supported".into(),
            ));
        }
        config.moe = Some(moe);
        configure_latent(v, config, LATENT_NORM_EPS)?;
        Ok(())
    }

    fn block(
        &self,
        config: &ModelConfig,
        source: &mut dyn TensorSource,
        layer: usize,
        format: WeightFormat,
    ) -> Result<DecoderLayer> {
        latent_moe_block("deepseek_v3", config, source, layer, format)
    }

    fn layer_tensor_names(&self, config: &ModelConfig, layer: usize) -> Vec<String> {
        latent_moe_tensor_names(config, layer)
    }
}

impl GgufNames for DeepseekV3 {
    fn gguf_part(&self, hf_part: &str) -> Option<&'static str> {
        gguf_part_in(LAYER_TENSORS, hf_part)
    }
}
