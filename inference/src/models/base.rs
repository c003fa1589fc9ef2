//! The pieces the model families share (as mlx-lm's `base.py` and the blocks its model files
//! repeat): grouped-query attention with RoPE, the SwiGLU MLP, the pre-norm decoder block, and
//! the helpers that read them from a [`TensorSource`]. A family ([`super::llama`],
//! [`super::qwen2`], [`super::qwen3`]) decides which of them its block uses and under which
//! tensor names; nothing here asks which family it serves.

use super::moe::MoeBlock;
use crate::config::ModelConfig;
use crate::error::{InferenceError, Result};
use crate::kv_cache::LayerCache;
use crate::kv_rows::{LayerKv, RowLayer, RowStep};
use crate::linear::{Linear, Matrix};
use crate::ring::RingGroup;
use crate::rope::Rope;
use crate::weights::{GgufNames, TensorSource, WeightFormat};
use mlx_rs::fast::{self, ScaledDotProductAttentionMask};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{nn, ops, Array};
use std::sync::Arc;

/// What makes a model family: how one of its decoder blocks is read from its tensors, and the
/// names those tensors carry (in Hugging Face folders; in GGUF files through [`GgufNames`]).
pub trait Family: GgufNames {
    /// Reads layer `layer` from `source`. The default is the plain Llama block (Qwen2's Q/K/V
    /// biases come with the projections, `TensorSource::linear`); a family with more in its
    /// block (Qwen3's Q/K norms) reads it itself.
    fn block(
        &self,
        config: &ModelConfig,
        source: &mut dyn TensorSource,
        layer: usize,
        format: WeightFormat,
    ) -> Result<DecoderLayer> {
        let attention = Attention::load(config, source, layer, format, None)?;
        DecoderLayer::load(config, source, layer, format, attention)
    }

    /// Hugging Face names of layer `layer`'s tensors (`model.layers.N.…`), as an export writes
    /// them.
    fn layer_tensor_names(&self, config: &ModelConfig, layer: usize) -> Vec<String>;

    /// The counts a tensor-parallel ring size must divide (heads, widths, their quantization
    /// groups): what placement checks before it places, and the cut checks again.
    fn tensor_divisors(&self, config: &ModelConfig) -> Vec<crate::tensor_split::TensorDivisor> {
        crate::tensor_split::standard_divisors(config)
    }

    /// Reads what only this family's `config.json` holds (its experts, its attention's
    /// shape) into `config`, after the shared numbers are read. The default reads nothing.
    fn configure(&self, json: &serde_json::Value, config: &mut ModelConfig) -> Result<()> {
        let _ = (json, config);
        Ok(())
    }
}

/// Hugging Face names of the weight matrices and norms every family's layer has, with the GGUF
/// names llama.cpp gives them (`model.layers.N.<hf>` is `blk.N.<gguf>`).
pub(crate) const LAYER_TENSORS: &[(&str, &str)] = &[
    ("self_attn.q_proj", "attn_q"),
    ("self_attn.k_proj", "attn_k"),
    ("self_attn.v_proj", "attn_v"),
    ("self_attn.o_proj", "attn_output"),
    ("mlp.gate_proj", "ffn_gate"),
    ("mlp.up_proj", "ffn_up"),
    ("mlp.down_proj", "ffn_down"),
    ("input_layernorm", "attn_norm"),
    ("post_attention_layernorm", "ffn_norm"),
];

/// The GGUF name of `hf_part` in the tables of a family's tensors.
pub(crate) fn gguf_part_in<'a>(
    tables: impl IntoIterator<Item = &'a (&'static str, &'static str)>,
    hf_part: &str,
) -> Option<&'static str> {
    tables
        .into_iter()
        .find(|(hf, _)| *hf == hf_part)
        .map(|(_, gguf)| *gguf)
}

/// Biases of the Q, K and V projections (Qwen2 always, Llama when configured).
pub(crate) const QKV_BIASES: &[&str] = &[
    "self_attn.q_proj.bias",
    "self_attn.k_proj.bias",
    "self_attn.v_proj.bias",
];

/// The name of tensor `part` (`self_attn.q_proj.weight`) of layer `layer`.
pub(crate) fn layer_tensor(layer: usize, part: &str) -> String {
    format!("model.layers.{layer}.{part}")
}

/// Adds up a row-parallel projection's partial results over the tensor-parallel ring.
pub(crate) fn all_sum(partial: Array, reduce: &Option<Arc<RingGroup>>) -> Result<Array> {
    match reduce {
        Some(group) => Ok(group.all_sum(&partial)?),
        None => Ok(partial),
    }
}

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
            return Ok(fast::rms_norm(t, Some(w), eps)?);
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
/// Q/K norms.
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
    /// Tensor parallel: the ring whose ranks each hold a slice of the heads; the output
    /// projection's partial sums are added up over it.
    pub(crate) reduce: Option<Arc<RingGroup>>,
}

