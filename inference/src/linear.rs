//! Linear layers and embeddings over dense or MLX-quantized weights.

use crate::error::Result;
use crate::quantized::{slice_axis, QuantizedMatrix};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{ops, Array};
use std::sync::atomic::{AtomicU8, Ordering};

/// A weight matrix `[out, in]`, dense or quantized as MLX stores it.
#[derive(Debug, Clone)]
pub enum Matrix {
    /// Plain floats.
    Dense(Array),
    /// Packed weights with per-group scales (see [`QuantizedMatrix`]).
    Quantized(QuantizedMatrix),
}

/// Rows per product when one row of activations meets a tall f32 matrix (the output head).
///
/// OpenBLAS (0.3.21, as Debian ships it) runs `1 x 576 @ 576 x 2048` in its single-threaded
/// small-matrix kernel straight from the weights, while the whole `1 x 576 @ 576 x 49152` head
/// goes through its general path, which first copies (packs) all 113 MB of the matrix: measured
/// through MLX, 8.1 ms for the head in slices of 2048 rows against 9.5 ms in one product, and no
/// OpenBLAS worker thread left spinning on the second core while the next step is built.
const HEAD_SLICE_ROWS: i32 = 2048;

/// The tallest matrix multiplied as `W @ x^T`; taller ones are output heads (vocabularies of
/// 32k to 152k rows), for which the transposed product in slices is faster.
const MATRIX_VECTOR_MAX_ROWS: i32 = 16384;

/// How one row of f32 activations is multiplied by a dense f32 matrix `W` `[out, in]`.
enum RowProduct {
    /// `W @ x^T`, a plain matrix-vector product, where BLAS runs it faster than the
    /// transposed `x @ W^T` for the layers' matrices (see [`calibrate_row_product`]).
    MatrixVector,
    /// `x @ W^T` over slices of [`HEAD_SLICE_ROWS`] rows, for the output head.
    Sliced,
}

/// Whether one-row products of the layers' matrices run as `W @ x^T`: unmeasured (0), yes
/// (1), no (2).
static MATRIX_VECTOR: AtomicU8 = AtomicU8::new(0);

/// Times a one-row product with `w` (a layer's dense f32 matrix) both ways, `x @ W^T` and
/// `W @ x^T`, and keeps the faster for every later one-row product of this process. Which is
/// faster depends on the CPU and the kernels OpenBLAS picks for it: `W @ x^T` decoded the
/// fixture at 17.6 tok/s against 14.9 on one machine, and `x @ W^T` was 25% faster on another
/// (68-74 against 92-104 ms per token). Measured once, at the first load; a few tens of
/// milliseconds.
pub fn calibrate_row_product(w: &Array) -> Result<()> {
    if MATRIX_VECTOR.load(Ordering::Relaxed) != 0
        || w.dtype() != mlx_rs::Dtype::Float32
        || w.ndim() != 2
    {
        return Ok(());
    }
    let in_dim = w.shape()[1];
    let x = ops::ones::<f32>(&[1, 1, in_dim])?;
    let transposed = || -> Result<Array> { Ok(ops::matmul(&x, w.t())?) };
    let vector = || -> Result<Array> { Ok(ops::matmul(w, x.reshape(&[in_dim, 1])?)?) };
    let time = |f: &dyn Fn() -> Result<Array>| -> Result<std::time::Duration> {
        let started = std::time::Instant::now();
        for _ in 0..4 {
            f()?.eval()?;
        }
        Ok(started.elapsed())
    };
    time(&transposed)?;
    time(&vector)?;
    let (mut t, mut v) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        t.push(time(&transposed)?);
        v.push(time(&vector)?);
    }
    t.sort();
    v.sort();
    let use_vector = v[2] < t[2];
    MATRIX_VECTOR.store(if use_vector { 1 } else { 2 }, Ordering::Relaxed);
    tracing::info!(
        transposed_us = t[2].as_micros() as u64 / 4,
        matrix_vector_us = v[2].as_micros() as u64 / 4,
        use_vector,
        "one-row products timed"
    );
    Ok(())
}

fn row_product(x: &Array, w: &Array) -> Option<RowProduct> {
    let one_row = x.size() as i32 == *x.shape().last().unwrap_or(&0);
    if !one_row || w.dtype() != mlx_rs::Dtype::Float32 {
        None
    } else if w.shape()[0] > MATRIX_VECTOR_MAX_ROWS {
        Some(RowProduct::Sliced)
    } else if MATRIX_VECTOR.load(Ordering::Relaxed) == 1 {
        Some(RowProduct::MatrixVector)
    } else {
        None
    }
}

