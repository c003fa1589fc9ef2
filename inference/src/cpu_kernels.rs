//! shoal's own CPU products with MLX affine-quantized weights (the C++ primitive in
//! `native/kernels/cpp/cpu_qmm.cpp`, wrapped by the `shoal-kernels` crate's `kernels::qmm`), and
//! when a quantized product uses them.
//!
//! MLX's CPU `quantized_matmul` unpacks weights one at a time: on this 2-core machine a 4-bit
//! 2048 → 5632 product for one token takes 10.1 ms, where reading those 7.2 MB at the
//! bandwidth f32 products reach would take under 1 ms. The primitive decodes eight weights per
//! AVX2 instruction and uses each decoded vector for up to eight rows of `x` (the decode rows
//! of a batch, a prefill's positions), shares large products with a helper thread per core,
//! and runs inside MLX's graph like any other operation (no evaluation barrier). It serves 2-,
//! 3-, 4-, 5-, 6- and 8-bit affine weights in MLX's packing with groups of any multiple of 8
//! (the 16 of GGUF's repacked K-quants included, which MLX's own kernels refuse), for any
//! number of rows: from 32 rows (a prefill) it dequantizes tiles of weights and multiplies
//! them with the BLAS's sgemm (`cargo run --release -p inference --example qmm_bench`).
//!
//! The gathered form (Mixture-of-Experts layers' `gather_qmm`) groups the (token, expert)
//! rows by expert and runs one such product per expert used. A second primitive dequantizes
//! (embedding lookups of quantized embeddings; MLX's CPU `dequantize` unpacks one weight at a
//! time and refuses groups of 16).
//!
//! With `SHOAL_QMM=int8`, products of fewer than 32 rows (decode) with 4- and 8-bit weights
//! round `x` to int8 per row and chunk of 32 values, so that 32 weights cost one or two
//! byte-product instructions (`vpdpbusd` with VNNI, `vpmaddubsw` with AVX2) instead of eight
//! float ones: each output differs from the exact sum by at most
//! `sum |s * (q - middle)| * dx / 2` (`dx = max|x| / 127` of the chunk; the weights centred,
//! their constant part meeting the exact sum of x), as llama.cpp's 8-bit activations do. One
//! 4-bit decode row of 2048 -> 5632 takes 0.53 ms that way against 0.88 ms with x in f32, but
//! it is not the default: on the SmolLM2 fixture the first token of the answer to "What is the
//! capital of France?" is a near tie, and int8 x in the last prompt position's layers turns
//! "The capital of France is Paris." into "L'Étoile, la Marseillaise, ...". The output head
//! keeps x in f32 even then ([`crate::linear::Matrix::apply_to_hidden_state`]).
//!
//! `SHOAL_QMM` chooses: `auto` or `exact` (default) the fastest path the CPU has with x kept
//! in f32, `int8` the int8-x decode products above, `scalar` the plain C++ path, `mlx` MLX's own kernels (to compare). GPU
//! builds always use MLX's.

use crate::error::Result;
use crate::quant_spec::{QuantMode, QuantSpec};
use mlx_rs::{Array, Dtype};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

/// The variable that chooses the CPU quantized kernels (see the module docs).
pub const QMM_ENV: &str = "SHOAL_QMM";

pub use kernels::{AffineOperands, KernelIsa};

/// The kernels' name for a matrix's quantization.
fn layout(spec: QuantSpec) -> kernels::Layout {
    kernels::Layout {
        group_size: spec.group_size,
        bits: spec.bits,
    }
}

/// Set by [`round_x_to_int8`]: 0 as `SHOAL_QMM` says, 1 x exact, 2 x rounded to int8.
static X_ROUNDING: AtomicU8 = AtomicU8::new(0);

/// Rounds x to int8 in the decode-sized products this process builds from now on (`on`), or
/// keeps it in f32 (`!on`), whatever `SHOAL_QMM` says: for tests that measure one against the
/// other, or compare the kernel's sums with another implementation's at float rounding.
pub fn round_x_to_int8(on: bool) {
    X_ROUNDING.store(if on { 2 } else { 1 }, Ordering::Relaxed);
}

/// What `SHOAL_QMM` asks for: `None` for MLX's kernels.
fn chosen() -> Option<KernelIsa> {
    static CHOSEN: OnceLock<Option<KernelIsa>> = OnceLock::new();
    *CHOSEN.get_or_init(|| {
        let on_cpu = mlx_rs::Device::try_default()
            .and_then(|d| d.get_type())
            .is_ok_and(|t| matches!(t, mlx_rs::DeviceType::Cpu));
        if !on_cpu {
            return None;
        }
        match std::env::var(QMM_ENV).as_deref().map(str::trim) {
            Ok("mlx") => None,
            Ok("scalar") => Some(KernelIsa::Scalar),
            Ok("int8") => Some(KernelIsa::Best),
            Ok("auto") | Ok("exact") | Ok("") | Err(_) => Some(KernelIsa::Exact),
            Ok(other) => {
                tracing::warn!(
                    value = other,
                    "{QMM_ENV} is auto, int8, exact, scalar or mlx; using auto"
                );
                Some(KernelIsa::Exact)
            }
        }
    })
}

