//! Gemma 3 (text; `gemma3_text`), as mlx-lm's `gemma3_text.py`: a dense decoder whose RMS norms
//! scale by `1 + w` (the weights are stored as offsets from one), with a norm before and after
//! both the attention and the feed-forward (`h = x + norm(attn(norm(x)))`, then
//! `h + norm(mlp(norm(h)))`), Q/K norms per head, a GELU-gated MLP (tanh approximation),
//! queries scaled by `query_pre_attn_scalar^-1/2`, token embeddings multiplied by
//! `sqrt(hidden)` (rounded to bf16, as the model was trained), and tied embeddings.
//!
//! Local layers attend to a sliding window with RoPE of base `rope_local_base_freq`; every
//! `sliding_window_pattern`-th layer is global, with RoPE of base `rope_theta` and the
//! configuration's scaling (linear in Gemma 3).

use super::base::{
    gguf_part_in, layer_tensor, norm_weight, Attention, DecoderLayer, Family, FeedForward,
    GateActivation, HeadNorms, Mlp, OutputNorms, LAYER_TENSORS,
};
use crate::config::{FamilyParams, ModelConfig, RopeScaling, SlidingWindow};
use crate::error::{InferenceError, Result};
use crate::rope::Rope;
use crate::weights::FormatOnMlx;
use crate::weights::{GgufNames, TensorSource, WeightFormat};
use mlx_rs::{Array, Dtype};
use serde_json::Value;

/// Gemma's norms beyond the shared block's, with their GGUF names.
const NORMS: &[(&str, &str)] = &[
    ("self_attn.q_norm", "attn_q_norm"),
    ("self_attn.k_norm", "attn_k_norm"),
    ("pre_feedforward_layernorm", "ffn_norm"),
    ("post_feedforward_layernorm", "post_ffw_norm"),
];

/// The Gemma 3 family.
pub struct Gemma3;

/// `x` rounded to the nearest bfloat16 (ties to even).
fn round_to_bf16(x: f32) -> f32 {
    let bits = x.to_bits();
    let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) & 0xffff_0000;
    f32::from_bits(rounded)
}

/// What Gemma 3's configuration holds beyond the shared numbers.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Gemma3Params {
    /// Queries are scaled by `query_pre_attn_scalar^-1/2` (not `head_dim^-1/2`).
    query_pre_attn_scalar: f32,
    /// RoPE base of the local (sliding) layers.
    rope_local_base_freq: f32,
}

impl Family for Gemma3 {
    fn hf_names(&self) -> (&'static str, &'static str) {
        ("gemma3_text", "Gemma3ForCausalLM")
    }

    fn configure(&self, json: &Value, config: &mut ModelConfig) -> Result<()> {
        let f = |key: &str, default: f64| json.get(key).and_then(Value::as_f64).unwrap_or(default);
        // mlx-lm decides which layers slide by `sliding_window_pattern` (every pattern-th layer
        // is global), falling back to its defaults (512, 6).
        let size = json
            .get("sliding_window")
            .and_then(Value::as_u64)
            .unwrap_or(512) as usize;
        let pattern = json
            .get("sliding_window_pattern")
            .and_then(Value::as_u64)
            .unwrap_or(6) as usize;
        if size == 0 || pattern == 0 {
            return Err(InferenceError::BadConfig(format!(
                "a gemma3_text config.json with sliding_window {size} and sliding_window_pattern \
                 {pattern}: both must be positive"
            )));
        }
        config.sliding_window = Some(SlidingWindow {
            size,
            layers: (0..config.num_layers)
                .map(|l| !(l + 1).is_multiple_of(pattern))
                .collect(),
        });
        config.family_params = FamilyParams::of(&Gemma3Params {
            query_pre_attn_scalar: f("query_pre_attn_scalar", 256.0) as f32,
            rope_local_base_freq: f("rope_local_base_freq", 10_000.0) as f32,
        })?;
        // Gemma's head is its embedding (mlx-lm ties them whenever `lm_head` is absent).
        config.tie_word_embeddings = json
            .get("tie_word_embeddings")
            .and_then(Value::as_bool)
            .unwrap_or(true);
        Ok(())
    }

    fn block(
        &self,
        config: &ModelConfig,
        source: &mut dyn TensorSource,
        layer: usize,
        format: WeightFormat,
    ) -> Result<DecoderLayer> {
        let params: Gemma3Params = config.family_params.get("gemma3_text")?;
        let dtype = format.compute_dtype();
        let name = |part: &str| layer_tensor(layer, &format!("{part}.weight"));
        let head_norms = HeadNorms::each_head(
            norm_weight(source, &name("self_attn.q_norm"), dtype, true)?,
            norm_weight(source, &name("self_attn.k_norm"), dtype, true)?,
        );
        let scale = (params.query_pre_attn_scalar as f64).powf(-0.5) as f32;
        let mut attention =
            Attention::load(config, source, layer, format, Some(head_norms))?.with_scale(scale);
        if attention.window.is_some() {
            let local = Rope::new(
                config.head_dim,
                params.rope_local_base_freq,
                &RopeScaling::None,
            );
            attention = attention.with_rope(local);
        }
        let mlp =
            Mlp::load(config, source, layer, format)?.with_activation(GateActivation::GeluApprox);
        let mut norm = |part: &str| norm_weight(source, &name(part), dtype, true);
        let output_norms = OutputNorms {
            attention: norm("post_attention_layernorm")?,
            ffn: norm("post_feedforward_layernorm")?,
        };
        Ok(DecoderLayer::new(
            config,
            norm("input_layernorm")?,
            attention,
            norm("pre_feedforward_layernorm")?,
            FeedForward::Dense(mlp),
        )
        .with_output_norms(output_norms))
    }

    fn final_norm(
        &self,
        _config: &ModelConfig,
        source: &mut dyn TensorSource,
        dtype: Dtype,
    ) -> Result<Array> {
        norm_weight(source, "model.norm.weight", dtype, true)
    }

    fn embedding_scale(&self, config: &ModelConfig) -> Option<f32> {
        Some(round_to_bf16((config.hidden_size as f64).sqrt() as f32))
    }

    fn layer_tensor_names(&self, _config: &ModelConfig, layer: usize) -> Vec<String> {
        LAYER_TENSORS
            .iter()
            .chain(NORMS)
            .map(|(part, _)| layer_tensor(layer, &format!("{part}.weight")))
            .collect()
    }
}

impl GgufNames for Gemma3 {
    fn gguf_part(&self, hf_part: &str) -> Option<&'static str> {
        // Gemma's `post_attention_layernorm` is the attention output's norm in llama.cpp.
        match hf_part {
            "post_attention_layernorm" => Some("post_attention_norm"),
            _ => gguf_part_in(NORMS.iter().chain(LAYER_TENSORS), hf_part),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedding_scale_is_rounded_to_bf16() {
        // sqrt(1152) = 33.941…; bfloat16 keeps 8 bits of mantissa: 34.0.
        assert_eq!(round_to_bf16(1152f32.sqrt()), 34.0);
        assert_eq!(round_to_bf16(8.0), 8.0);
        // sqrt(2560) = 50.596…: 50.5.
        assert_eq!(round_to_bf16(2560f32.sqrt()), 50.5);
    }
}
