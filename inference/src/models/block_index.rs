//! MiniMax M3's block-sparse attention, as mlx-lm's `minimax_m3_vl.py` runs it: a small
//! indexer scores each query against one index key per past position and lets the query read
//! only the `topk` best blocks of `block` consecutive positions (a block scores as its best
//! visible key), its own most recent `local` blocks always among them. Per layer:
//!
//! - index queries `q = norm(W_q · x)` (`heads` heads of `head_dim`) and one index key per
//!   position `k = norm(W_k · x)`, both rotated over their first `min(rotary_dim, head_dim)`
//!   numbers at the position;
//! - score `q_h · k_j` per index head (each index head serves `heads / index heads`
//!   consecutive query heads), masked to the visible keys, max-pooled per block;
//! - while the sequence has no more than `topk` blocks nothing is dropped.
//!
//! The index keys are cache state: they ride in the layer's value cache as one more head after
//! the value heads (zero-padded to the head width), so the prompt cache, truncation and
//! preemption keep them position for position with the keys and values. Such a cache decodes
//! on its own rather than in the shared decode rows ([`crate::kv_cache::LayerCache`]).
//! Tensor parallel: the index queries are cut with the query heads they serve (as mlx-lm's
//! `shard`), the index key is replicated.

use super::parts::check_shape;
use crate::error::{InferenceError, Result};
use crate::linear::Linear;
use crate::rope::Rope;
use crate::weights::FormatOnMlx;
use crate::weights::{TensorSource, WeightFormat};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{ops, Array, Dtype};

/// The indexer's shape (`sparse_attention_config`) and the layers that have it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BlockIndexShape {
    /// Index heads (`sparse_num_index_heads`).
    pub heads: usize,
    /// Width of an index head and of the index key (`sparse_index_dim`).
    pub head_dim: usize,
    /// Positions per block (`sparse_block_size`).
    pub block: usize,
    /// Blocks each query reads (`sparse_topk_blocks`).
    pub topk: usize,
    /// The query's own most recent blocks, always read (`sparse_local_block`).
    pub local: usize,
    /// Per layer, whether it attends sparsely.
    pub layers: Vec<bool>,
}

impl BlockIndexShape {
    /// Whether layer `layer` has the indexer.
    pub fn is_sparse(&self, layer: usize) -> bool {
        self.layers.get(layer).copied().unwrap_or(false)
    }

    /// Checks the shape against the attention it serves (`heads` query heads of `head_dim`).
    pub(crate) fn check(&self, heads: usize, head_dim: usize, family: &str) -> Result<()> {
        let bad = |what: String| Err(InferenceError::BadConfig(format!("a {family} {what}")));
        if self.heads == 0 || !heads.is_multiple_of(self.heads) {
            return bad(format!(
                "indexer of {} heads for {heads} attention heads (each index head serves a \
                 whole number of them)",
                self.heads
            ));
        }
        // The index key rides in the value cache as one more head.
        if self.head_dim == 0 || self.head_dim > head_dim || !self.head_dim.is_multiple_of(2) {
            return bad(format!(
                "indexer {} wide for heads {head_dim} wide (shoal needs an even width no \
                 wider than the attention's heads)",
                self.head_dim
            ));
        }
        if self.block == 0 || self.block > 1 << 20 || self.topk == 0 || self.local > self.topk {
            return bad(format!(
                "indexer of blocks of {}, {} read, {} of them local (positive sizes, no more \
                 local blocks than read ones)",
                self.block, self.topk, self.local
            ));
        }
        Ok(())
    }
}

/// One layer's indexer: its projections, norms and RoPE.
#[derive(Debug, Clone)]
pub struct BlockIndexer {
    q_proj: Linear,
    k_proj: Linear,
    /// The index query and key norms as RMS norm takes them (`[head_dim]`).
    q_norm: Array,
    k_norm: Array,
    eps: f32,
    rope: Rope,
    /// Index heads held (a tensor-parallel rank's share).
    heads: i32,
    head_dim: i32,
    block: usize,
    topk: usize,
    local: usize,
}

/// One segment's index queries and keys, normalized, not yet rotated.
pub(crate) struct IndexProjections {
    /// `[b, heads, new, head_dim]`.
    pub q: Array,
    /// `[b, 1, new, head_dim]`.
    pub k: Array,
}

impl IndexProjections {
    /// Positions `[from, to)` of the new ones.
    pub(crate) fn part(&self, from: i32, to: i32) -> IndexProjections {
        let p = |t: &Array| t.index((.., .., from..to, ..));
        IndexProjections {
            q: p(&self.q),
            k: p(&self.k),
        }
    }
}