/// Whether shoal's kernel serves `x @ matrix^T` (a 2-D matrix) or the gathered product (3-D,
/// stacked experts) for a matrix of `spec` whose packed words have `packed_ndim` axes, and
/// with which instructions. `exact_x`: this product keeps x in f32 (the output head, see
/// [`crate::linear::Matrix::apply_to_hidden_state`]).
pub(crate) fn product_isa(
    spec: QuantSpec,
    packed_ndim: usize,
    x: &Array,
    exact_x: bool,
) -> Option<KernelIsa> {
    let isa = match (chosen()?, X_ROUNDING.load(Ordering::Relaxed)) {
        (KernelIsa::Best | KernelIsa::Exact, 1) => KernelIsa::Exact,
        (KernelIsa::Best | KernelIsa::Exact, 2) => KernelIsa::Best,
        (isa, _) => isa,
    };
    let isa = if exact_x && isa == KernelIsa::Best {
        KernelIsa::Exact
    } else {
        isa
    };
    let fits = serves(spec) && matches!(packed_ndim, 2 | 3) && x.dtype() == Dtype::Float32;
    fits.then_some(isa)
}

/// Whether shoal's CPU kernel serves weights quantized as `spec` (affine, 2, 3, 4, 5, 6 or 8
/// bits, groups of a multiple of 8): a property of the file alone, so every node decides the
/// same ([`crate::weights::WeightFormat::preferred`] keeps such files quantized on the CPU).
pub fn serves(spec: QuantSpec) -> bool {
    spec.mode == QuantMode::Affine
        && matches!(spec.bits, 2 | 3 | 4 | 5 | 6 | 8)
        && spec.group_size > 0
        && spec.group_size % 8 == 0
}

/// Whether MLX's own kernels (`quantized_matmul`, `dequantize`: used on GPUs and with
/// `SHOAL_QMM=mlx`) read weights of `spec`: MLX 0.32 takes groups of 32, 64 and 128 only.
pub fn mlx_reads(spec: QuantSpec) -> bool {
    matches!(spec.group_size, 32 | 64 | 128)
}

/// The instructions shoal's kernel runs with in this process, `None` where MLX's kernels run
/// instead (a GPU device, or `SHOAL_QMM=mlx`).
pub fn active() -> Option<KernelIsa> {
    chosen()
}

/// `dequantize(packed, scales, biases)` as f32 with shoal's CPU kernel (the layouts
/// [`serves`] names, of any leading axes): MLX's `dequantize` refuses groups of 16 and unpacks
/// one weight at a time.
pub fn affine_dequantize(
    packed: &Array,
    scales: &Array,
    biases: &Array,
    spec: QuantSpec,
    isa: KernelIsa,
) -> Result<Array> {
    Ok(kernels::affine_dequantize(
        packed,
        scales,
        biases,
        layout(spec),
        isa,
    )?)
}

/// `x @ dequantize(packed, scales, biases)^T` with shoal's CPU kernel: `x` f32 `[..., k]`,
/// `packed` `[n, k * bits / 32]` uint32, `scales` and `biases` `[n, k / group]` (f32, f16 or
/// bf16). Errors name what does not fit.
pub fn affine_product(
    x: &Array,
    packed: &Array,
    scales: &Array,
    biases: &Array,
    spec: QuantSpec,
    isa: KernelIsa,
) -> Result<Array> {
    Ok(kernels::affine_product(
        x,
        packed,
        scales,
        biases,
        layout(spec),
        isa,
    )?)
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
    spec: QuantSpec,
    isa: KernelIsa,
) -> Result<Array> {
    Ok(kernels::affine_gather_product(
        x,
        packed,
        scales,
        biases,
        experts,
        layout(spec),
        isa,
    )?)
}

/// `silu(x @ gate^T) * (x @ up^T)` with shoal's CPU kernel, as one primitive (SwiGLU's two
/// products and their combination): both matrices of `spec`, `x` f32 `[..., k]`. Errors name
/// what does not fit; [`crate::linear::swiglu`] says when a layer's projections fit.
pub fn swiglu_product(
    x: &Array,
    gate: AffineOperands<'_>,
    up: AffineOperands<'_>,
    spec: QuantSpec,
    isa: KernelIsa,
) -> Result<Array> {
    Ok(kernels::swiglu_product(x, gate, up, layout(spec), isa)?)
}