impl Attention {
    /// The projections of layer `layer` (with their biases where the weights have them) and
    /// `head_norms`, checked against the configuration.
    pub(crate) fn load(
        config: &ModelConfig,
        source: &mut dyn TensorSource,
        layer: usize,
        format: WeightFormat,
        head_norms: Option<HeadNorms>,
    ) -> Result<Attention> {
        let p = |part: &str| layer_tensor(layer, part);
        let (q_rows, kv_rows) = (
            config.num_heads * config.head_dim,
            config.num_kv_heads * config.head_dim,
        );
        let mut proj = |part: &str, rows: usize| -> Result<Linear> {
            let linear = source.linear(&p(part), format)?;
            check_shape(&linear.weight, &p(part), rows)?;
            Ok(linear)
        };
        Ok(Attention {
            q_proj: proj("self_attn.q_proj", q_rows)?,
            k_proj: proj("self_attn.k_proj", kv_rows)?,
            v_proj: proj("self_attn.v_proj", kv_rows)?,
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
            ),
            reduce: None,
        })
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
                (Some(w), _) => {
                    fast::rms_norm(&t.reshape(&[b, l, n, self.head_dim])?, Some(w), self.eps)?
                }
                (None, _) => t.reshape(&[b, l, n, self.head_dim])?,
            };
            Ok(t.transpose_axes(&[0, 2, 1, 3])?)
        };
        let norms = self.head_norms.as_ref();
        let q = heads(self.q_proj.forward(x)?, self.num_heads, norms.map(|n| &n.q))?;
        let k = heads(
            self.k_proj.forward(x)?,
            self.num_kv_heads,
            norms.map(|n| &n.k),
        )?;
        let v = heads(self.v_proj.forward(x)?, self.num_kv_heads, None)?;
        let o = if let [LayerKv::Own(_, cache)] = segments {
            self.attend(q, k, v, cache)?
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
                    LayerKv::Own(_, cache) => self.attend(part(&q), part(&k), part(&v), cache)?,
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
        let o =
            o.transpose_axes(&[0, 2, 1, 3])?
                .reshape(&[b, l, self.num_heads * self.head_dim])?;
        all_sum(self.o_proj.forward(&o)?, &self.reduce)
    }

    /// Attention of one sequence's new positions (`[b, heads, new, head_dim]`) over its cache.
    fn attend(&self, q: Array, k: Array, v: Array, cache: &mut LayerCache) -> Result<Array> {
        let l = q.shape()[2];
        let offset = cache.len();
        let q = self.rope.apply(&q, offset)?;
        let k = self.rope.apply(&k, offset)?;
        let (k, v) = cache.append(k, v)?;
        let scale = 1.0 / (self.head_dim as f32).sqrt();
        let mask = if l > 1 {
            Some(ScaledDotProductAttentionMask::Causal)
        } else {
            None
        };
        Ok(fast::scaled_dot_product_attention(
            &q, &k, &v, scale, mask, None,
        )?)
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
        // [1, heads, rows, d] -> [rows, heads, 1, d]: each row a batch entry.
        let by_row = |t: Array| t.transpose_axes(&[2, 1, 0, 3]);
        let q = self.rope.apply_at(&by_row(q)?, &step.positions)?;
        let k = self.rope.apply_at(&by_row(k)?, &step.positions)?;
        let (k, v) = layer.write(&k, &by_row(v)?, step)?;
        let scale = 1.0 / (self.head_dim as f32).sqrt();
        let o = fast::scaled_dot_product_attention(
            &q,
            &k,
            &v,
            scale,
            step.mask.as_ref().map(ScaledDotProductAttentionMask::Array),
            None,
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
        Ok(Attention {
            q_proj: self.q_proj.slice_rows(q0, q1)?,
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
            reduce: Some(group.clone()),
        })
    }

    fn arrays(&self) -> Vec<&Array> {
        let mut v: Vec<&Array> = [&self.q_proj, &self.k_proj, &self.v_proj, &self.o_proj]
            .into_iter()
            .flat_map(Linear::arrays)
            .collect();
        v.extend(self.head_norms.iter().flat_map(|n| [&n.q, &n.k]));
        v
    }
}

/// The SwiGLU feed-forward: `down(silu(gate(x)) * up(x))`.
#[derive(Debug, Clone)]
pub struct Mlp {
    pub(crate) gate_proj: Linear,
    pub(crate) up_proj: Linear,
    pub(crate) down_proj: Linear,
    /// Tensor parallel: see [`Attention`].
    pub(crate) reduce: Option<Arc<RingGroup>>,
}