impl BlockIndexer {
    /// Layer `prefix`'s (`model.layers.N.self_attn`) indexer: `index_q_proj`, `index_k_proj`
    /// and the norms `index_q_norm` / `index_k_norm` (of `1 + w` when `one_plus`), RoPE over
    /// the first `min(rotary_dim, head_dim)` numbers of base `theta`.
    pub(crate) fn load(
        shape: &BlockIndexShape,
        source: &mut dyn TensorSource,
        prefix: &str,
        format: WeightFormat,
        (rotary_dim, theta, eps, one_plus): (usize, f32, f32, bool),
    ) -> Result<BlockIndexer> {
        let name = |part: &str| format!("{prefix}.{part}");
        let q_proj = source.linear(&name("index_q_proj"), format)?;
        check_shape(
            &q_proj.weight,
            &name("index_q_proj"),
            shape.heads * shape.head_dim,
        )?;
        let k_proj = source.linear(&name("index_k_proj"), format)?;
        check_shape(&k_proj.weight, &name("index_k_proj"), shape.head_dim)?;
        let dtype = format.compute_dtype();
        let mut norm = |part: &str| -> Result<Array> {
            let full = name(&format!("{part}.weight"));
            let w = super::parts::norm_weight(source, &full, dtype, one_plus)?;
            if w.shape() != [shape.head_dim as i32] {
                return Err(InferenceError::BadTensor {
                    name: full,
                    reason: format!("expected [{}], found {:?}", shape.head_dim, w.shape()),
                });
            }
            Ok(w)
        };
        Ok(BlockIndexer {
            q_norm: norm("index_q_norm")?,
            k_norm: norm("index_k_norm")?,
            q_proj,
            k_proj,
            eps,
            rope: Rope::new(
                rotary_dim.min(shape.head_dim),
                theta,
                &crate::config::RopeScaling::None,
            ),
            heads: shape.heads as i32,
            head_dim: shape.head_dim as i32,
            block: shape.block,
            topk: shape.topk,
            local: shape.local,
        })
    }

    /// The index queries and keys of `x` `[b, l, hidden]`, normalized.
    pub(crate) fn project(&self, x: &Array) -> Result<IndexProjections> {
        let (b, l) = (x.shape()[0], x.shape()[1]);
        let heads = |t: Array, n: i32, w: &Array| -> Result<Array> {
            let t = t.reshape(&[b, l, n, self.head_dim])?;
            Ok(crate::cpu_layer_ops::rms_norm(&t, Some(w), self.eps)?
                .transpose_axes(&[0, 2, 1, 3])?)
        };
        Ok(IndexProjections {
            q: heads(self.q_proj.forward(x)?, self.heads, &self.q_norm)?,
            k: heads(self.k_proj.forward(x)?, 1, &self.k_norm)?,
        })
    }

    /// The values to cache for new positions at `offset`: `values` `[b, kv_heads, l, d]` and,
    /// as one more head, the rotated index keys zero-padded to `d`.
    pub(crate) fn values_with_keys(
        &self,
        values: &Array,
        index: &IndexProjections,
        offset: usize,
    ) -> Result<Array> {
        let k = self
            .rope
            .apply(&index.k, offset)?
            .as_dtype(values.dtype())?;
        let s = values.shape();
        let pad = s[3] - self.head_dim;
        let k = if pad > 0 {
            let zeros = ops::zeros_dtype(&[s[0], 1, s[2], pad], values.dtype())?;
            ops::concatenate(&[k, zeros], -1)?
        } else {
            k
        };
        Ok(ops::concatenate(&[values, &k], 1)?)
    }

    /// The cached values `[b, kv_heads + 1, S, d]` split into the values and the index keys
    /// `[b, 1, S, head_dim]`.
    pub(crate) fn split_values(&self, cached: &Array) -> (Array, Array) {
        let heads = cached.shape()[1];
        (
            cached.index((.., ..heads - 1, .., ..)),
            cached.index((.., heads - 1.., .., ..self.head_dim)),
        )
    }

