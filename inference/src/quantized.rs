//! Quantized weights as MLX stores them: packed integers (or micro-scaled floats) with per-group
//! scales, in the modes MLX-community checkpoints use (`affine` 2–8 bit with per-group biases,
//! `mxfp4` and `mxfp8` with shared power-of-two scales and no biases).
//!
//! A [`QuantizedMatrix`] is one projection `[out, in]` or a stack of experts' projections
//! `[experts, out, in]`; it multiplies (`quantized_matmul`, `gather_qmm`), dequantizes, and cuts
//! itself for tensor parallelism at group boundaries. mlx-rs 0.33 passes `mode = "affine"` to
//! every quantized op, so the micro-scaled modes call mlx-c directly.

use crate::error::{InferenceError, Result};
pub use crate::quant_spec::{QuantMode, QuantSpec};
use crate::raw_op::raw_op;
use mlx_rs::{ops, Array, Dtype};

/// A quantized weight: `[out, in]` or, for a Mixture-of-Experts layer, `[experts, out, in]`
/// (the packed words' last axis holds `in * bits / 32` words; scales and biases have
/// `in / group_size` columns).
#[derive(Debug, Clone)]
pub struct QuantizedMatrix {
    /// Packed `u32` words.
    pub packed: Array,
    /// Per-group scales (floats for affine, `u8` exponents for the MX modes).
    pub scales: Array,
    /// Per-group biases (affine only).
    pub biases: Option<Array>,
    /// How the weights are encoded.
    pub spec: QuantSpec,
}

fn optional_int(value: i32) -> mlx_sys::mlx_optional_int {
    mlx_sys::mlx_optional_int {
        value,
        has_value: true,
    }
}

fn null_array() -> mlx_sys::mlx_array {
    // SAFETY: an empty handle stands for "no array" in mlx-c's optional arguments.
    unsafe { mlx_sys::mlx_array_new() }
}

impl QuantizedMatrix {
    /// Output rows (the second-to-last axis).
    pub fn out_rows(&self) -> usize {
        let s = self.packed.shape();
        s[s.len() - 2] as usize
    }

    /// Input columns, as the weights were before packing.
    pub fn in_columns(&self) -> usize {
        let s = self.packed.shape();
        s[s.len() - 1] as usize * 32 / self.spec.bits as usize
    }

    /// `x @ W^T` for a 2-D weight.
    pub fn matmul(&self, x: &Array) -> Result<Array> {
        self.product(x, false)
    }

    /// [`Self::matmul`] with x kept in f32 on shoal's CPU kernel, where decode-sized products
    /// would round it to int8 (see [`crate::cpu_kernels`]): for the output head.
    pub fn matmul_exact_x(&self, x: &Array) -> Result<Array> {
        self.product(x, true)
    }

    fn product(&self, x: &Array, exact_x: bool) -> Result<Array> {
        let QuantSpec {
            group_size,
            bits,
            mode,
        } = self.spec;
        if mode == QuantMode::Affine {
            let biases = self.biases.as_ref().ok_or_else(|| {
                InferenceError::InvalidRequest("an affine quantized matrix has no biases".into())
            })?;
            if let Some(isa) =
                crate::cpu_kernels::product_isa(self.spec, self.packed.ndim(), x, exact_x)
                    .filter(|_| self.packed.ndim() == 2)
            {
                return crate::cpu_kernels::affine_product(
                    x,
                    &self.packed,
                    &self.scales,
                    biases,
                    self.spec,
                    isa,
                );
            }
            return Ok(ops::quantized_matmul(
                x,
                &self.packed,
                &self.scales,
                biases,
                true,
                group_size,
                bits,
            )?);
        }
        raw_op("quantized_matmul", |res, stream| unsafe {
            mlx_sys::mlx_quantized_matmul(
                res,
                x.as_ptr(),
                self.packed.as_ptr(),
                self.scales.as_ptr(),
                null_array(),
                true,
                optional_int(group_size),
                optional_int(bits),
                mode.c_name().as_ptr(),
                stream,
            )
        })
    }

