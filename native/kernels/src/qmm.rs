//! Products with MLX affine-quantized weights on the CPU (`cpp/cpu_qmm.cpp`,
//! `cpp/affine_kernels.cpp`, the int8 paths in `cpp/int8_*.cpp`): `x @ dequantize(w)^T` for
//! 2-, 3-, 4-, 5-, 6- and 8-bit weights in MLX's packing with groups of any multiple of 8, its
//! gathered form (Mixture-of-Experts layers), SwiGLU's two products as one primitive, and the
//! dequantization alone; [`KernelIsa`] names the path and instructions each runs with.
//!
//! A matrix's [`Layout`] is its group size and width as MLX's `quantize` takes them; every
//! function reports a layout or operand it does not serve as a [`crate::KernelError`].

use crate::raw_op::raw_op;
use crate::Result;
use mlx_rs::Array;

/// How a matrix is quantized: `bits`-bit weights in groups of `group_size` along a row, each
/// group with its own scale and bias (MLX's affine `quantize`). The kernels take it as two
/// integers; `inference` builds it from a file's `QuantSpec`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Weights per scale and bias (a multiple of 8).
    pub group_size: i32,
    /// Bits per weight (2, 3, 4, 5, 6 or 8).
    pub bits: i32,
}

/// Which path and instructions shoal's kernel uses (the numbers of
/// `cpp/affine_kernels.h`'s `Isa`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelIsa {
    /// The fastest this CPU has (`SHOAL_QMM=int8`): below 32 rows the int8-activation
    /// products (AVX-VNNI, AVX-512 VNNI or AVX2), from 32 rows dequantized tiles through sgemm.
    Best,
    /// x stays f32 everywhere (sgemm for many rows, AVX2 + FMA or plain C++ for few): the
    /// same sums as a dequantize-then-multiply, to the float rounding. The default.
    Exact,
    /// Plain C++ with f32 x: the reference path, and what other CPUs run.
    Scalar,
    /// AVX2 + FMA with f32 x (what `Exact` uses for few rows).
    Avx2,
    /// int8 x in plain C++: the reference for the instruction-set forms below.
    Int8Scalar,
    /// int8 x with AVX2's `vpmaddubsw`.
    Int8Avx2,
    /// int8 x with AVX-VNNI's `vpdpbusd`.
    Int8AvxVnni,
    /// int8 x with AVX-512 VNNI's `vpdpbusd` on 256-bit registers.
    Int8Avx512Vnni,
}

impl KernelIsa {
    /// Every path, for tests that check each one this CPU has.
    pub const ALL: [KernelIsa; 8] = [
        KernelIsa::Best,
        KernelIsa::Exact,
        KernelIsa::Scalar,
        KernelIsa::Avx2,
        KernelIsa::Int8Scalar,
        KernelIsa::Int8Avx2,
        KernelIsa::Int8AvxVnni,
        KernelIsa::Int8Avx512Vnni,
    ];

    /// The number `cpp/affine_kernels.h`'s `Isa` gives this path (what the entries take).
    pub fn code(self) -> i32 {
        match self {
            KernelIsa::Best => 0,
            KernelIsa::Scalar => 1,
            KernelIsa::Avx2 => 2,
            KernelIsa::Int8Scalar => 3,
            KernelIsa::Int8Avx2 => 4,
            KernelIsa::Int8AvxVnni => 5,
            KernelIsa::Int8Avx512Vnni => 6,
            KernelIsa::Exact => 7,
        }
    }

    /// Whether this CPU runs this path (a path it lacks falls back to plain C++ with f32 x).
    pub fn is_available(self) -> bool {
        // SAFETY: a pure query of the CPU's features.
        unsafe { crate::ffi::shoal_cpu_qmm_isa_available(self.code()) == 1 }
    }

    /// The paths this CPU runs.
    pub fn available() -> Vec<KernelIsa> {
        KernelIsa::ALL
            .into_iter()
            .filter(|isa| isa.is_available())
            .collect()
    }

    /// Whether this path rounds x to int8 for a product of `rows` rows with groups of
    /// `group_size` and `bits`-bit weights (then each output may differ from the exact sum
    /// by up to `sum |s * (q - middle)| * dx / 2`, `dx` the row's `max|x| / 127` per chunk of
    /// 32).
    pub fn rounds_x(self, rows: usize, group_size: i32, bits: i32) -> bool {
        let fits = matches!(bits, 4 | 8) && group_size % 32 == 0;
        match self {
            KernelIsa::Best => fits && rows < INT8_BELOW_ROWS && best_int8_exists(),
            KernelIsa::Int8Scalar
            | KernelIsa::Int8Avx2
            | KernelIsa::Int8AvxVnni
            | KernelIsa::Int8Avx512Vnni => fits && self.is_available(),
            _ => false,
        }
    }
}

