//! Qwen3.5 / Qwen3.6 dense (`qwen3_5`), the text model, as mlx-lm's `qwen3_5.py`: a hybrid of
//! Gated DeltaNet layers ([`super::gated_delta`], with `in_proj_qkv`, `in_proj_z`, `in_proj_b`,
//! `in_proj_a`) and, every `full_attention_interval`-th layer, Qwen3-Next's gated attention
//! (`q_proj` gives each head's queries and a gate, per-head Q/K RMS norms, RoPE over
//! `partial_rotary_factor` of each head, the output times `sigmoid(gate)`), each followed by a
//! SwiGLU MLP.
//!
//! The releases are multimodal (`Qwen3_5ForConditionalGeneration`): the text model's numbers
//! are under `text_config` and its weights under `model.language_model.` (Hugging Face) or
//! `language_model.model.` (mlx-lm's save, as mlx-community publishes); both are read as a
//! text model's ([`crate::config`], [`crate::weights::text_model_name`]); the vision tower is
//! read apart, on the rank that embeds ([`super::qwen3_5_vision`]). RoPE parameters come from
//! `rope_parameters`; its `mrope_section` places image tokens' positions ([`crate::mrope`]),
//! which text alone does not need (plain RoPE). Hugging Face's own files store the
//! block norms zero-centred (`1 + w`) and the convolution as `[channels, 1, kernel]`; mlx-lm
//! converts both when it sees that convolution shape, and so does [`super::hybrid`] (the layers
//! both Qwen3.5 families share).

use super::base::{layer_tensor, DecoderLayer, Family, FeedForward, Mlp};
use super::hybrid::{
    configure_hybrid, hybrid_block, hybrid_final_norm, hybrid_tensor_divisors, hybrid_tensor_names,
    QWEN3_5,
};
use crate::config::ModelConfig;
use crate::error::Result;
use crate::weights::{GgufNames, TensorSource, WeightFormat};
use mlx_rs::{Array, Dtype};
use serde_json::Value;

/// The Qwen3.5 dense family.
pub struct Qwen3_5;

impl Family for Qwen3_5 {
    fn hf_names(&self) -> (&'static str, &'static str) {
        ("qwen3_5", "Qwen3_5ForCausalLM")
    }

    fn configure(&self, json: &Value, config: &mut ModelConfig) -> Result<()> {
        configure_hybrid(json, config, "qwen3_5", QWEN3_5)
    }

    fn block(
        &self,
        config: &ModelConfig,
        source: &mut dyn TensorSource,
        layer: usize,
        format: WeightFormat,
    ) -> Result<DecoderLayer> {
        let mlp = FeedForward::Dense(Mlp::load(config, source, layer, format)?);
        hybrid_block(config, source, layer, format, mlp, QWEN3_5)
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
        for proj in ["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"] {
            names.push(layer_tensor(layer, &format!("{proj}.weight")));
        }
        names
    }

    fn tensor_divisors(&self, config: &ModelConfig) -> Vec<crate::tensor_divisors::TensorDivisor> {
        hybrid_tensor_divisors(config)
    }
}

impl GgufNames for Qwen3_5 {
    fn gguf_part(&self, _hf_part: &str) -> Option<&'static str> {
        None
    }
}
