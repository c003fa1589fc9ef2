//! Multi-head latent attention (DeepSeek V2/V3, Kimi K2), as mlx-lm's `deepseek_v3.py` runs
//! it. Per token:
//!
//! - queries through a low-rank bottleneck: `q = W_qb · rms(W_qa · x)`, split per head into a
//!   part without position `q_nope` and a rotated part `q_pe`;
//! - keys and values from one shared latent: `[c_kv, k_pe] = W_kva · x`, `c = rms(c_kv)`, with
//!   `k_pe` (one rotated key for all heads);
//! - head h's score for position j: `scale · (q_nope,h · W_uk,h · c_j + q_pe,h · k_pe,j)` and its
//!   output `W_uv,h · Σ_j p_j c_j`, where `W_uk` (`embed_q`) and `W_uv` (`unembed_out`) are the
//!   two halves of the checkpoint's `kv_b_proj`.
//!
//! The cache keeps only `c` and `k_pe` per position (`kv_lora_rank + qk_rope_head_dim` numbers
//! for every head together): the keys of [`LayerCache`] hold `c` as `[b, 1, len, kv_lora]`,
//! its values `k_pe` as `[b, 1, len, rope]` (with DeepSeek Sparse Attention's indexer,
//! [`super::dsa_indexer`], its key after `k_pe`: `[b, 1, len, rope + index_head_dim]`, so the
//! indexer's keys live, and are trimmed, joined and reused, with the latent). A prompt expands the latent into per-head keys
//! and values (`k = c · W_uk`, `v = c · W_uv^T`); a decode step instead absorbs `W_uk` into the
//! query and attends in latent space, as the reference does for one token (the two differ by
//! rounding only).
//!
//! Tensor parallel: each rank keeps its heads (`q_b_proj` rows, `embed_q`/`unembed_out` heads,
//! `o_proj` columns); the latent projection, the latent cache and the indexer are whole on
//! every rank.

use super::dsa_indexer::{Indexer, IndexerInputs};
use super::parts::all_sum;
use crate::config::LatentConfig;
use crate::error::{InferenceError, Result};
use crate::kv_cache::LayerCache;
use crate::kv_rows::{LayerKv, RowLayer, RowStep};
use crate::linear::Linear;
use crate::quantized::{slice_axis, QuantMode, QuantizedMatrix};
use crate::ring::RingGroup;
use crate::weights::Stacked;
use mlx_rs::fast::{self, ScaledDotProductAttentionMask};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{ops, Array};
use std::sync::Arc;

/// How the queries are made.
#[derive(Debug, Clone)]
pub enum QueryProjection {
    /// One matrix (`q_proj`; DeepSeek V2-Lite).
    Direct(Linear),
    /// `q_b_proj(rms(q_a_proj(x)))` (`q_lora_rank`).
    LowRank {
        /// `q_a_proj`.
        down: Linear,
        /// `q_a_layernorm`.
        norm: Array,
        /// `q_b_proj`.
        up: Linear,
    },
}

impl QueryProjection {
    /// The queries, and the normalized bottleneck they come from (the indexer's input; `None`
    /// for one matrix).
    fn forward(&self, x: &Array, eps: f32) -> Result<(Array, Option<Array>)> {
        match self {
            QueryProjection::Direct(q) => Ok((q.forward(x)?, None)),
            QueryProjection::LowRank { down, norm, up } => {
                let qr = crate::cpu_layer_ops::rms_norm(down.forward(x)?, Some(norm), eps)?;
                Ok((up.forward(&qr)?, Some(qr)))
            }
        }
    }

    fn slice_rows(&self, start: usize, end: usize) -> Result<QueryProjection> {
        Ok(match self {
            QueryProjection::Direct(q) => QueryProjection::Direct(q.slice_rows(start, end)?),
            QueryProjection::LowRank { down, norm, up } => QueryProjection::LowRank {
                down: down.clone(),
                norm: norm.clone(),
                up: up.slice_rows(start, end)?,
            },
        })
    }

