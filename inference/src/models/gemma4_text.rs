//! Gemma 4's text decoder (`gemma4_text`, as mlx-lm's `gemma4_text.py`), in the shape of the
//! large releases (26B-A4B, 31B), the ones a cluster is for:
//!
//! - sliding layers (`sliding_attention`, a window of `sliding_window`) and full layers, each
//!   kind with its own RoPE from `rope_parameters` (the full layers' "proportional" RoPE turns
//!   only `partial_rotary_factor` of the head), the full layers `global_head_dim` wide;
//! - with `attention_k_eq_v`, a full layer has no `v_proj`: its values are its keys before the
//!   key norm and RoPE, over `num_global_key_value_heads` heads;
//! - per-head RMS norms on queries and keys (with weights) and on values (without), queries
//!   unscaled (`scale = 1`);
//! - the sandwich block (norms before and after the attention and the feed-forward), a GELU-
//!   gated MLP, and with `enable_moe_block` the experts beside it
//!   ([`super::dense_and_experts`]); a learned `layer_scalar` on each block's output;
//! - embeddings times `sqrt(hidden)`, tied head, logits soft-capped at
//!   `final_logit_softcapping`.
//!
//! The small releases (E2B/E4B) have two more pieces:
//!
//! - per-layer inputs (`hidden_size_per_layer_input`): a second embedding table and a
//!   projection of the embedded token give each layer a small vector per token, which the
//!   layer gates with its output and adds ([`super::per_layer_inputs`]; the vectors travel
//!   after the hidden state, so a pipeline rank gets its layers');
//! - the last `num_kv_shared_layers` layers have no keys or values of their own: each reads
//!   those of the last earlier layer of its kind ([`super::shared_kv`]; a pipeline cut must
//!   keep them with that layer), and with `use_double_wide_mlp` their MLP is twice as wide.

use super::base::{
    layer_tensor, Attention, DecoderLayer, Family, FeedForward, GateActivation, HeadNorms,
    LayerParameters, Mlp, OutputNorms, SelfAttention,
};
use super::config_keys::family_keys;
use super::dense_and_experts::DenseAndExperts;
use super::moe::{ExpertActivation, Experts, MoeBlock};
use super::per_layer_inputs::{PerLayerEmbedding, PerLayerGate};
use super::shared_kv::{self, SharedKvAttention};
use super::sparse_moe::fused_experts;
use crate::config::{FamilyParams, ModelConfig, MoeConfig, RouterKind, SlidingWindow};
use crate::error::{InferenceError, Result};
use crate::rope::RopeSpec;
use crate::tensor_divisors::TensorDivisor;
use crate::weights::FormatOnMlx;
use crate::weights::{GgufNames, TensorSource, WeightFormat};
use mlx_rs::{ops, Array};
use serde_json::Value;

/// The `config.json` keys only this family has, with mlx-lm's defaults.
#[derive(serde::Deserialize)]
struct Gemma4Keys {
    #[serde(default = "defaults::global_head_dim")]
    global_head_dim: usize,
    num_global_key_value_heads: Option<usize>,
    #[serde(default = "defaults::kv_shared")]
    num_kv_shared_layers: usize,
    #[serde(default = "defaults::per_layer_input")]
    hidden_size_per_layer_input: usize,
    #[serde(default = "defaults::per_layer_vocab")]
    vocab_size_per_layer_input: usize,
    #[serde(default = "defaults::double_wide")]
    use_double_wide_mlp: bool,
    #[serde(default)]
    rope_traditional: bool,
    rope_parameters: Option<Value>,
    #[serde(default = "defaults::window")]
    sliding_window: usize,
    #[serde(default = "defaults::pattern")]
    sliding_window_pattern: usize,
    layer_types: Option<Vec<String>>,
    #[serde(default)]
    attention_k_eq_v: bool,
    #[serde(default = "defaults::softcap")]
    final_logit_softcapping: Option<f64>,
    #[serde(default)]
    enable_moe_block: bool,
    num_experts: Option<usize>,
    top_k_experts: Option<usize>,
    moe_intermediate_size: Option<usize>,
    #[serde(default = "defaults::tied")]
    tie_word_embeddings: bool,
}

/// mlx-lm's `ModelArgs` defaults for the keys a config.json may leave out.
mod defaults {
    pub fn global_head_dim() -> usize {
        512
    }
    pub fn kv_shared() -> usize {
        20
    }
    pub fn per_layer_input() -> usize {
        256
    }
    pub fn per_layer_vocab() -> usize {
        262_144
    }
    pub fn double_wide() -> bool {
        true
    }
    pub fn window() -> usize {
        512
    }
    pub fn pattern() -> usize {
        5
    }
    pub fn softcap() -> Option<f64> {
        Some(30.0)
    }
    pub fn tied() -> bool {
        true
    }
}

