//! shoal's CPU kernels: MLX primitives written in C++ (`cpp/`, compiled by this crate's build
//! script against the headers of the MLX that `mlx-sys` links) and their Rust wrappers, which
//! take and return mlx-rs [`Array`](mlx_rs::Array)s.
//!
//! They exist because MLX's CPU backend is slow where a decode step spends its time: its
//! `quantized_matmul` unpacks one weight at a time and refuses groups of 16 (GGUF's repacked
//! K-quants), and it has no CPU kernels for `fast::rms_norm`, `fast::rope` or
//! `fast::scaled_dot_product_attention` (each becomes a composition of many small primitives).
//! Each kernel runs inside MLX's graph like any other operation, so no evaluation barrier.
//!
//! - [`qmm`]: products with affine-quantized weights (plain, gathered by expert, SwiGLU's pair),
//!   their dequantization, and the instruction sets ([`KernelIsa`]);
//! - [`layer_ops`]: RMS norm, rotary embeddings and attention as one primitive each;
//! - [`raw_op`]: calling any mlx-c entry that mlx-rs does not expose, with the error of a
//!   rejected operand as text;
//! - [`ffi`]: the `extern "C"` entries themselves.
//!
//! When a model uses which kernel is `inference`'s choice (`inference::cpu_kernels`,
//! `inference::cpu_layer_ops`); this crate only computes. See `README.md` for how the kernels
//! are built and tested.

pub mod ffi;
pub mod layer_ops;
pub mod qmm;
mod raw_op;

pub use layer_ops::{fused_attention, fused_rms_norm, fused_rope, RopePositions};
pub use qmm::{
    affine_dequantize, affine_gather_product, affine_product, swiglu_product, AffineOperands,
    KernelIsa, Layout,
};
pub use raw_op::{raw_op, KernelError};

/// What a kernel returns: its output, or why MLX rejected its operands.
pub type Result<T> = std::result::Result<T, KernelError>;