    /// `silu(x @ self^T) * (x @ up^T)` as one primitive on shoal's CPU kernel, with `self` the
    /// gate: `None` where the kernel does not serve both alike (2-D, affine, one layout, f32
    /// `x`), and the caller composes the operations.
    pub fn swiglu_with(&self, up: &QuantizedMatrix, x: &Array) -> Result<Option<Array>> {
        let (Some(gate_biases), Some(up_biases)) = (self.biases.as_ref(), up.biases.as_ref())
        else {
            return Ok(None);
        };
        let alike = self.spec == up.spec && self.packed.ndim() == 2 && up.packed.ndim() == 2;
        let Some(isa) = crate::cpu_kernels::product_isa(self.spec, 2, x, false).filter(|_| alike)
        else {
            return Ok(None);
        };
        use crate::cpu_kernels::AffineOperands;
        let gate = AffineOperands {
            packed: &self.packed,
            scales: &self.scales,
            biases: gate_biases,
        };
        let up = AffineOperands {
            packed: &up.packed,
            scales: &up.scales,
            biases: up_biases,
        };
        crate::cpu_kernels::swiglu_product(x, gate, up, self.spec, isa).map(Some)
    }

    /// `x @ W[e]^T` for each expert `e` in `experts` (a 3-D weight), as `gather_qmm` does it:
    /// `x` `[..., 1, in]` broadcast against `experts` `[...]`.
    pub fn gather_matmul(&self, x: &Array, experts: &Array, sorted: bool) -> Result<Array> {
        let QuantSpec {
            group_size,
            bits,
            mode,
        } = self.spec;
        if mode == QuantMode::Affine {
            if let (Some(isa), Some(biases)) = (
                crate::cpu_kernels::product_isa(self.spec, self.packed.ndim(), x, false),
                self.biases.as_ref(),
            ) {
                if self.packed.ndim() == 3 {
                    return crate::cpu_kernels::affine_gather_product(
                        x,
                        &self.packed,
                        &self.scales,
                        biases,
                        experts,
                        self.spec,
                        isa,
                    );
                }
            }
            return Ok(ops::gather_qmm(
                x,
                &self.packed,
                &self.scales,
                self.biases.as_ref(),
                None,
                experts,
                true,
                group_size,
                bits,
                sorted,
            )?);
        }
        raw_op("gather_qmm", |res, stream| unsafe {
            mlx_sys::mlx_gather_qmm(
                res,
                x.as_ptr(),
                self.packed.as_ptr(),
                self.scales.as_ptr(),
                null_array(),
                null_array(),
                experts.as_ptr(),
                true,
                optional_int(group_size),
                optional_int(bits),
                mode.c_name().as_ptr(),
                sorted,
                stream,
            )
        })
    }

    /// The weights as floats of `dtype`.
    pub fn dequantize(&self, dtype: Dtype) -> Result<Array> {
        dequantize_parts(&self.packed, &self.scales, self.biases.as_ref(), self.spec)?
            .as_dtype(dtype)
            .map_err(Into::into)
    }

    /// Rows `ids` (of a 2-D weight) as floats (an embedding lookup).
    pub fn rows(&self, ids: &Array) -> Result<Array> {
        let biases = match &self.biases {
            Some(b) => Some(b.take_axis(ids, 0)?),
            None => None,
        };
        dequantize_parts(
            &self.packed.take_axis(ids, 0)?,
            &self.scales.take_axis(ids, 0)?,
            biases.as_ref(),
            self.spec,
        )
    }

    /// Output rows `[start, end)` (a column-parallel slice; the second-to-last axis).
    pub fn slice_rows(&self, start: usize, end: usize) -> Result<QuantizedMatrix> {
        let cut = |a: &Array| -> Result<Array> { slice_axis(a, -2, start, end) };
        Ok(QuantizedMatrix {
            packed: cut(&self.packed)?,
            scales: cut(&self.scales)?,
            biases: self.biases.as_ref().map(cut).transpose()?,
            spec: self.spec,
        })
    }

