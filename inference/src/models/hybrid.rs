//! The hybrid layer pattern of Qwen3-Next and Qwen3.5 (dense and MoE) as mlx-lm's
//! `qwen3_next.py` and `qwen3_5.py` build it:
//! Gated DeltaNet layers ([`super::gated_delta`]) and, every `full_attention_interval`-th
//! layer, Qwen3-Next's gated attention (`q_proj` gives each head's queries and a gate, per-head
//! Q/K RMS norms, RoPE over `partial_rotary_factor` of each head, the output times
//! `sigmoid(gate)`); the block norms around them; the configuration keys that lay them out.
//! A library the three families call with their own feed-forward and [`HybridLayout`].
//!
//! Hugging Face's own files store the block norms zero-centred (`1 + w`) and the convolution
//! as `[channels, 1, kernel]`; mlx-lm converts both when it sees that convolution shape (or,
//! for Qwen3-Next, experts stored one matrix each), and so does this file. RoPE parameters come from `rope_parameters` (its `mrope_section` places
//! image positions, which text alone does not use: plain RoPE).

use super::base::{layer_tensor, DecoderLayer, FeedForward, HeadNorms, SelfAttention};
use super::config_keys::family_keys;
use super::gated_delta::{DeltaNetShape, GatedDeltaNet};
use crate::config::{LinearLayers, ModelConfig, RopeScaling};
use crate::error::{InferenceError, Result};
use crate::weights::FormatOnMlx;
use crate::weights::{TensorSource, WeightFormat};
use mlx_rs::{ops, Array, Dtype};
use serde_json::Value;

/// The keys of a Qwen3.5 text configuration (dense or MoE) beyond the shared ones (mlx-lm's defaults).
#[derive(serde::Deserialize)]
struct HybridKeys {
    #[serde(default = "defaults::v_heads")]
    linear_num_value_heads: usize,
    #[serde(default = "defaults::k_heads")]
    linear_num_key_heads: usize,
    #[serde(default = "defaults::k_dim")]
    linear_key_head_dim: usize,
    #[serde(default = "defaults::v_dim")]
    linear_value_head_dim: usize,
    #[serde(default = "defaults::kernel")]
    linear_conv_kernel_dim: usize,
    #[serde(default = "defaults::interval")]
    full_attention_interval: usize,
    /// Absent: mlx-lm's default (theta 100000, a quarter rotated); `null`: the top-level keys.
    #[serde(default = "defaults::rope_parameters")]
    rope_parameters: Value,
    #[serde(default = "defaults::theta")]
    rope_theta: f64,
    #[serde(default = "defaults::partial")]
    partial_rotary_factor: f64,
}

mod defaults {
    pub fn v_heads() -> usize {
        64
    }
    pub fn k_heads() -> usize {
        16
    }
    pub fn k_dim() -> usize {
        192
    }
    pub fn v_dim() -> usize {
        128
    }
    pub fn kernel() -> usize {
        4
    }
    pub fn interval() -> usize {
        4
    }
    pub fn theta() -> f64 {
        100000.0
    }
    pub fn partial() -> f64 {
        0.25
    }
    pub fn rope_parameters() -> serde_json::Value {
        serde_json::json!({"type": "default", "rope_theta": 100000.0, "partial_rotary_factor": 0.25})
    }
}

/// What differs between the families' hybrid layers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HybridLayout {
    /// Gated DeltaNet's projections fused per key head (`in_proj_qkvz`, `in_proj_ba`:
    /// Qwen3-Next) rather than split (`in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`).
    pub fused: bool,
    /// RoPE from `rope_parameters` (Qwen3.5's, with mlx-lm's default when absent) rather than
    /// the top-level `rope_theta`, `partial_rotary_factor` and `rope_scaling` (Qwen3-Next).
    pub rope_parameters: bool,
}

/// Qwen3.5's, dense and MoE.
pub(crate) const QWEN3_5: HybridLayout = HybridLayout {
    fused: false,
    rope_parameters: true,
};

/// Qwen3-Next's.
pub(crate) const QWEN3_NEXT: HybridLayout = HybridLayout {
    fused: true,
    rope_parameters: false,
};

