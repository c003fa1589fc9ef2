//! A layer's small operations as one MLX primitive each on the CPU
//! (`cpp/cpu_layer_ops.cpp`): RMS norm, rotary embeddings in the half-split layout, and
//! attention of a few query positions. MLX 0.32 has no CPU kernels for `fast::rms_norm`,
//! `fast::rope` or `fast::scaled_dot_product_attention` (each becomes a composition of 5, ~15
//! and 8 primitives); whether a model uses these is `inference::cpu_layer_ops`'s choice.
//!
//! These run whatever the device and report operands they do not take as errors.

use crate::raw_op::raw_op;
use crate::Result;
use mlx_rs::fast::ScaledDotProductAttentionMask;
use mlx_rs::Array;

/// An empty mlx-c handle: "no array" for an optional operand.
fn no_array() -> mlx_sys::mlx_array {
    // SAFETY: an empty handle, which the entry points read as absent and never free.
    unsafe { mlx_sys::mlx_array_new() }
}

/// `x / sqrt(mean(x²) + eps) · w` over the last axis (`fast::rms_norm`) as shoal's primitive,
/// whatever the device (float32 `x`, and `w` one weight per element of `x`'s last axis;
/// anything else is an error).
pub fn fused_rms_norm(x: &Array, w: &Array, eps: f32) -> Result<Array> {
    raw_op("shoal_cpu_rms_norm", |res, stream| unsafe {
        // SAFETY: live handles; the entry fills `res` or reports an error.
        crate::ffi::shoal_cpu_rms_norm(res, x.as_ptr(), w.as_ptr(), eps, stream)
    })
}

/// How a rotation's positions are given.
#[derive(Clone, Copy)]
pub enum RopePositions<'a> {
    /// Position `offset + i` for the `i`-th of `x`'s positions, in every batch entry.
    From(i32),
    /// Batch entry `b`'s single position is `starts[b]` (`[batch]`, int32).
    PerEntry(&'a Array),
}

/// Rotary embeddings in the half-split layout over the first `dims` features of `x` `[batch,
/// heads, positions, head_dim]`, with frequencies `base^(-2i/dims)` or `1 / periods[i]`
/// (`fast::rope` / `fast::rope_dynamic` with `traditional = false`) as shoal's primitive,
/// whatever the device (float32 `x` of four axes, and a base or periods; anything else is an
/// error).
pub fn fused_rope(
    x: &Array,
    dims: i32,
    base: Option<f32>,
    scale: f32,
    positions: RopePositions<'_>,
    periods: Option<&Array>,
) -> Result<Array> {
    let (offset, starts) = match positions {
        RopePositions::From(offset) => (offset, no_array()),
        RopePositions::PerEntry(starts) => (0, starts.as_ptr()),
    };
    let periods = periods.map_or_else(no_array, Array::as_ptr);
    raw_op("shoal_cpu_rope", |res, stream| unsafe {
        // SAFETY: live handles (or empty ones for absent operands), which the entry only reads.
        crate::ffi::shoal_cpu_rope(
            res,
            x.as_ptr(),
            dims,
            base.unwrap_or(0.0),
            scale,
            offset,
            starts,
            periods,
            stream,
        )
    })
}

/// Scaled dot-product attention without sinks (`fast::scaled_dot_product_attention`): queries
/// `[batch, heads, positions, dim]` over keys and values `[batch, kv_heads, keys, dim]`, as
/// shoal's primitive, whatever the device or query count (float32 operands of four axes, a
/// boolean or float32 mask; anything else is an error).
pub fn fused_attention(
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f32,
    mask: Option<ScaledDotProductAttentionMask<'_>>,
) -> Result<Array> {
    let (mode, mask) = match mask {
        None => (0, no_array()),
        Some(ScaledDotProductAttentionMask::Causal) => (1, no_array()),
        Some(ScaledDotProductAttentionMask::Array(m)) => (0, m.as_ptr()),
    };
    raw_op("shoal_cpu_attention", |res, stream| unsafe {
        // SAFETY: live handles (or an empty one for no mask), which the entry only reads.
        crate::ffi::shoal_cpu_attention(
            res,
            q.as_ptr(),
            k.as_ptr(),
            v.as_ptr(),
            scale,
            mode,
            mask,
            stream,
        )
    })
}