    fn arrays(&self) -> Vec<&Array> {
        match self {
            QueryProjection::Direct(q) => q.arrays(),
            QueryProjection::LowRank { down, norm, up } => {
                let mut v = down.arrays();
                v.push(norm);
                v.extend(up.arrays());
                v
            }
        }
    }
}

/// One matrix per head, `[heads, out, in]` (mlx-lm's `MultiLinear`).
#[derive(Debug, Clone)]
pub struct PerHead(pub(crate) Stacked);

impl PerHead {
    /// A per-head matrix as stored; micro-scaled modes are widened to floats (only affine
    /// `quantized_matmul` takes the transpose flag through mlx-rs).
    pub(crate) fn new(w: Stacked) -> Result<PerHead> {
        Ok(PerHead(match w {
            Stacked::Quantized(q) if q.spec.mode != QuantMode::Affine => {
                Stacked::Dense(q.dequantize(mlx_rs::Dtype::Float32)?)
            }
            w => w,
        }))
    }

    /// `x @ W_h^T` (`transpose`) or `x @ W_h`, per head `h` (x's head axis broadcasts).
    fn apply(&self, x: &Array, transpose: bool) -> Result<Array> {
        match &self.0 {
            Stacked::Dense(w) => Ok(if transpose {
                ops::matmul(x, w.swap_axes(-1, -2)?)?
            } else {
                ops::matmul(x, w)?
            }),
            Stacked::Quantized(q) => {
                let biases = q.biases.as_ref().ok_or_else(|| {
                    InferenceError::InvalidRequest(
                        "an affine quantized matrix has no biases".into(),
                    )
                })?;
                Ok(ops::quantized_matmul(
                    x,
                    &q.packed,
                    &q.scales,
                    biases,
                    transpose,
                    q.spec.group_size,
                    q.spec.bits,
                )?)
            }
        }
    }

    fn heads(&self, start: usize, end: usize) -> Result<PerHead> {
        Ok(PerHead(match &self.0 {
            Stacked::Dense(w) => Stacked::Dense(slice_axis(w, 0, start, end)?),
            Stacked::Quantized(q) => Stacked::Quantized(QuantizedMatrix {
                packed: slice_axis(&q.packed, 0, start, end)?,
                scales: slice_axis(&q.scales, 0, start, end)?,
                biases: q
                    .biases
                    .as_ref()
                    .map(|b| slice_axis(b, 0, start, end))
                    .transpose()?,
                spec: q.spec,
            }),
        }))
    }

    fn arrays(&self) -> Vec<&Array> {
        match &self.0 {
            Stacked::Dense(w) => vec![w],
            Stacked::Quantized(q) => q.arrays(),
        }
    }
}

/// RoPE over the rotated part of the heads: interleaved pairs ("traditional"), with YaRN's
/// periods and magnitude factor as the reference's `YarnRoPE` (or plain periods).
#[derive(Debug, Clone)]
pub struct LatentRope {
    pub(crate) dims: i32,
    pub(crate) periods: Array,
    /// Factor on the rotated part before rotating (YaRN's `mscale / mscale_all_dim` ratio).
    pub(crate) mscale: f32,
}

impl LatentRope {
    fn scaled(&self, x: &Array) -> Result<Array> {
        Ok(if self.mscale == 1.0 {
            x.clone()
        } else {
            ops::multiply(x, Array::from_f32(self.mscale))?
        })
    }

    fn apply(&self, x: &Array, offset: usize) -> Result<Array> {
        let x = self.scaled(x)?;
        Ok(fast::rope(
            &x,
            self.dims,
            true,
            None,
            1.0,
            offset as i32,
            Some(&self.periods),
        )?)
    }

    fn apply_at(&self, x: &Array, positions: &Array) -> Result<Array> {
        let x = self.scaled(x)?;
        Ok(fast::rope_dynamic(
            &x,
            self.dims,
            true,
            None,
            1.0,
            positions,
            Some(&self.periods),
        )?)
    }
}

