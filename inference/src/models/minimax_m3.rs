//! MiniMax M3's language model (`minimax_m3_vl`, the text part), as mlx-lm's
//! `minimax_m3_vl.py` runs it. The release is a vision-language checkpoint: the numbers are
//! in `text_config`, the weights under `language_model.*` ([`crate::weights::text_model_name`]),
//! and the vision tower is not read.
//!
//! - attention: grouped-query heads with per-head Q/K norms, RoPE on the first
//!   `partial_rotary_factor` of each head; on the layers `sparse_attention_config` names, a
//!   query reads only the key blocks an indexer picks ([`super::block_index`]);
//! - feed-forward: a dense MLP (`dense_intermediate_size`) on the layers `moe_layer_freq` (or
//!   `mlp_layer_types`) marks dense, elsewhere sigmoid-routed experts chosen with a score
//!   correction, their weights divided by their sum and scaled by `routed_scaling_factor`,
//!   plus a shared expert; every one of them gpt-oss's clamped SwiGLU;
//! - RMS norms scale by `1 + w` (`use_gemma_norm`).
//!
//! Checkpoints store expert e as `experts.<e>.w1` (gate), `w3` (up) and `w2` (down); mlx-lm's
//! files stack them as `switch_mlp.*`. The other layouts mlx-lm's sanitize accepts (the
//! shared expert folded in as one more expert, fused `gate_up_proj`, FP8 weights) are refused
//! by the missing tensor's name. Tensor parallel: heads, index heads (each serves its query
//! heads), the experts' and MLPs' widths are cut; the index key is replicated.

use super::base::{
    gguf_part_in, layer_tensor, norm_weight, Attention, DecoderLayer, Family, FeedForward,
    GateActivation, HeadNorms, Mlp, LAYER_TENSORS,
};
use super::block_index::{BlockIndexShape, BlockIndexer};
use super::config_keys::family_keys;
use super::moe::{ExpertActivation, ExpertNames, Experts, MoeBlock};
use crate::config::{FamilyParams, ModelConfig, MoeConfig, RouterKind};
use crate::error::{InferenceError, Result};
use crate::weights::FormatOnMlx;
use crate::weights::{GgufNames, TensorSource, WeightFormat};
use mlx_rs::{Array, Dtype};
use serde_json::Value;

/// Expert e's gate, up and down projections in MiniMax's checkpoints.
const EXPERT_NAMES: ExpertNames = ["w1", "w3", "w2"];

/// Where a layer's experts and router live.
const MOE: &str = "block_sparse_moe";

/// The family's name in errors.
const FAMILY: &str = "minimax_m3_vl";

/// The MiniMax M3 family.
pub struct MiniMaxM3;

/// `sparse_attention_config`, as the release nests it.
#[derive(serde::Deserialize, Default)]
struct SparseKeys {
    sparse_num_index_heads: Option<usize>,
    sparse_index_dim: Option<usize>,
    sparse_block_size: Option<usize>,
    sparse_topk_blocks: Option<usize>,
    sparse_local_block: Option<usize>,
    sparse_attention_freq: Option<Vec<u8>>,
}

/// The keys of `text_config` only this family reads (a re-save by transformers 5 spells the
/// sparse ones flat, as `index_*`).
#[derive(serde::Deserialize)]
struct M3Keys {
    intermediate_size: usize,
    dense_intermediate_size: usize,
    #[serde(default)]
    shared_intermediate_size: usize,
    num_local_experts: usize,
    num_experts_per_tok: usize,
    #[serde(default = "default_scaling")]
    routed_scaling_factor: f64,
    #[serde(default = "yes")]
    use_qk_norm: bool,
    #[serde(default = "yes")]
    use_gemma_norm: bool,
    #[serde(default = "default_alpha")]
    swiglu_alpha: f64,
    #[serde(default = "default_limit")]
    swiglu_limit: f64,
    mlp_layer_types: Option<Vec<String>>,
    moe_layer_freq: Option<Vec<u8>>,
    layer_types: Option<Vec<String>>,
    sparse_attention_config: Option<SparseKeys>,
    sparse_attention_freq: Option<Vec<u8>>,
    index_n_heads: Option<usize>,
    index_head_dim: Option<usize>,
    index_block_size: Option<usize>,
    index_topk_blocks: Option<usize>,
    index_local_blocks: Option<usize>,
    rope_parameters: Option<Value>,
    rope_theta: Option<f64>,
    rotary_dim: Option<usize>,
    partial_rotary_factor: Option<f64>,
}

