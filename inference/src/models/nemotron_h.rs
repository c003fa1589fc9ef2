//! Nemotron-H (`nemotron_h`: Nemotron-H, Nemotron 3 Nano), as mlx-lm's `nemotron_h.py`: a stack
//! of single-part blocks `x + part(rms(x))` laid out by a pattern (`hybrid_override_pattern`,
//! or `layers_block_type` / `layer_types` by name): `M` a Mamba-2 mixer ([`super::mamba2`]),
//! `*` attention without positions (no RoPE, no Q/K norms), `-` an MLP `relu(up(x))²`, `E`
//! experts of that MLP routed by sigmoid scores with DeepSeek's correction and groups, plus a
//! shared expert. Its files name the model `backbone.*` (`embeddings`, `norm_f`), read as
//! every family's names ([`crate::weights::text_model_name`]).
//!
//! A Mamba-2 layer's state is recurrent: sequences of this model decode on their own caches;
//! the MLP and MoE layers keep nothing, their caches count positions. Memory counts the state
//! of every layer without keys and values (the MLP and MoE layers' too: an over-count of the
//! fixed per-sequence bytes, never of the per-token KV). Tensor parallelism cuts the Mamba-2
//! layers by heads and groups ([`super::recurrent_split`]). Nemotron 3 Super's experts run on a
//! latent projection (`moe_latent_size`): `fc1_latent_proj` narrows the hidden state before
//! them and `fc2_latent_proj` widens their weighted sum back, while the router and the shared
//! expert read the hidden state itself ([`super::moe`]'s latent block; every rank keeps both
//! projections whole).

use super::base::{
    layer_tensor, Attention, DecoderLayer, Family, FeedForward, GateActivation, LayerParameters,
    Mlp, SelfAttention,
};
use super::config_keys::family_keys;
use super::expert_activation::ExpertActivation;
use super::gated_delta::DeltaNetShape;
use super::mamba2::{Mamba2, Mamba2Shape};
use super::moe::{Experts, LatentProjection, MoeBlock};
use crate::config::{FamilyParams, LinearLayers, ModelConfig, MoeConfig, RouterKind};
use crate::error::{InferenceError, Result};
use crate::rope::Rope;
use crate::weights::FormatOnMlx;
use crate::weights::{GgufNames, Stacked, TensorSource, WeightFormat};
use mlx_rs::{ops, Array, Dtype};
use serde_json::Value;

/// The `config.json` keys only this family has.
#[derive(serde::Deserialize)]
struct NemotronKeys {
    hybrid_override_pattern: Option<Value>,
    layers_block_type: Option<Vec<String>>,
    layer_types: Option<Vec<String>>,
    mamba_num_heads: usize,
    mamba_head_dim: usize,
    ssm_state_size: usize,
    conv_kernel: usize,
    n_groups: usize,
    layer_norm_epsilon: f64,
    time_step_limit: Option<(f64, f64)>,
    moe_intermediate_size: Option<usize>,
    moe_shared_expert_intermediate_size: Option<usize>,
    moe_latent_size: Option<usize>,
    mlp_bias: Option<bool>,
    n_group: Option<usize>,
    n_routed_experts: Option<usize>,
    n_shared_experts: Option<usize>,
    topk_group: Option<usize>,
    num_experts_per_tok: Option<usize>,
    norm_topk_prob: Option<bool>,
    routed_scaling_factor: Option<f64>,
}

/// What the blocks need beyond the shared numbers.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct NemotronParams {
    /// Per layer, its kind: `M`, `*`, `-` or `E`.
    pattern: Vec<char>,
    mamba: Mamba2Shape,
    /// The shared expert's width (0: none).
    shared_width: usize,
    /// The width the experts run on when it is not the hidden size (`moe_latent_size`).
    #[serde(default)]
    latent: Option<usize>,
    /// Whether the MLPs and latent projections have biases (`mlp_bias`).
    #[serde(default)]
    mlp_bias: bool,
}

