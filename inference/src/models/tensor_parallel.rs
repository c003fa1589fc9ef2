//! Tensor parallelism (Megatron style) over an MLX ring: every rank holds every layer, with a
//! contiguous slice of the attention heads and of the feed-forward's hidden units (of every
//! expert, in a Mixture-of-Experts layer), and of the recurrent layers' heads with their
//! state ([`super::recurrent_split`]).
//!
//! Q, K, V, gate and up are column-parallel (each rank keeps its rows of `W[out, in]`); O and
//! down are row-parallel (each rank keeps its columns), so each block's output is a partial sum
//! that one `all_sum` completes. Each kind of attention and feed-forward cuts itself
//! ([`super::base::Attention::cut`], [`super::base::FeedForward::cut`]); quantized weights are
//! cut in place, at their groups' boundaries. Embedding, norms, routers and head stay whole on
//! every rank.

use super::shard::ModelShard;
use crate::error::{InferenceError, Result};
use crate::ring::RingGroup;
use std::sync::Arc;

impl ModelShard {
    /// This shard (which must hold every layer) cut down to rank `group.rank()`'s slice of a
    /// `group.size()`-way tensor-parallel instance. Forward passes then all-sum over `group`
    /// twice per layer; every rank must run the same steps in the same order.
    pub fn into_tensor_parallel(self, group: Arc<RingGroup>) -> Result<ModelShard> {
        let (rank, size) = (group.rank(), group.size());
        if !(self.is_first() && self.is_last()) {
            return Err(InferenceError::InvalidRequest(
                "tensor parallelism needs every layer on every rank".into(),
            ));
        }
        let mut layers = Vec::with_capacity(self.layers.len());
        for (i, layer) in self.layers.iter().enumerate() {
            let layer = layer.cut(rank, size, &group, &format!("layer {i}"))?;
            mlx_rs::transforms::eval(layer.arrays())?;
            layers.push(layer);
        }
        let sliced = ModelShard { layers, ..self };
        sliced.prefer_huge_pages();
        Ok(sliced)
    }
}