impl Mlp {
    /// The MLP of layer `layer`, checked against the configuration.
    pub(crate) fn load(
        config: &ModelConfig,
        source: &mut dyn TensorSource,
        layer: usize,
        format: WeightFormat,
    ) -> Result<Mlp> {
        let prefix = layer_tensor(layer, "mlp");
        Mlp::load_at(config, source, &prefix, config.intermediate_size, format)
    }

    /// The MLP `width` units wide under `prefix` (`model.layers.3.mlp.shared_experts`).
    pub(crate) fn load_at(
        config: &ModelConfig,
        source: &mut dyn TensorSource,
        prefix: &str,
        width: usize,
        format: WeightFormat,
    ) -> Result<Mlp> {
        let p = |part: &str| format!("{prefix}.{part}");
        let mlp = Mlp {
            gate_proj: source.linear(&p("gate_proj"), format)?,
            up_proj: source.linear(&p("up_proj"), format)?,
            down_proj: source.linear(&p("down_proj"), format)?,
            reduce: None,
        };
        check_shape(&mlp.gate_proj.weight, &p("gate_proj"), width)?;
        check_shape(&mlp.up_proj.weight, &p("up_proj"), width)?;
        check_shape(&mlp.down_proj.weight, &p("down_proj"), config.hidden_size)?;
        Ok(mlp)
    }

    /// Applies the block.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let gate = nn::silu(self.gate_proj.forward(x)?)?;
        let h = ops::multiply(&gate, &self.up_proj.forward(x)?)?;
        all_sum(self.down_proj.forward(&h)?, &self.reduce)
    }

    pub(crate) fn arrays(&self) -> Vec<&Array> {
        [&self.gate_proj, &self.up_proj, &self.down_proj]
            .into_iter()
            .flat_map(Linear::arrays)
            .collect()
    }

    /// Rank `rank`'s slice of a `size`-way tensor-parallel instance: its share of the hidden
    /// units (gate and up by rows, down by columns).
    pub(crate) fn cut(
        &self,
        rank: usize,
        size: usize,
        group: &Arc<RingGroup>,
        what: &str,
    ) -> Result<Mlp> {
        let width = self.gate_proj.weight.out_rows();
        if !width.is_multiple_of(size) {
            return Err(InferenceError::BadSplit(format!(
                "{what}: an MLP of {width} units cannot be split over {size} ranks"
            )));
        }
        let (f0, f1) = (rank * width / size, (rank + 1) * width / size);
        Ok(Mlp {
            gate_proj: self.gate_proj.slice_rows(f0, f1)?,
            up_proj: self.up_proj.slice_rows(f0, f1)?,
            down_proj: self.down_proj.slice_columns(f0, f1, size, what)?,
            reduce: Some(group.clone()),
        })
    }
}

/// A block's feed-forward: a dense SwiGLU MLP or a Mixture of Experts (the family decides,
/// layer by layer).
#[derive(Debug, Clone)]
pub enum FeedForward {
    /// One SwiGLU MLP.
    Dense(Mlp),
    /// Routed experts.
    Experts(MoeBlock),
}

impl FeedForward {
    /// Applies it.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        match self {
            FeedForward::Dense(m) => m.forward(x),
            FeedForward::Experts(m) => m.forward(x),
        }
    }

    /// Rank `rank`'s slice of a `size`-way tensor-parallel instance.
    pub(crate) fn cut(
        &self,
        rank: usize,
        size: usize,
        group: &Arc<RingGroup>,
        what: &str,
    ) -> Result<FeedForward> {
        Ok(match self {
            FeedForward::Dense(m) => FeedForward::Dense(m.cut(rank, size, group, what)?),
            FeedForward::Experts(m) => FeedForward::Experts(m.cut(rank, size, group, what)?),
        })
    }

    /// A dense f32 matrix of the block to time one-row products with (see
    /// [`crate::linear::calibrate_row_product`]).
    pub(crate) fn calibration_matrix(&self) -> Option<&Array> {
        match self {
            FeedForward::Dense(m) => match &m.gate_proj.weight {
                Matrix::Dense(w) => Some(w),
                Matrix::Quantized(_) => None,
            },
            FeedForward::Experts(_) => None,
        }
    }

    fn arrays(&self) -> Vec<&Array> {
        match self {
            FeedForward::Dense(m) => m.arrays(),
            FeedForward::Experts(m) => m.arrays(),
        }
    }
}

/// A block's attention: heads with their own keys and values, or latent attention (the
/// family decides).
#[derive(Debug, Clone)]
pub enum SelfAttention {
    /// Grouped-query heads.
    Heads(Attention),
    /// Multi-head latent attention (DeepSeek V3).
    Latent(super::mla::LatentAttention),
}

impl From<Attention> for SelfAttention {
    fn from(a: Attention) -> SelfAttention {
        SelfAttention::Heads(a)
    }
}

