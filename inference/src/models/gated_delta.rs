//! Gated DeltaNet, the linear attention of the hybrid families (Qwen3.5 / 3.6, Qwen3-Next), as
//! mlx-lm's `GatedDeltaNet` and `gated_delta.py` compute it.
//!
//! Instead of keys and values per position, a layer carries a fixed-size state per sequence
//! ([`RecurrentState`]): a causal depthwise convolution over the last `kernel` inputs of the
//! query/key/value projection, and per value head a `[v_dim, k_dim]` matrix that the delta rule
//! updates at every position:
//!
//! ```text
//! S ← g·S;  S ← S + k ⊗ β(v − S k);  y = S q
//! ```
//!
//! with `β = sigmoid(b)`, the decay `g = exp(−exp(A_log)·softplus(a + dt_bias))`, and `q`, `k`
//! l2-normalized (`q` also scaled by `1/√k_dim`). The output goes through an RMS norm gated by
//! `silu(z)` and the output projection. Here the recurrence runs position by position with MLX
//! ops (mlx-lm's ops path, the one it takes on CPU). Tensor parallelism cuts the layer by key
//! heads with their value heads ([`super::recurrent_split`]).

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

/// The shape of a Gated DeltaNet layer (`linear_*` keys of config.json).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DeltaNetShape {
    /// Query/key heads (`linear_num_key_heads`).
    pub k_heads: usize,
    /// Value heads (`linear_num_value_heads`), a multiple of the key heads.
    pub v_heads: usize,
    /// Width of one query/key head (`linear_key_head_dim`).
    pub k_dim: usize,
    /// Width of one value head (`linear_value_head_dim`).
    pub v_dim: usize,
    /// The convolution's kernel (`linear_conv_kernel_dim`).
    pub kernel: usize,
}

impl DeltaNetShape {
    /// Channels of the convolution: queries, keys and values.
    pub fn conv_channels(&self) -> usize {
        2 * self.k_heads * self.k_dim + self.v_heads * self.v_dim
    }

    /// Checks what the layer's arithmetic needs.
    pub fn validate(&self) -> Result<()> {
        let zero: Vec<&str> = [
            ("linear_num_key_heads", self.k_heads),
            ("linear_num_value_heads", self.v_heads),
            ("linear_key_head_dim", self.k_dim),
            ("linear_value_head_dim", self.v_dim),
            ("linear_conv_kernel_dim", self.kernel),
        ]
        .iter()
        .filter(|(_, n)| *n == 0)
        .map(|(k, _)| *k)
        .collect();
        if !zero.is_empty() {
            return Err(InferenceError::BadConfig(format!(
                "config.json's {} must be positive",
                zero.join(", ")
            )));
        }
        if !self.v_heads.is_multiple_of(self.k_heads) {
            return Err(InferenceError::BadConfig(format!(
                "linear_num_value_heads ({}) must be a multiple of linear_num_key_heads ({})",
                self.v_heads, self.k_heads
            )));
        }
        if [
            self.k_heads,
            self.v_heads,
            self.k_dim,
            self.v_dim,
            self.kernel,
        ]
        .iter()
        .any(|&n| n > 1 << 16)
        {
            return Err(InferenceError::BadConfig(
                "a linear attention width is over 65536; check config.json".into(),
            ));
        }
        Ok(())
    }

    /// Parameters of one layer over `hidden`: projections, convolution, decay, norm, output.
    pub fn parameters(&self, hidden: usize) -> usize {
        let value = self.v_heads * self.v_dim;
        let conv = self.conv_channels();
        hidden * (conv + value + 2 * self.v_heads)
            + conv * self.kernel
            + 2 * self.v_heads
            + self.v_dim
            + value * hidden
    }

    /// Numbers of one sequence's state (convolution inputs and matrices), whatever its length.
    pub fn state_elements(&self) -> usize {
        (self.kernel - 1) * self.conv_channels() + self.v_heads * self.v_dim * self.k_dim
    }
}

/// How the checkpoint lays out the input projections.
#[derive(Debug, Clone)]
pub enum InProjection {
    /// Qwen3.5: `in_proj_qkv` (queries, keys, values one after another), `in_proj_z`,
    /// `in_proj_b`, `in_proj_a`.
    Split {
        /// Queries, keys and values.
        qkv: Linear,
        /// The output gate.
        z: Linear,
        /// The write strength, before its sigmoid.
        b: Linear,
        /// The decay's input.
        a: Linear,
    },
    /// Qwen3-Next: `in_proj_qkvz` and `in_proj_ba`, grouped by key head (each group: its
    /// query, its key, then the values and gates of its value heads; its `b`s then `a`s).
    Fused {
        /// Queries, keys, values and gates by key head.
        qkvz: Linear,
        /// `b` and `a` by key head.
        ba: Linear,
    },
}

