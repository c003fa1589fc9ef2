//! Raw bindings to mlx-c, generated at build time from the mlx-sys 0.7.0 sources that
//! `cargo xtask setup` downloaded and patched (see "How MLX is built on Linux" in
//! `docs/architecture.md`).
//!
//! This crate replaces the published `mlx-sys` through `[patch.crates-io]`, because the
//! published build script only knows how to build for Apple platforms with network access.
#![allow(non_upper_case_globals)]
#![allow(non_camel_case_types)]
#![allow(non_snake_case)]
#![allow(clippy::all)]
#![allow(missing_docs)]

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));

unsafe extern "C" {
    /// shoal's CPU product with MLX affine-quantized weights (`kernels/cpu_qmm.cpp`):
    /// `*res = x @ dequantize(w, scales, biases)^T` for 2-, 3-, 4-, 5-, 6- and 8-bit weights (MLX's
    /// packing; groups of any multiple of 8), `x` f32 `[..., k]`,
    /// `w` `[n, k * bits / 32]`, scales and biases `[n, k / group_size]`. `isa` 0 uses the
    /// fastest path the CPU has, the others force one (`kernels/affine_kernels.h`'s `Isa`). Returns 0, or 1 after reporting
    /// the error through mlx-c's handler.
    pub fn shoal_cpu_affine_qmm(
        res: *mut mlx_array,
        x: mlx_array,
        w: mlx_array,
        scales: mlx_array,
        biases: mlx_array,
        group_size: ::std::os::raw::c_int,
        bits: ::std::os::raw::c_int,
        isa: ::std::os::raw::c_int,
        s: mlx_stream,
    ) -> ::std::os::raw::c_int;

    /// Whether this CPU runs the kernel path `isa` (the codes of `kernels/affine_kernels.h`'s
    /// `Isa`): 1 or 0.
    pub fn shoal_cpu_qmm_isa_available(isa: ::std::os::raw::c_int) -> ::std::os::raw::c_int;

    /// The gathered form of [`shoal_cpu_affine_qmm`] (MLX's `gather_qmm` with expert indices
    /// only): batch entry `b` of `x` `[..., m, k]`, broadcast with `indices`, uses weights
    /// `w[indices[b]]` of `[experts, n, k * bits / 32]`; the result is `[..., m, n]`.
    pub fn shoal_cpu_affine_gather_qmm(
        res: *mut mlx_array,
        x: mlx_array,
        w: mlx_array,
        scales: mlx_array,
        biases: mlx_array,
        indices: mlx_array,
        group_size: ::std::os::raw::c_int,
        bits: ::std::os::raw::c_int,
        isa: ::std::os::raw::c_int,
        s: mlx_stream,
    ) -> ::std::os::raw::c_int;

    /// The weights [`shoal_cpu_affine_qmm`] reads, as f32 `[..., n, k]`: MLX's `dequantize`
    /// refuses groups of 16, which GGUF's K-quants repack into.
    pub fn shoal_cpu_affine_dequantize(
        res: *mut mlx_array,
        w: mlx_array,
        scales: mlx_array,
        biases: mlx_array,
        group_size: ::std::os::raw::c_int,
        bits: ::std::os::raw::c_int,
        isa: ::std::os::raw::c_int,
        s: mlx_stream,
    ) -> ::std::os::raw::c_int;

    /// SwiGLU's gate and up projections as one primitive (`kernels/cpu_qmm.cpp`): `*res =
    /// silu(x @ dequantize(wg, sg, bg)^T) * (x @ dequantize(wu, su, bu)^T)`, both of one layout
    /// as [`shoal_cpu_affine_qmm`] takes it.
    pub fn shoal_cpu_swiglu_qmm(
        res: *mut mlx_array,
        x: mlx_array,
        wg: mlx_array,
        sg: mlx_array,
        bg: mlx_array,
        wu: mlx_array,
        su: mlx_array,
        bu: mlx_array,
        group_size: ::std::os::raw::c_int,
        bits: ::std::os::raw::c_int,
        isa: ::std::os::raw::c_int,
        s: mlx_stream,
    ) -> ::std::os::raw::c_int;

    /// The message of the last error one of shoal's entries (`shoal_cpu_*`) reported on this
    /// thread, and forgets it: `""` when there is none. Valid until the thread's next call.
    pub fn shoal_take_last_error() -> *const ::std::os::raw::c_char;

    /// RMS norm on the CPU as one primitive (`kernels/cpu_layer_ops.cpp`): `*res = x /
    /// sqrt(mean(x²) + eps) * w` over the last axis; float32, `w` `[x.shape[-1]]`.
    pub fn shoal_cpu_rms_norm(
        res: *mut mlx_array,
        x: mlx_array,
        w: mlx_array,
        eps: f32,
        s: mlx_stream,
    ) -> ::std::os::raw::c_int;

    /// Rotary embeddings on the CPU as one primitive, half-split layout: `x` float32 `[B, H, L,
    /// D]`, its first `dims` features rotated; positions from `offset`, or from `starts[b]`
    /// (int32 `[B]`) when `starts` holds an array; frequencies `base^(-2i/dims)`, or `1 /
    /// periods[i]` when `periods` holds an array.
    pub fn shoal_cpu_rope(
        res: *mut mlx_array,
        x: mlx_array,
        dims: ::std::os::raw::c_int,
        base: f32,
        scale: f32,
        offset: ::std::os::raw::c_int,
        starts: mlx_array,
        periods: mlx_array,
        s: mlx_stream,
    ) -> ::std::os::raw::c_int;

    /// Attention on the CPU as one primitive: float32 queries `[B, Hq, L, D]` over keys `[B,
    /// Hkv, T, D]` and values `[B, Hkv, T, Dv]` (grouped heads), scores scaled by `scale`;
    /// `mask_mode` 1 is causal, otherwise `mask`, when it holds an array, is a boolean or
    /// additive float32 mask broadcast to `[B, Hq, L, T]`.
    pub fn shoal_cpu_attention(
        res: *mut mlx_array,
        q: mlx_array,
        k: mlx_array,
        v: mlx_array,
        scale: f32,
        mask_mode: ::std::os::raw::c_int,
        mask: mlx_array,
        s: mlx_stream,
    ) -> ::std::os::raw::c_int;
}

/// mlx-rs seeds its random generator with macOS's `mach_approximate_time`. Off Apple
/// platforms that symbol does not exist, so the link of every mlx-rs program would fail;
/// a monotonic nanosecond clock serves the same purpose (a seed, never compared across hosts).
#[cfg(not(target_vendor = "apple"))]
#[unsafe(no_mangle)]
pub extern "C" fn mach_approximate_time() -> u64 {
    use std::time::Instant;
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let start = START.get_or_init(Instant::now);
    // Offset by one so the seed is never zero.
    start.elapsed().as_nanos() as u64 + 1
}