/// A block kind by its name in `layers_block_type` (transformers' names and their older ones).
fn kind_of(name: &str) -> Option<char> {
    Some(match name {
        "full_attention" | "attention" => '*',
        "linear_attention" | "mamba" | "conv" => 'M',
        "moe" => 'E',
        "mlp" => '-',
        _ => return None,
    })
}

/// The Nemotron-H family.
pub struct NemotronH;

impl Family for NemotronH {
    fn hf_names(&self) -> (&'static str, &'static str) {
        ("nemotron_h", "NemotronHForCausalLM")
    }

    fn configure(&self, json: &Value, config: &mut ModelConfig) -> Result<()> {
        let keys: NemotronKeys = family_keys(json, "nemotron_h")?;
        let bad = |what: String| {
            Err(InferenceError::BadConfig(format!(
                "a nemotron_h config.json {what}"
            )))
        };
        let pattern: Vec<char> = match (
            &keys.hybrid_override_pattern,
            &keys.layers_block_type,
            &keys.layer_types,
        ) {
            (Some(Value::String(p)), _, _) => p.chars().collect(),
            (Some(Value::Array(p)), _, _) => p
                .iter()
                .map(|c| c.as_str().and_then(|s| s.chars().next()).unwrap_or('?'))
                .collect(),
            (_, Some(names), _) | (_, None, Some(names)) => {
                names.iter().map(|n| kind_of(n).unwrap_or('?')).collect()
            }
            _ => return bad("has no hybrid_override_pattern or layers_block_type".into()),
        };
        if pattern.is_empty() || pattern.len() > 1024 {
            return bad(format!("has a layer pattern of {} layers", pattern.len()));
        }
        if let Some(c) = pattern.iter().find(|c| !"M*-E".contains(**c)) {
            return bad(format!(
                "has the layer kind `{c}` (M, *, - and E are known)"
            ));
        }
        if keys.moe_latent_size == Some(0) {
            return bad("has moe_latent_size 0".into());
        }
        let (dt_min, dt_max) = keys.time_step_limit.unwrap_or((0.0, f64::INFINITY));
        let mamba = Mamba2Shape {
            heads: keys.mamba_num_heads,
            head_dim: keys.mamba_head_dim,
            state: keys.ssm_state_size,
            groups: keys.n_groups,
            kernel: keys.conv_kernel,
            dt_min: dt_min as f32,
            dt_max: dt_max.is_finite().then_some(dt_max as f32),
        };
        mamba.validate()?;
        config.num_layers = pattern.len();
        config.rms_norm_eps = keys.layer_norm_epsilon as f32;
        // Layers without keys and values; the state shape in Gated DeltaNet's terms has the
        // same sizes (value heads = heads of head_dim, key heads = groups of state width).
        config.attention.linear = Some(LinearLayers {
            layers: pattern.iter().map(|&c| c != '*').collect(),
            shape: DeltaNetShape {
                k_heads: mamba.groups,
                v_heads: mamba.heads,
                k_dim: mamba.state,
                v_dim: mamba.head_dim,
                kernel: mamba.kernel,
            },
        });
        let mut shared_width = 0;
        if pattern.contains(&'E') {
            let (Some(experts), Some(k), Some(width)) = (
                keys.n_routed_experts,
                keys.num_experts_per_tok,
                keys.moe_intermediate_size,
            ) else {
                return bad(
                    "with E layers needs n_routed_experts, num_experts_per_tok and \
                            moe_intermediate_size"
                        .into(),
                );
            };
            if keys.n_shared_experts.is_some() {
                shared_width = keys.moe_shared_expert_intermediate_size.unwrap_or(0);
            }
            config.moe = Some(MoeConfig {
                num_experts: experts,
                experts_per_token: k,
                expert_width: width,
                router: RouterKind::SigmoidGroupedTopK {
                    groups: keys.n_group.unwrap_or(1),
                    top_groups: keys.topk_group.unwrap_or(1),
                    normalize: keys.norm_topk_prob.unwrap_or(false) && k > 1,
                    scale: keys.routed_scaling_factor.unwrap_or(1.0) as f32,
                },
                dense_layers: (0..pattern.len()).filter(|&l| pattern[l] != 'E').collect(),
                sparse_step: 1,
                first_dense: 0,
                shared_width,
                latent_width: keys.moe_latent_size.unwrap_or(0),
            });
        }
        config.family_params = FamilyParams::of(&NemotronParams {
            pattern,
            mamba,
            shared_width,
            latent: keys.moe_latent_size,
            mlp_bias: keys.mlp_bias.unwrap_or(false),
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
        let params: NemotronParams = config.family_params.get("nemotron_h")?;
        let dtype = format.compute_dtype();
        let norm = source.dense(&layer_tensor(layer, "norm.weight"), dtype)?;
        let ones = || -> Result<Array> {
            Ok(Array::ones::<f32>(&[config.hidden_size as i32])?.as_dtype(dtype)?)
        };
        let mixer = layer_tensor(layer, "mixer");
        Ok(match params.pattern[layer] {
            'M' => {
                let m = Mamba2::load(
                    params.mamba,
                    config.hidden_size,
                    config.rms_norm_eps,
                    source,
                    layer,
                    format,
                )?;
                DecoderLayer::new(
                    config,
                    norm,
                    SelfAttention::Mamba(m),
                    ones()?,
                    FeedForward::Absent,
                )
            }
            '*' => {
                let a = attention(config, source, layer, format)?;
                DecoderLayer::new(config, norm, a, ones()?, FeedForward::Absent)
            }
            '-' => {
                let mlp = relu2_mlp(config, source, &mixer, config.intermediate_size, format)?;
                DecoderLayer::new(
                    config,
                    ones()?,
                    SelfAttention::Absent,
                    norm,
                    FeedForward::Dense(mlp),
                )
            }
            _ => {
                let moe = config.moe.as_ref().ok_or_else(|| {
                    InferenceError::BadConfig("an E layer without experts".into())
                })?;
                let block = load_moe(config, moe, &params, source, &mixer, format)?;
                DecoderLayer::new(
                    config,
                    ones()?,
                    SelfAttention::Absent,
                    norm,
                    FeedForward::Experts(block),
                )
            }
        })
    }

    fn layer_parameters(&self, config: &ModelConfig, layer: usize) -> Option<LayerParameters> {
        let params: NemotronParams = config.family_params.get("nemotron_h").ok()?;
        let h = config.hidden_size;
        let bias = usize::from(params.mlp_bias);
        // Each layer is one kind, after its one norm; the MLPs and experts are relu² (an up
        // and a down matrix, no gate).
        let own = match *params.pattern.get(layer)? {
            'M' => {
                let m = &params.mamba;
                let (inner, channels) = (m.inner(), m.conv_channels());
                LayerParameters::dense(
                    h * (inner + channels + m.heads)
                        + channels * (m.kernel + 1)
                        + 3 * m.heads
                        + inner
                        + inner * h,
                )
            }
            '*' => LayerParameters::dense(
                h * config.head_dim * (2 * config.num_heads + 2 * config.num_kv_heads),
            ),
            '-' => LayerParameters::dense(
                2 * h * config.intermediate_size + bias * (h + config.intermediate_size),
            ),
            _ => {
                let moe = config.moe.as_ref()?;
                let (io, projections) = match params.latent {
                    Some(latent) => (latent, 2 * h * latent + bias * (h + latent)),
                    None => (h, 0),
                };
                let experts = |n: usize| 2 * io * moe.expert_width * n;
                let rest = (h + 1) * moe.num_experts
                    + 2 * h * params.shared_width
                    + bias * (h + params.shared_width)
                    + projections;
                LayerParameters {
                    all: rest + experts(moe.num_experts),
                    active: rest + experts(moe.experts_per_token),
                }
            }
        };
        Some(LayerParameters {
            all: own.all + h,
            active: own.active + h,
        })
    }

    fn layer_tensor_names(&self, config: &ModelConfig, layer: usize) -> Vec<String> {
        let Ok(params) = config.family_params.get::<NemotronParams>("nemotron_h") else {
            return Vec::new();
        };
        let mut parts: Vec<String> = vec!["norm.weight".into()];
        let m = |p: &str| format!("mixer.{p}");
        match params.pattern[layer] {
            'M' => parts.extend(
                [
                    "in_proj.weight",
                    "conv1d.weight",
                    "dt_bias",
                    "A_log",
                    "D",
                    "norm.weight",
                    "out_proj.weight",
                ]
                .map(m),
            ),
            '*' => parts.extend(
                [
                    "q_proj.weight",
                    "k_proj.weight",
                    "v_proj.weight",
                    "o_proj.weight",
                ]
                .map(m),
            ),
            '-' => parts.extend(["up_proj.weight", "down_proj.weight"].map(m)),
            _ => {
                parts.extend(["gate.weight", "gate.e_score_correction_bias"].map(m));
                if let Some(moe) = &config.moe {
                    for e in 0..moe.num_experts {
                        parts.push(m(&format!("experts.{e}.up_proj.weight")));
                        parts.push(m(&format!("experts.{e}.down_proj.weight")));
                    }
                }
                if params.shared_width > 0 {
                    parts.extend(
                        [
                            "shared_experts.up_proj.weight",
                            "shared_experts.down_proj.weight",
                        ]
                        .map(m),
                    );
                }
                if params.latent.is_some() {
                    parts.extend(["fc1_latent_proj.weight", "fc2_latent_proj.weight"].map(m));
                }
            }
        }
        if params.mlp_bias {
            // The MLPs' and latent projections' biases (`mlp_bias`); the experts have none.
            let biased: Vec<String> = parts
                .iter()
                .filter(|p| {
                    !p.contains(".experts.")
                        && ["up_proj.weight", "down_proj.weight", "latent_proj.weight"]
                            .iter()
                            .any(|s| p.ends_with(s))
                })
                .map(|p| p.replace(".weight", ".bias"))
                .collect();
            parts.extend(biased);
        }
        parts.iter().map(|p| layer_tensor(layer, p)).collect()
    }

    fn tensor_divisors(&self, config: &ModelConfig) -> Vec<crate::tensor_divisors::TensorDivisor> {
        super::recurrent_split::linear_divisors(
            config,
            super::recurrent_split::RecurrentKind::Mamba2,
        )
    }
}

/// A `*` layer: attention without positions under `mixer`.
fn attention(
    config: &ModelConfig,
    source: &mut dyn TensorSource,
    layer: usize,
    format: WeightFormat,
) -> Result<Attention> {
    let mut renamed = MixerNames(source);
    Ok(Attention::load(config, &mut renamed, layer, format, None)?.with_rope(Rope::none()))
}

/// The attention's projections are `mixer.q_proj` in these files, `self_attn.q_proj` where
/// the shared attention reads them.
struct MixerNames<'a>(&'a mut dyn TensorSource);

impl MixerNames<'_> {
    fn name(n: &str) -> String {
        n.replace(".self_attn.", ".mixer.")
    }
}