/// `x @ W^T` for one row `x` as the matrix-vector product `W @ x^T`.
fn matrix_vector(w: &Array, x: &Array) -> Result<Array> {
    let (out_dim, in_dim) = (w.shape()[0], w.shape()[1]);
    let mut shape = x.shape().to_vec();
    *shape.last_mut().unwrap_or(&mut 0) = out_dim;
    Ok(ops::matmul(w, x.reshape(&[in_dim, 1])?)?.reshape(&shape)?)
}

/// `x @ W^T` over slices of [`HEAD_SLICE_ROWS`] rows of `W`.
fn sliced(w: &Array, x: &Array) -> Result<Array> {
    let rows = w.shape()[0];
    let parts = (0..rows)
        .step_by(HEAD_SLICE_ROWS as usize)
        .map(|start| {
            let slice = w.index(start..(start + HEAD_SLICE_ROWS).min(rows));
            ops::matmul(x, slice.t())
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(ops::concatenate(&parts, -1)?)
}

impl Matrix {
    /// `x @ W^T`.
    pub fn apply(&self, x: &Array) -> Result<Array> {
        Ok(match self {
            Matrix::Dense(w) => match row_product(x, w) {
                Some(RowProduct::MatrixVector) => matrix_vector(w, x)?,
                Some(RowProduct::Sliced) => sliced(w, x)?,
                None => ops::matmul(x, w.t())?,
            },
            Matrix::Quantized(q) => q.matmul(x)?,
        })
    }

    /// The output head's product: [`Self::apply`], with x kept in f32 where a quantized
    /// product would round it to int8. The head's errors land on the logits unnormalized: on
    /// the SmolLM2 fixture (4-bit layers, 8-bit tied head) int8 x in the head alone turned the
    /// greedy answer to "What is the capital of France?" from "The capital of France is
    /// Paris." into "L'Étoile, la Marseillaise, ..."; in the layers it did not. It costs about
    /// 1 ms a token there (28 MB of 8-bit weights at 1.50 against 0.94 ms per 13 MB).
    pub fn apply_to_hidden_state(&self, x: &Array) -> Result<Array> {
        match self {
            Matrix::Quantized(q) => q.matmul_exact_x(x),
            dense => dense.apply(x),
        }
    }

    /// Rows `ids` of the matrix as dense floats (an embedding lookup).
    pub fn rows(&self, ids: &Array) -> Result<Array> {
        Ok(match self {
            Matrix::Dense(w) => w.take_axis(ids, 0)?,
            Matrix::Quantized(q) => q.rows(ids)?,
        })
    }

    /// The arrays that hold this matrix (to evaluate them eagerly).
    pub fn arrays(&self) -> Vec<&Array> {
        match self {
            Matrix::Dense(w) => vec![w],
            Matrix::Quantized(q) => q.arrays(),
        }
    }

    /// Output rows.
    pub fn out_rows(&self) -> usize {
        match self {
            Matrix::Dense(w) => w.shape()[0] as usize,
            Matrix::Quantized(q) => q.out_rows(),
        }
    }

    /// Output rows `[start, end)` (a column-parallel slice).
    pub fn slice_rows(&self, start: usize, end: usize) -> Result<Matrix> {
        Ok(match self {
            Matrix::Dense(w) => Matrix::Dense(slice_axis(w, 0, start, end)?),
            Matrix::Quantized(q) => Matrix::Quantized(q.slice_rows(start, end)?),
        })
    }

    /// The output rows in the order `order` (row `i` of the result is row `order[i]`): how a
    /// family whose reference rotates interleaved pairs lays its query and key rows out for
    /// the half-split RoPE every attention runs (see [`interleaved_to_half_split`]).
    pub fn reorder_rows(&self, order: &[i32]) -> Result<Matrix> {
        let idx = Array::from_slice(order, &[order.len() as i32]);
        let take = |a: &Array| -> Result<Array> { Ok(a.take_axis(&idx, -2)?) };
        Ok(match self {
            Matrix::Dense(w) => Matrix::Dense(take(w)?),
            Matrix::Quantized(q) => Matrix::Quantized(QuantizedMatrix {
                packed: take(&q.packed)?,
                scales: take(&q.scales)?,
                biases: q.biases.as_ref().map(take).transpose()?,
                spec: q.spec,
            }),
        })
    }

    /// Input columns `[start, end)` (a row-parallel slice; quantized, at group boundaries).
    pub fn slice_columns(&self, start: usize, end: usize, what: &str) -> Result<Matrix> {
        Ok(match self {
            Matrix::Dense(w) => Matrix::Dense(slice_axis(w, 1, start, end)?),
            Matrix::Quantized(q) => Matrix::Quantized(q.slice_columns(start, end, what)?),
        })
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

    /// Output rows `[start, end)` with their bias (a column-parallel slice).
    pub fn slice_rows(&self, start: usize, end: usize) -> Result<Linear> {
        Ok(Linear {
            weight: self.weight.slice_rows(start, end)?,
            bias: self
                .bias
                .as_ref()
                .map(|b| slice_axis(b, 0, start, end))
                .transpose()?,
        })
    }

    /// The output rows (and bias entries) in the order `order` (see [`Matrix::reorder_rows`]).
    pub fn reorder_rows(&self, order: &[i32]) -> Result<Linear> {
        let idx = Array::from_slice(order, &[order.len() as i32]);
        Ok(Linear {
            weight: self.weight.reorder_rows(order)?,
            bias: self
                .bias
                .as_ref()
                .map(|b| b.take_axis(&idx, 0))
                .transpose()?,
        })
    }

    /// Input columns `[start, end)` of one of `ranks` row-parallel slices. The ranks' partial
    /// outputs are summed, so each keeps `bias / ranks` and the sum adds it once.
    pub fn slice_columns(
        &self,
        start: usize,
        end: usize,
        ranks: usize,
        what: &str,
    ) -> Result<Linear> {
        Ok(Linear {
            weight: self.weight.slice_columns(start, end, what)?,
            bias: self
                .bias
                .as_ref()
                .map(|b| ops::divide(b, Array::from_f32(ranks as f32)))
                .transpose()?,
        })
    }

    /// The arrays of this layer.
    pub fn arrays(&self) -> Vec<&Array> {
        let mut v = self.weight.arrays();
        v.extend(self.bias.iter());
        v
    }
}

/// The row order that turns `heads` heads of `head_dim` rows laid out for interleaved
/// ("traditional") RoPE, which rotates features `(2i, 2i + 1)` together, into the half-split
/// layout, which rotates `(i, i + head_dim / 2)`: each head's even rows, then its odd rows.
/// Queries and keys reordered alike give the same products, so attention is unchanged.
pub fn interleaved_to_half_split(heads: usize, head_dim: usize) -> Vec<i32> {
    (0..heads)
        .flat_map(|h| {
            let base = (h * head_dim) as i32;
            (0..head_dim as i32)
                .step_by(2)
                .chain((1..head_dim as i32).step_by(2))
                .map(move |r| base + r)
        })
        .collect()
}

/// `silu(gate(x)) * up(x)` (SwiGLU's gate and up projections and their combination) as one
/// primitive where shoal's CPU kernel serves both projections alike (quantized, one layout,
/// no bias): one array for four in every MLP of a decode step. `None` where it does not: the
/// caller composes the operations.
pub fn swiglu(x: &Array, gate: &Linear, up: &Linear) -> Result<Option<Array>> {
    match (&gate.weight, &up.weight, &gate.bias, &up.bias) {
        (Matrix::Quantized(g), Matrix::Quantized(u), None, None) => g.swiglu_with(u, x),
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(a: &Array) -> Vec<f32> {
        a.eval().unwrap();
        a.as_slice::<f32>().to_vec()
    }

    /// The matrix-vector and sliced forms compute the same product as the plain one, and
    /// whatever the timing chose, `apply` does too.
    #[test]
    fn row_products_agree_with_the_plain_product() {
        mlx_rs::random::seed(7).unwrap();
        let rows = MATRIX_VECTOR_MAX_ROWS + 3 * HEAD_SLICE_ROWS + 5;
        let head = mlx_rs::random::normal::<f32>(&[rows, 64], None, None, None).unwrap();
        let layer = mlx_rs::random::normal::<f32>(&[300, 64], None, None, None).unwrap();
        let x = mlx_rs::random::normal::<f32>(&[1, 1, 64], None, None, None).unwrap();
        calibrate_row_product(&layer).unwrap();
        assert_ne!(MATRIX_VECTOR.load(Ordering::Relaxed), 0);
        assert!(matches!(row_product(&x, &head), Some(RowProduct::Sliced)));
        let forms: [(&Array, Array); 4] = [
            (&layer, matrix_vector(&layer, &x).unwrap()),
            (&layer, Matrix::Dense(layer.clone()).apply(&x).unwrap()),
            (&head, sliced(&head, &x).unwrap()),
            (&head, Matrix::Dense(head.clone()).apply(&x).unwrap()),
        ];
        for (w, got) in forms {
            let rows = w.shape()[0];
            assert_eq!(got.shape(), &[1, 1, rows]);
            let want = host(&ops::matmul(&x, w.t()).unwrap());
            let got = host(&got);
            let diff = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(diff < 1e-4, "{rows} rows: differ by {diff}");
        }
    }
}
