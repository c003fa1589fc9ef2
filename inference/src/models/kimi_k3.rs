//! Kimi K3 (`kimi_k3`), as mlx-lm's `kimi_k3.py`: Kimi Linear's hybrid grown three ways.
//!
//! - Kimi Delta Attention ([`super::kda`]) on the layers `linear_attn_config.kda_layers` names
//!   (from 1), its q/k/v projections and convolutions stored fused, its decay bounded below
//!   (`gate_lower_bound`) and its output gate full-rank (`use_full_rank_gate`) where the
//!   configuration says; latent attention without position encoding ([`super::mla`], NoPE)
//!   on the others, with a query bottleneck (`q_lora_rank`) and an output gate
//!   (`mla_use_output_gate`), its bottleneck norms at 1e-6.
//! - Attention residuals (`attn_res_block_size`, [`super::attn_res`]): each layer reads a
//!   learned mix of earlier blocks' inputs instead of one running residual; the blocks travel
//!   between pipeline ranks after the hidden state.
//! - SiTU (`beta·tanh(g/beta)·sigmoid(g) · up`, [`super::mlp::Situ`]) in the dense MLPs, the
//!   experts and the shared expert; the routed experts run on a latent width
//!   (`routed_expert_hidden_size`: projected down before them, their weighted sum normed
//!   when `latent_moe_use_norm` and projected back up), sigmoid-routed with a correction,
//!   group-limited; a dense MLP on the first `first_k_dense_replace` layers and between
//!   `moe_layer_freq` steps.
//!
//! The release is multimodal (`KimiK3ForConditionalGeneration`): its numbers are read from
//! `text_config` and its weights under `language_model.`, the vision tower left unread.
//! Weights: Moonshot's layout (`block_sparse_moe.*`, experts `w1`/`w2`/`w3` one matrix each,
//! `q_proj`…, `q_conv1d`… `[channels, 1, kernel]`, `kv_b_proj`, `*_res.proj_weight`) or
//! mlx-community's (`mlp.switch_mlp`, `qkv_proj`, `qkv_conv`, `embed_q`/`unembed_out`,
//! `*_res_proj.weight`); the multi-token-prediction tensors are not read.

use super::attn_res::{AttentionResiduals, ResidualBlocks};
use super::base::{
    DecoderLayer, Family, FeedForward, GateActivation, LayerParameters, Mlp, SelfAttention,
};
use super::config_keys::family_keys;
use super::expert_activation::ExpertActivation;
use super::kda::{KdaConfig, KimiDeltaAttention};
use super::latent_moe::load_latent_attention;
use super::mlp::Situ;
use super::moe::{LatentProjection, MoeBlock, PROJ_NAMES};
use super::parts::{check_shape, layer_tensor};
use super::sigmoid_moe::{load_moonshot_moe, moonshot_moe_tensor_names};
use crate::config::{FamilyParams, LatentConfig, ModelConfig, MoeConfig, RouterKind};
use crate::error::{InferenceError, Result};
use crate::weights::FormatOnMlx;
use crate::weights::{GgufNames, TensorSource, WeightFormat};
use serde_json::Value;

/// The Kimi K3 family.
pub struct KimiK3;

/// The keys of a `kimi_k3` text configuration, with the reference's defaults.
#[derive(serde::Deserialize)]
struct KimiK3Keys {
    linear_attn_config: KdaConfig,
    #[serde(default = "situ")]
    hidden_act: String,
    #[serde(default)]
    activation_situ_beta: Option<f32>,
    #[serde(default)]
    activation_situ_linear_beta: Option<f32>,
    #[serde(default)]
    attn_res_block_size: Option<usize>,
    #[serde(default)]
    q_lora_rank: Option<usize>,
    kv_lora_rank: usize,
    qk_nope_head_dim: usize,
    qk_rope_head_dim: usize,
    v_head_dim: usize,
    #[serde(default = "yes")]
    mla_use_nope: bool,
    #[serde(default)]
    mla_use_output_gate: bool,
    #[serde(default)]
    num_experts: Option<usize>,
    #[serde(default = "sixteen")]
    num_experts_per_token: usize,
    #[serde(default)]
    num_shared_experts: usize,
    #[serde(default)]
    moe_intermediate_size: Option<usize>,
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
    #[serde(default)]
    routed_expert_hidden_size: Option<usize>,
    #[serde(default)]
    latent_moe_use_norm: bool,
}

