//! Linear layers and embeddings over dense or MLX-quantized weights.

use crate::error::Result;
use mlx_rs::{ops, Array};

/// A weight matrix `[out, in]`, dense or in MLX's affine quantized layout.
#[derive(Debug, Clone)]
pub enum Matrix {
    /// Plain floats.
    Dense(Array),
    /// Packed integers with per-group scales and biases.
    Quantized {
        /// Packed `u32` words, `[out, in * bits / 32]`.
        packed: Array,
        /// `[out, in / group_size]`.
        scales: Array,
        /// `[out, in / group_size]`.
        biases: Array,
        /// Weights per group.
        group_size: i32,
        /// Bits per weight.
        bits: i32,
    },
}

/// Whether `x @ W^T` should run as `W @ x^T`: a single row of f32 against a matrix of
/// moderate height (for the huge output head the transposed product is faster).
fn gemv_path(x: &Array, w: &Array) -> bool {
    static MAX_ROWS: std::sync::OnceLock<i32> = std::sync::OnceLock::new();
    let max_rows = *MAX_ROWS.get_or_init(|| {
        std::env::var("SHOAL_GEMV_MAX_ROWS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(16384)
    });
    x.size() as i32 == *x.shape().last().unwrap_or(&0)
        && w.shape()[0] <= max_rows
        && w.dtype() == mlx_rs::Dtype::Float32
}

impl Matrix {
    /// `x @ W^T`.
    pub fn apply(&self, x: &Array) -> Result<Array> {
        Ok(match self {
            Matrix::Dense(w) if gemv_path(x, w) => {
                // One row: W @ x^T is a plain matrix-vector product, which BLAS runs much
                // faster than the transposed x @ W^T (measured through MLX + OpenBLAS).
                let (out_dim, in_dim) = (w.shape()[0], w.shape()[1]);
                let mut shape = x.shape().to_vec();
                *shape.last_mut().unwrap_or(&mut 0) = out_dim;
                ops::matmul(w, x.reshape(&[in_dim, 1])?)?.reshape(&shape)?
            }
            Matrix::Dense(w) => ops::matmul(x, w.t())?,
            Matrix::Quantized {
                packed,
                scales,
                biases,
                group_size,
                bits,
            } => ops::quantized_matmul(x, packed, scales, biases, true, *group_size, *bits)?,
        })
    }

    /// Rows `ids` of the matrix as dense floats (an embedding lookup).
    pub fn rows(&self, ids: &Array) -> Result<Array> {
        Ok(match self {
            Matrix::Dense(w) => w.take_axis(ids, 0)?,
            Matrix::Quantized {
                packed,
                scales,
                biases,
                group_size,
                bits,
            } => ops::dequantize(
                packed.take_axis(ids, 0)?,
                scales.take_axis(ids, 0)?,
                &biases.take_axis(ids, 0)?,
                *group_size,
                *bits,
            )?,
        })
    }

    /// The arrays that hold this matrix (to evaluate them eagerly).
    pub fn arrays(&self) -> Vec<&Array> {
        match self {
            Matrix::Dense(w) => vec![w],
            Matrix::Quantized {
                packed,
                scales,
                biases,
                ..
            } => vec![packed, scales, biases],
        }
    }
}

/// `y = x W^T + b`.
#[derive(Debug, Clone)]
pub struct Linear {
    /// The weight.
    pub weight: Matrix,
    /// Optional bias `[out]`.
    pub bias: Option<Array>,
}

impl Linear {
    /// Applies the layer.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let y = self.weight.apply(x)?;
        Ok(match &self.bias {
            Some(b) => ops::add(&y, b)?,
            None => y,
        })
    }

    /// The arrays of this layer.
    pub fn arrays(&self) -> Vec<&Array> {
        let mut v = self.weight.arrays();
        v.extend(self.bias.iter());
        v
    }
}