/// One Gated DeltaNet layer (see the module docs).
#[derive(Debug, Clone)]
pub struct GatedDeltaNet {
    pub(crate) proj: InProjection,
    /// Depthwise convolution weights `[channels, kernel, 1]` (MLX's layout).
    pub(crate) conv: Array,
    pub(crate) dt_bias: Array,
    /// `A_log` in float32 (mlx-lm never casts it).
    pub(crate) a_log: Array,
    pub(crate) norm: Array,
    pub(crate) out_proj: Linear,
    pub(crate) shape: DeltaNetShape,
    pub(crate) eps: f32,
    pub(crate) reduce: Option<Arc<RingGroup>>,
}

/// The projections of some positions, split as the recurrence takes them.
struct Projected {
    /// `[1, n, channels]`.
    qkv: Array,
    /// `[1, n, v_heads, v_dim]`.
    z: Array,
    /// `[1, n, v_heads]`.
    b: Array,
    a: Array,
}

impl GatedDeltaNet {
    /// Layer `layer`'s `linear_attn` from `source`, with the projections laid out as `fused`
    /// says. The convolution is taken in MLX's layout `[channels, kernel, 1]` or the
    /// Hugging Face one `[channels, 1, kernel]`.
    pub(crate) fn load(
        shape: DeltaNetShape,
        hidden: usize,
        eps: f32,
        source: &mut dyn TensorSource,
        layer: usize,
        format: WeightFormat,
        fused: bool,
    ) -> Result<GatedDeltaNet> {
        let p = |part: &str| layer_tensor(layer, &format!("linear_attn.{part}"));
        let mut proj = |part: &str, rows: usize| -> Result<Linear> {
            let linear = source.linear(&p(part), format)?;
            check_shape(&linear.weight, &p(part), rows)?;
            Ok(linear)
        };
        let (channels, value) = (shape.conv_channels(), shape.v_heads * shape.v_dim);
        let in_proj = if fused {
            InProjection::Fused {
                qkvz: proj("in_proj_qkvz", channels + value)?,
                ba: proj("in_proj_ba", 2 * shape.v_heads)?,
            }
        } else {
            InProjection::Split {
                qkv: proj("in_proj_qkv", channels)?,
                z: proj("in_proj_z", value)?,
                b: proj("in_proj_b", shape.v_heads)?,
                a: proj("in_proj_a", shape.v_heads)?,
            }
        };
        let out_proj = proj("out_proj", hidden)?;
        let dtype = format.compute_dtype();
        let conv = source.dense(&p("conv1d.weight"), dtype)?;
        let conv = match conv.shape() {
            [c, k, 1] if *c as usize == channels && *k as usize == shape.kernel => conv,
            [c, 1, k] if *c as usize == channels && *k as usize == shape.kernel => {
                conv.swap_axes(1, 2)?
            }
            other => {
                return Err(InferenceError::BadTensor {
                    name: p("conv1d.weight"),
                    reason: format!(
                        "expected [{channels}, {k}, 1] or [{channels}, 1, {k}], found {other:?}",
                        k = shape.kernel
                    ),
                })
            }
        };
        let vector = |source: &mut dyn TensorSource, part: &str, len: usize, dtype: Dtype| {
            let a = source.dense(&p(part), dtype)?;
            if a.shape() != [len as i32] {
                return Err(InferenceError::BadTensor {
                    name: p(part),
                    reason: format!("expected [{len}], found {:?}", a.shape()),
                });
            }
            Ok(a)
        };
        Ok(GatedDeltaNet {
            proj: in_proj,
            conv,
            dt_bias: vector(source, "dt_bias", shape.v_heads, dtype)?,
            a_log: vector(source, "A_log", shape.v_heads, Dtype::Float32)?,
            norm: vector(source, "norm.weight", shape.v_dim, dtype)?,
            out_proj,
            shape,
            eps,
            reduce: None,
        })
    }

