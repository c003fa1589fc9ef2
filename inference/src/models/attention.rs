//! Grouped-query attention with RoPE (mlx-lm's attention blocks): the projections, per-head
//! Q/K norms where a family has them, and attention of a sequence's new positions over its own
//! cache ([`Attention::forward`]) or of every decoding row at once ([`crate::kv_rows`]). Each
//! attention cuts itself for tensor parallelism by heads ([`Attention::cut`]).

use super::block_index::{BlockIndexer, IndexProjections};
use super::parts::{all_sum, check_shape, layer_tensor};
use crate::config::ModelConfig;
use crate::error::{InferenceError, Result};
use crate::kv_cache::LayerCache;
use crate::kv_rows::{LayerKv, RowLayer, RowStep};
use crate::linear::Linear;
use crate::quantized::slice_axis;
use crate::ring::RingGroup;
use crate::rope::Rope;
use crate::sliding_window::visible;
use crate::weights::{TensorSource, WeightFormat};
use mlx_rs::fast::ScaledDotProductAttentionMask;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{ops, Array};
use std::sync::Arc;

/// RMS norms applied to the queries and keys before RoPE: over each head (Qwen3, GLM) or
/// over all heads together (MiniMax).
#[derive(Debug, Clone)]
pub struct HeadNorms {
    /// `[head_dim]`, or `[heads·head_dim]` over all heads.
    pub(crate) q: Array,
    /// `[head_dim]`, or `[kv_heads·head_dim]` over all heads.
    pub(crate) k: Array,
    /// What one norm spans.
    pub(crate) span: NormSpan,
}

/// What one query/key RMS norm spans.
#[derive(Debug, Clone)]
pub enum NormSpan {
    /// Each head alone.
    EachHead,
    /// Every head of the layer together. Under tensor parallelism a rank holds some heads:
    /// their sum of squares is added over `reduce` before dividing, so the norm is the whole
    /// layer's.
    AllHeads {
        /// The tensor-parallel ring, once cut.
        reduce: Option<Arc<RingGroup>>,
    },
}

impl HeadNorms {
    /// Norms over each head, weights `[head_dim]`.
    pub(crate) fn each_head(q: Array, k: Array) -> HeadNorms {
        HeadNorms {
            q,
            k,
            span: NormSpan::EachHead,
        }
    }

    /// Norms over all heads together, weights `[heads·head_dim]` and `[kv_heads·head_dim]`.
    pub(crate) fn all_heads(q: Array, k: Array) -> HeadNorms {
        HeadNorms {
            q,
            k,
            span: NormSpan::AllHeads { reduce: None },
        }
    }

    /// `t` `[b, l, width]` normalized with `w`: `t / rms(t) · w`, the mean of squares taken
    /// over `width` (all heads), or over every rank's heads when cut.
    fn across_heads(
        t: &Array,
        w: &Array,
        eps: f32,
        reduce: &Option<Arc<RingGroup>>,
    ) -> Result<Array> {
        let Some(group) = reduce else {
            return crate::cpu_layer_ops::rms_norm(t, Some(w), eps);
        };
        let width = *t.shape().last().unwrap_or(&1) * group.size() as i32;
        let squares = group.all_sum(&t.square()?.sum_axis(-1, true)?)?;
        let mean = ops::divide(&squares, Array::from_f32(width as f32))?;
        let inv = ops::rsqrt(ops::add(&mean, Array::from_f32(eps))?)?;
        Ok(ops::multiply(&ops::multiply(t, &inv)?, w)?)
    }

    /// This rank's slice: per-head weights stay whole, all-head weights keep the rank's heads
    /// (`[q0, q1)` and `[k0, k1)` of the widths) and add their squares over `group`.
    fn cut(&self, q: (usize, usize), k: (usize, usize), group: &Arc<RingGroup>) -> Result<Self> {
        Ok(match self.span {
            NormSpan::EachHead => self.clone(),
            NormSpan::AllHeads { .. } => HeadNorms {
                q: crate::quantized::slice_axis(&self.q, 0, q.0, q.1)?,
                k: crate::quantized::slice_axis(&self.k, 0, k.0, k.1)?,
                span: NormSpan::AllHeads {
                    reduce: Some(group.clone()),
                },
            },
        })
    }
}

