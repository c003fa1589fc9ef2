//! Kimi Delta Attention (KDA), the linear attention of Kimi Linear, as mlx-lm's
//! `kimi_linear.py` runs it: Gated DeltaNet's delta rule ([`super::gated_delta`]) with a decay
//! per key channel instead of per head. Per layer and position:
//!
//! - queries, keys and values from their own projections, each through its own causal
//!   depthwise convolution of `short_conv_kernel_size` and SiLU (kept here as one convolution
//!   over the three concatenated, which is the same arithmetic), `q`, `k` l2-normalized;
//! - the decay `g = exp(−exp(A_log)·softplus(f_b(f_a(x)) + dt_bias))`, one per head and key
//!   channel (Kimi K3's, with `gate_lower_bound` `lb`: `exp(lb·sigmoid(exp(A_log)·(a +
//!   dt_bias)))`), and the write strength `β = sigmoid(b_proj(x))`;
//! - `S ← g ⊙ S;  S ← S + k ⊗ β(v − S k);  y = S q`, then an RMS norm per head gated by
//!   `sigmoid(g_b(g_a(x)))` (Kimi K3's full-rank gate: `sigmoid(g_proj(x))`) and the output
//!   projection.
//!
//! Kimi K3's layers store the three projections as one `qkv_proj` and the three convolutions
//! as one `qkv_conv` (mlx-lm's layout); they are read as the three.
//!
//! The state per sequence is Gated DeltaNet's ([`crate::kv_cache::RecurrentState`]: the last
//! `kernel − 1` convolution inputs and one `[head_dim, head_dim]` matrix per head), so its
//! shape is a [`DeltaNetShape`] with as many key as value heads. Tensor parallelism splits it by
//! heads ([`super::recurrent_split`]).

use super::gated_delta::{decay, delta_rule, normalize_qk, short_conv, DeltaNetShape};
use super::parts::{all_sum, check_shape, layer_tensor};
use crate::error::{InferenceError, Result};
use crate::kv_cache::{LayerCache, RecurrentState};
use crate::kv_rows::LayerKv;
use crate::linear::Linear;
use crate::ring::RingGroup;
use crate::weights::FormatOnMlx;
use crate::weights::{TensorSource, WeightFormat};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{ops, Array, Dtype};
use std::sync::Arc;

/// `linear_attn_config` of Moonshot's hybrids (Kimi Linear, Kimi K3): which layers are KDA
/// (counted from 1), their heads, and Kimi K3's variant keys.
#[derive(serde::Deserialize)]
pub(crate) struct KdaConfig {
    kda_layers: Vec<usize>,
    num_heads: usize,
    head_dim: usize,
    #[serde(default = "four")]
    short_conv_kernel_size: usize,
    /// Kimi K3's decay bound (see the module docs).
    #[serde(default)]
    pub(crate) gate_lower_bound: Option<f32>,
    /// Kimi K3's full-rank output gate `g_proj`.
    #[serde(default)]
    pub(crate) use_full_rank_gate: bool,
}

fn four() -> usize {
    4
}

impl KdaConfig {
    /// Which of a model's `layers` layers are KDA, and their shape (checked).
    pub(crate) fn layers(&self, layers: usize) -> Result<crate::config::LinearLayers> {
        let shape = DeltaNetShape {
            k_heads: self.num_heads,
            v_heads: self.num_heads,
            k_dim: self.head_dim,
            v_dim: self.head_dim,
            kernel: self.short_conv_kernel_size,
        };
        shape.validate()?;
        Ok(crate::config::LinearLayers {
            layers: (0..layers)
                .map(|l| self.kda_layers.contains(&(l + 1)))
                .collect(),
            shape,
        })
    }
}

