//! Kimi Linear (`kimi_linear`), as mlx-lm's `kimi_linear.py`: a hybrid of Kimi Delta Attention
//! ([`super::kda`], on the layers `linear_attn_config.kda_layers` names, counted from 1) and
//! latent attention without position encoding ([`super::mla`], NoPE: the "rotated" part is
//! used as it comes; queries from one `q_proj`) on the others; a dense SwiGLU on the first
//! `first_k_dense_replace` layers, then sigmoid-routed experts with a score correction,
//! group-limited, and a shared expert.
//!
//! Weights: Moonshot's layout (`block_sparse_moe.*` with experts `w1`/`w2`/`w3` one matrix
//! each, the correction at `block_sparse_moe.gate.e_score_correction_bias`, convolutions
//! `q_conv1d` … `[channels, 1, kernel]`, `kv_b_proj`) or mlx-community's (`mlp.switch_mlp`,
//! `mlp.e_score_correction_bias`, `embed_q`/`unembed_out`). The multi-token-prediction
//! tensors (`model.mtp.*`) are not read. Tensor parallelism cuts the KDA layers by heads
//! ([`super::recurrent_split`]) and the latent attention as DeepSeek V3's.

use super::base::{
    gguf_part_in, DecoderLayer, Family, FeedForward, LayerParameters, Mlp, SelfAttention,
    LAYER_TENSORS,
};
use super::config_keys::family_keys;
use super::kda::{KdaConfig, KimiDeltaAttention};
use super::latent_moe::load_latent_attention;
use super::moe::PROJ_NAMES;
use super::parts::layer_tensor;
use super::sigmoid_moe::{load_moonshot_moe, moonshot_moe_tensor_names};
use crate::config::{LatentConfig, ModelConfig, MoeConfig, RouterKind};
use crate::error::{InferenceError, Result};
use crate::weights::{GgufNames, TensorSource, WeightFormat};
use serde_json::Value;

/// The Kimi Linear family.
pub struct KimiLinear;

/// The keys of a `kimi_linear` config.json, with the reference's defaults.
#[derive(serde::Deserialize)]
struct KimiLinearKeys {
    linear_attn_config: KdaConfig,
    head_dim: usize,
    kv_lora_rank: usize,
    #[serde(default)]
    qk_nope_head_dim: Option<usize>,
    #[serde(default)]
    qk_rope_head_dim: Option<usize>,
    #[serde(default)]
    v_head_dim: Option<usize>,
    num_experts: usize,
    moe_intermediate_size: usize,
    #[serde(default = "one")]
    num_experts_per_token: usize,
    #[serde(default)]
    num_shared_experts: usize,
    #[serde(default = "sigmoid")]
    moe_router_activation_func: String,
    #[serde(default = "yes")]
    moe_renormalize: bool,
    #[serde(default = "one_f64")]
    routed_scaling_factor: f64,
    #[serde(default)]
    first_k_dense_replace: usize,
    #[serde(default = "one")]
    moe_layer_freq: usize,
    #[serde(default = "one")]
    num_expert_group: usize,
    #[serde(default = "one")]
    topk_group: usize,
}

fn one() -> usize {
    1
}

fn one_f64() -> f64 {
    1.0
}

fn yes() -> bool {
    true
}

fn sigmoid() -> String {
    "sigmoid".into()
}

impl Family for KimiLinear {
    fn hf_names(&self) -> (&'static str, &'static str) {
        ("kimi_linear", "KimiLinearForCausalLM")
    }

    fn layer_parameters(&self, config: &ModelConfig, layer: usize) -> Option<LayerParameters> {
        let linear = config.attention.linear.as_ref()?;
        if !linear.is_linear(layer) {
            return None;
        }
        // A KDA layer, then the shared feed-forward and the two norms.
        let h = config.hidden_size;
        let kda = KimiDeltaAttention::parameters(h, &linear.shape, false);
        let (all, active) = config.ffn_parameters(layer);
        Some(LayerParameters {
            all: kda + all + 2 * h,
            active: kda + active + 2 * h,
        })
    }