/// Reads the hybrid layout: which layers are linear, their shape, the gated attention and
/// its RoPE.
pub(crate) fn configure_hybrid(
    json: &Value,
    config: &mut ModelConfig,
    family: &str,
    layout: HybridLayout,
) -> Result<()> {
    let keys: HybridKeys = family_keys(json, family)?;
    let shape = DeltaNetShape {
        k_heads: keys.linear_num_key_heads,
        v_heads: keys.linear_num_value_heads,
        k_dim: keys.linear_key_head_dim,
        v_dim: keys.linear_value_head_dim,
        kernel: keys.linear_conv_kernel_dim,
    };
    shape.validate()?;
    let interval = keys.full_attention_interval;
    if interval == 0 {
        return Err(InferenceError::BadConfig(format!(
            "a {family} config.json's full_attention_interval must be positive"
        )));
    }
    config.attention.linear = Some(LinearLayers {
        layers: (0..config.num_layers)
            .map(|i| !(i + 1).is_multiple_of(interval))
            .collect(),
        shape,
    });
    config.attention.output_gate = true;
    config.attention.qk_norm = true;
    let (kind, theta, partial, scaling) = match &keys.rope_parameters {
        Value::Object(p) if layout.rope_parameters => {
            let kind = p
                .get("type")
                .or_else(|| p.get("rope_type"))
                .and_then(Value::as_str)
                .unwrap_or("default");
            let f = |k: &str, d: f64| p.get(k).and_then(Value::as_f64).unwrap_or(d);
            (
                kind.to_owned(),
                f("rope_theta", 100000.0),
                f("partial_rotary_factor", 0.25),
                f("factor", 1.0),
            )
        }
        _ => {
            let kind = json
                .pointer("/rope_scaling/type")
                .or_else(|| json.pointer("/rope_scaling/rope_type"))
                .and_then(Value::as_str)
                .unwrap_or("default");
            let factor = json
                .pointer("/rope_scaling/factor")
                .and_then(Value::as_f64)
                .unwrap_or(1.0);
            (
                kind.to_owned(),
                keys.rope_theta,
                keys.partial_rotary_factor,
                factor,
            )
        }
    };
    config.rope_scaling = match kind.as_str() {
        "default" | "mrope" => RopeScaling::None,
        "linear" => RopeScaling::Linear {
            factor: scaling as f32,
        },
        other => {
            return Err(InferenceError::BadConfig(format!(
                "a {family} config.json's rope type `{other}` is not supported (default and \
                 linear are)"
            )))
        }
    };
    config.rope_theta = theta as f32;
    config.attention.rotary_dim = Some((config.head_dim as f64 * partial) as usize);
    config.attention.mrope_section = keys
        .rope_parameters
        .get("mrope_section")
        .and_then(Value::as_array)
        .filter(|_| layout.rope_parameters)
        .and_then(|s| {
            let n: Vec<usize> = s
                .iter()
                .filter_map(|v| v.as_u64())
                .map(|v| v as usize)
                .collect();
            <[usize; 3]>::try_from(n).ok()
        });
    Ok(())
}

/// Whether the checkpoint is Hugging Face's own layout (convolution `[channels, 1, kernel]`,
/// block norms stored as `w` of `1 + w`), told as mlx-lm tells it: by a linear layer's
/// convolution (Qwen3.5) or by experts stored one matrix each (Qwen3-Next, whose sanitize
/// converts the norms whenever it stacks experts). A source holding neither (a pipeline rank
/// of attention layers only, Qwen3.5) is taken as mlx-lm's layout.
fn zero_centred_norms(config: &ModelConfig, source: &mut dyn TensorSource) -> Result<bool> {
    let per_expert = (0..config.num_layers)
        .any(|l| source.contains(&layer_tensor(l, "mlp.experts.0.up_proj.weight")));
    if per_expert {
        return Ok(true);
    }
    for layer in (0..config.num_layers).filter(|&l| config.is_linear_layer(l)) {
        let name = layer_tensor(layer, "linear_attn.conv1d.weight");
        if source.contains(&name) {
            let w = source.dense(&name, Dtype::Float32)?;
            return Ok(w.shape().last() != Some(&1));
        }
    }
    Ok(false)
}

/// A block norm's weight as RMS norm takes it (`1 + w` in Hugging Face's own layout).
fn block_norm(
    source: &mut dyn TensorSource,
    name: &str,
    dtype: Dtype,
    zero_centred: bool,
) -> Result<Array> {
    let w = source.dense(name, dtype)?;
    Ok(if zero_centred {
        ops::add(&w, Array::from_f32(1.0).as_dtype(dtype)?)?
    } else {
        w
    })
}

