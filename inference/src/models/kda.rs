//! Kimi Delta Attention (KDA), the linear attention of Kimi Linear, as mlx-lm's
//! `kimi_linear.py` runs it: Gated DeltaNet's delta rule ([`super::gated_delta`]) with a decay
//! per key channel instead of per head. Per layer and position:
//!
//! - queries, keys and values from their own projections, each through its own causal
//!   depthwise convolution of `short_conv_kernel_size` and SiLU (kept here as one convolution
//!   over the three concatenated, which is the same arithmetic), `q`, `k` l2-normalized;
//! - the decay `g = exp(−exp(A_log)·softplus(f_b(f_a(x)) + dt_bias))`, one per head and key
//!   channel, and the write strength `β = sigmoid(b_proj(x))`;
//! - `S ← g ⊙ S;  S ← S + k ⊗ β(v − S k);  y = S q`, then an RMS norm per head gated by
//!   `sigmoid(g_b(g_a(x)))` and the output projection.
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
use crate::weights::{TensorSource, WeightFormat};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{ops, Array, Dtype};
use std::sync::Arc;

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
    /// The output gate's low-rank projection, `g_a_proj` then `g_b_proj`.
    pub(super) gate: [Linear; 2],
    /// `A_log`, `[heads, 1]`, float32.
    pub(super) a_log: Array,
    /// `[heads, head_dim]`.
    pub(super) dt_bias: Array,
    pub(super) o_norm: Array,
    pub(super) o_proj: Linear,
    pub(super) shape: DeltaNetShape,
    pub(super) eps: f32,
    pub(super) reduce: Option<Arc<RingGroup>>,
}

/// The names of a KDA layer's tensors under `self_attn.` in Moonshot's layout (mlx-lm's names
/// for the convolutions are `{q,k,v}_conv.conv.weight`, and its `dt_bias` is flat).
const TENSORS: [&str; 15] = [
    "q_proj.weight",
    "k_proj.weight",
    "v_proj.weight",
    "q_conv1d.weight",
    "k_conv1d.weight",
    "v_conv1d.weight",
    "f_a_proj.weight",
    "f_b_proj.weight",
    "b_proj.weight",
    "g_a_proj.weight",
    "g_b_proj.weight",
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
        let mut proj = |part: &str, rows: usize| -> Result<Linear> {
            let linear = source.linear(&p(part), format)?;
            check_shape(&linear.weight, &p(part), rows)?;
            Ok(linear)
        };
        let qkv = [
            proj("q_proj", width)?,
            proj("k_proj", width)?,
            proj("v_proj", width)?,
        ];
        let f = [proj("f_a_proj", dim)?, proj("f_b_proj", width)?];
        let b_proj = proj("b_proj", heads)?;
        let gate = [proj("g_a_proj", dim)?, proj("g_b_proj", width)?];
        let o_proj = proj("o_proj", hidden)?;
        let dtype = format.compute_dtype();
        let mut convs = Vec::with_capacity(3);
        for c in ["q", "k", "v"] {
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
        })
    }

    /// Hugging Face names of layer `layer`'s KDA tensors.
    pub(crate) fn tensor_names(layer: usize) -> impl Iterator<Item = String> {
        TENSORS
            .iter()
            .map(move |t| layer_tensor(layer, &format!("self_attn.{t}")))
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
        let gate = per_head(self.gate[1].forward(&self.gate[0].forward(x)?)?)?;
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
        let g = decay(&self.a_log, a, &self.dt_bias)?;
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