    /// The projections of `x` (`[1, n, hidden]`).
    fn project(&self, x: &Array) -> Result<Projected> {
        let s = &self.shape;
        let n = x.shape()[1];
        let (kd, vd) = ((s.k_heads * s.k_dim) as i32, (s.v_heads * s.v_dim) as i32);
        let vh = s.v_heads as i32;
        Ok(match &self.proj {
            InProjection::Split { qkv, z, b, a } => Projected {
                qkv: qkv.forward(x)?,
                z: z.forward(x)?.reshape(&[1, n, vh, s.v_dim as i32])?,
                b: b.forward(x)?,
                a: a.forward(x)?,
            },
            InProjection::Fused { qkvz, ba } => {
                let (nk, per) = (s.k_heads as i32, (s.v_heads / s.k_heads * s.v_dim) as i32);
                let (dk, r) = (s.k_dim as i32, (s.v_heads / s.k_heads) as i32);
                let grouped = qkvz.forward(x)?.reshape(&[1, n, nk, -1])?;
                let part = |from: i32, to: i32| grouped.index((.., .., .., from..to));
                let flat = |t: Array| t.reshape(&[1, n, -1]);
                let qkv = ops::concatenate(
                    &[
                        flat(part(0, dk))?,
                        flat(part(dk, 2 * dk))?,
                        flat(part(2 * dk, 2 * dk + per))?,
                    ],
                    2,
                )?;
                debug_assert_eq!(qkv.shape()[2], 2 * kd + vd);
                let z = part(2 * dk + per, 2 * dk + 2 * per).reshape(&[1, n, vh, -1])?;
                let ba = ba.forward(x)?.reshape(&[1, n, nk, -1])?;
                Projected {
                    qkv,
                    z,
                    b: ba.index((.., .., .., 0..r)).reshape(&[1, n, vh])?,
                    a: ba.index((.., .., .., r..2 * r)).reshape(&[1, n, vh])?,
                }
            }
        })
    }

    /// The layer over several sequences' new positions (`x`: `[1, total, hidden]`, one
    /// sequence's positions after another, as `segments` says); each continues its own
    /// state. A recurrent layer has no shared decode rows: such sequences keep their own
    /// caches ([`crate::batch`]'s slots never put them in rows).
    pub fn forward_segments(&self, x: &Array, segments: &mut [LayerKv<'_>]) -> Result<Array> {
        let all = self.project(x)?;
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
            let seg = Projected {
                qkv: part(&all.qkv),
                z: part(&all.z),
                b: part(&all.b),
                a: part(&all.a),
            };
            outs.push(self.recur(seg, cache)?);
            at = end;
        }
        let out = if outs.len() == 1 {
            outs.pop().expect("one output")
        } else {
            ops::concatenate(&outs, 1)?
        };
        // The gated norm: rms_norm(y)·w times silu(z), in float32.
        let z = all.z.as_dtype(Dtype::Float32)?;
        let normed = crate::cpu_layer_ops::rms_norm(&out, Some(&self.norm), self.eps)?;
        let gated = ops::multiply(&mlx_rs::nn::silu(&z)?, &normed.as_dtype(Dtype::Float32)?)?
            .as_dtype(out.dtype())?;
        let n = x.shape()[1];
        let flat = gated.reshape(&[1, n, -1])?;
        all_sum(self.out_proj.forward(&flat)?, &self.reduce)
    }

    /// One sequence's positions through the convolution and the delta rule, continuing and
    /// then replacing `cache`'s state: `[1, n, v_heads, v_dim]`.
    fn recur(&self, p: Projected, cache: &mut LayerCache) -> Result<Array> {
        let s = &self.shape;
        let n = p.qkv.shape()[1];
        let channels = s.conv_channels() as i32;
        let (conv, next_conv, matrix) = short_conv(s, &self.conv, p.qkv, cache)?;
        let kd = (s.k_heads * s.k_dim) as i32;
        let heads = |from: i32, to: i32, h: usize, d: usize| {
            conv.index((.., .., from..to))
                .reshape(&[1, n, h as i32, d as i32])
        };
        let q = heads(0, kd, s.k_heads, s.k_dim)?;
        let k = heads(kd, 2 * kd, s.k_heads, s.k_dim)?;
        let v = heads(2 * kd, channels, s.v_heads, s.v_dim)?;
        let (q, k) = normalize_qk(&q, &k, s.k_dim)?;
        let beta = ops::sigmoid(&p.b)?;
        let g = decay(&self.a_log, &p.a, &self.dt_bias)?;
        let r = (s.v_heads / s.k_heads) as i32;
        let (q, k) = if r > 1 {
            (
                Array::repeat_axis::<f32>(q, r, 2)?,
                Array::repeat_axis::<f32>(k, r, 2)?,
            )
        } else {
            (q, k)
        };
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
        let mut v: Vec<&Array> = match &self.proj {
            InProjection::Split { qkv, z, b, a } => [qkv, z, b, a]
                .into_iter()
                .flat_map(Linear::arrays)
                .collect(),
            InProjection::Fused { qkvz, ba } => {
                [qkvz, ba].into_iter().flat_map(Linear::arrays).collect()
            }
        };
        v.extend(self.out_proj.arrays());
        v.extend([&self.conv, &self.dt_bias, &self.a_log, &self.norm]);
        v
    }
}

