//! Step 3.5 Flash (`step3p5`, as mlx-lm's `step3p5.py`): a pre-norm decoder whose layers each
//! have their own attention geometry and RoPE, and a sigmoid-routed Mixture of Experts with a
//! shared expert:
//!
//! - sliding layers (`layer_types`; without it every even layer) may have their own head counts
//!   (`attention_other_setting`); key/value heads are `num_attention_groups`;
//! - per layer, RoPE of base `rope_theta[layer]` (a list, or one value) over
//!   `partial_rotary_factors[layer]` of the head, the configuration's `rope_scaling` (YaRN) only
//!   on the layer types `yarn_only_types` names;
//! - per-head Q/K RMS norms, and a head-wise gate: each head's output times
//!   `sigmoid(g_proj(x))` of its row ([`Attention::with_head_gate`]);
//! - the MoE on the layers `moe_layers_enum` lists (else every layer but the first): sigmoid
//!   scores plus `router_bias` choose the top k, the plain scores (normalized,
//!   `norm_expert_weight`) times `moe_router_scaling_factor` weigh them; a shared expert
//!   `share_expert_dim` wide; SwiGLUs clamped at the layer's `swiglu_limits` (experts) and
//!   `swiglu_limits_shared` (shared expert and dense MLP) entries when positive.
//!
//! StepFun's own files ("vanilla", as mlx-lm calls them) name the experts `moe.*` and the
//! shared expert `share_expert.*` at the layer's level, and store every norm zero-centred
//! (`w - 1`); mlx-lm's files name them `mlp.switch_mlp.*`, `mlp.gate.gate`,
//! `mlp.gate.router_bias`, `mlp.share_expert.*` with the norms as they apply. Both are read.

use super::base::{
    layer_tensor, Attention, DecoderLayer, Family, FeedForward, GateActivation, HeadNorms,
    LayerParameters, Mlp,
};
use super::config_keys::family_keys;
use super::moe::{ExpertActivation, Experts, MoeBlock, PROJ_NAMES};
use crate::config::{FamilyParams, ModelConfig, MoeConfig, RopeScaling, RouterKind, SlidingWindow};
use crate::error::{InferenceError, Result};
use crate::rope::Rope;
use crate::weights::FormatOnMlx;
use crate::weights::{GgufNames, TensorSource, WeightFormat};
use mlx_rs::{Array, Dtype};
use serde_json::Value;

/// The `config.json` keys only this family has, with mlx-lm's defaults.
#[derive(serde::Deserialize)]
struct Step3p5Keys {
    num_attention_groups: usize,
    #[serde(default = "defaults::window")]
    sliding_window: usize,
    layer_types: Option<Vec<String>>,
    #[serde(default)]
    yarn_only_types: Vec<String>,
    partial_rotary_factors: Option<Vec<f64>>,
    attention_other_setting: Option<OtherSetting>,
    #[serde(default = "defaults::yes")]
    use_head_wise_attn_gate: bool,
    #[serde(default = "defaults::experts")]
    moe_num_experts: usize,
    #[serde(default = "defaults::top_k")]
    moe_top_k: usize,
    #[serde(default = "defaults::width")]
    moe_intermediate_size: usize,
    #[serde(default = "defaults::width")]
    share_expert_dim: usize,
    moe_layers_enum: Option<String>,
    #[serde(default = "defaults::scaling")]
    moe_router_scaling_factor: f64,
    #[serde(default = "defaults::yes")]
    norm_expert_weight: bool,
    swiglu_limits: Option<Vec<Option<f64>>>,
    swiglu_limits_shared: Option<Vec<Option<f64>>>,
    rope_theta: Option<Value>,
}

/// The sliding layers' own head counts.
#[derive(serde::Deserialize)]
struct OtherSetting {
    num_attention_heads: usize,
    num_attention_groups: usize,
}

mod defaults {
    pub fn window() -> usize {
        512
    }
    pub fn yes() -> bool {
        true
    }
    pub fn experts() -> usize {
        288
    }
    pub fn top_k() -> usize {
        8
    }
    pub fn width() -> usize {
        1280
    }
    pub fn scaling() -> f64 {
        3.0
    }
}