/// One KDA layer (see the module docs).
#[derive(Debug, Clone)]
pub struct KimiDeltaAttention {
    /// `q_proj`, `k_proj`, `v_proj`.
    pub(super) qkv: [Linear; 3],
    /// The three depthwise convolutions, concatenated: `[3·heads·head_dim, kernel, 1]`.
    pub(super) conv: Array,
    /// The decay's low-rank input, `f_a_proj` then `f_b_proj`.
    pub(super) f: [Linear; 2],
    pub(super) b_proj: Linear,
    /// The output gate's projections applied in turn, the last one per head: `g_a_proj` then
    /// `g_b_proj`, or Kimi K3's full-rank `g_proj` alone.
    pub(super) gate: Vec<Linear>,
    /// `A_log`, `[heads, 1]`, float32.
    pub(super) a_log: Array,
    /// `[heads, head_dim]`.
    pub(super) dt_bias: Array,
    pub(super) o_norm: Array,
    pub(super) o_proj: Linear,
    pub(super) shape: DeltaNetShape,
    pub(super) eps: f32,
    pub(super) reduce: Option<Arc<RingGroup>>,
    /// Kimi K3's `gate_lower_bound` (the decay's other form, see the module docs).
    pub(super) lower_bound: Option<f32>,
}

/// The names of a KDA layer's tensors under `self_attn.` in Moonshot's layout (mlx-lm's names
/// for the convolutions are `{q,k,v}_conv.conv.weight`, and its `dt_bias` is flat).
const TENSORS: [&str; 13] = [
    "q_proj.weight",
    "k_proj.weight",
    "v_proj.weight",
    "q_conv1d.weight",
    "k_conv1d.weight",
    "v_conv1d.weight",
    "f_a_proj.weight",
    "f_b_proj.weight",
    "b_proj.weight",
    "A_log",
    "dt_bias",
    "o_norm.weight",
    "o_proj.weight",
];

impl KimiDeltaAttention {
    /// Layer `layer`'s `self_attn` from `source` (Moonshot's names or mlx-lm's).
    pub(crate) fn load(
        shape: DeltaNetShape,
        hidden: usize,
        eps: f32,
        source: &mut dyn TensorSource,
        layer: usize,
        format: WeightFormat,
    ) -> Result<KimiDeltaAttention> {
        let p = |part: &str| layer_tensor(layer, &format!("self_attn.{part}"));
        let (heads, dim) = (shape.v_heads, shape.v_dim);
        let width = heads * dim;
        let fused_qkv = source.contains(&p("qkv_proj.weight"));
        let full_rank_gate = source.contains(&p("g_proj.weight"));
        let mut proj = |part: &str, rows: usize| -> Result<Linear> {
            let linear = source.linear(&p(part), format)?;
            check_shape(&linear.weight, &p(part), rows)?;
            Ok(linear)
        };
        let qkv = if fused_qkv {
            let fused = proj("qkv_proj", 3 * width)?;
            let third = |i: usize| fused.slice_rows(i * width, (i + 1) * width);
            [third(0)?, third(1)?, third(2)?]
        } else {
            [
                proj("q_proj", width)?,
                proj("k_proj", width)?,
                proj("v_proj", width)?,
            ]
        };
        let f = [proj("f_a_proj", dim)?, proj("f_b_proj", width)?];
        let b_proj = proj("b_proj", heads)?;
        let gate = if full_rank_gate {
            vec![proj("g_proj", width)?]
        } else {
            vec![proj("g_a_proj", dim)?, proj("g_b_proj", width)?]
        };
        let o_proj = proj("o_proj", hidden)?;
        let dtype = format.compute_dtype();
        let fused_conv = p("qkv_conv.conv.weight");
        let parts: &[&str] = if source.contains(&fused_conv) {
            &["qkv"]
        } else {
            &["q", "k", "v"]
        };
        let mut convs = Vec::with_capacity(3);
        for &c in parts {
            let width = width * c.len();
            let (hf, mlx) = (
                p(&format!("{c}_conv1d.weight")),
                p(&format!("{c}_conv.conv.weight")),
            );
            let name = if source.contains(&hf) { hf } else { mlx };
            let w = source.dense(&name, dtype)?;
            let k = shape.kernel as i32;
            convs.push(match w.shape() {
                [n, kk, 1] if *n as usize == width && *kk == k => w,
                [n, 1, kk] if *n as usize == width && *kk == k => w.swap_axes(1, 2)?,
                other => {
                    return Err(InferenceError::BadTensor {
                        name,
                        reason: format!(
                            "expected [{width}, {k}, 1] or [{width}, 1, {k}], found {other:?}"
                        ),
                    })
                }
            });
        }
        let mut sized = |part: &str, len: usize, dtype: Dtype, to: &[i32]| -> Result<Array> {
            let a = source.dense(&p(part), dtype)?;
            if a.size() != len {
                return Err(InferenceError::BadTensor {
                    name: p(part),
                    reason: format!("expected {len} numbers, found {:?}", a.shape()),
                });
            }
            Ok(a.reshape(to)?)
        };
        let (h, d) = (heads as i32, dim as i32);
        Ok(KimiDeltaAttention {
            qkv,
            conv: ops::concatenate(&convs, 0)?,
            f,
            b_proj,
            gate,
            // mlx-lm never casts `A_log` (its cast predicate) and computes the decay in f32.
            a_log: sized("A_log", heads, Dtype::Float32, &[h, 1])?,
            dt_bias: sized("dt_bias", width, Dtype::Float32, &[h, d])?,
            o_norm: sized("o_norm.weight", dim, dtype, &[d])?,
            o_proj,
            shape,
            eps,
            reduce: None,
            lower_bound: None,
        })
    }

