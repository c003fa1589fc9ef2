//! Attention over another layer's cache (Gemma 4 E2B/E4B's `num_kv_shared_layers`, as mlx-lm's
//! `gemma4_text.py` runs it), a library piece: the last layers of the model have queries but no
//! keys or values of their own; each reads, in the same step, the keys and values the last
//! earlier layer of its kind (sliding or full) attended over, with that layer's window.
//!
//! The source layer lends what it attended over through its cache
//! ([`crate::kv_cache::LayerCache::lend`]); before a sharing layer runs, the shard makes its
//! cache follow the source's ([`crate::kv_cache::LayerCache::follow`]), so the sharing layer
//! holds no keys of its own: its cache counts positions, and its sequence decodes on its own
//! cache rather than in the shared decode rows. A pipeline rank must hold a sharing layer's
//! source too (the shard refuses a cut between them). Tensor parallel: a rank's query heads
//! read the key/value heads the source's cut gave the same rank.

use super::parts::{all_sum, check_shape, layer_tensor};
use crate::config::ModelConfig;
use crate::error::{InferenceError, Result};
use crate::kv_rows::LayerKv;
use crate::linear::Linear;
use crate::ring::RingGroup;
use crate::rope::Rope;
use crate::sliding_window::visible;
use crate::weights::FormatOnMlx;
use crate::weights::{TensorSource, WeightFormat};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{ops, Array};
use std::sync::Arc;

/// A layer's queries over the keys and values of layer `source`.
#[derive(Debug, Clone)]
pub struct SharedKvAttention {
    q_proj: Linear,
    o_proj: Linear,
    /// The per-head RMS norm on queries, `[head_dim]`.
    q_norm: Array,
    num_heads: i32,
    num_kv_heads: i32,
    head_dim: i32,
    eps: f32,
    rope: Rope,
    scale: f32,
    /// The source's window (the same kind of layer as this one).
    window: Option<usize>,
    /// The layer (global index) whose keys and values it reads.
    source: usize,
    reduce: Option<Arc<RingGroup>>,
}

impl SharedKvAttention {
    /// Layer `layer`'s queries and output projection (`config` that layer's shape), reading
    /// layer `source`'s cache with `rope` and queries scaled by `scale`.
    pub(crate) fn load(
        config: &ModelConfig,
        source: &mut dyn TensorSource,
        (layer, kv_source): (usize, usize),
        format: WeightFormat,
        (rope, scale): (Rope, f32),
    ) -> Result<SharedKvAttention> {
        let p = |part: &str| layer_tensor(layer, part);
        let q_proj = source.linear(&p("self_attn.q_proj"), format)?;
        check_shape(
            &q_proj.weight,
            &p("self_attn.q_proj"),
            config.num_heads * config.head_dim,
        )?;
        let o_proj = source.linear(&p("self_attn.o_proj"), format)?;
        check_shape(&o_proj.weight, &p("self_attn.o_proj"), config.hidden_size)?;
        let q_norm = source.dense(&p("self_attn.q_norm.weight"), format.compute_dtype())?;
        Ok(SharedKvAttention {
            q_proj,
            o_proj,
            q_norm,
            num_heads: config.num_heads as i32,
            num_kv_heads: config.num_kv_heads as i32,
            head_dim: config.head_dim as i32,
            eps: config.rms_norm_eps,
            rope,
            scale,
            window: config
                .sliding_window
                .as_ref()
                .and_then(|w| w.of_layer(layer)),
            source: kv_source,
            reduce: None,
        })
    }

    /// The layer whose keys and values this one reads.
    pub fn source(&self) -> usize {
        self.source
    }