impl TensorSource for MixerNames<'_> {
    fn contains(&self, name: &str) -> bool {
        self.0.contains(&Self::name(name))
    }
    fn dense(&mut self, name: &str, dtype: Dtype) -> Result<Array> {
        self.0.dense(&Self::name(name), dtype)
    }
    fn matrix(&mut self, prefix: &str, format: WeightFormat) -> Result<crate::linear::Matrix> {
        self.0.matrix(&Self::name(prefix), format)
    }
    fn stacked(&mut self, prefix: &str, format: WeightFormat) -> Result<Option<Stacked>> {
        self.0.stacked(&Self::name(prefix), format)
    }
}

/// `relu(up(x))²` under `prefix` (`up_proj`, `down_proj`), `width` wide.
fn relu2_mlp(
    config: &ModelConfig,
    source: &mut dyn TensorSource,
    prefix: &str,
    width: usize,
    format: WeightFormat,
) -> Result<Mlp> {
    let up = source.linear(&format!("{prefix}.up_proj"), format)?;
    let down = source.linear(&format!("{prefix}.down_proj"), format)?;
    super::parts::check_shape(&up.weight, &format!("{prefix}.up_proj"), width)?;
    super::parts::check_shape(
        &down.weight,
        &format!("{prefix}.down_proj"),
        config.hidden_size,
    )?;
    Ok(Mlp {
        gate_proj: up.clone(),
        up_proj: up,
        down_proj: down,
        activation: GateActivation::Relu2,
        reduce: None,
    })
}