/// Rows from which `Best` multiplies dequantized tiles with sgemm (x in f32) instead of
/// rounding x to int8 (`SGEMM_FROM_ROWS` in `affine_kernels.cpp`).
const INT8_BELOW_ROWS: usize = 32;

fn best_int8_exists() -> bool {
    [
        KernelIsa::Int8Avx2,
        KernelIsa::Int8AvxVnni,
        KernelIsa::Int8Avx512Vnni,
    ]
    .into_iter()
    .any(KernelIsa::is_available)
}

/// `dequantize(packed, scales, biases)` as f32 with shoal's CPU kernel (2- to 8-bit weights,
/// groups of a multiple of 8, any leading axes): MLX's `dequantize` refuses groups of 16 and
/// unpacks one weight at a time.
pub fn affine_dequantize(
    packed: &Array,
    scales: &Array,
    biases: &Array,
    layout: Layout,
    isa: KernelIsa,
) -> Result<Array> {
    raw_op("shoal_cpu_affine_dequantize", |res, stream| unsafe {
        crate::ffi::shoal_cpu_affine_dequantize(
            res,
            packed.as_ptr(),
            scales.as_ptr(),
            biases.as_ptr(),
            layout.group_size,
            layout.bits,
            isa.code(),
            stream,
        )
    })
}

/// `x @ dequantize(packed, scales, biases)^T` with shoal's CPU kernel: `x` f32 `[..., k]`,
/// `packed` `[n, k * bits / 32]` uint32, `scales` and `biases` `[n, k / group]` (f32, f16 or
/// bf16). Errors name what does not fit.
pub fn affine_product(
    x: &Array,
    packed: &Array,
    scales: &Array,
    biases: &Array,
    layout: Layout,
    isa: KernelIsa,
) -> Result<Array> {
    raw_op("shoal_cpu_affine_qmm", |res, stream| unsafe {
        crate::ffi::shoal_cpu_affine_qmm(
            res,
            x.as_ptr(),
            packed.as_ptr(),
            scales.as_ptr(),
            biases.as_ptr(),
            layout.group_size,
            layout.bits,
            isa.code(),
            stream,
        )
    })
}

/// The gathered product (MLX's `gather_qmm` with expert indices only) with shoal's CPU
/// kernel: batch entry `b` of `x` `[..., m, k]`, broadcast with `experts`, is multiplied by
/// the stacked weights `experts[b]` of `[experts, n, k * bits / 32]`; the rows that use one
/// expert are done together, so sorting them first is not needed.
pub fn affine_gather_product(
    x: &Array,
    packed: &Array,
    scales: &Array,
    biases: &Array,
    experts: &Array,
    layout: Layout,
    isa: KernelIsa,
) -> Result<Array> {
    raw_op("shoal_cpu_affine_gather_qmm", |res, stream| unsafe {
        crate::ffi::shoal_cpu_affine_gather_qmm(
            res,
            x.as_ptr(),
            packed.as_ptr(),
            scales.as_ptr(),
            biases.as_ptr(),
            experts.as_ptr(),
            layout.group_size,
            layout.bits,
            isa.code(),
            stream,
        )
    })
}

/// One quantized matrix's arrays as shoal's kernel reads them (`[n, k * bits / 32]` packed
/// words, `[n, k / group]` scales and biases).
pub struct AffineOperands<'a> {
    /// The packed words.
    pub packed: &'a Array,
    /// Per-group scales.
    pub scales: &'a Array,
    /// Per-group biases.
    pub biases: &'a Array,
}

/// `silu(x @ gate^T) * (x @ up^T)` with shoal's CPU kernel, as one primitive (SwiGLU's two
/// products and their combination): both matrices of `layout`, `x`
/// f32 `[..., k]`. Errors name what does not fit; `inference::linear::swiglu` says when a
/// layer's projections fit.
pub fn swiglu_product(
    x: &Array,
    gate: AffineOperands<'_>,
    up: AffineOperands<'_>,
    layout: Layout,
    isa: KernelIsa,
) -> Result<Array> {
    raw_op("shoal_cpu_swiglu_qmm", |res, stream| unsafe {
        // SAFETY: live handles, which the entry only reads; it fills `res` or reports.
        crate::ffi::shoal_cpu_swiglu_qmm(
            res,
            x.as_ptr(),
            gate.packed.as_ptr(),
            gate.scales.as_ptr(),
            gate.biases.as_ptr(),
            up.packed.as_ptr(),
            up.scales.as_ptr(),
            up.biases.as_ptr(),
            layout.group_size,
            layout.bits,
            isa.code(),
            stream,
        )
    })
}