/// What Kimi K3's blocks need beyond the shared configuration.
#[derive(serde::Serialize, serde::Deserialize)]
struct KimiK3Params {
    situ: Situ,
    /// `attn_res_block_size` (none: a plain residual).
    residual_block: Option<usize>,
    lower_bound: Option<f32>,
    full_rank_gate: bool,
    output_gate: bool,
    /// Whether the experts' latent sum is normed (`latent_moe_use_norm`).
    latent_norm: bool,
}

fn situ() -> String {
    "situ".into()
}

fn sixteen() -> usize {
    16
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

fn params(config: &ModelConfig) -> Result<KimiK3Params> {
    config.family_params.get("kimi_k3")
}

impl Family for KimiK3 {
    fn hf_names(&self) -> (&'static str, &'static str) {
        ("kimi_k3", "KimiK3ForCausalLM")
    }

    fn layer_parameters(&self, config: &ModelConfig, layer: usize) -> Option<LayerParameters> {
        let params = params(config).ok()?;
        let h = config.hidden_size;
        let (ffn_all, ffn_active) = config.ffn_parameters(layer);
        // The mixer and the two norms: a KDA layer (its gate full-rank or low-rank), or the
        // shared count's latent attention with K3's output gate (one per head and value).
        let mixer = match config
            .attention
            .linear
            .as_ref()
            .filter(|l| l.is_linear(layer))
        {
            Some(linear) => {
                KimiDeltaAttention::parameters(h, &linear.shape, params.full_rank_gate) + 2 * h
            }
            None => {
                config.shared_parameters_of_layer(layer) - ffn_all
                    + usize::from(params.output_gate) * h * config.num_heads * config.head_dim
            }
        };
        // Attention residuals: a norm and a one-row projection before the mixer and the
        // feed-forward; the experts' latent sum's norm.
        let residuals = usize::from(params.residual_block.is_some()) * 4 * h;
        let latent_norm = match &config.moe {
            Some(moe) if params.latent_norm && moe.is_moe_layer(layer) => moe.latent_width,
            _ => 0,
        };
        let rest = mixer + residuals + latent_norm;
        Some(LayerParameters {
            all: rest + ffn_all,
            active: rest + ffn_active,
        })
    }

    fn configure(&self, v: &Value, config: &mut ModelConfig) -> Result<()> {
        let keys: KimiK3Keys = family_keys(v, "kimi_k3")?;
        let bad = |what: String| Err(InferenceError::BadConfig(format!("kimi_k3: {what}")));
        if keys.hidden_act != "situ" || keys.moe_router_activation_func != "sigmoid" {
            return bad(format!(
                "a `{}` activation with a `{}` router is not supported (situ and sigmoid are, \
                 as in mlx-lm)",
                keys.hidden_act, keys.moe_router_activation_func
            ));
        }
        if !keys.mla_use_nope {
            return bad("only latent attention without RoPE (mla_use_nope) is supported".into());
        }
        if keys.attn_res_block_size == Some(0) || keys.moe_layer_freq == 0 {
            return bad("attn_res_block_size and moe_layer_freq must be positive".into());
        }
        let la = &keys.linear_attn_config;
        config.attention.linear = Some(la.layers(config.num_layers)?);
        let latent = LatentConfig {
            q_lora_rank: keys.q_lora_rank,
            kv_lora_rank: keys.kv_lora_rank,
            qk_nope_head_dim: keys.qk_nope_head_dim,
            qk_rope_head_dim: keys.qk_rope_head_dim,
            v_head_dim: keys.v_head_dim,
            // The reference's bottleneck norms take 1e-6 whatever rms_norm_eps is.
            norm_eps: 1e-6,
            indexer: None,
            position_scale: None,
            no_rope: true,
        };
        let widths = [
            latent.kv_lora_rank,
            latent.qk_nope_head_dim,
            latent.qk_rope_head_dim,
            latent.v_head_dim,
        ];
        if widths.contains(&0) || latent.q_lora_rank == Some(0) {
            return bad(format!(
                "latent attention of {latent:?} cannot be built: every width must be positive"
            ));
        }
        config.num_kv_heads = config.num_heads;
        config.head_dim = latent.v_head_dim;
        config.attention.latent = Some(latent);
        config.moe = match (keys.num_experts, keys.moe_intermediate_size) {
            (Some(experts), Some(width)) if experts > 0 => {
                let k = keys.num_experts_per_token;
                let freq = keys.moe_layer_freq;
                Some(MoeConfig {
                    num_experts: experts,
                    experts_per_token: k,
                    expert_width: width,
                    router: RouterKind::SigmoidGroupedTopK {
                        groups: keys.num_expert_group,
                        top_groups: keys.topk_group,
                        // The reference divides by the sum only when more than one is chosen.
                        normalize: k > 1 && keys.moe_renormalize,
                        scale: keys.routed_scaling_factor as f32,
                    },
                    // Experts on every `moe_layer_freq`-th layer, counted from 0.
                    dense_layers: (0..config.num_layers)
                        .filter(|l| !l.is_multiple_of(freq))
                        .collect(),
                    sparse_step: 1,
                    first_dense: keys.first_k_dense_replace,
                    shared_width: keys.num_shared_experts * width,
                    latent_width: keys.routed_expert_hidden_size.unwrap_or(0),
                })
            }
            (Some(experts), None) if experts > 0 => {
                return bad("num_experts without moe_intermediate_size".into())
            }
            _ => None,
        };
        config.family_params = FamilyParams::of(&KimiK3Params {
            situ: Situ {
                beta: keys.activation_situ_beta.unwrap_or(1.0),
                linear_beta: keys.activation_situ_linear_beta,
            },
            residual_block: keys.attn_res_block_size,
            lower_bound: la.gate_lower_bound,
            full_rank_gate: la.use_full_rank_gate,
            output_gate: keys.mla_use_output_gate,
            latent_norm: keys.latent_moe_use_norm,
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
        let params = params(config)?;
        let (Some(latent), Some(linear)) = (
            config.attention.latent.as_ref(),
            config.attention.linear.as_ref(),
        ) else {
            return Err(InferenceError::BadConfig(
                "a kimi_k3 configuration without its layers' kinds".into(),
            ));
        };
        let attention = if linear.is_linear(layer) {
            let kda = KimiDeltaAttention::load(
                linear.shape,
                config.hidden_size,
                config.rms_norm_eps,
                source,
                layer,
                format,
            )?;
            SelfAttention::Kda(Box::new(kda.with_lower_bound(params.lower_bound)))
        } else {
            let attention = load_latent_attention(config, latent, source, layer, format)?;
            let gate = layer_tensor(layer, "self_attn.g_proj");
            match &attention.gate {
                Some(g) => check_shape(&g.weight, &gate, config.num_heads * latent.v_head_dim)?,
                None if params.output_gate => {
                    return Err(InferenceError::MissingTensor(format!("{gate}.weight")))
                }
                None => {}
            }
            SelfAttention::Latent(attention)
        };
        let situ = params.situ;
        let ffn = match config.moe.as_ref().filter(|m| m.is_moe_layer(layer)) {
            Some(moe) => {
                FeedForward::Experts(load_moe(config, moe, &params, source, layer, format)?)
            }
            None => FeedForward::Dense(
                Mlp::load(config, source, layer, format)?
                    .with_activation(GateActivation::Situ(situ)),
            ),
        };
        let block = DecoderLayer::assemble(config, source, layer, format, attention, ffn)?;
        Ok(match residual_blocks(config, &params) {
            Some(blocks) => block.with_attention_residuals(AttentionResiduals::load(
                source,
                layer,
                blocks,
                config.rms_norm_eps,
            )?),
            None => block,
        })
    }

    fn carried_columns(&self, config: &ModelConfig) -> usize {
        params(config)
            .ok()
            .and_then(|p| residual_blocks(config, &p))
            .map_or(0, |b| b.carried_columns())
    }

    fn layer_tensor_names(&self, config: &ModelConfig, layer: usize) -> Vec<String> {
        let Ok(params) = params(config) else {
            return Vec::new();
        };
        let mut names: Vec<String> = if config.is_linear_layer(layer) {
            KimiDeltaAttention::tensor_names(layer, params.full_rank_gate)
        } else {
            let low_rank = config
                .attention
                .latent
                .as_ref()
                .is_some_and(|l| l.q_lora_rank.is_some());
            let query: &[&str] = if low_rank {
                &["q_a_proj", "q_a_layernorm", "q_b_proj"]
            } else {
                &["q_proj"]
            };
            let gate: &[&str] = if params.output_gate { &["g_proj"] } else { &[] };
            query
                .iter()
                .chain(&[
                    "kv_a_proj_with_mqa",
                    "kv_a_layernorm",
                    "kv_b_proj",
                    "o_proj",
                ])
                .chain(gate)
                .map(|p| layer_tensor(layer, &format!("self_attn.{p}.weight")))
                .collect()
        };
        for norm in ["input_layernorm", "post_attention_layernorm"] {
            names.push(layer_tensor(layer, &format!("{norm}.weight")));
        }
        match config.moe.as_ref().filter(|m| m.is_moe_layer(layer)) {
            Some(moe) => {
                names.extend(moonshot_moe_tensor_names(moe, layer));
                let mut latent = Vec::new();
                if moe.latent_width > 0 {
                    latent.extend(["routed_expert_down_proj", "routed_expert_up_proj"]);
                    if params.latent_norm {
                        latent.push("routed_expert_norm");
                    }
                }
                names.extend(
                    latent
                        .iter()
                        .map(|p| layer_tensor(layer, &format!("block_sparse_moe.{p}.weight"))),
                );
            }
            None => {
                for proj in PROJ_NAMES {
                    names.push(layer_tensor(layer, &format!("mlp.{proj}.weight")));
                }
            }
        }
        if residual_blocks(config, &params).is_some() {
            names.extend(AttentionResiduals::tensor_names(layer, config.num_layers));
        }
        names
    }

    fn tensor_divisors(&self, config: &ModelConfig) -> Vec<crate::tensor_divisors::TensorDivisor> {
        super::recurrent_split::linear_divisors(config, super::recurrent_split::RecurrentKind::Kda)
    }
}

/// Where the attention residuals' blocks fall, when the model has them.
fn residual_blocks(config: &ModelConfig, params: &KimiK3Params) -> Option<ResidualBlocks> {
    params.residual_block.map(|block_size| ResidualBlocks {
        block_size,
        layers: config.num_layers,
        hidden: config.hidden_size,
    })
}

/// Layer `layer`'s experts: the sigmoid-routed block in Moonshot's or mlx-lm's layout, SiTU in
/// the experts and the shared expert, on the latent width with its projections (and norm).
fn load_moe(
    config: &ModelConfig,
    moe: &MoeConfig,
    params: &KimiK3Params,
    source: &mut dyn TensorSource,
    layer: usize,
    format: WeightFormat,
) -> Result<MoeBlock> {
    let (block, prefix) = load_moonshot_moe(config, moe, source, layer, format)?;
    let block = block.with_activations(
        ExpertActivation::Situ(params.situ),
        GateActivation::Situ(params.situ),
    );
    if moe.latent_width == 0 {
        return Ok(block);
    }
    let p = |part: &str| format!("{prefix}.{part}");
    let down = source.linear(&p("routed_expert_down_proj"), format)?;
    check_shape(
        &down.weight,
        &p("routed_expert_down_proj"),
        moe.latent_width,
    )?;
    let up = source.linear(&p("routed_expert_up_proj"), format)?;
    check_shape(&up.weight, &p("routed_expert_up_proj"), config.hidden_size)?;
    let norm = match params.latent_norm {
        true => {
            let name = p("routed_expert_norm.weight");
            let w = source.dense(&name, format.compute_dtype())?;
            if w.size() != moe.latent_width {
                return Err(InferenceError::BadTensor {
                    name,
                    reason: format!(
                        "expected {} numbers, found {:?}",
                        moe.latent_width,
                        w.shape()
                    ),
                });
            }
            Some((w, config.rms_norm_eps))
        }
        false => None,
    };
    Ok(block.with_latent(LatentProjection { down, up, norm }))
}

impl GgufNames for KimiK3 {
    fn gguf_part(&self, _hf_part: &str) -> Option<&'static str> {
        None
    }
}