    /// Which of the `S` cached positions each of the `l` new queries (positions
    /// `offset..offset + l`, `S = offset + l`) of `query_heads` heads reads: a boolean mask
    /// `[b, query_heads, l, S]`, or `None` when every block fits the budget (plain causal
    /// attention).
    pub(crate) fn select(
        &self,
        index: &IndexProjections,
        keys: &Array,
        offset: usize,
        query_heads: i32,
    ) -> Result<Option<Array>> {
        let l = index.q.shape()[2] as usize;
        let total = offset + l;
        let blocks = total.div_ceil(self.block);
        if self.topk >= blocks {
            return Ok(None);
        }
        let q = self
            .rope
            .apply(&index.q, offset)?
            .as_dtype(Dtype::Float32)?;
        let k = keys.as_dtype(Dtype::Float32)?;
        // [b, heads, l, S]: a future key must not win its block, so mask before pooling.
        let visible = causal(offset, l)?;
        let scores = ops::matmul(&q, &k.swap_axes(-1, -2)?)?;
        let neg = Array::from_f32(f32::NEG_INFINITY);
        let scores = ops::select(&visible, &scores, &neg)?;
        let (b, h) = (scores.shape()[0], scores.shape()[1]);
        let padded = (blocks * self.block - total) as i32;
        let scores = if padded > 0 {
            let fill = ops::full::<f32>(&[b, h, l as i32, padded], &neg)?;
            ops::concatenate(&[scores, fill], -1)?
        } else {
            scores
        };
        let pooled = scores
            .reshape(&[b, h, l as i32, blocks as i32, self.block as i32])?
            .max_axis(-1, false)?;
        let pooled = ops::select(
            local_blocks(offset, l, blocks, self.block, self.local)?,
            Array::from_f32(f32::INFINITY),
            &pooled,
        )?;
        // The topk-th best block's score: every block at least as good is read (ties aside,
        // the same choice as the reference's top-k).
        let sorted = ops::sort_axis(&pooled, -1)?;
        let at = (blocks - self.topk) as i32;
        let threshold = sorted.index((.., .., .., at..at + 1));
        let keep = ops::ge(&pooled, &threshold)?;
        let keep = ops::repeat_axis::<bool>(keep, self.block as i32, -1)?.index((
            ..,
            ..,
            ..,
            ..total as i32,
        ));
        let keep = ops::logical_and(&keep, &visible)?;
        Ok(Some(ops::repeat_axis::<bool>(
            keep,
            query_heads / self.heads,
            1,
        )?))
    }

    /// Rank `rank`'s slice of a `size`-way tensor-parallel instance: the index heads serving
    /// its query heads; the index key whole.
    pub(crate) fn cut(&self, rank: usize, size: usize) -> Result<BlockIndexer> {
        let heads = self.heads as usize;
        if !heads.is_multiple_of(size) {
            return Err(InferenceError::BadSplit(format!(
                "{heads} sparse-attention index heads cannot be split over {size} ranks; \
                 choose a ring size that divides it"
            )));
        }
        let (per, d) = (heads / size, self.head_dim as usize);
        Ok(BlockIndexer {
            q_proj: self
                .q_proj
                .slice_rows(rank * per * d, (rank + 1) * per * d)?,
            heads: per as i32,
            ..self.clone()
        })
    }

    /// Every array of the indexer.
    pub(crate) fn arrays(&self) -> Vec<&Array> {
        let mut v: Vec<&Array> = [&self.q_proj, &self.k_proj]
            .into_iter()
            .flat_map(Linear::arrays)
            .collect();
        v.extend([&self.q_norm, &self.k_norm]);
        v
    }
}

/// Positions `from..to` as a column `[to - from, 1]` (`column`) or a row `[1, to - from]`.
fn positions(from: usize, to: usize, column: bool) -> Result<Array> {
    let p = Array::arange::<i32, i32>(from as i32, to as i32, None)?;
    let n = (to - from) as i32;
    let shape = if column { [n, 1] } else { [1, n] };
    Ok(p.reshape(&shape)?)
}

/// `[l, S]`: query `offset + i` sees keys `0..=offset + i` (built on the device: a long
/// prompt's mask is never a host allocation).
fn causal(offset: usize, l: usize) -> Result<Array> {
    let total = offset + l;
    Ok(ops::le(
        &positions(0, total, false)?,
        &positions(offset, total, true)?,
    )?)
}

/// `[l, blocks]`: query `offset + i`'s own block and the `local - 1` before it.
fn local_blocks(
    offset: usize,
    l: usize,
    blocks: usize,
    block: usize,
    local: usize,
) -> Result<Array> {
    let own = ops::floor_divide(
        &positions(offset, offset + l, true)?,
        Array::from_int(block as i32),
    )?;
    let ids = positions(0, blocks, false)?;
    let later = ops::gt(&ops::add(&ids, Array::from_int(local as i32))?, &own)?;
    Ok(ops::logical_and(&ops::le(&ids, &own)?, &later)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(a: &Array) -> Vec<bool> {
        a.eval().unwrap();
        a.as_slice::<bool>().to_vec()
    }

    /// Blocks of 4, the query at position 9 in block 2: with one local block it always reads
    /// block 2; blocks 0 and 1 compete for the second place.
    #[test]
    fn a_query_always_reads_its_own_block() {
        assert_eq!(
            host(&local_blocks(9, 1, 3, 4, 1).unwrap()),
            vec![false, false, true]
        );
        assert_eq!(
            host(&local_blocks(9, 1, 3, 4, 2).unwrap()),
            vec![false, true, true]
        );
        // Queries at 3 and 4 straddle a block boundary.
        assert_eq!(
            host(&local_blocks(3, 2, 2, 4, 1).unwrap()),
            vec![true, false, false, true]
        );
    }

    #[test]
    fn causal_sees_the_past_and_itself() {
        assert_eq!(
            host(&causal(1, 2).unwrap()),
            vec![true, true, false, true, true, true]
        );
    }
}
