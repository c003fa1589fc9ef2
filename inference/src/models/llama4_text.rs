//! Llama 4's dense text decoder (`llama4_text`, as mlx-lm's `llama4_text.py`; MobileLLM-R1 and
//! the small models built on it): the pre-norm block with grouped-query attention whose
//! queries and keys are RMS-normalized per head without a weight (`use_qk_norm`), interleaved
//! ("traditional") RoPE on the layers `no_rope_layers` marks and none on the others (NoPE
//! layers), a SwiGLU MLP `intermediate_size_mlp` wide named `feed_forward`, and the output head
//! named `output`.
//!
//! The query and key rows are reordered at load so that the half-split RoPE every attention
//! runs rotates the pairs the reference rotates ([`interleaved_to_half_split`]); the weightless
//! head norms are a norm with a weight of ones, which the reordering does not change.

use super::base::{layer_tensor, Attention, DecoderLayer, Family, FeedForward, HeadNorms, Mlp};
use super::config_keys::family_keys;
use crate::config::{FamilyParams, ModelConfig};
use crate::error::{InferenceError, Result};
use crate::linear::interleaved_to_half_split;
use crate::rope::Rope;
use crate::weights::FormatOnMlx;
use crate::weights::{GgufNames, TensorSource, WeightFormat};
use mlx_rs::Array;

/// The block's tensors (the attention's as every family names them, the MLP under
/// `feed_forward`).
const LAYER_PARTS: &[&str] = &[
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "feed_forward.gate_proj",
    "feed_forward.up_proj",
    "feed_forward.down_proj",
    "input_layernorm",
    "post_attention_layernorm",
];

/// The `config.json` keys only this family has (mlx-lm requires each of them).
#[derive(serde::Deserialize)]
struct Llama4TextKeys {
    /// Per layer, non-zero (or true) where the layer rotates its queries and keys.
    no_rope_layers: Vec<serde_json::Value>,
    /// Whether queries and keys are RMS-normalized per head.
    use_qk_norm: bool,
    /// The MLP's width (`intermediate_size` is the unused Mixture-of-Experts width).
    intermediate_size_mlp: usize,
}

/// What the blocks need from the configuration beyond the shared numbers.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Llama4TextParams {
    /// Per layer, whether it applies RoPE.
    rotates: Vec<bool>,
    /// Whether queries and keys are RMS-normalized per head.
    qk_norm: bool,
}

/// The Llama 4 text family.
pub struct Llama4Text;

impl Family for Llama4Text {
    fn hf_names(&self) -> (&'static str, &'static str) {
        ("llama4_text", "Llama4ForCausalLM")
    }

    fn configure(&self, json: &serde_json::Value, config: &mut ModelConfig) -> Result<()> {
        let keys: Llama4TextKeys = family_keys(json, "llama4_text")?;
        if keys.no_rope_layers.len() != config.num_layers {
            return Err(InferenceError::BadConfig(format!(
                "a llama4_text config.json has {} entries in no_rope_layers for {} layers: it \
                 needs one per layer",
                keys.no_rope_layers.len(),
                config.num_layers
            )));
        }
        if !config.head_dim.is_multiple_of(2) {
            return Err(InferenceError::BadConfig(format!(
                "a llama4_text config.json with head_dim {}: RoPE needs an even head width",
                config.head_dim
            )));
        }
        config.intermediate_size = keys.intermediate_size_mlp;
        config.family_params = FamilyParams::of(&Llama4TextParams {
            rotates: keys
                .no_rope_layers
                .iter()
                .map(|r| r.as_bool().unwrap_or_else(|| r.as_f64() != Some(0.0)))
                .collect(),
            qk_norm: keys.use_qk_norm,
        })?;
        Ok(())
    }

    fn block(
        &self,
        config: &ModelConfig,
        source: &mut dyn TensorSource,
        layer: usize,
        format: WeightFormat,
    ) -> Result<DecoderLayer> {
        let params: Llama4TextParams = config.family_params.get("llama4_text")?;
        let dtype = format.compute_dtype();
        let head_norms = params.qk_norm.then(|| -> Result<HeadNorms> {
            let ones = Array::ones::<f32>(&[config.head_dim as i32])?.as_dtype(dtype)?;
            Ok(HeadNorms::each_head(ones.clone(), ones))
        });
        let mut attention =
            Attention::load(config, source, layer, format, head_norms.transpose()?)?;
        if params.rotates[layer] {
            attention.q_proj = attention.q_proj.reorder_rows(&interleaved_to_half_split(
                config.num_heads,
                config.head_dim,
            ))?;
            attention.k_proj = attention.k_proj.reorder_rows(&interleaved_to_half_split(
                config.num_kv_heads,
                config.head_dim,
            ))?;
        } else {
            attention = attention.with_rope(Rope::none());
        }
        let prefix = layer_tensor(layer, "feed_forward");
        let mlp = Mlp::load_at(config, source, &prefix, config.intermediate_size, format)?;
        DecoderLayer::assemble(
            config,
            source,
            layer,
            format,
            attention,
            FeedForward::Dense(mlp),
        )
    }

    fn head_tensor(&self) -> &'static str {
        "output"
    }

    fn layer_tensor_names(&self, _config: &ModelConfig, layer: usize) -> Vec<String> {
        LAYER_PARTS
            .iter()
            .map(|part| layer_tensor(layer, &format!("{part}.weight")))
            .collect()
    }
}

impl GgufNames for Llama4Text {
    fn gguf_part(&self, _hf_part: &str) -> Option<&'static str> {
        None
    }
}

#[cfg(test)]
mod tests {
    use crate::linear::interleaved_to_half_split;

    #[test]
    fn each_head_takes_its_even_rows_then_its_odd_rows() {
        assert_eq!(
            interleaved_to_half_split(2, 4),
            vec![0, 2, 1, 3, 4, 6, 5, 7]
        );
    }
}