fn default_scaling() -> f64 {
    2.0
}
fn yes() -> bool {
    true
}
fn default_alpha() -> f64 {
    1.702
}
fn default_limit() -> f64 {
    7.0
}

/// What a block needs beyond the shared numbers.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct M3Params {
    /// Norms scale by `1 + w`.
    gemma_norm: bool,
    /// The clamped SwiGLU's `alpha` and `limit`.
    alpha: f32,
    limit: f32,
}

impl M3Params {
    fn activation(&self) -> (GateActivation, ExpertActivation) {
        let (alpha, limit) = (self.alpha, self.limit);
        (
            GateActivation::ClampedSwiGlu { alpha, limit },
            ExpertActivation::ClampedSwiGlu { alpha, limit },
        )
    }
}

/// Per layer, from a list of strings (`kind_of` tells a match) or of 0/1 flags.
fn per_layer(
    n: usize,
    names: &Option<Vec<String>>,
    flags: &Option<Vec<u8>>,
    is: impl Fn(&str) -> bool,
    what: &str,
) -> Result<Option<Vec<bool>>> {
    let bad = |len: usize| {
        Err(InferenceError::BadConfig(format!(
            "a {FAMILY} config.json has {len} entries of {what} for {n} layers"
        )))
    };
    match (names, flags) {
        (Some(list), _) if list.len() != n => bad(list.len()),
        (Some(list), _) => Ok(Some(list.iter().map(|s| is(s)).collect())),
        (None, Some(list)) if list.len() != n => bad(list.len()),
        (None, Some(list)) => Ok(Some(list.iter().map(|&f| f != 0).collect())),
        (None, None) => Ok(None),
    }
}

impl M3Keys {
    /// The indexer's shape and its layers, when the configuration has one.
    fn block_index(&self, n: usize) -> Result<Option<BlockIndexShape>> {
        let nested = self.sparse_attention_config.as_ref();
        let pick = |inner: Option<usize>, flat: Option<usize>| inner.or(flat);
        let Some(block) = pick(
            nested.and_then(|s| s.sparse_block_size),
            self.index_block_size,
        ) else {
            return Ok(None);
        };
        let freq = nested
            .and_then(|s| s.sparse_attention_freq.clone())
            .or_else(|| self.sparse_attention_freq.clone());
        let layers = per_layer(
            n,
            &self.layer_types,
            &freq,
            |t| t != "full_attention",
            "sparse-attention layers",
        )?
        .unwrap_or_else(|| vec![true; n]);
        let missing = |key: &str| {
            InferenceError::BadConfig(format!(
                "a {FAMILY} config.json with sparse attention has no `{key}`"
            ))
        };
        Ok(Some(BlockIndexShape {
            heads: pick(
                nested.and_then(|s| s.sparse_num_index_heads),
                self.index_n_heads,
            )
            .ok_or_else(|| missing("sparse_num_index_heads"))?,
            head_dim: pick(nested.and_then(|s| s.sparse_index_dim), self.index_head_dim)
                .ok_or_else(|| missing("sparse_index_dim"))?,
            block,
            topk: pick(
                nested.and_then(|s| s.sparse_topk_blocks),
                self.index_topk_blocks,
            )
            .ok_or_else(|| missing("sparse_topk_blocks"))?,
            local: pick(
                nested.and_then(|s| s.sparse_local_block),
                self.index_local_blocks,
            )
            .unwrap_or(1),
            layers,
        }))
    }
}

impl Family for MiniMaxM3 {
    fn hf_names(&self) -> (&'static str, &'static str) {
        ("minimax_m3_vl", "MiniMaxM3ForCausalLM")
    }