    /// Input columns `[start, end)` (a row-parallel slice). Both ends must fall on group
    /// boundaries: a group shares one scale, so it cannot be split between ranks.
    pub fn slice_columns(&self, start: usize, end: usize, what: &str) -> Result<QuantizedMatrix> {
        let g = self.spec.group_size as usize;
        if !start.is_multiple_of(g) || !end.is_multiple_of(g) {
            return Err(InferenceError::BadSplit(format!(
                "{what}: columns {start}..{end} do not fall on its quantization groups of {g}; \
                 choose a ring size whose slices are multiples of {g} columns"
            )));
        }
        let bits = self.spec.bits as usize;
        if !(start * bits).is_multiple_of(32) || !(end * bits).is_multiple_of(32) {
            return Err(InferenceError::BadSplit(format!(
                "{what}: columns {start}..{end} do not start and end on whole packed words of \
                 {bits}-bit weights; choose a ring size whose slices are multiples of 32 columns"
            )));
        }
        let words = |c: usize| c * bits / 32;
        let (g0, g1) = (start / g, end / g);
        Ok(QuantizedMatrix {
            packed: slice_axis(&self.packed, -1, words(start), words(end))?,
            scales: slice_axis(&self.scales, -1, g0, g1)?,
            biases: self
                .biases
                .as_ref()
                .map(|b| slice_axis(b, -1, g0, g1))
                .transpose()?,
            spec: self.spec,
        })
    }

    /// The arrays that hold this matrix (to evaluate them eagerly).
    pub fn arrays(&self) -> Vec<&Array> {
        let mut v = vec![&self.packed, &self.scales];
        v.extend(self.biases.iter());
        v
    }
}

/// Indices `[start, end)` of `axis` (negative counts from the end), copied out so the whole
/// tensor it came from can be freed.
pub(crate) fn slice_axis(a: &Array, axis: i32, start: usize, end: usize) -> Result<Array> {
    let idx: Vec<i32> = (start as i32..end as i32).collect();
    Ok(a.take_axis(Array::from_slice(&idx, &[idx.len() as i32]), axis)?)
}

/// Dequantizes packed weights in any mode.
pub(crate) fn dequantize_parts(
    packed: &Array,
    scales: &Array,
    biases: Option<&Array>,
    spec: QuantSpec,
) -> Result<Array> {
    if spec.mode == QuantMode::Affine {
        let biases = biases.ok_or_else(|| {
            InferenceError::InvalidRequest("an affine quantized matrix has no biases".into())
        })?;
        if let Some(isa) = crate::cpu_kernels::active().filter(|_| crate::cpu_kernels::serves(spec))
        {
            // In the scales' dtype, as MLX's `dequantize` gives it, except f16: on the CPU only
            // GGUF files' Q4_0/Q4_1/Q8_0 keep f16 scales (the file's own, for memory), while
            // their weights run in f32; f16 rows would round the embedding (2.6e-3 on the
            // logits of a Q4_K_M file).
            let dtype = match scales.dtype() {
                Dtype::Float16 => Dtype::Float32,
                other => other,
            };
            return Ok(
                crate::cpu_kernels::affine_dequantize(packed, scales, biases, spec, isa)?
                    .as_dtype(dtype)?,
            );
        }
        return Ok(ops::dequantize(
            packed,
            scales,
            biases,
            spec.group_size,
            spec.bits,
        )?);
    }
    let dtype = mlx_sys::mlx_optional_dtype {
        value: mlx_sys::mlx_dtype__MLX_FLOAT32,
        has_value: true,
    };
    raw_op("dequantize", |res, stream| unsafe {
        mlx_sys::mlx_dequantize(
            res,
            packed.as_ptr(),
            scales.as_ptr(),
            null_array(),
            optional_int(spec.group_size),
            optional_int(spec.bits),
            spec.mode.c_name().as_ptr(),
            null_array(),
            dtype,
            stream,
        )
    })
}
