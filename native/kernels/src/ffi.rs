//! The `extern "C"` entries of `cpp/` (mlx-c's convention: the result through `res`, 0 or 1
//! after reporting the error, which [`shoal_take_last_error`] then returns). The safe forms are
//! [`crate::qmm`] and [`crate::layer_ops`]; these stay public for a caller that needs an entry
//! the wrappers do not cover.

unsafe extern "C" {
    /// shoal's CPU product with MLX affine-quantized weights (`cpp/cpu_qmm.cpp`):
    /// `*res = x @ dequantize(w, scales, biases)^T` for 2-, 3-, 4-, 5-, 6- and 8-bit weights (MLX's
    /// packing; groups of any multiple of 8), `x` f32 `[..., k]`,
    /// `w` `[n, k * bits / 32]`, scales and biases `[n, k / group_size]`. `isa` 0 uses the
    /// fastest path the CPU has, the others force one (`cpp/affine_kernels.h`'s `Isa`). Returns 0, or 1 after reporting
    /// the error through mlx-c's handler.
    pub fn shoal_cpu_affine_qmm(
        res: *mut mlx_sys::mlx_array,
        x: mlx_sys::mlx_array,
        w: mlx_sys::mlx_array,
        scales: mlx_sys::mlx_array,
        biases: mlx_sys::mlx_array,
        group_size: ::std::os::raw::c_int,
        bits: ::std::os::raw::c_int,
        isa: ::std::os::raw::c_int,
        s: mlx_sys::mlx_stream,
    ) -> ::std::os::raw::c_int;

    /// Whether this CPU runs the kernel path `isa` (the codes of `cpp/affine_kernels.h`'s
    /// `Isa`): 1 or 0.
    pub fn shoal_cpu_qmm_isa_available(isa: ::std::os::raw::c_int) -> ::std::os::raw::c_int;

    /// The gathered form of [`shoal_cpu_affine_qmm`] (MLX's `gather_qmm` with expert indices
    /// only): batch entry `b` of `x` `[..., m, k]`, broadcast with `indices`, uses weights
    /// `w[indices[b]]` of `[experts, n, k * bits / 32]`; the result is `[..., m, n]`.
    pub fn shoal_cpu_affine_gather_qmm(
        res: *mut mlx_sys::mlx_array,
        x: mlx_sys::mlx_array,
        w: mlx_sys::mlx_array,
        scales: mlx_sys::mlx_array,
        biases: mlx_sys::mlx_array,
        indices: mlx_sys::mlx_array,
        group_size: ::std::os::raw::c_int,
        bits: ::std::os::raw::c_int,
        isa: ::std::os::raw::c_int,
        s: mlx_sys::mlx_stream,
    ) -> ::std::os::raw::c_int;

    /// The weights [`shoal_cpu_affine_qmm`] reads, as f32 `[..., n, k]`: MLX's `dequantize`
    /// refuses groups of 16, which GGUF's K-quants repack into.
    pub fn shoal_cpu_affine_dequantize(
        res: *mut mlx_sys::mlx_array,
        w: mlx_sys::mlx_array,
        scales: mlx_sys::mlx_array,
        biases: mlx_sys::mlx_array,
        group_size: ::std::os::raw::c_int,
        bits: ::std::os::raw::c_int,
        isa: ::std::os::raw::c_int,
        s: mlx_sys::mlx_stream,
    ) -> ::std::os::raw::c_int;

    /// SwiGLU's gate and up projections as one primitive (`cpp/cpu_qmm.cpp`): `*res =
    /// silu(x @ dequantize(wg, sg, bg)^T) * (x @ dequantize(wu, su, bu)^T)`, both of one layout
    /// as [`shoal_cpu_affine_qmm`] takes it.
    pub fn shoal_cpu_swiglu_qmm(
        res: *mut mlx_sys::mlx_array,
        x: mlx_sys::mlx_array,
        wg: mlx_sys::mlx_array,
        sg: mlx_sys::mlx_array,
        bg: mlx_sys::mlx_array,
        wu: mlx_sys::mlx_array,
        su: mlx_sys::mlx_array,
        bu: mlx_sys::mlx_array,
        group_size: ::std::os::raw::c_int,
        bits: ::std::os::raw::c_int,
        isa: ::std::os::raw::c_int,
        s: mlx_sys::mlx_stream,
    ) -> ::std::os::raw::c_int;

    /// The message of the last error one of shoal's entries (`shoal_cpu_*`) reported on this
    /// thread, and forgets it: `""` when there is none. Valid until the thread's next call.
    pub fn shoal_take_last_error() -> *const ::std::os::raw::c_char;

    /// RMS norm on the CPU as one primitive (`cpp/cpu_layer_ops.cpp`): `*res = x /
    /// sqrt(mean(x²) + eps) * w` over the last axis; float32, `w` `[x.shape[-1]]`.
    pub fn shoal_cpu_rms_norm(
        res: *mut mlx_sys::mlx_array,
        x: mlx_sys::mlx_array,
        w: mlx_sys::mlx_array,
        eps: f32,
        s: mlx_sys::mlx_stream,
    ) -> ::std::os::raw::c_int;

    /// Rotary embeddings on the CPU as one primitive, half-split layout: `x` float32 `[B, H, L,
    /// D]`, its first `dims` features rotated; positions from `offset`, or from `starts[b]`
    /// (int32 `[B]`) when `starts` holds an array; frequencies `base^(-2i/dims)`, or `1 /
    /// periods[i]` when `periods` holds an array.
    pub fn shoal_cpu_rope(
        res: *mut mlx_sys::mlx_array,
        x: mlx_sys::mlx_array,
        dims: ::std::os::raw::c_int,
        base: f32,
        scale: f32,
        offset: ::std::os::raw::c_int,
        starts: mlx_sys::mlx_array,
        periods: mlx_sys::mlx_array,
        s: mlx_sys::mlx_stream,
    ) -> ::std::os::raw::c_int;

    /// Attention on the CPU as one primitive: float32 queries `[B, Hq, L, D]` over keys `[B,
    /// Hkv, T, D]` and values `[B, Hkv, T, Dv]` (grouped heads), scores scaled by `scale`;
    /// `mask_mode` 1 is causal, otherwise `mask`, when it holds an array, is a boolean or
    /// additive float32 mask broadcast to `[B, Hq, L, T]`.
    pub fn shoal_cpu_attention(
        res: *mut mlx_sys::mlx_array,
        q: mlx_sys::mlx_array,
        k: mlx_sys::mlx_array,
        v: mlx_sys::mlx_array,
        scale: f32,
        mask_mode: ::std::os::raw::c_int,
        mask: mlx_sys::mlx_array,
        s: mlx_sys::mlx_stream,
    ) -> ::std::os::raw::c_int;
}