/// An `E` layer: the router, the experts (stacked as `switch_mlp.fc1`/`fc2` by mlx-lm, one
/// matrix each as `experts.<e>.up_proj`/`down_proj` in Hugging Face's files) and the shared
/// expert.
fn load_moe(
    config: &ModelConfig,
    moe: &MoeConfig,
    params: &NemotronParams,
    source: &mut dyn TensorSource,
    mixer: &str,
    format: WeightFormat,
) -> Result<MoeBlock> {
    let router = source.linear(&format!("{mixer}.gate"), format)?;
    let correction = source.dense(
        &format!("{mixer}.gate.e_score_correction_bias"),
        Dtype::Float32,
    )?;
    let dtype = format.compute_dtype();
    let mut read = |stacked: &str, per_expert: &str| -> Result<Stacked> {
        if let Some(s) = source.stacked(&format!("{mixer}.switch_mlp.{stacked}"), format)? {
            return Ok(s);
        }
        let mut parts = Vec::with_capacity(moe.num_experts);
        for e in 0..moe.num_experts {
            let name = format!("{mixer}.experts.{e}.{per_expert}");
            parts.push(match source.matrix(&name, format)? {
                crate::linear::Matrix::Dense(w) => w,
                crate::linear::Matrix::Quantized(q) => q.dequantize(dtype)?,
            });
        }
        Ok(Stacked::Dense(ops::stack(&parts, 0)?))
    };
    let up = read("fc1", "up_proj")?;
    let down = read("fc2", "down_proj")?;
    // Experts on a latent projection read and write `moe_latent_size` wide vectors.
    let io = params.latent.unwrap_or(config.hidden_size);
    let experts = Experts::new_in(
        moe,
        io,
        &format!("{mixer}.switch_mlp"),
        [up.clone(), up, down],
        None,
        ExpertActivation::Relu2,
    )?;
    let latent = match params.latent {
        Some(width) => {
            let down = source.linear(&format!("{mixer}.fc1_latent_proj"), format)?;
            let up = source.linear(&format!("{mixer}.fc2_latent_proj"), format)?;
            super::parts::check_shape(&down.weight, &format!("{mixer}.fc1_latent_proj"), width)?;
            let hidden = config.hidden_size;
            super::parts::check_shape(&up.weight, &format!("{mixer}.fc2_latent_proj"), hidden)?;
            Some(LatentProjection {
                down,
                up,
                norm: None,
            })
        }
        None => None,
    };
    let shared = if params.shared_width > 0 {
        let at = format!("{mixer}.shared_experts");
        Some(relu2_mlp(config, source, &at, params.shared_width, format)?)
    } else {
        None
    };
    let block = MoeBlock::from_parts(
        moe,
        router,
        Some(correction),
        experts,
        shared,
        &format!("{mixer}.gate.weight"),
    )?;
    Ok(match latent {
        Some(l) => block.with_latent(l),
        None => block,
    })
}

impl GgufNames for NemotronH {
    fn gguf_part(&self, _hf_part: &str) -> Option<&'static str> {
        None
    }
}