/// What the blocks need beyond the shared numbers.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Gemma4Params {
    /// Per layer, whether it is a full-attention layer.
    full: Vec<bool>,
    global_head_dim: usize,
    /// Key/value heads of a full layer.
    global_kv_heads: usize,
    keys_are_values: bool,
    softcap: Option<f32>,
    sliding_rope: RopeSpec,
    full_rope: RopeSpec,
    /// Per layer and token, the width of its per-layer input (0: none).
    #[serde(default)]
    per_layer_width: usize,
    /// Rows of the per-layer inputs' table.
    #[serde(default)]
    per_layer_vocab: usize,
    /// Per layer, the earlier layer whose keys and values it reads (KV-shared layers).
    #[serde(default)]
    kv_sources: Vec<Option<usize>>,
    /// Whether the KV-shared layers' MLPs are twice `intermediate_size` wide.
    #[serde(default)]
    double_wide: bool,
}

/// The Gemma 4 text family.
pub struct Gemma4Text;

impl Gemma4Text {
    /// The configuration of layer `layer` (a full layer's wider heads, a KV-shared layer's
    /// double-wide MLP).
    fn layer_config(config: &ModelConfig, params: &Gemma4Params, layer: usize) -> ModelConfig {
        let mut c = config.clone();
        if params.full[layer] {
            c.head_dim = params.global_head_dim;
            c.num_kv_heads = params.global_kv_heads;
        }
        if params.double_wide && params.kv_sources.get(layer).is_some_and(Option::is_some) {
            c.intermediate_size *= 2;
        }
        c
    }
}

impl Family for Gemma4Text {
    fn hf_names(&self) -> (&'static str, &'static str) {
        ("gemma4_text", "Gemma4ForCausalLM")
    }