    /// With Kimi K3's decay, bounded below by `exp(lower_bound)` (none: Kimi Linear's).
    pub(crate) fn with_lower_bound(self, lower_bound: Option<f32>) -> KimiDeltaAttention {
        KimiDeltaAttention {
            lower_bound,
            ..self
        }
    }

    /// Parameters of one KDA layer of `shape` over `hidden`: the q, k and v projections each
    /// with its short convolution, the low-rank decay (`f_a`, `f_b`), the output gate (low
    /// rank `g_a`, `g_b`, or `full_rank_gate`'s `g_proj`), `b_proj`, `A_log`, `dt_bias`, the
    /// output norm and projection.
    pub(crate) fn parameters(
        hidden: usize,
        shape: &super::gated_delta::DeltaNetShape,
        full_rank_gate: bool,
    ) -> usize {
        let (h, s) = (hidden, shape);
        let (d, keys, width) = (s.k_dim, s.k_heads * s.k_dim, s.v_heads * s.v_dim);
        let gate = match full_rank_gate {
            true => h * width,
            false => h * d + d * width,
        };
        h * (2 * keys + width)
            + (2 * keys + width) * s.kernel
            + (h * d + d * width)
            + gate
            + s.v_heads * h
            + s.v_heads
            + width
            + d
            + width * h
    }

    /// Hugging Face names of layer `layer`'s KDA tensors, its output gate low-rank or
    /// `full_rank_gate` (Kimi K3's `use_full_rank_gate`).
    pub(crate) fn tensor_names(layer: usize, full_rank_gate: bool) -> Vec<String> {
        let gate: &[&str] = if full_rank_gate {
            &["g_proj.weight"]
        } else {
            &["g_a_proj.weight", "g_b_proj.weight"]
        };
        TENSORS
            .iter()
            .chain(gate)
            .map(|t| layer_tensor(layer, &format!("self_attn.{t}")))
            .collect()
    }