    fn configure(&self, json: &Value, config: &mut ModelConfig) -> Result<()> {
        let keys: M3Keys = family_keys(json, FAMILY)?;
        let n = config.num_layers;
        let rope = keys.rope_parameters.as_ref();
        let rope_key = |key: &str| rope.and_then(|r| r.get(key));
        match rope_key("rope_type")
            .or_else(|| rope_key("type"))
            .and_then(Value::as_str)
        {
            None | Some("default") => {}
            Some(other) => {
                return Err(InferenceError::BadConfig(format!(
                    "a {FAMILY} config.json's rope_parameters of type `{other:.40}` is not \
                     supported (the default RoPE is)"
                )))
            }
        }
        config.rope_theta = rope_key("rope_theta")
            .and_then(Value::as_f64)
            .or(keys.rope_theta)
            .unwrap_or(5_000_000.0) as f32;
        let fraction = rope_key("partial_rotary_factor")
            .and_then(Value::as_f64)
            .or(keys.partial_rotary_factor)
            .unwrap_or(0.5);
        let rotary = keys
            .rotary_dim
            .unwrap_or((config.head_dim as f64 * fraction) as usize);
        if rotary == 0 || rotary > config.head_dim || !rotary.is_multiple_of(2) {
            return Err(InferenceError::BadConfig(format!(
                "a {FAMILY} config.json rotates {rotary} of each head's {} numbers",
                config.head_dim
            )));
        }
        config.attention.rotary_dim = (rotary != config.head_dim).then_some(rotary);
        config.attention.qk_norm = keys.use_qk_norm;
        let moe_layers = per_layer(
            n,
            &keys.mlp_layer_types,
            &keys.moe_layer_freq,
            |t| t == "sparse",
            "MLP layer kinds",
        )?
        .unwrap_or_else(|| vec![true; n]);
        if keys.num_experts_per_tok == 0 || keys.num_experts_per_tok > keys.num_local_experts {
            return Err(InferenceError::BadConfig(format!(
                "a {FAMILY} config.json's experts: {} of {} per token",
                keys.num_experts_per_tok, keys.num_local_experts
            )));
        }
        // Dense layers' MLPs are `dense_intermediate_size` wide; `intermediate_size` is an
        // expert's width.
        config.intermediate_size = keys.dense_intermediate_size;
        config.moe = Some(MoeConfig {
            num_experts: keys.num_local_experts,
            experts_per_token: keys.num_experts_per_tok,
            expert_width: keys.intermediate_size,
            router: RouterKind::SigmoidGroupedTopK {
                groups: 1,
                top_groups: 1,
                normalize: true,
                scale: keys.routed_scaling_factor as f32,
            },
            dense_layers: (0..n).filter(|&l| !moe_layers[l]).collect(),
            sparse_step: 1,
            first_dense: 0,
            shared_width: keys.shared_intermediate_size,
            latent_width: 0,
        });
        if let Some(shape) = keys.block_index(n)? {
            shape.check(config.num_heads, config.head_dim, FAMILY)?;
            config.attention.block_index = Some(shape);
        }
        config.family_params = FamilyParams::of(&M3Params {
            gemma_norm: keys.use_gemma_norm,
            alpha: keys.swiglu_alpha as f32,
            limit: keys.swiglu_limit as f32,
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
        let params: M3Params = config.family_params.get(FAMILY)?;
        let moe = config.moe.as_ref().ok_or_else(|| {
            InferenceError::BadConfig(format!("a {FAMILY} configuration without its experts"))
        })?;
        let dtype = format.compute_dtype();
        let gemma = params.gemma_norm;
        let norm = |source: &mut dyn TensorSource, part: &str| {
            norm_weight(source, &layer_tensor(layer, part), dtype, gemma)
        };
        let head_norms = if config.attention.qk_norm {
            Some(HeadNorms::each_head(
                norm(source, "self_attn.q_norm.weight")?,
                norm(source, "self_attn.k_norm.weight")?,
            ))
        } else {
            None
        };
        let mut attention = Attention::load(config, source, layer, format, head_norms)?;
        if let Some(shape) = config
            .attention
            .block_index
            .as_ref()
            .filter(|s| s.is_sparse(layer))
        {
            let rotary = config.attention.rotary_dim.unwrap_or(config.head_dim);
            let indexer = BlockIndexer::load(
                shape,
                source,
                &layer_tensor(layer, "self_attn"),
                format,
                (rotary, config.rope_theta, config.rms_norm_eps, gemma),
            )?;
            attention = attention.with_block_index(indexer);
        }
        let (mlp_activation, expert_activation) = params.activation();
        let ffn = if moe.is_moe_layer(layer) {
            let prefix = layer_tensor(layer, MOE);
            let router = source.linear(&format!("{prefix}.gate"), format)?;
            let correction =
                source.dense(&format!("{prefix}.e_score_correction_bias"), Dtype::Float32)?;
            let experts = Experts::load(config, moe, source, &prefix, EXPERT_NAMES, format)?
                .with_activation(expert_activation);
            let shared = if moe.shared_width > 0 {
                let at = format!("{prefix}.shared_experts");
                Some(
                    Mlp::load_at(config, source, &at, moe.shared_width, format)?
                        .with_activation(mlp_activation),
                )
            } else {
                None
            };
            FeedForward::Experts(MoeBlock::from_parts(
                moe,
                router,
                Some(correction),
                experts,
                shared,
                &format!("{prefix}.gate.weight"),
            )?)
        } else {
            FeedForward::Dense(
                Mlp::load(config, source, layer, format)?.with_activation(mlp_activation),
            )
        };
        Ok(DecoderLayer::new(
            config,
            norm(source, "input_layernorm.weight")?,
            attention,
            norm(source, "post_attention_layernorm.weight")?,
            ffn,
        ))
    }

    fn final_norm(
        &self,
        config: &ModelConfig,
        source: &mut dyn TensorSource,
        dtype: Dtype,
    ) -> Result<Array> {
        let params: M3Params = config.family_params.get(FAMILY)?;
        norm_weight(source, "model.norm.weight", dtype, params.gemma_norm)
    }

    fn layer_tensor_names(&self, config: &ModelConfig, layer: usize) -> Vec<String> {
        let mut parts: Vec<String> = [
            "self_attn.q_proj.weight",
            "self_attn.k_proj.weight",
            "self_attn.v_proj.weight",
            "self_attn.o_proj.weight",
            "input_layernorm.weight",
            "post_attention_layernorm.weight",
        ]
        .map(String::from)
        .to_vec();
        if config.attention.qk_norm {
            parts.extend(["self_attn.q_norm.weight", "self_attn.k_norm.weight"].map(String::from));
        }
        let sparse = config.attention.block_index.as_ref();
        if sparse.is_some_and(|s| s.is_sparse(layer)) {
            for p in ["q_proj", "k_proj", "q_norm", "k_norm"] {
                parts.push(format!("self_attn.index_{p}.weight"));
            }
        }
        match config.moe.as_ref().filter(|m| m.is_moe_layer(layer)) {
            Some(moe) => {
                parts.push(format!("{MOE}.gate.weight"));
                parts.push(format!("{MOE}.e_score_correction_bias"));
                for e in 0..moe.num_experts {
                    for proj in EXPERT_NAMES {
                        parts.push(format!("{MOE}.experts.{e}.{proj}.weight"));
                    }
                }
                if moe.shared_width > 0 {
                    for proj in ["gate_proj", "up_proj", "down_proj"] {
                        parts.push(format!("{MOE}.shared_experts.{proj}.weight"));
                    }
                }
            }
            None => {
                for proj in ["gate_proj", "up_proj", "down_proj"] {
                    parts.push(format!("mlp.{proj}.weight"));
                }
            }
        }
        parts.iter().map(|p| layer_tensor(layer, p)).collect()
    }

    fn tensor_divisors(&self, config: &ModelConfig) -> Vec<crate::tensor_divisors::TensorDivisor> {
        let mut out = crate::tensor_divisors::standard_divisors(config);
        if let Some(shape) = &config.attention.block_index {
            out.push(crate::tensor_divisors::TensorDivisor {
                what: "sparse-attention index heads".into(),
                count: crate::tensor_divisors::count_of(shape.heads),
            });
        }
        out
    }
}

impl GgufNames for MiniMaxM3 {
    fn gguf_part(&self, hf_part: &str) -> Option<&'static str> {
        gguf_part_in(LAYER_TENSORS, hf_part)
    }
}