/// The causal depthwise convolution (weights `[channels, kernel, 1]`) of one sequence's new
/// `inputs` `[1, n, channels]` after the inputs `cache` kept, with SiLU; returns it, the
/// inputs to keep for the next step, and the delta rule's matrices to continue from (zeros
/// before the sequence's first position).
pub(crate) fn short_conv(
    s: &DeltaNetShape,
    weights: &Array,
    inputs: Array,
    cache: &LayerCache,
) -> Result<(Array, Array, Array)> {
    let (n, channels) = (inputs.shape()[1], s.conv_channels() as i32);
    let keep = (s.kernel - 1) as i32;
    let (conv_state, matrix) = match cache.state() {
        Some(st) => (st.conv.clone(), st.matrix.clone()),
        None => (
            ops::zeros_dtype(&[1, keep, channels], inputs.dtype())?,
            ops::zeros_dtype(
                &[1, s.v_heads as i32, s.v_dim as i32, s.k_dim as i32],
                Dtype::Float32,
            )?,
        ),
    };
    let input = ops::concatenate(&[conv_state, inputs], 1)?;
    let total = keep + n;
    let next_conv = input.index((.., total - keep..total, ..));
    let conv = ops::conv1d(&input, weights, 1, 0, 1, channels)?;
    Ok((mlx_rs::nn::silu(&conv)?, next_conv, matrix))
}

/// `q` and `k` (`[.., k_dim]`) l2-normalized over each head, `q` also scaled by `1/k_dim`
/// (the readout's `1/√k_dim` folded in twice over the norm's `√k_dim`), as mlx-lm's
/// `normalize_qk`: an RMS norm whose epsilon is the l2 norm's 1e-6 over `k_dim`.
pub(crate) fn normalize_qk(q: &Array, k: &Array, k_dim: usize) -> Result<(Array, Array)> {
    let inv = 1.0 / (k_dim as f32).sqrt();
    let eps = 1e-6 * inv * inv;
    let q = crate::cpu_layer_ops::rms_norm(q, None, eps)?;
    let k = crate::cpu_layer_ops::rms_norm(k, None, eps)?;
    Ok((
        ops::multiply(&q, Array::from_f32(inv * inv).as_dtype(q.dtype())?)?,
        ops::multiply(&k, Array::from_f32(inv).as_dtype(k.dtype())?)?,
    ))
}

/// The decay `exp(−exp(A_log)·softplus(a + dt_bias))`, float32: `[1, n, v_heads]` per head,
/// or `[1, n, heads, k_dim]` per key channel (Kimi Delta Attention's `a` and `dt_bias`).
pub(crate) fn decay(a_log: &Array, a: &Array, dt_bias: &Array) -> Result<Array> {
    let softplus = ops::logaddexp(ops::add(a, dt_bias)?, Array::from_f32(0.0))?;
    let rate = ops::multiply(&ops::negative(&ops::exp(a_log)?)?, &softplus)?;
    Ok(ops::exp(&rate)?)
}

/// The delta rule over `n` positions: `q`, `k` `[1, n, heads, k_dim]`, `v` `[1, n, heads,
/// v_dim]`, `beta` `[1, n, heads]`, the decay `g` `[1, n, heads]` or, per key channel,
/// `[1, n, heads, k_dim]`, from `state` `[1, heads, v_dim, k_dim]`. Returns the outputs
/// `[1, n, heads, v_dim]` (in `q`'s dtype) and the state after the last position.
pub(crate) fn delta_rule(
    q: &Array,
    k: &Array,
    v: &Array,
    g: &Array,
    beta: &Array,
    mut state: Array,
) -> Result<(Array, Array)> {
    let n = q.shape()[1];
    let mut ys = Vec::with_capacity(n as usize);
    for t in 0..n {
        let at = |x: &Array| x.index((.., t));
        let (q_t, k_t, v_t) = (at(q), at(k), at(v));
        let (g_t, beta_t) = (at(g), at(beta));
        let g_t = if g.ndim() == 4 {
            g_t.expand_dims(-2)?
        } else {
            g_t.reshape(&[1, -1, 1, 1])?
        };
        state = ops::multiply(&state, &g_t)?;
        let k_row = ops::expand_dims(&k_t, -2)?;
        let remembered = ops::multiply(&state, &k_row)?.sum_axis(-1, false)?;
        let delta = ops::multiply(
            &ops::subtract(&v_t, &remembered)?,
            &ops::expand_dims(&beta_t, -1)?,
        )?;
        state = ops::add(
            &state,
            &ops::multiply(&k_row, &ops::expand_dims(&delta, -1)?)?,
        )?;
        let y = ops::multiply(&state, &ops::expand_dims(&q_t, -2)?)?.sum_axis(-1, false)?;
        ys.push(y.as_dtype(q.dtype())?);
    }
    Ok((ops::stack(&ys, 1)?, state))
}