    /// The layer over several sequences' new positions, each on its own cache (see
    /// [`super::gated_delta::GatedDeltaNet::forward_segments`]).
    pub fn forward_segments(&self, x: &Array, segments: &mut [LayerKv<'_>]) -> Result<Array> {
        let n = x.shape()[1];
        let (h, d) = (self.shape.v_heads as i32, self.shape.v_dim as i32);
        let per_head = |t: Array| t.reshape(&[1, n, h, d]);
        let qkv = ops::concatenate(
            &[
                self.qkv[0].forward(x)?,
                self.qkv[1].forward(x)?,
                self.qkv[2].forward(x)?,
            ],
            2,
        )?;
        let a = per_head(self.f[1].forward(&self.f[0].forward(x)?)?)?;
        let b = self.b_proj.forward(x)?;
        let mut outs = Vec::with_capacity(segments.len());
        let mut at = 0i32;
        for segment in segments.iter_mut() {
            let LayerKv::Own(len, cache) = segment else {
                return Err(InferenceError::InvalidRequest(
                    "a linear-attention layer was given shared decode rows; sequences of a \
                     model with recurrent layers decode on their own caches"
                        .into(),
                ));
            };
            let end = at + *len as i32;
            let part = |t: &Array| t.index((.., at..end));
            outs.push(self.recur(&part(&qkv), &part(&a), &part(&b), cache)?);
            at = end;
        }
        let out = if outs.len() == 1 {
            outs.pop().expect("one output")
        } else {
            ops::concatenate(&outs, 1)?
        };
        let mut gate = x.clone();
        for g in &self.gate {
            gate = g.forward(&gate)?;
        }
        let gate = per_head(gate)?;
        let normed = crate::cpu_layer_ops::rms_norm(&out, Some(&self.o_norm), self.eps)?;
        let gated = ops::multiply(&normed, &ops::sigmoid(&gate)?)?.reshape(&[1, n, -1])?;
        all_sum(self.o_proj.forward(&gated)?, &self.reduce)
    }

    /// One sequence's positions (`qkv` `[1, n, 3·width]`, `a` `[1, n, heads, head_dim]`, `b`
    /// `[1, n, heads]`) through the convolution and the delta rule, continuing and then
    /// replacing `cache`'s state: `[1, n, heads, head_dim]`.
    fn recur(&self, qkv: &Array, a: &Array, b: &Array, cache: &mut LayerCache) -> Result<Array> {
        let s = &self.shape;
        let n = qkv.shape()[1];
        let (conv, next_conv, matrix) = short_conv(s, &self.conv, qkv.clone(), cache)?;
        let (h, d) = (s.v_heads as i32, s.v_dim as i32);
        let width = h * d;
        let heads = |i: i32| {
            conv.index((.., .., i * width..(i + 1) * width))
                .reshape(&[1, n, h, d])
        };
        let (q, k) = normalize_qk(&heads(0)?, &heads(1)?, s.k_dim)?;
        let v = heads(2)?;
        let g = match self.lower_bound {
            Some(bound) => bounded_decay(&self.a_log, a, &self.dt_bias, bound)?,
            None => decay(&self.a_log, a, &self.dt_bias)?,
        };
        let beta = ops::sigmoid(b)?;
        let (ys, matrix) = delta_rule(&q, &k, &v, &g, &beta, matrix)?;
        cache.set_state(
            RecurrentState {
                conv: next_conv,
                matrix,
            },
            n as usize,
        );
        Ok(ys)
    }

    /// Every array of the layer (to evaluate them eagerly).
    pub(crate) fn arrays(&self) -> Vec<&Array> {
        let mut v: Vec<&Array> = self
            .qkv
            .iter()
            .chain(&self.f)
            .chain(&self.gate)
            .chain([&self.b_proj, &self.o_proj])
            .flat_map(Linear::arrays)
            .collect();
        v.extend([&self.conv, &self.a_log, &self.dt_bias, &self.o_norm]);
        v
    }
}

/// Kimi K3's decay `exp(lower_bound · sigmoid(exp(A_log) · (a + dt_bias)))`, float32, per head
/// and key channel (mlx-lm's `compute_lower_bound_g`).
fn bounded_decay(a_log: &Array, a: &Array, dt_bias: &Array, lower_bound: f32) -> Result<Array> {
    let a = a.as_dtype(Dtype::Float32)?;
    let rate = ops::multiply(&ops::exp(a_log)?, &ops::add(&a, dt_bias)?)?;
    let bound = Array::from_f32(lower_bound);
    Ok(ops::exp(&ops::multiply(&ops::sigmoid(&rate)?, &bound)?)?)
}