/// One layer's attention geometry, RoPE and clamps.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct LayerSpec {
    heads: usize,
    kv_heads: usize,
    theta: f32,
    rotary_dim: usize,
    yarn: bool,
    /// The experts' SwiGLU clamp (0: none).
    limit: f32,
    /// The shared expert's and the dense MLP's clamp (0: none).
    limit_shared: f32,
    moe: bool,
}

/// What the blocks need beyond the shared numbers.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Step3p5Params {
    layers: Vec<LayerSpec>,
    head_gate: bool,
}

/// The Step 3.5 family.
pub struct Step3p5;

/// Entry `layer` of a per-layer list of limits (absent, null or non-positive: 0).
fn limit_of(list: &Option<Vec<Option<f64>>>, layer: usize) -> f32 {
    list.as_ref()
        .and_then(|l| l.get(layer).copied().flatten())
        .filter(|v| *v > 0.0)
        .unwrap_or(0.0) as f32
}

impl Family for Step3p5 {
    fn hf_names(&self) -> (&'static str, &'static str) {
        ("step3p5", "Step3p5ForCausalLM")
    }

    fn layer_parameters(&self, config: &ModelConfig, layer: usize) -> Option<LayerParameters> {
        let params: Step3p5Params = config.family_params.get("step3p5").ok()?;
        let spec = params.layers.get(layer)?;
        let (h, hd) = (config.hidden_size, config.head_dim);
        // This layer's own head counts (the sliding layers' differ), the head-wise gate, the
        // query and key norms; the shared feed-forward and the two norms.
        let attention = h * hd * (2 * spec.heads + 2 * spec.kv_heads)
            + usize::from(params.head_gate) * h * spec.heads
            + 2 * hd;
        let (all, active) = config.ffn_parameters(layer);
        Some(LayerParameters {
            all: attention + all + 2 * h,
            active: attention + active + 2 * h,
        })
    }