    fn configure(&self, v: &Value, config: &mut ModelConfig) -> Result<()> {
        let keys: KimiLinearKeys = family_keys(v, "kimi_linear")?;
        let bad = |what: String| Err(InferenceError::BadConfig(format!("kimi_linear: {what}")));
        if keys.moe_router_activation_func != "sigmoid" || keys.moe_layer_freq != 1 {
            return bad(format!(
                "a `{}` router with moe_layer_freq {} is not supported (sigmoid and 1 are)",
                keys.moe_router_activation_func, keys.moe_layer_freq
            ));
        }
        config.attention.linear = Some(keys.linear_attn_config.layers(config.num_layers)?);
        let latent = LatentConfig {
            q_lora_rank: None,
            kv_lora_rank: keys.kv_lora_rank,
            qk_nope_head_dim: keys.qk_nope_head_dim.unwrap_or(keys.head_dim),
            qk_rope_head_dim: keys.qk_rope_head_dim.unwrap_or(0),
            v_head_dim: keys.v_head_dim.unwrap_or(keys.head_dim),
            norm_eps: config.rms_norm_eps,
            indexer: None,
            position_scale: None,
            no_rope: true,
        };
        if [
            latent.kv_lora_rank,
            latent.qk_nope_head_dim,
            latent.qk_rope_head_dim,
            latent.v_head_dim,
        ]
        .contains(&0)
        {
            return bad(format!(
                "latent attention of {latent:?} cannot be built: every width must be positive"
            ));
        }
        config.num_kv_heads = config.num_heads;
        config.head_dim = latent.v_head_dim;
        config.attention.latent = Some(latent);
        let k = keys.num_experts_per_token;
        config.moe = Some(MoeConfig {
            num_experts: keys.num_experts,
            experts_per_token: k,
            expert_width: keys.moe_intermediate_size,
            router: RouterKind::SigmoidGroupedTopK {
                groups: keys.num_expert_group,
                top_groups: keys.topk_group,
                // The reference divides by the sum only when more than one expert is chosen.
                normalize: k > 1 && keys.moe_renormalize,
                scale: keys.routed_scaling_factor as f32,
            },
            dense_layers: Vec::new(),
            sparse_step: 1,
            first_dense: keys.first_k_dense_replace,
            shared_width: keys.num_shared_experts * keys.moe_intermediate_size,
            latent_width: 0,
        });
        Ok(())
    }

    fn block(
        &self,
        config: &ModelConfig,
        source: &mut dyn TensorSource,
        layer: usize,
        format: WeightFormat,
    ) -> Result<DecoderLayer> {
        let (Some(moe), Some(latent), Some(linear)) = (
            config.moe.as_ref(),
            config.attention.latent.as_ref(),
            config.attention.linear.as_ref(),
        ) else {
            return Err(InferenceError::BadConfig(
                "a kimi_linear configuration without its layers' kinds".into(),
            ));
        };
        let attention = if linear.is_linear(layer) {
            SelfAttention::Kda(Box::new(KimiDeltaAttention::load(
                linear.shape,
                config.hidden_size,
                config.rms_norm_eps,
                source,
                layer,
                format,
            )?))
        } else {
            SelfAttention::Latent(load_latent_attention(
                config, latent, source, layer, format,
            )?)
        };
        let ffn = if moe.is_moe_layer(layer) {
            FeedForward::Experts(load_moonshot_moe(config, moe, source, layer, format)?.0)
        } else {
            FeedForward::Dense(Mlp::load(config, source, layer, format)?)
        };
        DecoderLayer::assemble(config, source, layer, format, attention, ffn)
    }

    fn layer_tensor_names(&self, config: &ModelConfig, layer: usize) -> Vec<String> {
        let mut names: Vec<String> = if config.is_linear_layer(layer) {
            KimiDeltaAttention::tensor_names(layer, false)
        } else {
            [
                "q_proj",
                "kv_a_proj_with_mqa",
                "kv_a_layernorm",
                "kv_b_proj",
                "o_proj",
            ]
            .iter()
            .map(|p| layer_tensor(layer, &format!("self_attn.{p}.weight")))
            .collect()
        };
        for norm in ["input_layernorm", "post_attention_layernorm"] {
            names.push(layer_tensor(layer, &format!("{norm}.weight")));
        }
        match config.moe.as_ref().filter(|m| m.is_moe_layer(layer)) {
            Some(moe) => names.extend(moonshot_moe_tensor_names(moe, layer)),
            None => {
                for proj in PROJ_NAMES {
                    names.push(layer_tensor(layer, &format!("mlp.{proj}.weight")));
                }
            }
        }
        names
    }

    fn tensor_divisors(&self, config: &ModelConfig) -> Vec<crate::tensor_divisors::TensorDivisor> {
        super::recurrent_split::linear_divisors(config, super::recurrent_split::RecurrentKind::Kda)
    }
}

impl GgufNames for KimiLinear {
    fn gguf_part(&self, hf_part: &str) -> Option<&'static str> {
        gguf_part_in(LAYER_TENSORS, hf_part)
    }
}