    fn configure(&self, json: &Value, config: &mut ModelConfig) -> Result<()> {
        let keys: Gemma4Keys = family_keys(json, "gemma4_text")?;
        let refuse = |what: &str| {
            Err(InferenceError::BadConfig(format!(
                "this Gemma 4 model has {what}, which shoal does not run yet (no Gemma 4 \
                 release has it)"
            )))
        };
        if keys.rope_traditional {
            return refuse("interleaved RoPE (rope_traditional)");
        }
        let n = config.num_layers;
        let layer_types = match keys.layer_types {
            Some(types) => types,
            None => {
                let p = keys.sliding_window_pattern.max(1);
                (0..n)
                    .map(|l| {
                        if (l + 1) % p == 0 {
                            "full_attention".to_owned()
                        } else {
                            "sliding_attention".to_owned()
                        }
                    })
                    .collect()
            }
        };
        if layer_types.len() != n {
            return Err(InferenceError::BadConfig(format!(
                "a gemma4_text config.json has {} layer_types for {n} layers",
                layer_types.len()
            )));
        }
        if keys.sliding_window == 0 {
            return Err(InferenceError::BadConfig(
                "a gemma4_text config.json's sliding_window is 0".into(),
            ));
        }
        let sliding: Vec<bool> = layer_types
            .iter()
            .map(|t| t == "sliding_attention")
            .collect();
        let kv_sources = shared_kv::kv_sources(&sliding, keys.num_kv_shared_layers)?;
        let per_layer_width = keys.hidden_size_per_layer_input;
        if per_layer_width > 0
            && (per_layer_width > 1 << 14 || keys.vocab_size_per_layer_input == 0)
        {
            return Err(InferenceError::BadConfig(format!(
                "a gemma4_text config.json's per-layer inputs of {per_layer_width} over a \
                 table of {} rows",
                keys.vocab_size_per_layer_input
            )));
        }
        let parameters = keys.rope_parameters.unwrap_or_else(|| {
            serde_json::json!({
                "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0,
                                   "rope_type": "proportional"},
                "sliding_attention": {"rope_theta": 10_000.0, "rope_type": "default"},
            })
        });
        let global_head_dim = match keys.global_head_dim {
            0 => config.head_dim,
            d => d,
        };
        if global_head_dim > 1024 || !global_head_dim.is_multiple_of(2) {
            return Err(InferenceError::BadConfig(format!(
                "a gemma4_text config.json's global_head_dim {global_head_dim} must be even and \
                 at most 1024"
            )));
        }
        let global_kv_heads = match (keys.attention_k_eq_v, keys.num_global_key_value_heads) {
            (true, Some(h)) => h,
            _ => config.num_kv_heads,
        };
        if global_kv_heads == 0 || !config.num_heads.is_multiple_of(global_kv_heads) {
            return Err(InferenceError::BadConfig(format!(
                "a gemma4_text config.json with {} attention heads over {global_kv_heads} global \
                 key/value heads",
                config.num_heads
            )));
        }
        config.sliding_window = Some(SlidingWindow {
            size: keys.sliding_window,
            layers: sliding.clone(),
        });
        config.tie_word_embeddings = keys.tie_word_embeddings;
        if keys.enable_moe_block {
            let (Some(experts), Some(top_k), Some(width)) = (
                keys.num_experts,
                keys.top_k_experts,
                keys.moe_intermediate_size,
            ) else {
                return Err(InferenceError::BadConfig(
                    "a gemma4_text config.json with enable_moe_block needs num_experts, \
                     top_k_experts and moe_intermediate_size"
                        .into(),
                ));
            };
            if top_k == 0 || top_k > experts {
                return Err(InferenceError::BadConfig(format!(
                    "a gemma4_text config.json's experts: {top_k} of {experts} per token"
                )));
            }
            config.moe = Some(MoeConfig {
                num_experts: experts,
                experts_per_token: top_k,
                expert_width: width,
                router: RouterKind::TopKSoftmax,
                dense_layers: Vec::new(),
                sparse_step: 1,
                first_dense: 0,
                // The dense MLP beside the experts, counted as a shared expert is.
                shared_width: config.intermediate_size,
                latent_width: 0,
            });
        }
        config.family_params = FamilyParams::of(&Gemma4Params {
            full: sliding.iter().map(|s| !s).collect(),
            global_head_dim,
            global_kv_heads,
            keys_are_values: keys.attention_k_eq_v,
            softcap: keys
                .final_logit_softcapping
                .filter(|c| *c > 0.0)
                .map(|c| c as f32),
            sliding_rope: RopeSpec::read(&parameters, "sliding_attention")?,
            full_rope: RopeSpec::read(&parameters, "full_attention")?,
            per_layer_width,
            per_layer_vocab: keys.vocab_size_per_layer_input,
            kv_sources,
            double_wide: keys.use_double_wide_mlp,
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
        let params: Gemma4Params = config.family_params.get("gemma4_text")?;
        let full = params.full[layer];
        let lc = Gemma4Text::layer_config(config, &params, layer);
        let dtype = format.compute_dtype();
        let name = |part: &str| layer_tensor(layer, &format!("{part}.weight"));
        let rope = if full {
            params.full_rope.rope(lc.head_dim)
        } else {
            params.sliding_rope.rope(lc.head_dim)
        };
        let attention = match params.kv_sources.get(layer).copied().flatten() {
            Some(kv_source) => SelfAttention::SharedKv(Box::new(SharedKvAttention::load(
                &lc,
                source,
                (layer, kv_source),
                format,
                (rope, 1.0),
            )?)),
            None => {
                let mut norm = |part: &str| source.dense(&name(part), dtype);
                let head_norms =
                    HeadNorms::each_head(norm("self_attn.q_norm")?, norm("self_attn.k_norm")?);
                let attention = if full && params.keys_are_values {
                    Attention::load_keys_as_values(&lc, source, layer, format, Some(head_norms))?
                } else {
                    Attention::load(&lc, source, layer, format, Some(head_norms))?
                };
                let attention = attention.with_scale(1.0).with_rope(rope).with_value_norm();
                if params.kv_sources.contains(&Some(layer)) {
                    SelfAttention::Heads(attention.lending_kv())
                } else {
                    SelfAttention::Heads(attention)
                }
            }
        };
        let mlp =
            Mlp::load(&lc, source, layer, format)?.with_activation(GateActivation::GeluApprox);
        let (pre_ffn, ffn) = match &config.moe {
            None => (
                source.dense(&name("pre_feedforward_layernorm"), dtype)?,
                FeedForward::Dense(mlp),
            ),
            Some(moe) => {
                let mut norm = |part: &str| source.dense(&name(part), dtype);
                let (mlp_in, mlp_out, experts_in, experts_out) = (
                    norm("pre_feedforward_layernorm")?,
                    norm("post_feedforward_layernorm_1")?,
                    norm("pre_feedforward_layernorm_2")?,
                    norm("post_feedforward_layernorm_2")?,
                );
                let router_in = ops::multiply(
                    &source.dense(&layer_tensor(layer, "router.scale"), dtype)?,
                    Array::from_f32((config.hidden_size as f32).powf(-0.5)),
                )?;
                let both = DenseAndExperts {
                    mlp,
                    mlp_in,
                    mlp_out,
                    experts_in,
                    experts_out,
                    router_in,
                    experts: load_experts(config, moe, source, layer, format)?,
                    eps: config.rms_norm_eps,
                };
                // The three norms of the feed-forward share `rms(h)`; each weight is applied
                // inside it.
                let ones = Array::ones::<f32>(&[config.hidden_size as i32])?.as_dtype(dtype)?;
                (ones, FeedForward::DenseAndExperts(Box::new(both)))
            }
        };
        let mut norm = |part: &str| source.dense(&name(part), dtype);
        let output_norms = OutputNorms {
            attention: norm("post_attention_layernorm")?,
            ffn: norm("post_feedforward_layernorm")?,
        };
        let input_norm = norm("input_layernorm")?;
        let scalar = source.dense(&layer_tensor(layer, "layer_scalar"), dtype)?;
        let block = DecoderLayer::new(config, input_norm, attention, pre_ffn, ffn)
            .with_output_norms(output_norms)
            .with_output_scale(scalar);
        Ok(match params.per_layer_width {
            0 => block,
            width => block.with_per_layer_gate(PerLayerGate::load(
                source,
                format,
                layer,
                width,
                config.hidden_size,
            )?),
        })
    }

    fn per_layer_embedding(
        &self,
        config: &ModelConfig,
        source: &mut dyn TensorSource,
        format: WeightFormat,
    ) -> Result<Option<PerLayerEmbedding>> {
        let params: Gemma4Params = config.family_params.get("gemma4_text")?;
        if params.per_layer_width == 0 {
            return Ok(None);
        }
        let shape = (
            config.num_layers,
            params.per_layer_width,
            config.hidden_size,
            params.per_layer_vocab,
        );
        let eps = config.rms_norm_eps;
        Ok(Some(PerLayerEmbedding::load(source, format, shape, eps)?))
    }

    fn carried_columns(&self, config: &ModelConfig) -> usize {
        config
            .family_params
            .get::<Gemma4Params>("gemma4_text")
            .map_or(0, |p| p.per_layer_width * config.num_layers)
    }

    fn model_tensor_names(&self, config: &ModelConfig) -> Vec<String> {
        match self.carried_columns(config) {
            0 => Vec::new(),
            _ => PerLayerEmbedding::tensor_names(),
        }
    }

    fn layer_parameters(&self, config: &ModelConfig, layer: usize) -> Option<LayerParameters> {
        let params: Gemma4Params = config.family_params.get("gemma4_text").ok()?;
        let c = Self::layer_config(config, &params, layer);
        let (h, hd) = (c.hidden_size, c.head_dim);
        let shared = params.kv_sources.get(layer).is_some_and(Option::is_some);
        // Queries, output, query norm; keys (values unless they are the keys) and key norm.
        let same = params.keys_are_values && params.full.get(layer) == Some(&true);
        let kv = usize::from(!shared) * (h * hd * c.num_kv_heads * (2 - usize::from(same)) + hd);
        let attention = 2 * h * hd * c.num_heads + hd + kv;
        // MLP (its width as layer_config says), four norms, the scalar, the per-layer gate.
        let mut dense = attention + 3 * h * c.intermediate_size + 4 * h + 1;
        if params.per_layer_width > 0 {
            dense += 2 * h * params.per_layer_width + h;
        }
        Some(match &config.moe {
            None => LayerParameters::dense(dense),
            Some(moe) => {
                // The router (projection, input scale, per-expert scale), three more norms.
                let rest = dense + h * moe.num_experts + h + moe.num_experts + 3 * h;
                let experts = |n: usize| 3 * h * moe.expert_width * n;
                LayerParameters {
                    all: rest + experts(moe.num_experts),
                    active: rest + experts(moe.experts_per_token),
                }
            }
        })
    }

    fn model_parameters_beyond_layers(&self, config: &ModelConfig) -> usize {
        let Ok(params) = config.family_params.get::<Gemma4Params>("gemma4_text") else {
            return 0;
        };
        // The per-layer inputs' table, the projection to them and its norm.
        let columns = config.num_layers * params.per_layer_width;
        (params.per_layer_vocab + config.hidden_size) * columns + params.per_layer_width
    }

    fn kv_source(&self, config: &ModelConfig, layer: usize) -> Option<usize> {
        let params: Gemma4Params = config.family_params.get("gemma4_text").ok()?;
        params.kv_sources.get(layer).copied().flatten()
    }

    fn logit_softcap(&self, config: &ModelConfig) -> Option<f32> {
        config
            .family_params
            .get::<Gemma4Params>("gemma4_text")
            .ok()
            .and_then(|p| p.softcap)
    }

    fn embedding_scale(&self, config: &ModelConfig) -> Option<f32> {
        Some((config.hidden_size as f64).sqrt() as f32)
    }

    fn layer_tensor_names(&self, config: &ModelConfig, layer: usize) -> Vec<String> {
        let params: Option<Gemma4Params> = config.family_params.get("gemma4_text").ok();
        let keys_are_values = params
            .as_ref()
            .is_some_and(|p| p.keys_are_values && p.full[layer]);
        let shared = params
            .as_ref()
            .is_some_and(|p| p.kv_sources.get(layer).is_some_and(Option::is_some));
        let mut parts: Vec<&str> = vec![
            "self_attn.q_proj.weight",
            "self_attn.o_proj.weight",
            "self_attn.q_norm.weight",
            "mlp.gate_proj.weight",
            "mlp.up_proj.weight",
            "mlp.down_proj.weight",
            "input_layernorm.weight",
            "post_attention_layernorm.weight",
            "pre_feedforward_layernorm.weight",
            "post_feedforward_layernorm.weight",
            "layer_scalar",
        ];
        if !shared {
            parts.extend(["self_attn.k_proj.weight", "self_attn.k_norm.weight"]);
            if !keys_are_values {
                parts.push("self_attn.v_proj.weight");
            }
        }
        if config.moe.is_some() {
            parts.extend([
                "router.proj.weight",
                "router.scale",
                "router.per_expert_scale",
                "experts.gate_up_proj",
                "experts.down_proj",
                "pre_feedforward_layernorm_2.weight",
                "post_feedforward_layernorm_1.weight",
                "post_feedforward_layernorm_2.weight",
            ]);
        }
        let mut names: Vec<String> = parts.iter().map(|p| layer_tensor(layer, p)).collect();
        if params.is_some_and(|p| p.per_layer_width > 0) {
            names.extend(PerLayerGate::tensor_names(layer));
        }
        names
    }

    fn tensor_divisors(&self, config: &ModelConfig) -> Vec<TensorDivisor> {
        let mut out = crate::tensor_divisors::standard_divisors(config);
        if let Ok(p) = config.family_params.get::<Gemma4Params>("gemma4_text") {
            out.push(TensorDivisor {
                what: "full layers' key/value heads".into(),
                count: p.global_kv_heads as u32,
            });
        }
        out
    }
}

/// Layer `layer`'s router and experts: stacked as mlx-lm saves them (`experts.switch_glu.*`)
/// or fused as Hugging Face stores them (`experts.gate_up_proj`, `experts.down_proj`).
fn load_experts(
    config: &ModelConfig,
    moe: &MoeConfig,
    source: &mut dyn TensorSource,
    layer: usize,
    format: WeightFormat,
) -> Result<MoeBlock> {
    let at = |part: &str| layer_tensor(layer, part);
    let router = source.linear(&at("router.proj"), format)?;
    let scale = source.dense(&at("router.per_expert_scale"), format.compute_dtype())?;
    if scale.shape() != [moe.num_experts as i32] {
        return Err(InferenceError::BadTensor {
            name: at("router.per_expert_scale"),
            reason: format!("expected one scale per expert ({})", moe.num_experts),
        });
    }
    let stacked = at("experts.switch_glu");
    let experts = match source.stacked(&format!("{stacked}.gate_proj"), format)? {
        Some(gate) => {
            let mut read = |proj: &str| {
                source
                    .stacked(&format!("{stacked}.{proj}"), format)?
                    .ok_or_else(|| InferenceError::MissingTensor(format!("{stacked}.{proj}")))
            };
            let (up, down) = (read("up_proj")?, read("down_proj")?);
            Experts::new(
                config,
                moe,
                &stacked,
                [gate, up, down],
                None,
                ExpertActivation::GeGlu,
            )?
        }
        None => fused_experts(
            config,
            moe,
            source,
            &at("experts"),
            format,
            ExpertActivation::GeGlu,
        )?,
    };
    Ok(
        MoeBlock::from_parts(moe, router, None, experts, None, &at("router.proj.weight"))?
            .with_expert_scale(scale),
    )
}

impl GgufNames for Gemma4Text {
    fn gguf_part(&self, _hf_part: &str) -> Option<&'static str> {
        None
    }
}