/// Multi-head latent attention (see the module docs).
#[derive(Debug, Clone)]
pub struct LatentAttention {
    pub(crate) query: QueryProjection,
    /// `kv_a_proj_with_mqa`: `[kv_lora + rope, hidden]`.
    pub(crate) kv_down: Linear,
    /// `kv_a_layernorm`.
    pub(crate) kv_norm: Array,
    /// `W_uk`, `[heads, kv_lora, nope]`.
    pub(crate) embed_q: PerHead,
    /// `W_uv`, `[heads, v, kv_lora]`.
    pub(crate) unembed_out: PerHead,
    pub(crate) o_proj: Linear,
    pub(crate) num_heads: i32,
    pub(crate) shape: LatentConfig,
    /// Softmax scale: `(nope + rope)^-1/2`, times YaRN's `mscale_all_dim` correction squared.
    pub(crate) scale: f32,
    /// `None`: the rotated part is not rotated (Kimi Linear's NoPE attention).
    pub(crate) rope: Option<LatentRope>,
    pub(crate) reduce: Option<Arc<RingGroup>>,
    /// DeepSeek Sparse Attention's indexer (DeepSeek V3.2, GLM-5): which positions each query
    /// reads. Its keys are cached after the rotated key, in the cache's values.
    pub(crate) indexer: Option<Box<Indexer>>,
    /// Llama 4's attention scale on the queries by position (Mistral 4).
    pub(crate) position_scale: Option<PositionScale>,
    /// Kimi K3's output gate `g_proj` (`[heads · v_head_dim, hidden]`): the heads' outputs
    /// are scaled by `sigmoid(g_proj(x))` before `o_proj`.
    pub(crate) gate: Option<Linear>,
}

/// Llama 4's attention scale (Mistral 4): the queries at position p are multiplied by
/// `1 + beta · ln(1 + floor(p / original_max_position))`, 1 within the trained length, so
/// that attention does not flatten over longer contexts.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PositionScale {
    /// `llama_4_scaling_beta`.
    pub beta: f32,
    /// `original_max_position_embeddings`.
    pub original_max_position: f32,
}

impl PositionScale {
    /// `q` times the factor at `positions` (int32), shaped to broadcast against it.
    fn apply(&self, q: &Array, positions: &Array, shape: &[i32]) -> Result<Array> {
        let p = positions.as_dtype(mlx_rs::Dtype::Float32)?;
        let periods = ops::floor(&ops::divide(
            &p,
            Array::from_f32(self.original_max_position),
        )?)?;
        let growth = ops::log(&ops::add(&periods, Array::from_f32(1.0))?)?;
        let factor = ops::add(
            &ops::multiply(&growth, Array::from_f32(self.beta))?,
            Array::from_f32(1.0),
        )?;
        Ok(ops::multiply(
            q,
            &factor.reshape(shape)?.as_dtype(q.dtype())?,
        )?)
    }
}

