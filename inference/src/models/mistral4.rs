//! Mistral Small 4 (`mistral4`, released as `mistral3` with the text model under
//! `text_config`), as mlx-lm's `mistral4.py`: DeepSeek V3's block ([`super::latent_moe`]:
//! latent attention with interleaved RoPE, a dense SwiGLU on the first
//! `first_k_dense_replace` layers, then grouped experts with a shared expert), with what
//! differs:
//!
//! - RoPE's base and YaRN scaling come from `rope_parameters`, and with them Llama 4's
//!   attention scale: the queries at position p are multiplied by
//!   `1 + llama_4_scaling_beta · ln(1 + floor(p / original_max_position_embeddings))`
//!   ([`super::mla::PositionScale`]), so attention stays sharp past the trained length;
//! - the router is a softmax (no score correction), group-limited as DeepSeek's, its k weights
//!   divided by their sum whenever `norm_topk_prob` (even for one expert), times
//!   `routed_scaling_factor`.
//!
//! The bottleneck norms keep the reference's fixed 1e-6. Weights: Mistral's own layout
//! (`model.language_model.*`, `kv_b_proj`, experts one matrix each; the vision tower is not
//! read) and mlx-community's (`language_model.model.*`, `embed_q`/`unembed_out`, `switch_mlp`).

use super::base::{gguf_part_in, DecoderLayer, Family, LAYER_TENSORS};
use super::config_keys::{family_keys, required, usize_or};
use super::latent_moe::{configure_latent, latent_moe_block, latent_moe_tensor_names};
use super::mla::PositionScale;
use crate::config::{ModelConfig, MoeConfig, RopeScaling, RouterKind};
use crate::error::{InferenceError, Result};
use crate::weights::{GgufNames, TensorSource, WeightFormat};
use serde_json::Value;

/// The Mistral Small 4 family.
pub struct Mistral4;

/// The reference normalizes both bottlenecks with this epsilon, whatever `rms_norm_eps` says.
const LATENT_NORM_EPS: f32 = 1e-6;

/// The keys of a `mistral4` text config this file reads itself (the latent widths are read
/// by the library piece).
#[derive(serde::Deserialize)]
struct Mistral4Keys {
    rope_parameters: RopeParameters,
    #[serde(default)]
    rope_interleave: Option<bool>,
    #[serde(default)]
    norm_topk_prob: bool,
    #[serde(default = "one")]
    routed_scaling_factor: f64,
}

/// `rope_parameters`: RoPE's base, its scaling and Llama 4's attention scale.
#[derive(serde::Deserialize)]
struct RopeParameters {
    #[serde(default = "default_theta")]
    rope_theta: f64,
    #[serde(default, alias = "type")]
    rope_type: Option<String>,
    #[serde(default = "one")]
    factor: f64,
    original_max_position_embeddings: f64,
    #[serde(default = "beta_fast")]
    beta_fast: f64,
    #[serde(default = "one")]
    beta_slow: f64,
    #[serde(default = "one")]
    mscale: f64,
    #[serde(default)]
    mscale_all_dim: f64,
    llama_4_scaling_beta: f64,
}

fn one() -> f64 {
    1.0
}

fn default_theta() -> f64 {
    // The reference's default when `rope_parameters` omits it.
    100000.0
}

fn beta_fast() -> f64 {
    32.0
}

impl Family for Mistral4 {
    fn hf_names(&self) -> (&'static str, &'static str) {
        ("mistral4", "Mistral4ForCausalLM")
    }

    fn configure(&self, v: &Value, config: &mut ModelConfig) -> Result<()> {
        let keys: Mistral4Keys = family_keys(v, "mistral4")?;
        if keys.rope_interleave == Some(false) {
            return Err(InferenceError::BadConfig(
                "a mistral4 config.json with rope_interleave false is not supported (its \
                 latent attention rotates interleaved pairs)"
                    .into(),
            ));
        }
        let r = &keys.rope_parameters;
        config.rope_theta = r.rope_theta as f32;
        config.rope_scaling = match r.rope_type.as_deref() {
            None | Some("default") => RopeScaling::None,
            Some("yarn") | Some("deepseek_yarn") => RopeScaling::Yarn {
                factor: r.factor as f32,
                original_max_position: r.original_max_position_embeddings as f32,
                beta_fast: r.beta_fast as f32,
                beta_slow: r.beta_slow as f32,
                mscale: r.mscale as f32,
                mscale_all_dim: r.mscale_all_dim as f32,
            },
            Some(other) => {
                return Err(InferenceError::BadConfig(format!(
                    "a mistral4 config.json's rope_parameters of type `{other}` is not \
                     supported (default and yarn are)"
                )))
            }
        };
        let original = r.original_max_position_embeddings;
        if original.is_nan() || original < 1.0 || !r.llama_4_scaling_beta.is_finite() {
            return Err(InferenceError::BadConfig(format!(
                "a mistral4 config.json's rope_parameters: original_max_position_embeddings \
                 {} must be at least 1 and llama_4_scaling_beta {} finite",
                r.original_max_position_embeddings, r.llama_4_scaling_beta
            )));
        }
        let experts_per_token = required(v, "num_experts_per_tok")?;
        let expert_width = required(v, "moe_intermediate_size")?;
        config.moe = Some(MoeConfig {
            num_experts: required(v, "n_routed_experts")?,
            experts_per_token,
            expert_width,
            router: RouterKind::SoftmaxGroupedTopK {
                groups: usize_or(v, "n_group", 1),
                top_groups: usize_or(v, "topk_group", 1),
                normalize: keys.norm_topk_prob,
                scale: keys.routed_scaling_factor as f32,
            },
            dense_layers: Vec::new(),
            sparse_step: 1,
            first_dense: usize_or(v, "first_k_dense_replace", 0),
            shared_width: usize_or(v, "n_shared_experts", 0) * expert_width,
            latent_width: 0,
        });
        configure_latent(v, config, LATENT_NORM_EPS)?;
        if let Some(latent) = config.attention.latent.as_mut() {
            latent.position_scale = Some(PositionScale {
                beta: r.llama_4_scaling_beta as f32,
                original_max_position: r.original_max_position_embeddings as f32,
            });
        }
        Ok(())
    }

    fn block(
        &self,
        config: &ModelConfig,
        source: &mut dyn TensorSource,
        layer: usize,
        format: WeightFormat,
    ) -> Result<DecoderLayer> {
        latent_moe_block("mistral4", config, source, layer, format)
    }

    fn layer_tensor_names(&self, config: &ModelConfig, layer: usize) -> Vec<String> {
        latent_moe_tensor_names(config, layer)
    }
}

impl GgufNames for Mistral4 {
    fn gguf_part(&self, hf_part: &str) -> Option<&'static str> {
        gguf_part_in(LAYER_TENSORS, hf_part)
    }
}
