//! The DeepSeek-shaped decoder block, a library piece several families call (DeepSeek V3 /
//! Kimi K2, GLM-4.7-Flash): multi-head latent attention ([`super::mla`]) read under DeepSeek's
//! tensor names (its up-projection split from `kv_b_proj`, or stored split as mlx-lm writes
//! it), its RoPE and YaRN scale, and the block around it with a dense SwiGLU on the first
//! `first_k_dense_replace` layers and the sigmoid-routed experts ([`super::sigmoid_moe`]) on
//! the rest; with an indexer in the configuration (DeepSeek V3.2, GLM-5) the attention is
//! sparse ([`super::dsa_indexer`], read under `self_attn.indexer.*`). A family says only what
//! differs (its bottleneck norms' epsilon, its keys).

use super::base::{layer_tensor, DecoderLayer, FeedForward, Mlp, SelfAttention};
use super::config_keys::required;
use super::dsa_indexer::Indexer;
use super::mla::{LatentAttention, LatentRope, PerHead, QueryProjection};
use super::moe::PROJ_NAMES;
use super::sigmoid_moe::{load_sigmoid_moe, sigmoid_moe_tensor_names};
use crate::config::{LatentConfig, ModelConfig, RopeScaling};
use crate::error::{InferenceError, Result};
use crate::linear::Matrix;
use crate::rope::{yarn_mscale, yarn_periods};
use crate::weights::FormatOnMlx;
use crate::weights::{Stacked, TensorSource, WeightFormat};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;
use serde_json::Value;

/// Reads the latent attention's widths (`q_lora_rank`, `kv_lora_rank`, `qk_nope_head_dim`,
/// `qk_rope_head_dim`, `v_head_dim`) into `config`, with `norm_eps` for its bottleneck norms.
pub(crate) fn configure_latent(v: &Value, config: &mut ModelConfig, norm_eps: f32) -> Result<()> {
    let latent = LatentConfig {
        q_lora_rank: v
            .get("q_lora_rank")
            .and_then(Value::as_u64)
            .map(|r| r as usize),
        kv_lora_rank: required(v, "kv_lora_rank")?,
        qk_nope_head_dim: required(v, "qk_nope_head_dim")?,
        qk_rope_head_dim: required(v, "qk_rope_head_dim")?,
        v_head_dim: required(v, "v_head_dim")?,
        norm_eps,
        indexer: None,
        position_scale: None,
        no_rope: false,
    };
    if [
        latent.kv_lora_rank,
        latent.qk_nope_head_dim,
        latent.v_head_dim,
    ]
    .contains(&0)
        || latent.qk_rope_head_dim == 0
        || !latent.qk_rope_head_dim.is_multiple_of(2)
        || latent.q_lora_rank == Some(0)
    {
        return Err(InferenceError::BadConfig(format!(
            "latent attention of {latent:?} cannot be built: every width must be positive \
             and qk_rope_head_dim even"
        )));
    }
    // Every head reads the one latent: no key/value heads of their own. The output
    // projection takes heads · v_head_dim inputs, which placement's divisors count.
    config.num_kv_heads = config.num_heads;
    config.head_dim = latent.v_head_dim;
    config.attention.latent = Some(latent);
    Ok(())
}

/// Layer `layer`'s block: latent attention, then a dense MLP or the sigmoid-routed experts.
/// `family` names the configuration in errors.
pub(crate) fn latent_moe_block(
    family: &str,
    config: &ModelConfig,
    source: &mut dyn TensorSource,
    layer: usize,
    format: WeightFormat,
) -> Result<DecoderLayer> {
    let (Some(moe), Some(latent)) = (config.moe.as_ref(), config.attention.latent.as_ref()) else {
        return Err(InferenceError::BadConfig(format!(
            "a {family} configuration without its experts or latent attention"
        )));
    };
    let attention = load_latent_attention(config, latent, source, layer, format)?;
    let ffn = if moe.is_moe_layer(layer) {
        let prefix = layer_tensor(layer, "mlp");
        FeedForward::Experts(load_sigmoid_moe(config, moe, source, &prefix, format)?)
    } else {
        FeedForward::Dense(Mlp::load(config, source, layer, format)?)
    };
    DecoderLayer::assemble(
        config,
        source,
        layer,
        format,
        SelfAttention::Latent(attention),
        ffn,
    )
}

