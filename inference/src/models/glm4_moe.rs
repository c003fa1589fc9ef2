//! GLM-4.5 / 4.6 / 4.7 (`glm4_moe`), as mlx-lm's `glm4_moe.py`:
//!
//! - attention: grouped-query heads with Q/K/V biases, an RMS norm on each head's queries and
//!   keys (`use_qk_norm`), and RoPE on the first `partial_rotary_factor · head_dim` dimensions
//!   of each head only;
//! - feed-forward: a dense SwiGLU on the first `first_k_dense_replace` layers, then a Mixture
//!   of Experts whose router scores each expert `s_e = σ(w_e · x)`, chooses among the `topk_group`
//!   best of `n_group` groups the top k by `s_e + b_e` (`b`: `e_score_correction_bias`, which
//!   only balances the choice), and weighs expert e's output by `s_e / Σ s · routed_scaling_factor`;
//!   a shared expert (`n_shared_experts × moe_intermediate_size` wide) adds its output for
//!   every token.
//!
//! Hugging Face checkpoints carry a multi-token-prediction layer at index `num_hidden_layers`;
//! only layers below it are read, so it is never loaded.

use super::base::{
    gguf_part_in, layer_tensor, Attention, DecoderLayer, Family, FeedForward, HeadNorms, Mlp,
    LAYER_TENSORS,
};
use super::gguf_moe::{gguf_count, gguf_sigmoid_moe, EXPERT_TENSORS, SHARED_EXPERT_TENSORS};
use super::moe::PROJ_NAMES;
use super::sigmoid_moe::{load_sigmoid_moe, sigmoid_moe_config, sigmoid_moe_tensor_names};
use crate::config::ModelConfig;
use crate::error::{InferenceError, Result};
use crate::weights::FormatOnMlx;
use crate::weights::{GgufNames, TensorSource, WeightFormat};
use serde_json::Value;

/// The per-head norms, with their GGUF names.
const HEAD_NORMS: &[(&str, &str)] = &[
    ("self_attn.q_norm", "attn_q_norm"),
    ("self_attn.k_norm", "attn_k_norm"),
];

/// llama.cpp's names that differ from the other families': GLM's pre-FFN norm is its
/// `post_attention_norm` (llama.cpp's `ffn_norm` elsewhere).
const GGUF_OWN: &[(&str, &str)] = &[("post_attention_layernorm", "post_attention_norm")];

/// The GLM-4 MoE family.
pub struct Glm4Moe;

impl Family for Glm4Moe {
    fn hf_names(&self) -> (&'static str, &'static str) {
        ("glm4_moe", "Glm4MoeForCausalLM")
    }

    fn gguf_architectures(&self) -> &'static [&'static str] {
        &["glm4moe"]
    }

    /// llama.cpp's `glm4moe`: the sigmoid experts' keys ([`gguf_sigmoid_moe`]), RoPE on
    /// `rope.dimension_count` dimensions of each head, the Q/K norms where the file has them,
    /// and without the multi-token-prediction layers the converter appends to `block_count`
    /// (`nextn_predict_layers`).
    fn configure_gguf(
        &self,
        file: &crate::gguf::GgufFile,
        arch: &str,
        config: &mut ModelConfig,
    ) -> Result<()> {
        config.moe = Some(gguf_sigmoid_moe(file, arch)?);
        let rotary = gguf_count(file, arch, "rope.dimension_count").unwrap_or(config.head_dim);
        config.attention.rotary_dim = (rotary != config.head_dim).then_some(rotary);
        config.attention.qk_norm = file.tensors.contains_key("blk.0.attn_q_norm.weight");
        let nextn = gguf_count(file, arch, "nextn_predict_layers").unwrap_or(0);
        config.num_layers = config.num_layers.checked_sub(nextn).ok_or_else(|| {
            InferenceError::BadConfig(format!(
                "{nextn} prediction layers in a GGUF of {} blocks",
                config.num_layers
            ))
        })?;
        Ok(())
    }

    fn configure(&self, v: &Value, config: &mut ModelConfig) -> Result<()> {
        config.moe = Some(sigmoid_moe_config(v)?);
        let factor = v
            .get("partial_rotary_factor")
            .and_then(Value::as_f64)
            .unwrap_or(1.0);
        if !(factor > 0.0 && factor <= 1.0) {
            return Err(InferenceError::BadConfig(format!(
                "partial_rotary_factor {factor} must be in (0, 1]"
            )));
        }
        // The reference truncates, as Python's `int(head_dim * factor)`.
        let rotary = (config.head_dim as f64 * factor) as usize;
        config.attention.rotary_dim = (rotary != config.head_dim).then_some(rotary);
        config.attention.qk_norm = v
            .get("use_qk_norm")
            .and_then(Value::as_bool)
            .unwrap_or(false);
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
            InferenceError::BadConfig("a glm4_moe configuration without its experts".into())
        })?;
        let head_norms = if config.attention.qk_norm {
            let dtype = format.compute_dtype();
            let mut norm =
                |part: &str| source.dense(&layer_tensor(layer, &format!("{part}.weight")), dtype);
            Some(HeadNorms::each_head(
                norm(HEAD_NORMS[0].0)?,
                norm(HEAD_NORMS[1].0)?,
            ))
        } else {
            None
        };
        let attention = Attention::load(config, source, layer, format, head_norms)?;
        let ffn = if moe.is_moe_layer(layer) {
            let prefix = layer_tensor(layer, "mlp");
            FeedForward::Experts(load_sigmoid_moe(config, moe, source, &prefix, format)?)
        } else {
            FeedForward::Dense(Mlp::load(config, source, layer, format)?)
        };
        DecoderLayer::assemble(config, source, layer, format, attention, ffn)
    }

    fn layer_tensor_names(&self, config: &ModelConfig, layer: usize) -> Vec<String> {
        let mut names: Vec<String> = [
            "self_attn.q_proj.weight",
            "self_attn.k_proj.weight",
            "self_attn.v_proj.weight",
            "self_attn.o_proj.weight",
            "input_layernorm.weight",
            "post_attention_layernorm.weight",
        ]
        .iter()
        .map(|part| layer_tensor(layer, part))
        .collect();
        if config.attention_bias {
            for proj in ["q_proj", "k_proj", "v_proj"] {
                names.push(layer_tensor(layer, &format!("self_attn.{proj}.bias")));
            }
        }
        if config.attention.qk_norm {
            for (part, _) in HEAD_NORMS {
                names.push(layer_tensor(layer, &format!("{part}.weight")));
            }
        }
        match config.moe.as_ref().filter(|m| m.is_moe_layer(layer)) {
            Some(moe) => names.extend(sigmoid_moe_tensor_names(moe, layer)),
            None => {
                for proj in PROJ_NAMES {
                    names.push(layer_tensor(layer, &format!("mlp.{proj}.weight")));
                }
            }
        }
        names
    }
}

impl GgufNames for Glm4Moe {
    fn gguf_part(&self, hf_part: &str) -> Option<&'static str> {
        let tables = GGUF_OWN.iter().chain(LAYER_TENSORS).chain(HEAD_NORMS);
        gguf_part_in(
            tables.chain(EXPERT_TENSORS).chain(SHARED_EXPERT_TENSORS),
            hf_part,
        )
    }
}
