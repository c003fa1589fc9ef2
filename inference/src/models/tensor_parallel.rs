//! Tensor parallelism (Megatron style) over an MLX ring: every rank holds every layer, with a
//! contiguous slice of the attention heads and of the MLP's hidden units.
//!
//! Q, K, V, gate and up are column-parallel (each rank keeps its rows of `W[out, in]`); O and
//! down are row-parallel (each rank keeps its columns), so each block's output is a partial sum
//! that one `all_sum` completes. Rank r's query heads `[r·h/n, (r+1)·h/n)` use exactly its key/value
//! heads `[r·kv/n, (r+1)·kv/n)`, so grouped-query attention needs no communication. Embedding,
//! norms and head stay whole on every rank. The placement's rule (ring size divides the head and
//! key/value head counts) is checked again here, as is the MLP width.

use super::base::{Attention, DecoderLayer, Mlp};
use super::shard::ModelShard;
use crate::error::{InferenceError, Result};
use crate::linear::{Linear, Matrix};
use crate::ring::RingGroup;
use mlx_rs::Array;
use std::sync::Arc;

fn indices(start: usize, end: usize) -> Array {
    let idx: Vec<i32> = (start as i32..end as i32).collect();
    Array::from_slice(&idx, &[idx.len() as i32])
}

fn dense<'a>(linear: &'a Linear, what: &str) -> Result<&'a Array> {
    match &linear.weight {
        Matrix::Dense(w) => Ok(w),
        Matrix::Quantized { .. } => Err(InferenceError::InvalidRequest(format!(
            "tensor parallelism needs dense weights, but {what} is quantized; load with \
             --dtype f32 (or f16/bf16)"
        ))),
    }
}

/// Keeps output rows `[start, end)` (a column-parallel slice), with the bias.
fn rows(linear: &Linear, start: usize, end: usize, what: &str) -> Result<Linear> {
    let idx = indices(start, end);
    let weight = dense(linear, what)?.take_axis(&idx, 0)?;
    let bias = match &linear.bias {
        Some(b) => Some(b.take_axis(&idx, 0)?),
        None => None,
    };
    Ok(Linear {
        weight: Matrix::Dense(weight),
        bias,
    })
}

/// Keeps input columns `[start, end)` (a row-parallel slice). A bias would be added once per
/// rank before the sum, so row-parallel layers must have none.
fn columns(linear: &Linear, start: usize, end: usize, what: &str) -> Result<Linear> {
    if linear.bias.is_some() {
        return Err(InferenceError::InvalidRequest(format!(
            "{what} has a bias; row-parallel layers with a bias are not supported"
        )));
    }
    let weight = dense(linear, what)?.take_axis(indices(start, end), 1)?;
    Ok(Linear {
        weight: Matrix::Dense(weight),
        bias: None,
    })
}

impl ModelShard {
    /// This shard (which must hold every layer) cut down to rank `group.rank()`'s slice of a
    /// `group.size()`-way tensor-parallel instance. Forward passes then all-sum over `group`
    /// twice per layer; every rank must run the same steps in the same order.
    pub fn into_tensor_parallel(self, group: Arc<RingGroup>) -> Result<ModelShard> {
        let (rank, size) = (group.rank(), group.size());
        let config = &self.config;
        if !(self.is_first() && self.is_last()) {
            return Err(InferenceError::InvalidRequest(
                "tensor parallelism needs every layer on every rank".into(),
            ));
        }
        for (what, count) in [
            ("attention heads", config.num_heads),
            ("key/value heads", config.num_kv_heads),
        ] {
            if count % size != 0 {
                return Err(InferenceError::InvalidRequest(format!(
                    "{count} {what} cannot be split over {size} ranks; choose a ring size that \
                     divides it"
                )));
            }
        }
        let head_dim = config.head_dim;
        let (heads, kv_heads) = (config.num_heads / size, config.num_kv_heads / size);
        let (q0, q1) = (rank * heads * head_dim, (rank + 1) * heads * head_dim);
        let (k0, k1) = (rank * kv_heads * head_dim, (rank + 1) * kv_heads * head_dim);
        let mut layers = Vec::with_capacity(self.layers.len());
        for (i, layer) in self.layers.iter().enumerate() {
            let a = &layer.attention;
            let ffn = match &layer.mlp.gate_proj.weight {
                Matrix::Dense(w) => w.shape()[0] as usize,
                Matrix::Quantized { .. } => 0,
            };
            if ffn % size != 0 {
                return Err(InferenceError::InvalidRequest(format!(
                    "layer {i}: an MLP of {ffn} units cannot be split over {size} ranks"
                )));
            }
            let (f0, f1) = (rank * ffn / size, (rank + 1) * ffn / size);
            let name = |n: &str| format!("layer {i} {n}");
            let attention = Attention {
                q_proj: rows(&a.q_proj, q0, q1, &name("q_proj"))?,
                k_proj: rows(&a.k_proj, k0, k1, &name("k_proj"))?,
                v_proj: rows(&a.v_proj, k0, k1, &name("v_proj"))?,
                o_proj: columns(&a.o_proj, q0, q1, &name("o_proj"))?,
                head_norms: a.head_norms.clone(),
                num_heads: heads as i32,
                num_kv_heads: kv_heads as i32,
                head_dim: a.head_dim,
                eps: a.eps,
                rope: a.rope.clone(),
                reduce: Some(group.clone()),
            };
            let m = &layer.mlp;
            let mlp = Mlp {
                gate_proj: rows(&m.gate_proj, f0, f1, &name("gate_proj"))?,
                up_proj: rows(&m.up_proj, f0, f1, &name("up_proj"))?,
                down_proj: columns(&m.down_proj, f0, f1, &name("down_proj"))?,
                reduce: Some(group.clone()),
            };
            let layer = DecoderLayer {
                input_norm: layer.input_norm.clone(),
                attention,
                post_attention_norm: layer.post_attention_norm.clone(),
                mlp,
                eps: layer.eps,
            };
            mlx_rs::transforms::eval(layer.arrays())?;
            layers.push(layer);
        }
        let sliced = ModelShard { layers, ..self };
        sliced.prefer_huge_pages();
        Ok(sliced)
    }
}