/// Hugging Face names of layer `layer`'s tensors in a block of [`latent_moe_block`].
pub(crate) fn latent_moe_tensor_names(config: &ModelConfig, layer: usize) -> Vec<String> {
    let latent = config.attention.latent.as_ref();
    let low_rank = latent.is_some_and(|l| l.q_lora_rank.is_some());
    let query: &[&str] = if low_rank {
        &["q_a_proj", "q_a_layernorm", "q_b_proj"]
    } else {
        &["q_proj"]
    };
    let mut names: Vec<String> = query
        .iter()
        .chain(&[
            "kv_a_proj_with_mqa",
            "kv_a_layernorm",
            "kv_b_proj",
            "o_proj",
        ])
        .map(|part| layer_tensor(layer, &format!("self_attn.{part}.weight")))
        .collect();
    if latent.is_some_and(|l| l.indexer.is_some()) {
        names.extend(Indexer::tensor_names(layer));
    }
    for norm in ["input_layernorm", "post_attention_layernorm"] {
        names.push(layer_tensor(layer, &format!("{norm}.weight")));
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

/// Layer `layer`'s latent attention under DeepSeek's tensor names.
pub(crate) fn load_latent_attention(
    config: &ModelConfig,
    latent: &LatentConfig,
    source: &mut dyn TensorSource,
    layer: usize,
    format: WeightFormat,
) -> Result<LatentAttention> {
    let dtype = format.compute_dtype();
    let p = |part: &str| layer_tensor(layer, &format!("self_attn.{part}"));
    let query = match latent.q_lora_rank {
        Some(_) => QueryProjection::LowRank {
            down: source.linear(&p("q_a_proj"), format)?,
            norm: source.dense(&format!("{}.weight", p("q_a_layernorm")), dtype)?,
            up: source.linear(&p("q_b_proj"), format)?,
        },
        None => QueryProjection::Direct(source.linear(&p("q_proj"), format)?),
    };
    let (embed_q, unembed_out) = latent_up(config, latent, source, layer, format)?;
    let (rope, scale) = rope_and_scale(config, latent)?;
    let indexer = latent
        .indexer
        .as_ref()
        .map(|shape| {
            let rope = (rope.dims, rope.periods.clone(), rope.mscale);
            Indexer::load(shape, source, layer, format, rope).map(Box::new)
        })
        .transpose()?;
    Ok(LatentAttention {
        query,
        kv_down: source.linear(&p("kv_a_proj_with_mqa"), format)?,
        kv_norm: source.dense(&format!("{}.weight", p("kv_a_layernorm")), dtype)?,
        embed_q,
        unembed_out,
        o_proj: source.linear(&p("o_proj"), format)?,
        num_heads: config.num_heads as i32,
        shape: latent.clone(),
        scale,
        rope: (!latent.no_rope).then_some(rope),
        reduce: None,
        indexer,
        position_scale: latent.position_scale,
        // Kimi K3's output gate, where the checkpoint has one.
        gate: match source.contains(&format!("{}.weight", p("g_proj"))) {
            true => Some(source.linear(&p("g_proj"), format)?),
            false => None,
        },
    })
}

/// The latent attention's RoPE and softmax scale from the configuration.
fn rope_and_scale(config: &ModelConfig, latent: &LatentConfig) -> Result<(LatentRope, f32)> {
    let dims = latent.qk_rope_head_dim;
    let theta = config.rope_theta;
    let mut scale = 1.0 / ((latent.qk_nope_head_dim + dims) as f32).sqrt();
    let (periods, mscale) = match &config.rope_scaling {
        RopeScaling::None => (
            (0..dims / 2)
                .map(|i| theta.powf((2 * i) as f32 / dims as f32))
                .collect(),
            1.0,
        ),
        RopeScaling::Yarn {
            factor,
            original_max_position,
            beta_fast,
            beta_slow,
            mscale,
            mscale_all_dim,
        } => {
            if *mscale_all_dim != 0.0 && *factor > 1.0 {
                let s = yarn_mscale(*factor, *mscale_all_dim);
                scale *= s * s;
            }
            (
                yarn_periods(
                    dims,
                    theta,
                    *factor,
                    *original_max_position,
                    (*beta_fast, *beta_slow),
                ),
                yarn_mscale(*factor, *mscale) / yarn_mscale(*factor, *mscale_all_dim),
            )
        }
        other => {
            return Err(InferenceError::BadConfig(format!(
                "latent attention with rope_scaling {other:?} is not supported (none and yarn are)"
            )))
        }
    };
    let rope = LatentRope {
        dims: dims as i32,
        periods: Array::from_slice(&periods, &[periods.len() as i32]),
        mscale,
    };
    Ok((rope, scale))
}

/// `W_uk` and `W_uv` of layer `layer`: stored split (`embed_q`, `unembed_out`, mlx-lm's
/// layout) or split here from `kv_b_proj` (Hugging Face's).
fn latent_up(
    config: &ModelConfig,
    latent: &LatentConfig,
    source: &mut dyn TensorSource,
    layer: usize,
    format: WeightFormat,
) -> Result<(PerHead, PerHead)> {
    let p = |part: &str| layer_tensor(layer, &format!("self_attn.{part}"));
    let heads = config.num_heads as i32;
    let (nope, v, lora) = (
        latent.qk_nope_head_dim as i32,
        latent.v_head_dim as i32,
        latent.kv_lora_rank as i32,
    );
    if !source.contains(&format!("{}.weight", p("kv_b_proj"))) {
        let mut per_head = |part: &str, out: i32, inp: i32| -> Result<PerHead> {
            let w = source.stacked(&p(part), format)?.ok_or_else(|| {
                InferenceError::MissingTensor(format!("{}.weight (or kv_b_proj)", p(part)))
            })?;
            let shape = match &w {
                Stacked::Dense(a) => a.shape().to_vec(),
                Stacked::Quantized(q) => vec![
                    q.packed.shape()[0],
                    q.out_rows() as i32,
                    q.in_columns() as i32,
                ],
            };
            if shape != [heads, out, inp] {
                return Err(InferenceError::BadTensor {
                    name: format!("{}.weight", p(part)),
                    reason: format!("expected [{heads}, {out}, {inp}], found {shape:?}"),
                });
            }
            PerHead::new(w)
        };
        return Ok((
            per_head("embed_q", lora, nope)?,
            per_head("unembed_out", v, lora)?,
        ));
    }
    let w = match source.matrix(&p("kv_b_proj"), format)? {
        Matrix::Dense(w) => w,
        Matrix::Quantized(q) => q.dequantize(format.compute_dtype())?,
    };
    if w.shape() != [heads * (nope + v), lora] {
        return Err(InferenceError::BadTensor {
            name: format!("{}.weight", p("kv_b_proj")),
            reason: format!(
                "expected [{}, {lora}], found {:?}",
                heads * (nope + v),
                w.shape()
            ),
        });
    }
    let w = w.reshape(&[heads, nope + v, lora])?;
    let w_uk = w.index((.., ..nope, ..)).swap_axes(-1, -2)?;
    let w_uv = w.index((.., nope.., ..));
    Ok((
        PerHead::new(Stacked::Dense(w_uk.contiguous()?))?,
        PerHead::new(Stacked::Dense(w_uv.contiguous()?))?,
    ))
}