/// Multi-head attention with grouped keys/values, RoPE and, where the family has them, per-head
/// Q/K norms, attention sinks and a sliding window.
#[derive(Debug, Clone)]
pub struct Attention {
    pub(crate) q_proj: Linear,
    pub(crate) k_proj: Linear,
    pub(crate) v_proj: Linear,
    pub(crate) o_proj: Linear,
    pub(crate) head_norms: Option<HeadNorms>,
    pub(crate) num_heads: i32,
    pub(crate) num_kv_heads: i32,
    pub(crate) head_dim: i32,
    pub(crate) eps: f32,
    pub(crate) rope: Rope,
    /// Factor on the query-key products (`1/sqrt(head_dim)` unless the family says otherwise).
    pub(crate) scale: f32,
    /// Per head, a logit that joins every query's softmax without a value (gpt-oss's
    /// `sinks`): attention may give weight to "nothing".
    pub(crate) sinks: Option<Array>,
    /// A sliding layer's window: a query sees the last `window` positions, itself included.
    pub(crate) window: Option<usize>,
    /// Tensor parallel: the ring whose ranks each hold a slice of the heads; the output
    /// projection's partial sums are added up over it.
    pub(crate) reduce: Option<Arc<RingGroup>>,
    /// Qwen3-Next's gated attention: each head's query row block is followed by as many gate
    /// rows in `q_proj`, and the heads' outputs are multiplied by `sigmoid(gate)` before the
    /// output projection.
    pub(crate) output_gate: bool,
    /// Gemma 4: each head's values are RMS-normalized (without a weight) before they are
    /// cached.
    pub(crate) value_norm: bool,
    /// Step 3.5's head-wise gate (`g_proj`, one row per head): each head's output times
    /// `sigmoid(g_proj(x))` of its row. Cut with the heads.
    pub(crate) head_gate: Option<Linear>,
    /// MiniMax M3's block-sparse attention: the indexer choosing which blocks of past
    /// positions each query reads.
    pub(crate) block_index: Option<Box<BlockIndexer>>,
    /// Whether later layers read this layer's keys and values ([`Attention::lending_kv`]).
    pub(crate) lends_kv: bool,
}

impl Attention {
    /// The projections of layer `layer` (with their biases where the weights have them) and
    /// `head_norms`, checked against the configuration; the layer's window, if the
    /// configuration makes it a sliding layer.
    pub(crate) fn load(
        config: &ModelConfig,
        source: &mut dyn TensorSource,
        layer: usize,
        format: WeightFormat,
        head_norms: Option<HeadNorms>,
    ) -> Result<Attention> {
        Attention::load_gated(config, source, layer, format, head_norms, false)
    }

    /// As [`Attention::load`]; with `output_gate`, `q_proj` holds each head's queries and
    /// then its gate (Qwen3-Next, Qwen3.5).
    pub(crate) fn load_gated(
        config: &ModelConfig,
        source: &mut dyn TensorSource,
        layer: usize,
        format: WeightFormat,
        head_norms: Option<HeadNorms>,
        output_gate: bool,
    ) -> Result<Attention> {
        Attention::read(
            config,
            source,
            layer,
            format,
            head_norms,
            output_gate,
            false,
        )
    }

    /// As [`Attention::load`] for a layer without `v_proj`, whose values are its keys before
    /// the key norm and RoPE (Gemma 4's full-attention layers, `attention_k_eq_v`).
    pub(crate) fn load_keys_as_values(
        config: &ModelConfig,
        source: &mut dyn TensorSource,
        layer: usize,
        format: WeightFormat,
        head_norms: Option<HeadNorms>,
    ) -> Result<Attention> {
        Attention::read(config, source, layer, format, head_norms, false, true)
    }