impl SelfAttention {
    fn forward_segments(&self, x: &Array, segments: &mut [LayerKv<'_>]) -> Result<Array> {
        match self {
            SelfAttention::Heads(a) => a.forward_segments(x, segments),
            SelfAttention::Latent(a) => a.forward_segments(x, segments),
        }
    }

    fn cut(
        &self,
        rank: usize,
        size: usize,
        group: &Arc<RingGroup>,
        what: &str,
    ) -> Result<SelfAttention> {
        Ok(match self {
            SelfAttention::Heads(a) => SelfAttention::Heads(a.cut(rank, size, group, what)?),
            SelfAttention::Latent(a) => SelfAttention::Latent(a.cut(rank, size, group, what)?),
        })
    }

    fn arrays(&self) -> Vec<&Array> {
        match self {
            SelfAttention::Heads(a) => a.arrays(),
            SelfAttention::Latent(a) => a.arrays(),
        }
    }
}

/// One pre-norm transformer block.
#[derive(Debug, Clone)]
pub struct DecoderLayer {
    pub(crate) input_norm: Array,
    pub(crate) attention: SelfAttention,
    pub(crate) post_attention_norm: Array,
    pub(crate) ffn: FeedForward,
    pub(crate) eps: f32,
}

impl DecoderLayer {
    /// The block of layer `layer` around `attention` with a dense MLP, and its two norms.
    pub(crate) fn load(
        config: &ModelConfig,
        source: &mut dyn TensorSource,
        layer: usize,
        format: WeightFormat,
        attention: Attention,
    ) -> Result<DecoderLayer> {
        let mlp = FeedForward::Dense(Mlp::load(config, source, layer, format)?);
        DecoderLayer::assemble(config, source, layer, format, attention, mlp)
    }

    /// The block of layer `layer` from its attention and feed-forward, with its two norms.
    pub(crate) fn assemble(
        config: &ModelConfig,
        source: &mut dyn TensorSource,
        layer: usize,
        format: WeightFormat,
        attention: impl Into<SelfAttention>,
        ffn: FeedForward,
    ) -> Result<DecoderLayer> {
        let dtype = format.compute_dtype();
        let p = |part: &str| layer_tensor(layer, part);
        Ok(DecoderLayer {
            input_norm: source.dense(&p("input_layernorm.weight"), dtype)?,
            attention: attention.into(),
            post_attention_norm: source.dense(&p("post_attention_layernorm.weight"), dtype)?,
            ffn,
            eps: config.rms_norm_eps,
        })
    }

    /// Rank `rank`'s slice of a `size`-way tensor-parallel instance over `group`: its heads
    /// and its share of the feed-forward; the norms stay whole.
    pub(crate) fn cut(
        &self,
        rank: usize,
        size: usize,
        group: &Arc<RingGroup>,
        what: &str,
    ) -> Result<DecoderLayer> {
        Ok(DecoderLayer {
            input_norm: self.input_norm.clone(),
            attention: self.attention.cut(rank, size, group, what)?,
            post_attention_norm: self.post_attention_norm.clone(),
            ffn: self.ffn.cut(rank, size, group, what)?,
            eps: self.eps,
        })
    }

    /// `h = x + attn(norm(x)); h + mlp(norm(h))`.
    pub fn forward(&self, x: &Array, cache: &mut LayerCache) -> Result<Array> {
        let l = x.shape()[1] as usize;
        self.forward_segments(x, &mut [LayerKv::Own(l, cache)])
    }

    /// The block over several sequences' positions at once (see
    /// [`Attention::forward_segments`]).
    pub fn forward_segments(&self, x: &Array, segments: &mut [LayerKv<'_>]) -> Result<Array> {
        let a = self.attention.forward_segments(
            &fast::rms_norm(x, Some(&self.input_norm), self.eps)?,
            segments,
        )?;
        let h = ops::add(x, &a)?;
        let m = self.ffn.forward(&fast::rms_norm(
            &h,
            Some(&self.post_attention_norm),
            self.eps,
        )?)?;
        Ok(ops::add(&h, &m)?)
    }

    /// Every array of the block (to evaluate them eagerly).
    pub(crate) fn arrays(&self) -> Vec<&Array> {
        let mut v = vec![&self.input_norm, &self.post_attention_norm];
        v.extend(self.attention.arrays());
        v.extend(self.ffn.arrays());
        v
    }
}

/// Fails unless `m` has `rows` output rows.
pub(crate) fn check_shape(m: &Matrix, name: &str, rows: usize) -> Result<()> {
    let got = m.out_rows();
    if got != rows {
        return Err(InferenceError::BadTensor {
            name: name.to_owned(),
            reason: format!("expected {rows} rows, found {got}"),
        });
    }
    Ok(())
}