impl LatentAttention {
    /// Several sequences' new positions at once (see
    /// [`super::base::Attention::forward_segments`]).
    pub fn forward_segments(&self, x: &Array, segments: &mut [LayerKv<'_>]) -> Result<Array> {
        let (b, l) = (x.shape()[0], x.shape()[1]);
        let s = &self.shape;
        let (nope, rope, lora) = (
            s.qk_nope_head_dim as i32,
            s.qk_rope_head_dim as i32,
            s.kv_lora_rank as i32,
        );
        let (q, qr) = self.query.forward(x, s.norm_eps)?;
        let q = q
            .reshape(&[b, l, self.num_heads, nope + rope])?
            .transpose_axes(&[0, 2, 1, 3])?;
        let index = match (&self.indexer, &qr) {
            (Some(indexer), Some(qr)) => Some(indexer.project(x, qr)?),
            (Some(_), None) => {
                return Err(InferenceError::BadConfig(
                    "a sparse attention indexer needs the query bottleneck (q_lora_rank)".into(),
                ))
            }
            (None, _) => None,
        };
        let kv = self.kv_down.forward(x)?;
        let latent = crate::cpu_layer_ops::rms_norm(
            kv.index((.., .., ..lora)),
            Some(&self.kv_norm),
            s.norm_eps,
        )?
        .expand_dims(1)?;
        let k_pe = kv
            .index((.., .., lora..))
            .reshape(&[b, l, 1, rope])?
            .transpose_axes(&[0, 2, 1, 3])?;
        let mut outs = Vec::with_capacity(segments.len());
        let mut at = 0i32;
        for segment in segments.iter_mut() {
            let len = match segment {
                LayerKv::Own(len, _) => *len as i32,
                LayerKv::Rows(_, step) => step.rows() as i32,
            };
            let end = at + len;
            let part = |t: &Array| t.index((.., .., at..end, ..));
            let index = index.as_ref().map(|i| IndexerInputs {
                q: part(&i.q),
                k: part(&i.k),
                w: part(&i.w),
            });
            let new = New {
                q: part(&q),
                latent: part(&latent),
                k_pe: part(&k_pe),
                index,
            };
            outs.push(match segment {
                LayerKv::Own(_, cache) => self.attend(new, cache)?,
                LayerKv::Rows(layer, step) => self.attend_rows(new, layer, step)?,
            });
            at = end;
        }
        let o = if outs.len() == 1 {
            outs.pop().expect("one output")
        } else {
            ops::concatenate(&outs, 2)?
        };
        let o = o.transpose_axes(&[0, 2, 1, 3])?.reshape(&[
            b,
            l,
            self.num_heads * s.v_head_dim as i32,
        ])?;
        let o = match &self.gate {
            Some(g) => ops::multiply(&o, &ops::sigmoid(&g.forward(x)?)?)?,
            None => o,
        };
        all_sum(self.o_proj.forward(&o)?, &self.reduce)
    }

    /// `x` rotated at positions `offset..` (unrotated without RoPE).
    fn rotate(&self, x: &Array, offset: usize) -> Result<Array> {
        match &self.rope {
            Some(rope) => rope.apply(x, offset),
            None => Ok(x.clone()),
        }
    }

    /// `x` rotated, each row at its own position (unrotated without RoPE).
    fn rotate_at(&self, x: &Array, positions: &Array) -> Result<Array> {
        match &self.rope {
            Some(rope) => rope.apply_at(x, positions),
            None => Ok(x.clone()),
        }
    }

    /// `q` `[b, heads, new, nope + rope]` split into its two parts.
    fn split(&self, q: &Array) -> (Array, Array) {
        let nope = self.shape.qk_nope_head_dim as i32;
        (q.index((.., .., .., ..nope)), q.index((.., .., .., nope..)))
    }

    /// What the cache's values hold per position: the rotated key, then the indexer's key.
    fn cached_values(&self, k_pe: Array, index_k: Option<Array>) -> Result<Array> {
        Ok(match index_k {
            Some(k) => ops::concatenate(&[k_pe, k], -1)?,
            None => k_pe,
        })
    }

    /// The cache's values split back into the rotated keys and the indexer's keys.
    fn split_values(&self, values: Array) -> (Array, Option<Array>) {
        if self.indexer.is_none() {
            return (values, None);
        }
        let rope = self.shape.qk_rope_head_dim as i32;
        (
            values.index((.., .., .., ..rope)),
            Some(values.index((.., .., .., rope..))),
        )
    }

    /// The positions each new query reads: the indexer's choice within `visible`, or `visible`.
    fn readable(
        &self,
        index: Option<(Array, Array)>,
        keys: Option<Array>,
        visible: Option<Array>,
    ) -> Result<Option<Array>> {
        let (Some(indexer), Some((q, w)), Some(keys)) = (&self.indexer, index, keys) else {
            return Ok(visible);
        };
        Ok(indexer.select(&q, &w, &keys, visible.as_ref())?.or(visible))
    }

    /// One sequence's new positions over its latent cache.
    fn attend(&self, new: New, cache: &mut LayerCache) -> Result<Array> {
        let (l, offset) = (new.q.shape()[2], cache.len());
        let q = match &self.position_scale {
            Some(s) => {
                let positions = ops::arange::<_, i32>(offset as i32, offset as i32 + l, None)?;
                s.apply(&new.q, &positions, &[1, 1, l, 1])?
            }
            None => new.q,
        };
        let (q_nope, q_pe) = self.split(&q);
        let q_pe = self.rotate(&q_pe, offset)?;
        let k_pe = self.rotate(&new.k_pe, offset)?;
        let (index, index_k) = match (&self.indexer, new.index) {
            (Some(indexer), Some(i)) => (
                Some((indexer.rotate(&i.q, offset)?, i.w)),
                Some(indexer.rotate(&i.k, offset)?),
            ),
            _ => (None, None),
        };
        let (latent, values) = cache.append(new.latent, self.cached_values(k_pe, index_k)?)?;
        let (k_pe, index_keys) = self.split_values(values);
        let mut pe_scores = self.position_scores(&q_pe, &k_pe)?;
        if l == 1 {
            if let Some(read) = self.readable(index, index_keys, None)? {
                pe_scores = mask_scores(&pe_scores, &read)?;
            }
            return self.attend_latent(&q_nope, &latent, &pe_scores);
        }
        // Causal: new position i (at offset + i) sees columns up to offset + i.
        let total = latent.shape()[2];
        let rows = ops::arange::<_, i32>(offset as i32, offset as i32 + l, None)?;
        let cols = ops::arange::<_, i32>(0, total, None)?;
        let visible = rows.expand_dims(1)?.ge(cols.expand_dims(0)?)?;
        if let Some(read) = self.readable(index, index_keys, Some(visible))? {
            pe_scores = mask_scores(&pe_scores, &read)?;
        }
        let k = self.embed_q.apply(&latent, false)?;
        let v = self.unembed_out.apply(&latent, true)?;
        Ok(fast::scaled_dot_product_attention(
            &q_nope,
            &k,
            &v,
            self.scale,
            ScaledDotProductAttentionMask::Array(&pe_scores),
            None,
        )?)
    }

    /// The rotated parts' scores, `scale · q_pe · k_pe^T`: `[b, heads, new, columns]`.
    fn position_scores(&self, q_pe: &Array, k_pe: &Array) -> Result<Array> {
        let q_pe = ops::multiply(q_pe, Array::from_f32(self.scale))?;
        Ok(ops::matmul(&q_pe, k_pe.swap_axes(-1, -2)?)?)
    }

    /// Attention in latent space: the query absorbs `W_uk`, attends over the latents as keys
    /// and values, and the result leaves through `W_uv`.
    fn attend_latent(&self, q_nope: &Array, latent: &Array, pe_scores: &Array) -> Result<Array> {
        let q = self.embed_q.apply(q_nope, true)?;
        let o = fast::scaled_dot_product_attention(
            &q,
            latent,
            latent,
            self.scale,
            ScaledDotProductAttentionMask::Array(pe_scores),
            None,
        )?;
        self.unembed_out.apply(&o, true)
    }

    /// The decoding rows' new positions (one per row) over their shared latent buffers.
    fn attend_rows(&self, new: New, layer: &mut RowLayer, step: &RowStep) -> Result<Array> {
        let by_row = |t: &Array| t.transpose_axes(&[2, 1, 0, 3]);
        let mut q = by_row(&new.q)?;
        if let Some(s) = &self.position_scale {
            q = s.apply(&q, &step.positions, &[step.rows() as i32, 1, 1, 1])?;
        }
        let (q_nope, q_pe) = self.split(&q);
        let q_pe = self.rotate_at(&q_pe, &step.positions)?;
        let k_pe = self.rotate_at(&by_row(&new.k_pe)?, &step.positions)?;
        let (index, index_k) = match (&self.indexer, new.index) {
            (Some(indexer), Some(i)) => (
                Some((
                    indexer.rotate_at(&by_row(&i.q)?, &step.positions)?,
                    by_row(&i.w)?,
                )),
                Some(indexer.rotate_at(&by_row(&i.k)?, &step.positions)?),
            ),
            _ => (None, None),
        };
        let values = self.cached_values(k_pe, index_k)?;
        let (latent, values, _) = layer.write(&by_row(&new.latent)?, &values, step)?;
        let (k_pe, index_keys) = self.split_values(values);
        let mut pe_scores = self.position_scores(&q_pe, &k_pe)?;
        if let Some(read) = self.readable(index, index_keys, step.mask.clone())? {
            pe_scores = mask_scores(&pe_scores, &read)?;
        }
        let o = self.attend_latent(&q_nope, &latent, &pe_scores)?;
        Ok(by_row(&o)?)
    }

    /// Rank `rank`'s heads of a `size`-way tensor-parallel instance; the latent stays whole.
    pub(crate) fn cut(
        &self,
        rank: usize,
        size: usize,
        group: &Arc<RingGroup>,
        what: &str,
    ) -> Result<LatentAttention> {
        let heads = self.num_heads as usize;
        if !heads.is_multiple_of(size) {
            return Err(InferenceError::BadSplit(format!(
                "{heads} attention heads cannot be split over {size} ranks; choose a ring \
                 size that divides it"
            )));
        }
        let per = heads / size;
        let (h0, h1) = (rank * per, (rank + 1) * per);
        let q_width = self.shape.qk_nope_head_dim + self.shape.qk_rope_head_dim;
        let v = self.shape.v_head_dim;
        Ok(LatentAttention {
            query: self.query.slice_rows(h0 * q_width, h1 * q_width)?,
            kv_down: self.kv_down.clone(),
            kv_norm: self.kv_norm.clone(),
            embed_q: self.embed_q.heads(h0, h1)?,
            unembed_out: self.unembed_out.heads(h0, h1)?,
            o_proj: self
                .o_proj
                .slice_columns(h0 * v, h1 * v, size, &format!("{what} o_proj"))?,
            num_heads: per as i32,
            shape: self.shape.clone(),
            scale: self.scale,
            rope: self.rope.clone(),
            reduce: Some(group.clone()),
            indexer: self.indexer.clone(),
            position_scale: self.position_scale,
            gate: match &self.gate {
                Some(g) => Some(g.slice_rows(h0 * v, h1 * v)?),
                None => None,
            },
        })
    }

    /// Every array of the attention.
    pub(crate) fn arrays(&self) -> Vec<&Array> {
        let mut v = self.query.arrays();
        v.extend(self.kv_down.arrays());
        v.push(&self.kv_norm);
        v.extend(self.embed_q.arrays());
        v.extend(self.unembed_out.arrays());
        v.extend(self.o_proj.arrays());
        if let Some(indexer) = &self.indexer {
            v.extend(indexer.arrays());
        }
        v.extend(self.gate.iter().flat_map(Linear::arrays));
        v
    }
}

/// One segment's new positions as the attention reads them: queries `[b, heads, l, nope +
/// rope]`, the normalized latent `[b, 1, l, kv_lora]`, the rotated key before rotation
/// `[b, 1, l, rope]`, and the indexer's view of them.
struct New {
    q: Array,
    latent: Array,
    k_pe: Array,
    index: Option<IndexerInputs>,
}

/// `scores` where `visible` (booleans broadcasting against it), the lowest float elsewhere
/// (the reference's masking of the rotated scores, which then serve as SDPA's additive mask).
fn mask_scores(scores: &Array, visible: &Array) -> Result<Array> {
    Ok(ops::select(
        visible,
        scores,
        Array::from_f32(f32::MIN).as_dtype(scores.dtype())?,
    )?)
}