    fn read(
        config: &ModelConfig,
        source: &mut dyn TensorSource,
        layer: usize,
        format: WeightFormat,
        head_norms: Option<HeadNorms>,
        output_gate: bool,
        keys_are_values: bool,
    ) -> Result<Attention> {
        let p = |part: &str| layer_tensor(layer, part);
        let (q_rows, kv_rows) = (
            config.num_heads * config.head_dim * if output_gate { 2 } else { 1 },
            config.num_kv_heads * config.head_dim,
        );
        let mut proj = |part: &str, rows: usize| -> Result<Linear> {
            let linear = source.linear(&p(part), format)?;
            check_shape(&linear.weight, &p(part), rows)?;
            Ok(linear)
        };
        let k_proj = proj("self_attn.k_proj", kv_rows)?;
        Ok(Attention {
            q_proj: proj("self_attn.q_proj", q_rows)?,
            v_proj: if keys_are_values {
                k_proj.clone()
            } else {
                proj("self_attn.v_proj", kv_rows)?
            },
            k_proj,
            o_proj: proj("self_attn.o_proj", config.hidden_size)?,
            head_norms,
            num_heads: config.num_heads as i32,
            num_kv_heads: config.num_kv_heads as i32,
            head_dim: config.head_dim as i32,
            eps: config.rms_norm_eps,
            rope: Rope::new(
                config.attention.rotary_dim.unwrap_or(config.head_dim),
                config.rope_theta,
                &config.rope_scaling,
            )
            .with_mrope(config.attention.mrope_section),
            scale: 1.0 / (config.head_dim as f32).sqrt(),
            sinks: None,
            window: config
                .sliding_window
                .as_ref()
                .and_then(|w| w.of_layer(layer)),
            reduce: None,
            output_gate,
            value_norm: false,
            head_gate: None,
            block_index: None,
            lends_kv: false,
        })
    }

    /// With block-sparse attention chosen by `indexer` (MiniMax M3).
    pub(crate) fn with_block_index(self, indexer: BlockIndexer) -> Attention {
        Attention {
            block_index: Some(Box::new(indexer)),
            ..self
        }
    }

    /// With a head-wise gate `g_proj` (`[heads, hidden]`), `name` naming it in errors.
    pub(crate) fn with_head_gate(self, gate: Linear, name: &str) -> Result<Attention> {
        check_shape(&gate.weight, name, self.num_heads as usize)?;
        Ok(Attention {
            head_gate: Some(gate),
            ..self
        })
    }

    /// With each head's values RMS-normalized without a weight (Gemma 4).
    pub(crate) fn with_value_norm(self) -> Attention {
        Attention {
            value_norm: true,
            ..self
        }
    }

    /// With per-head attention sinks `[heads]`.
    pub(crate) fn with_sinks(self, sinks: Array) -> Result<Attention> {
        if sinks.shape() != [self.num_heads] {
            return Err(InferenceError::BadTensor {
                name: "self_attn.sinks".into(),
                reason: format!(
                    "expected one sink per head ({}), found shape {:?}",
                    self.num_heads,
                    sinks.shape()
                ),
            });
        }
        Ok(Attention {
            sinks: Some(sinks),
            ..self
        })
    }

    /// With another factor on the query-key products.
    pub(crate) fn with_scale(self, scale: f32) -> Attention {
        Attention { scale, ..self }
    }

    /// With another RoPE (a layer kind with its own base).
    pub(crate) fn with_rope(self, rope: Rope) -> Attention {
        Attention { rope, ..self }
    }

    /// `x`: `[batch, seq, hidden]`, one sequence (per batch row) continuing `cache`.
    pub fn forward(&self, x: &Array, cache: &mut LayerCache) -> Result<Array> {
        let l = x.shape()[1] as usize;
        self.forward_segments(x, &mut [LayerKv::Own(l, cache)])
    }