    fn configure(&self, json: &Value, config: &mut ModelConfig) -> Result<()> {
        let keys: Step3p5Keys = family_keys(json, "step3p5")?;
        let n = config.num_layers;
        let bad = |what: String| {
            Err(InferenceError::BadConfig(format!(
                "a step3p5 config.json {what}"
            )))
        };
        let sliding: Vec<bool> = match &keys.layer_types {
            Some(types) if types.len() == n => {
                types.iter().map(|t| t == "sliding_attention").collect()
            }
            Some(types) => return bad(format!("has {} layer_types for {n} layers", types.len())),
            None => (0..n).map(|l| l % 2 == 0).collect(),
        };
        let thetas: Vec<f64> = match &keys.rope_theta {
            Some(Value::Array(list)) if list.len() >= n => list
                .iter()
                .map(|v| v.as_f64().unwrap_or(10_000.0))
                .collect(),
            Some(Value::Array(list)) => {
                return bad(format!(
                    "has {} rope_theta entries for {n} layers",
                    list.len()
                ))
            }
            Some(v) => vec![v.as_f64().unwrap_or(10_000.0); n],
            None => vec![10_000.0; n],
        };
        let moe_layers: Vec<bool> = match &keys.moe_layers_enum {
            Some(list) => {
                let mut set = vec![false; n];
                for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                    match part.parse::<usize>() {
                        Ok(l) if l < n => set[l] = true,
                        _ => return bad(format!("lists `{part:.20}` in moe_layers_enum")),
                    }
                }
                set
            }
            None => (0..n).map(|l| l >= 1).collect(),
        };
        if keys.num_attention_groups == 0 || keys.sliding_window == 0 {
            return bad("has num_attention_groups or sliding_window 0".into());
        }
        let mut layers = Vec::with_capacity(n);
        for l in 0..n {
            let (heads, kv_heads) = match (&keys.attention_other_setting, sliding[l]) {
                (Some(o), true) => (o.num_attention_heads, o.num_attention_groups),
                _ => (config.num_heads, keys.num_attention_groups),
            };
            if kv_heads == 0 || heads == 0 || !heads.is_multiple_of(kv_heads) || heads > 1024 {
                return bad(format!(
                    "gives layer {l} {heads} heads over {kv_heads} groups"
                ));
            }
            let fraction = keys
                .partial_rotary_factors
                .as_ref()
                .and_then(|f| f.get(l).copied())
                .unwrap_or(1.0);
            let rotary_dim = (config.head_dim as f64 * fraction) as usize;
            if rotary_dim > config.head_dim || !rotary_dim.is_multiple_of(2) {
                return bad(format!(
                    "rotates {rotary_dim} of layer {l}'s {} features",
                    config.head_dim
                ));
            }
            let kind = if sliding[l] {
                "sliding_attention"
            } else {
                "full_attention"
            };
            layers.push(LayerSpec {
                heads,
                kv_heads,
                theta: thetas[l] as f32,
                rotary_dim,
                yarn: keys.yarn_only_types.is_empty()
                    || keys.yarn_only_types.iter().any(|t| t == kind),
                limit: limit_of(&keys.swiglu_limits, l),
                limit_shared: limit_of(&keys.swiglu_limits_shared, l),
                moe: moe_layers[l],
            });
        }
        config.num_kv_heads = keys.num_attention_groups;
        config.sliding_window = Some(SlidingWindow {
            size: keys.sliding_window,
            layers: sliding,
        });
        if layers.iter().any(|l| l.moe) {
            config.moe = Some(MoeConfig {
                num_experts: keys.moe_num_experts,
                experts_per_token: keys.moe_top_k,
                expert_width: keys.moe_intermediate_size,
                router: RouterKind::SigmoidGroupedTopK {
                    groups: 1,
                    top_groups: 1,
                    normalize: keys.norm_expert_weight,
                    scale: keys.moe_router_scaling_factor as f32,
                },
                dense_layers: (0..n).filter(|&l| !layers[l].moe).collect(),
                sparse_step: 1,
                first_dense: 0,
                shared_width: keys.share_expert_dim,
                latent_width: 0,
            });
        }
        config.family_params = FamilyParams::of(&Step3p5Params {
            layers,
            head_gate: keys.use_head_wise_attn_gate,
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
        let params: Step3p5Params = config.family_params.get("step3p5")?;
        let spec = &params.layers[layer];
        let dtype = format.compute_dtype();
        let vanilla = stored_as_released(config, source);
        let mut norm = |part: &str| {
            super::parts::norm_weight(source, &layer_tensor(layer, part), dtype, vanilla)
        };
        let head_norms = HeadNorms::each_head(
            norm("self_attn.q_norm.weight")?,
            norm("self_attn.k_norm.weight")?,
        );
        let input_norm = norm("input_layernorm.weight")?;
        let ffn_norm = norm("post_attention_layernorm.weight")?;
        let mut lc = config.clone();
        lc.num_heads = spec.heads;
        lc.num_kv_heads = spec.kv_heads;
        let scaling = if spec.yarn {
            config.rope_scaling.clone()
        } else {
            RopeScaling::None
        };
        let mut attention = Attention::load(&lc, source, layer, format, Some(head_norms))?
            .with_rope(Rope::new(spec.rotary_dim, spec.theta, &scaling));
        if params.head_gate {
            let name = layer_tensor(layer, "self_attn.g_proj");
            let gate = source.linear(&name, format)?;
            attention = attention.with_head_gate(gate, &name)?;
        }
        let ffn = match (&config.moe, spec.moe) {
            (Some(moe), true) => {
                FeedForward::Experts(load_moe(config, moe, spec, source, layer, format, vanilla)?)
            }
            _ => {
                let mlp = Mlp::load(config, source, layer, format)?;
                FeedForward::Dense(clamped(mlp, spec.limit_shared))
            }
        };
        Ok(DecoderLayer::new(
            config, input_norm, attention, ffn_norm, ffn,
        ))
    }

    fn final_norm(
        &self,
        config: &ModelConfig,
        source: &mut dyn TensorSource,
        dtype: Dtype,
    ) -> Result<Array> {
        let vanilla = stored_as_released(config, source);
        super::parts::norm_weight(source, "model.norm.weight", dtype, vanilla)
    }

    fn layer_tensor_names(&self, config: &ModelConfig, layer: usize) -> Vec<String> {
        let params: Option<Step3p5Params> = config.family_params.get("step3p5").ok();
        let spec = params.as_ref().map(|p| &p.layers[layer]);
        let mut parts: Vec<String> = [
            "self_attn.q_proj.weight",
            "self_attn.k_proj.weight",
            "self_attn.v_proj.weight",
            "self_attn.o_proj.weight",
            "self_attn.q_norm.weight",
            "self_attn.k_norm.weight",
            "input_layernorm.weight",
            "post_attention_layernorm.weight",
        ]
        .map(String::from)
        .to_vec();
        if params.as_ref().is_some_and(|p| p.head_gate) {
            parts.push("self_attn.g_proj.weight".into());
        }
        if spec.is_some_and(|s| s.moe) {
            parts.extend(["moe.gate.weight".into(), "moe.router_bias".into()]);
            parts.extend(PROJ_NAMES.map(|p| format!("moe.{p}.weight")));
            parts.extend(PROJ_NAMES.map(|p| format!("share_expert.{p}.weight")));
        } else {
            parts.extend(PROJ_NAMES.map(|p| format!("mlp.{p}.weight")));
        }
        parts.iter().map(|p| layer_tensor(layer, p)).collect()
    }
}

/// Whether the weights are StepFun's own layout (experts under `moe.`), whose norms are
/// stored zero-centred: told, as mlx-lm tells it, by any MoE layer's released names.
fn stored_as_released(config: &ModelConfig, source: &dyn TensorSource) -> bool {
    (0..config.num_layers).any(|l| {
        source.contains(&layer_tensor(l, "moe.gate.weight"))
            || source.contains(&layer_tensor(l, "share_expert.gate_proj.weight"))
    })
}

/// `mlp` with its SwiGLU clamped at `limit` (none at 0).
fn clamped(mlp: Mlp, limit: f32) -> Mlp {
    if limit > 0.0 {
        mlp.with_activation(GateActivation::ClampedSilu { limit })
    } else {
        mlp
    }
}

/// Layer `layer`'s router, experts and shared expert, under either layout's names.
fn load_moe(
    config: &ModelConfig,
    moe: &MoeConfig,
    spec: &LayerSpec,
    source: &mut dyn TensorSource,
    layer: usize,
    format: WeightFormat,
    vanilla: bool,
) -> Result<MoeBlock> {
    let at = |part: &str| layer_tensor(layer, part);
    let (router, bias, experts, shared) = if vanilla {
        ("moe.gate", "moe.router_bias", "moe", "share_expert")
    } else {
        (
            "mlp.gate.gate",
            "mlp.gate.router_bias",
            "mlp.switch_mlp",
            "mlp.share_expert",
        )
    };
    let router = source.linear(&at(router), format)?;
    let bias = source.dense(&at(bias), Dtype::Float32)?;
    let mut stacked = |proj: &str| {
        let name = format!("{}.{proj}", at(experts));
        source
            .stacked(&name, format)?
            .ok_or_else(|| InferenceError::MissingTensor(format!("{name}.weight")))
    };
    let projections = [
        stacked("gate_proj")?,
        stacked("up_proj")?,
        stacked("down_proj")?,
    ];
    let activation = if spec.limit > 0.0 {
        ExpertActivation::ClampedSilu { limit: spec.limit }
    } else {
        ExpertActivation::SwiGlu
    };
    let experts = Experts::new(config, moe, &at(experts), projections, None, activation)?;
    let shared = Mlp::load_at(config, source, &at(shared), moe.shared_width, format)?;
    MoeBlock::from_parts(
        moe,
        router,
        Some(bias),
        experts,
        Some(clamped(shared, spec.limit_shared)),
        &at("mlp.gate.gate.weight"),
    )
}

impl GgufNames for Step3p5 {
    fn gguf_part(&self, _hf_part: &str) -> Option<&'static str> {
        None
    }
}