/// Layer `layer`'s mixer: Gated DeltaNet or gated attention, with its norms read as
/// `zero_centred` says.
fn hybrid_mixer(
    config: &ModelConfig,
    source: &mut dyn TensorSource,
    layer: usize,
    format: WeightFormat,
    zero_centred: bool,
    layout: HybridLayout,
) -> Result<SelfAttention> {
    let dtype = format.compute_dtype();
    if let Some(linear) = config
        .attention
        .linear
        .as_ref()
        .filter(|l| l.is_linear(layer))
    {
        let net = GatedDeltaNet::load(
            linear.shape,
            config.hidden_size,
            config.rms_norm_eps,
            source,
            layer,
            format,
            layout.fused,
        )?;
        return Ok(SelfAttention::Linear(net));
    }
    let mut norm = |part: &str| block_norm(source, &layer_tensor(layer, part), dtype, zero_centred);
    let head_norms = HeadNorms::each_head(
        norm("self_attn.q_norm.weight")?,
        norm("self_attn.k_norm.weight")?,
    );
    let attention =
        super::base::Attention::load_gated(config, source, layer, format, Some(head_norms), true)?;
    Ok(SelfAttention::Heads(attention))
}

/// The block of layer `layer` around `mixer` and `ffn`, with its two norms.
pub(crate) fn hybrid_block(
    config: &ModelConfig,
    source: &mut dyn TensorSource,
    layer: usize,
    format: WeightFormat,
    ffn: FeedForward,
    layout: HybridLayout,
) -> Result<DecoderLayer> {
    let zero_centred = zero_centred_norms(config, source)?;
    let mixer = hybrid_mixer(config, source, layer, format, zero_centred, layout)?;
    let dtype = format.compute_dtype();
    let mut norm = |part: &str| block_norm(source, &layer_tensor(layer, part), dtype, zero_centred);
    let input = norm("input_layernorm.weight")?;
    let post = norm("post_attention_layernorm.weight")?;
    Ok(DecoderLayer::new(config, input, mixer, post, ffn))
}

/// The final norm, `1 + w` in Hugging Face's own layout.
pub(crate) fn hybrid_final_norm(
    config: &ModelConfig,
    source: &mut dyn TensorSource,
    dtype: Dtype,
) -> Result<Array> {
    let zero_centred = zero_centred_norms(config, source)?;
    block_norm(source, "model.norm.weight", dtype, zero_centred)
}

/// Names of layer `layer`'s mixer tensors and block norms (mlx-lm's names under `model.`).
pub(crate) fn hybrid_tensor_names(
    config: &ModelConfig,
    layer: usize,
    layout: HybridLayout,
) -> Vec<String> {
    let parts: &[&str] = if config.is_linear_layer(layer) && layout.fused {
        &[
            "linear_attn.in_proj_qkvz.weight",
            "linear_attn.in_proj_ba.weight",
            "linear_attn.conv1d.weight",
            "linear_attn.dt_bias",
            "linear_attn.A_log",
            "linear_attn.norm.weight",
            "linear_attn.out_proj.weight",
        ]
    } else if config.is_linear_layer(layer) {
        &[
            "linear_attn.in_proj_qkv.weight",
            "linear_attn.in_proj_z.weight",
            "linear_attn.in_proj_b.weight",
            "linear_attn.in_proj_a.weight",
            "linear_attn.conv1d.weight",
            "linear_attn.dt_bias",
            "linear_attn.A_log",
            "linear_attn.norm.weight",
            "linear_attn.out_proj.weight",
        ]
    } else {
        &[
            "self_attn.q_proj.weight",
            "self_attn.k_proj.weight",
            "self_attn.v_proj.weight",
            "self_attn.o_proj.weight",
            "self_attn.q_norm.weight",
            "self_attn.k_norm.weight",
        ]
    };
    parts
        .iter()
        .chain(&["input_layernorm.weight", "post_attention_layernorm.weight"])
        .map(|p| layer_tensor(layer, p))
        .collect()
}

/// What placement checks before a tensor-parallel cut of a hybrid model: the shared divisors
/// and the Gated DeltaNet layers' key and value heads ([`super::recurrent_split`]).
pub(crate) fn hybrid_tensor_divisors(
    config: &ModelConfig,
) -> Vec<crate::tensor_divisors::TensorDivisor> {
    super::recurrent_split::linear_divisors(
        config,
        super::recurrent_split::RecurrentKind::GatedDeltaNet,
    )
}
