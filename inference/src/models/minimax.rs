//! MiniMax M2 (`minimax_m2`), as mlx-lm's `minimax.py`:
//!
//! - attention: grouped-query heads without biases; the queries of all heads together take
//!   one RMS norm (`q_norm`, `[heads·head_dim]`), and so do the keys (`k_norm`); RoPE turns
//!   the first `rotary_dim` dimensions of each head only;
//! - feed-forward: a Mixture of Experts on every layer (`block_sparse_moe`), each expert
//!   `intermediate_size` wide; the router scores `s_e = σ(w_e · x)`, chooses the top k by
//!   `s_e + b_e` (`e_score_correction_bias`) and weighs the chosen by `s_e / Σ s`.
//!
//! Hugging Face checkpoints store expert e as `experts.<e>.w1` (gate), `w3` (up) and `w2`
//! (down); mlx-lm's files stack them as `switch_mlp.gate_proj` etc. Under tensor parallelism
//! each rank holds some heads, so the all-head norms add their sums of squares over the ring
//! ([`super::base::NormSpan::AllHeads`]).

use super::base::{
    gguf_part_in, layer_tensor, Attention, DecoderLayer, Family, FeedForward, HeadNorms,
    LAYER_TENSORS,
};
use super::config_keys::required;
use super::moe::{ExpertNames, Experts, MoeBlock};
use crate::config::{ModelConfig, MoeConfig, RouterKind};
use crate::error::{InferenceError, Result};
use crate::weights::FormatOnMlx;
use crate::weights::{GgufNames, TensorSource, WeightFormat};
use serde_json::Value;

/// The all-head norms, with their GGUF names.
const QK_NORMS: &[(&str, &str)] = &[
    ("self_attn.q_norm", "attn_q_norm"),
    ("self_attn.k_norm", "attn_k_norm"),
];

/// Expert e's gate, up and down projections in Hugging Face checkpoints.
const EXPERT_NAMES: ExpertNames = ["w1", "w3", "w2"];

/// Where a layer's experts and router live.
const MOE: &str = "block_sparse_moe";

/// The MiniMax M2 family.
pub struct MiniMax;

impl Family for MiniMax {
    fn hf_names(&self) -> (&'static str, &'static str) {
        ("minimax_m2", "MiniMaxM2ForCausalLM")
    }

    fn configure(&self, v: &Value, config: &mut ModelConfig) -> Result<()> {
        if v.get("scoring_func")
            .and_then(Value::as_str)
            .unwrap_or("sigmoid")
            != "sigmoid"
        {
            return Err(InferenceError::BadConfig(
                "minimax_m2: only the sigmoid `scoring_func` is supported".into(),
            ));
        }
        if v.get("shared_intermediate_size")
            .and_then(Value::as_u64)
            .unwrap_or(0)
            > 0
        {
            return Err(InferenceError::BadConfig(
                "minimax_m2 with a shared expert (`shared_intermediate_size` > 0) is not \
                 supported: the reference implementation has none"
                    .into(),
            ));
        }
        config.moe = Some(MoeConfig {
            num_experts: required(v, "num_local_experts")?,
            experts_per_token: required(v, "num_experts_per_tok")?,
            expert_width: config.intermediate_size,
            router: RouterKind::SigmoidGroupedTopK {
                groups: 1,
                top_groups: 1,
                normalize: true,
                scale: 1.0,
            },
            dense_layers: Vec::new(),
            sparse_step: 1,
            first_dense: 0,
            shared_width: 0,
            latent_width: 0,
        });
        let rotary = required(v, "rotary_dim")?;
        config.attention.rotary_dim = (rotary != config.head_dim).then_some(rotary);
        config.attention.qk_norm = v
            .get("use_qk_norm")
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
        let moe = config.moe.as_ref().ok_or_else(|| {
            InferenceError::BadConfig("a minimax_m2 configuration without its experts".into())
        })?;
        let dtype = format.compute_dtype();
        let head_norms = if config.attention.qk_norm {
            let mut norm = |part: &str, width: usize| -> Result<mlx_rs::Array> {
                let name = layer_tensor(layer, &format!("{part}.weight"));
                let w = source.dense(&name, dtype)?;
                if w.shape() != [width as i32] {
                    return Err(InferenceError::BadTensor {
                        name,
                        reason: format!("expected [{width}] (all heads), found {:?}", w.shape()),
                    });
                }
                Ok(w)
            };
            Some(HeadNorms::all_heads(
                norm(QK_NORMS[0].0, config.num_heads * config.head_dim)?,
                norm(QK_NORMS[1].0, config.num_kv_heads * config.head_dim)?,
            ))
        } else {
            None
        };
        let attention = Attention::load(config, source, layer, format, head_norms)?;
        let prefix = layer_tensor(layer, MOE);
        let router = source.linear(&format!("{prefix}.gate"), format)?;
        let correction = source.dense(
            &format!("{prefix}.e_score_correction_bias"),
            mlx_rs::Dtype::Float32,
        )?;
        let experts = Experts::load(config, moe, source, &prefix, EXPERT_NAMES, format)?;
        let ffn = FeedForward::Experts(MoeBlock::from_parts(
            moe,
            router,
            Some(correction),
            experts,
            None,
            &format!("{prefix}.gate.weight"),
        )?);
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
        if config.attention.qk_norm {
            for (part, _) in QK_NORMS {
                names.push(layer_tensor(layer, &format!("{part}.weight")));
            }
        }
        names.push(layer_tensor(layer, &format!("{MOE}.gate.weight")));
        names.push(layer_tensor(
            layer,
            &format!("{MOE}.e_score_correction_bias"),
        ));
        let experts = config.moe.as_ref().map_or(0, |m| m.num_experts);
        for e in 0..experts {
            for proj in EXPERT_NAMES {
                names.push(layer_tensor(
                    layer,
                    &format!("{MOE}.experts.{e}.{proj}.weight"),
                ));
            }
        }
        names
    }
}

impl GgufNames for MiniMax {
    fn gguf_part(&self, hf_part: &str) -> Option<&'static str> {
        gguf_part_in(LAYER_TENSORS.iter().chain(QK_NORMS), hf_part)
    }
}