    /// Several sequences in one pass (continuous batching): `x` is `[1, total, hidden]`, the
    /// new positions of each sequence one after another, and `segments` says, in the same
    /// order, how many positions each has and which cache it continues. The projections run
    /// once over all positions (one read of the weights for every sequence). A sequence with
    /// its own cache gets RoPE, its cache write and attention at its own offset; the decoding
    /// rows ([`crate::kv_rows`]) get them once for all rows, each at its own position and
    /// masked to its own columns. Either way each sequence sees exactly what it would alone.
    pub fn forward_segments(&self, x: &Array, segments: &mut [LayerKv<'_>]) -> Result<Array> {
        let (b, l) = (x.shape()[0], x.shape()[1]);
        let heads = |t: Array, n: i32, norm: Option<&Array>| -> Result<Array> {
            let span = self.head_norms.as_ref().map(|h| &h.span);
            let t = match (norm, span) {
                (Some(w), Some(NormSpan::AllHeads { reduce })) => {
                    HeadNorms::across_heads(&t, w, self.eps, reduce)?.reshape(&[
                        b,
                        l,
                        n,
                        self.head_dim,
                    ])?
                }
                (Some(w), _) => crate::cpu_layer_ops::rms_norm(
                    &t.reshape(&[b, l, n, self.head_dim])?,
                    Some(w),
                    self.eps,
                )?,
                (None, _) => t.reshape(&[b, l, n, self.head_dim])?,
            };
            Ok(t.transpose_axes(&[0, 2, 1, 3])?)
        };
        let norms = self.head_norms.as_ref();
        let (queries, gate) = if self.output_gate {
            let both = self
                .q_proj
                .forward(x)?
                .reshape(&[b, l, self.num_heads, -1])?;
            let d = self.head_dim;
            let half = |from: i32| {
                both.index((.., .., .., from..from + d))
                    .reshape(&[b, l, self.num_heads * d])
            };
            (half(0)?, Some(half(d)?))
        } else {
            (self.q_proj.forward(x)?, None)
        };
        let q = heads(queries, self.num_heads, norms.map(|n| &n.q))?;
        let k = heads(
            self.k_proj.forward(x)?,
            self.num_kv_heads,
            norms.map(|n| &n.k),
        )?;
        let v = if self.value_norm {
            let v = self.v_proj.forward(x)?;
            let v = v.reshape(&[b, l, self.num_kv_heads, self.head_dim])?;
            crate::cpu_layer_ops::rms_norm(&v, None, self.eps)?.transpose_axes(&[0, 2, 1, 3])?
        } else {
            heads(self.v_proj.forward(x)?, self.num_kv_heads, None)?
        };
        let index = self
            .block_index
            .as_ref()
            .map(|indexer| indexer.project(x))
            .transpose()?;
        let o = if let [LayerKv::Own(_, cache)] = segments {
            self.attend(q, k, v, index, cache)?
        } else {
            let mut outs = Vec::with_capacity(segments.len());
            let mut at = 0i32;
            for segment in segments.iter_mut() {
                let len = match segment {
                    LayerKv::Own(len, _) => *len as i32,
                    LayerKv::Rows(_, step) => step.rows() as i32,
                };
                let end = at + len;
                let part = |t: &Array| t.index((.., .., at..end, ..));
                outs.push(match segment {
                    LayerKv::Own(_, cache) => {
                        let index = index.as_ref().map(|i| i.part(at, end));
                        self.attend(part(&q), part(&k), part(&v), index, cache)?
                    }
                    LayerKv::Rows(layer, step) => {
                        self.attend_rows(part(&q), part(&k), part(&v), layer, step)?
                    }
                });
                at = end;
            }
            if outs.len() == 1 {
                outs.pop().expect("one output")
            } else {
                ops::concatenate(&outs, 2)?
            }
        };
        let o = o.transpose_axes(&[0, 2, 1, 3])?;
        let o = match &self.head_gate {
            Some(g) => ops::multiply(&o, &ops::sigmoid(&g.forward(x)?)?.expand_dims(-1)?)?,
            None => o,
        };
        let o = o.reshape(&[b, l, self.num_heads * self.head_dim])?;
        let o = match gate {
            Some(g) => ops::multiply(&o, &ops::sigmoid(&g)?)?,
            None => o,
        };
        all_sum(self.o_proj.forward(&o)?, &self.reduce)
    }

    /// Attention of one sequence's new positions (`[b, heads, new, head_dim]`) over its cache.
    fn attend(
        &self,
        q: Array,
        k: Array,
        v: Array,
        index: Option<IndexProjections>,
        cache: &mut LayerCache,
    ) -> Result<Array> {
        let l = q.shape()[2];
        let offset = cache.len();
        let q = self.rope.apply_in(&q, offset, cache.mrope())?;
        let k = self.rope.apply_in(&k, offset, cache.mrope())?;
        if let (Some(indexer), Some(index)) = (&self.block_index, index) {
            // The index keys are cached as one more value head; the layer decodes alone.
            let v = indexer.values_with_keys(&v, &index, offset)?;
            cache.keep_out_of_decode_rows();
            let (k, cached) = cache.append(k, v)?;
            let (v, index_keys) = indexer.split_values(&cached);
            let mask = indexer.select(&index, &index_keys, offset, self.num_heads)?;
            let mask = match &mask {
                Some(m) => Some(ScaledDotProductAttentionMask::Array(m)),
                None => (l > 1).then_some(ScaledDotProductAttentionMask::Causal),
            };
            return self.sdpa(&q, &k, &v, mask);
        }
        let (k, v, held_from) = cache.append_within(k, v, self.window)?;
        if self.lends_kv {
            cache.lend(crate::kv_cache::LentKv {
                keys: k.clone(),
                values: v.clone(),
                held_from,
                offset,
            });
        }
        let (k, v, mask) = visible(&k, &v, held_from, offset, l as usize, self.window);
        self.sdpa(&q, &k, &v, mask.as_sdpa())
    }

    /// With this step's keys and values lent to the layers that share this layer's cache
    /// (Gemma 4's KV-shared layers, [`super::shared_kv`]).
    pub(crate) fn lending_kv(self) -> Attention {
        Attention {
            lends_kv: true,
            ..self
        }
    }

    /// Scaled dot-product attention with this attention's scale and sinks.
    fn sdpa(
        &self,
        q: &Array,
        k: &Array,
        v: &Array,
        mask: Option<ScaledDotProductAttentionMask<'_>>,
    ) -> Result<Array> {
        crate::cpu_layer_ops::attention(q, k, v, self.scale, mask, self.sinks.as_ref())
    }

    /// Attention of the decoding rows' new positions (`[1, heads, rows, head_dim]`, one per
    /// row, in row order) over their shared buffers.
    fn attend_rows(
        &self,
        q: Array,
        k: Array,
        v: Array,
        layer: &mut RowLayer,
        step: &RowStep,
    ) -> Result<Array> {
        if self.block_index.is_some() {
            return Err(InferenceError::InvalidRequest(
                "a block-sparse attention layer decodes each sequence on its own cache, not \
                 in the shared decode rows"
                    .into(),
            ));
        }
        // [1, heads, rows, d] -> [rows, heads, 1, d]: each row a batch entry.
        let by_row = |t: Array| t.transpose_axes(&[2, 1, 0, 3]);
        let q = self.rope.apply_at(&by_row(q)?, &step.positions)?;
        let k = self.rope.apply_at(&by_row(k)?, &step.positions)?;
        let (k, v, held_from) = layer.write(&k, &by_row(v)?, step)?;
        // Rows are right-aligned: every row's new position is the last column, so a window
        // is the same last columns for every row. The buffers hold columns from `held_from`.
        let columns = held_from as i32 + k.shape()[2];
        let first = match self.window {
            Some(w) => (columns - w as i32).max(held_from as i32),
            None => held_from as i32,
        };
        let (k, v, mask) = if first > 0 {
            let local = first - held_from as i32;
            let cut = |t: &Array| t.index((.., .., local.., ..));
            let mask = step.mask.as_ref().map(|m| m.index((.., .., .., first..)));
            (cut(&k), cut(&v), mask)
        } else {
            (k, v, step.mask.clone())
        };
        let o = self.sdpa(
            &q,
            &k,
            &v,
            mask.as_ref().map(ScaledDotProductAttentionMask::Array),
        )?;
        Ok(by_row(o)?)
    }

    /// Rank `rank`'s slice of a `size`-way tensor-parallel instance: query heads
    /// `[r·h/n, (r+1)·h/n)` with exactly the key/value heads they use, so grouped-query
    /// attention needs no communication; the output projection's partial sums are added over
    /// `group`.
    pub(crate) fn cut(
        &self,
        rank: usize,
        size: usize,
        group: &Arc<RingGroup>,
        what: &str,
    ) -> Result<Attention> {
        let (heads, kv_heads) = (self.num_heads as usize, self.num_kv_heads as usize);
        for (kind, count) in [("attention heads", heads), ("key/value heads", kv_heads)] {
            if !count.is_multiple_of(size) {
                return Err(InferenceError::BadSplit(format!(
                    "{count} {kind} cannot be split over {size} ranks; choose a ring size \
                     that divides it"
                )));
            }
        }
        let d = self.head_dim as usize;
        let (heads, kv_heads) = (heads / size, kv_heads / size);
        let (q0, q1) = (rank * heads * d, (rank + 1) * heads * d);
        let (k0, k1) = (rank * kv_heads * d, (rank + 1) * kv_heads * d);
        let name = |n: &str| format!("{what} {n}");
        // A gated q_proj holds each head's gate rows right after its query rows.
        let gated = if self.output_gate { 2 } else { 1 };
        Ok(Attention {
            q_proj: self.q_proj.slice_rows(gated * q0, gated * q1)?,
            k_proj: self.k_proj.slice_rows(k0, k1)?,
            v_proj: self.v_proj.slice_rows(k0, k1)?,
            o_proj: self.o_proj.slice_columns(q0, q1, size, &name("o_proj"))?,
            head_norms: self
                .head_norms
                .as_ref()
                .map(|n| n.cut((q0, q1), (k0, k1), group))
                .transpose()?,
            num_heads: heads as i32,
            num_kv_heads: kv_heads as i32,
            head_dim: self.head_dim,
            eps: self.eps,
            rope: self.rope.clone(),
            scale: self.scale,
            sinks: self
                .sinks
                .as_ref()
                .map(|s| slice_axis(s, 0, rank * heads, (rank + 1) * heads))
                .transpose()?,
            window: self.window,
            reduce: Some(group.clone()),
            output_gate: self.output_gate,
            value_norm: self.value_norm,
            head_gate: self
                .head_gate
                .as_ref()
                .map(|g| g.slice_rows(rank * heads, (rank + 1) * heads))
                .transpose()?,
            block_index: self
                .block_index
                .as_ref()
                .map(|b| b.cut(rank, size).map(Box::new))
                .transpose()?,
            lends_kv: self.lends_kv,
        })
    }

    /// Every array of the attention (to evaluate them eagerly).
    pub(crate) fn arrays(&self) -> Vec<&Array> {
        let mut v: Vec<&Array> = [&self.q_proj, &self.k_proj, &self.v_proj, &self.o_proj]
            .into_iter()
            .flat_map(Linear::arrays)
            .collect();
        v.extend(self.head_norms.iter().flat_map(|n| [&n.q, &n.k]));
        v.extend(self.head_gate.iter().flat_map(Linear::arrays));
        v.extend(self.sinks.iter());
        v.extend(self.block_index.iter().flat_map(|b| b.arrays()));
        v
    }
}
