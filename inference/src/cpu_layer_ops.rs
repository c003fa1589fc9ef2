//! A layer's small operations — RMS norm, rotary embeddings, attention of a few new positions —
//! as one MLX primitive each on the CPU (`native/kernels/cpp/cpu_layer_ops.cpp`, wrapped by the
//! `shoal-kernels` crate's `kernels::layer_ops`), and as MLX's `fast::` operations everywhere
//! else.
//!
//! MLX 0.32 has no CPU kernels for `fast::rms_norm`, `fast::rope` or
//! `fast::scaled_dot_product_attention`: on the CPU each becomes its composition (5, ~15 and 8
//! primitives). A decode step computes them on a few hundred floats, so scheduling is what
//! costs: a SmolLM2-135M token was ~2,900 arrays and ~6,200 tasks on MLX's CPU stream, and the
//! graph-building thread waited on MLX's limit of ten tasks in flight ~230 times a token. One
//! primitive per operation cuts the arrays about threefold.
//!
//! `SHOAL_CPU_OPS=mlx` keeps MLX's compositions (to compare them). Attention of more than
//! [`FUSED_ATTENTION_MAX_QUERIES`] positions (a prompt), with sinks, or with float16 data keeps
//! MLX's form, whose matrix products go through the BLAS.

use crate::error::Result;
pub use kernels::RopePositions;
use mlx_rs::fast::{self, ScaledDotProductAttentionMask};
use mlx_rs::{Array, Dtype};
use std::sync::OnceLock;

/// The variable that turns shoal's CPU layer operations off (`mlx`).
pub const CPU_OPS_ENV: &str = "SHOAL_CPU_OPS";

/// The most query positions the fused attention takes: decode steps, batched decode rows and
/// short chunks. Longer prompts keep MLX's form, whose products run on the BLAS.
pub const FUSED_ATTENTION_MAX_QUERIES: i32 = 16;

/// Whether this process runs shoal's primitives: the default device is the CPU and
/// `SHOAL_CPU_OPS` is not `mlx`.
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        let on_cpu = mlx_rs::Device::try_default()
            .and_then(|d| d.get_type())
            .is_ok_and(|t| matches!(t, mlx_rs::DeviceType::Cpu));
        on_cpu
            && std::env::var(CPU_OPS_ENV)
                .map(|v| v.trim() != "mlx")
                .unwrap_or(true)
    })
}

/// `x / sqrt(mean(x²) + eps) · w` over the last axis (`fast::rms_norm`).
pub fn rms_norm<'a>(
    x: impl AsRef<Array>,
    weight: impl Into<Option<&'a Array>>,
    eps: f32,
) -> Result<Array> {
    let (x, weight) = (x.as_ref(), weight.into());
    match weight {
        Some(w) if enabled() && x.dtype() == Dtype::Float32 && w.dtype() == Dtype::Float32 => {
            fused_rms_norm(x, w, eps)
        }
        _ => Ok(fast::rms_norm(x, weight, eps)?),
    }
}

/// [`rms_norm`] as shoal's primitive, whatever the device (float32 `x`, and `w` one weight per
/// element of `x`'s last axis; anything else is an error).
pub fn fused_rms_norm(x: &Array, w: &Array, eps: f32) -> Result<Array> {
    Ok(kernels::fused_rms_norm(x, w, eps)?)
}

/// Rotary embeddings in the half-split layout over the first `dims` features of `x` `[batch,
/// heads, positions, head_dim]`, with frequencies `base^(-2i/dims)` or `1 / periods[i]`
/// (`fast::rope` / `fast::rope_dynamic` with `traditional = false`).
pub fn rope(
    x: &Array,
    dims: i32,
    base: Option<f32>,
    scale: f32,
    positions: RopePositions<'_>,
    periods: Option<&Array>,
) -> Result<Array> {
    let fits = enabled()
        && x.dtype() == Dtype::Float32
        && x.ndim() == 4
        && (base.is_some() || periods.is_some())
        && periods.is_none_or(|p| p.dtype() == Dtype::Float32);
    if !fits {
        return Ok(match positions {
            RopePositions::From(offset) => {
                fast::rope(x, dims, false, base, scale, offset, periods)?
            }
            RopePositions::PerEntry(starts) => {
                fast::rope_dynamic(x, dims, false, base, scale, starts, periods)?
            }
        });
    }
    fused_rope(x, dims, base, scale, positions, periods)
}

/// [`rope`] as shoal's primitive, whatever the device (float32 `x` of four axes, and a base or
/// periods; anything else is an error).
pub fn fused_rope(
    x: &Array,
    dims: i32,
    base: Option<f32>,
    scale: f32,
    positions: RopePositions<'_>,
    periods: Option<&Array>,
) -> Result<Array> {
    Ok(kernels::fused_rope(
        x, dims, base, scale, positions, periods,
    )?)
}

/// Scaled dot-product attention (`fast::scaled_dot_product_attention`): queries `[batch,
/// heads, positions, dim]` over keys and values `[batch, kv_heads, keys, dim]`.
pub fn attention(
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f32,
    mask: Option<ScaledDotProductAttentionMask<'_>>,
    sinks: Option<&Array>,
) -> Result<Array> {
    let f32s = [q, k, v]
        .iter()
        .all(|a| a.dtype() == Dtype::Float32 && a.ndim() == 4);
    let mask_fits = match &mask {
        Some(ScaledDotProductAttentionMask::Array(m)) => {
            matches!(m.dtype(), Dtype::Bool | Dtype::Float32) && m.ndim() <= 4
        }
        _ => true,
    };
    let fits = enabled()
        && f32s
        && mask_fits
        && sinks.is_none()
        && q.shape()[2] <= FUSED_ATTENTION_MAX_QUERIES;
    if !fits {
        return Ok(fast::scaled_dot_product_attention(
            q, k, v, scale, mask, sinks,
        )?);
    }
    fused_attention(q, k, v, scale, mask)
}

/// [`attention`] without sinks as shoal's primitive, whatever the device or query count
/// (float32 operands of four axes, a boolean or float32 mask; anything else is an error).
pub fn fused_attention(
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f32,
    mask: Option<ScaledDotProductAttentionMask<'_>>,
) -> Result<Array> {
    Ok(kernels::fused_attention(q, k, v, scale, mask)?)
}