    /// `x` `[1, total, hidden]` over the source's keys and values each segment's cache was
    /// lent this step.
    pub fn forward_segments(&self, x: &Array, segments: &mut [LayerKv<'_>]) -> Result<Array> {
        let (b, l) = (x.shape()[0], x.shape()[1]);
        let q = self
            .q_proj
            .forward(x)?
            .reshape(&[b, l, self.num_heads, self.head_dim])?;
        let q = crate::cpu_layer_ops::rms_norm(&q, Some(&self.q_norm), self.eps)?
            .transpose_axes(&[0, 2, 1, 3])?;
        let mut outs = Vec::with_capacity(segments.len());
        let mut at = 0i32;
        for segment in segments.iter_mut() {
            let LayerKv::Own(len, cache) = segment else {
                return Err(InferenceError::InvalidRequest(
                    "a layer sharing another's keys decodes each sequence on its own cache".into(),
                ));
            };
            let end = at + *len as i32;
            let lent = cache.lent().ok_or_else(|| {
                InferenceError::InvalidRequest(format!(
                    "this layer reads layer {}'s keys and values, which did not run before it \
                     in this step",
                    self.source
                ))
            })?;
            let q =
                self.rope
                    .apply_in(&q.index((.., .., at..end, ..)), lent.offset, cache.mrope())?;
            let (k, v, mask) = visible(
                &lent.keys,
                &lent.values,
                lent.held_from,
                lent.offset,
                *len,
                self.window,
            );
            outs.push(crate::cpu_layer_ops::attention(
                &q,
                &k,
                &v,
                self.scale,
                mask.as_sdpa(),
                None,
            )?);
            at = end;
        }
        let o = if outs.len() == 1 {
            outs.pop().expect("one output")
        } else {
            ops::concatenate(&outs, 2)?
        };
        let o =
            o.transpose_axes(&[0, 2, 1, 3])?
                .reshape(&[b, l, self.num_heads * self.head_dim])?;
        all_sum(self.o_proj.forward(&o)?, &self.reduce)
    }

    /// Rank `rank`'s slice of a `size`-way tensor-parallel instance: query heads cut as the
    /// source's attention cuts them, so each rank's queries read the key/value heads its own
    /// slice of the source holds.
    pub(crate) fn cut(
        &self,
        rank: usize,
        size: usize,
        group: &Arc<RingGroup>,
        what: &str,
    ) -> Result<SharedKvAttention> {
        let (heads, kv_heads) = (self.num_heads as usize, self.num_kv_heads as usize);
        if !heads.is_multiple_of(size) || !kv_heads.is_multiple_of(size) {
            return Err(InferenceError::BadSplit(format!(
                "{what}: {heads} attention heads over {kv_heads} key/value heads cannot be \
                 split over {size} ranks"
            )));
        }
        let d = self.head_dim as usize;
        let heads = heads / size;
        let (q0, q1) = (rank * heads * d, (rank + 1) * heads * d);
        Ok(SharedKvAttention {
            q_proj: self.q_proj.slice_rows(q0, q1)?,
            o_proj: self
                .o_proj
                .slice_columns(q0, q1, size, &format!("{what} o_proj"))?,
            q_norm: self.q_norm.clone(),
            num_heads: heads as i32,
            num_kv_heads: (kv_heads / size) as i32,
            head_dim: self.head_dim,
            eps: self.eps,
            rope: self.rope.clone(),
            scale: self.scale,
            window: self.window,
            source: self.source,
            reduce: Some(group.clone()),
        })
    }

    /// Every array of the attention (to evaluate them eagerly).
    pub(crate) fn arrays(&self) -> Vec<&Array> {
        let mut v = self.q_proj.arrays();
        v.extend(self.o_proj.arrays());
        v.push(&self.q_norm);
        v
    }
}

/// Per layer, the earlier layer whose keys and values it reads: with `shared` KV-shared
/// layers, each of the last `shared` layers reads the last layer of its kind (sliding or full)
/// before them, as mlx-lm pairs them.
pub(crate) fn kv_sources(sliding: &[bool], shared: usize) -> Result<Vec<Option<usize>>> {
    let n = sliding.len();
    if shared == 0 {
        return Ok(vec![None; n]);
    }
    if shared >= n {
        return Err(InferenceError::BadConfig(format!(
            "a config.json shares the keys of {shared} of {n} layers: at least one \
             layer must have its own"
        )));
    }
    let first_shared = n - shared;
    let last_of = |kind: bool| (0..first_shared).rev().find(|&l| sliding[l] == kind);
    (0..n)
        .map(|l| {
            if l < first_shared {
                return Ok(None);
            }
            match last_of(sliding[l]) {
                Some(s) => Ok(Some(s)),
                None => Err(InferenceError::BadConfig(format!(
                    "a config.json's KV-shared layer {l} has no earlier {} layer to \
                     read keys from",
                    if sliding[l] { "sliding" } else { "full" }
                ))),
            }
        })
        .collect()
}
