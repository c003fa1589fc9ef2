//! The Mamba-2 mixer (Nemotron-H's `M` layers), as mlx-lm's `nemotron_h.py` and `ssm.py`
//! compute it:
//!
//! - `in_proj` gives the gate `z` (`heads·head_dim`), the convolution's input (`x`, `B`, `C`:
//!   `heads·head_dim + 2·groups·state`) and `dt` (one per head);
//! - a causal depthwise convolution over the kept inputs (bias where `use_conv_bias`), SiLU;
//! - the selective state space, position by position: `dt = clip(softplus(dt + dt_bias))`,
//!   `h = exp(dt·A)·h + dt·x ⊗ B` per head (`A = -exp(A_log)`, a head reads its group's `B` and
//!   `C`), `y = h·C + D·x`;
//! - the gated norm: `silu(z)·y`, RMS-normalized over each of the `groups` slices, times its
//!   weight; `out_proj`.
//!
//! The state (the convolution's last `kernel - 1` inputs and `h`, `[heads, head_dim, state]`
//! in float32) is a [`RecurrentState`], so a sequence with such layers keeps its own cache, as
//! Gated DeltaNet's do. The reference computes the prompt in chunks (the SSD form); the
//! recurrence here is the same sums in position order. Tensor parallelism cuts the mixer by
//! heads with their groups ([`super::recurrent_split`]).

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

/// A Mamba-2 mixer's numbers.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Mamba2Shape {
    /// `mamba_num_heads`.
    pub heads: usize,
    /// `mamba_head_dim`.
    pub head_dim: usize,
    /// `ssm_state_size`.
    pub state: usize,
    /// `n_groups` (heads share a group's `B` and `C`).
    pub groups: usize,
    /// `conv_kernel`.
    pub kernel: usize,
    /// `time_step_limit`: `dt` is clipped into it.
    pub dt_min: f32,
    /// The upper limit (`None`: none, mlx-lm's default of infinity).
    pub dt_max: Option<f32>,
}

impl Mamba2Shape {
    /// `heads·head_dim`: the gate's, the values' and the norm's width.
    pub fn inner(&self) -> usize {
        self.heads * self.head_dim
    }

    /// The convolution's channels: `x`, `B` and `C`.
    pub fn conv_channels(&self) -> usize {
        self.inner() + 2 * self.groups * self.state
    }

    /// The numbers a layer can be built from (each positive, heads in whole groups, widths
    /// bounded so nothing is sized from a hostile config.json).
    pub fn validate(&self) -> Result<()> {
        let ok = self.heads > 0
            && self.head_dim > 0
            && self.state > 0
            && self.groups > 0
            && self.kernel > 0
            && self.heads.is_multiple_of(self.groups)
            && self.heads <= 4096
            && self.head_dim <= 1024
            && self.state <= 1024
            && self.kernel <= 64;
        if ok {
            Ok(())
        } else {
            Err(InferenceError::BadConfig(format!(
                "a Mamba-2 mixer of {} heads of {} in {} groups, state {}, kernel {} cannot be \
                 built",
                self.heads, self.head_dim, self.groups, self.state, self.kernel
            )))
        }
    }
}

/// One Mamba-2 mixer (see the module docs).
#[derive(Debug, Clone)]
pub struct Mamba2 {
    pub(super) in_proj: Linear,
    /// `[channels, kernel, 1]` (MLX's layout).
    pub(super) conv: Array,
    pub(super) conv_bias: Option<Array>,
    pub(super) dt_bias: Array,
    /// `A_log` in float32.
    pub(super) a_log: Array,
    pub(super) d: Array,
    pub(super) norm: Array,
    pub(super) out_proj: Linear,
    pub(super) shape: Mamba2Shape,
    pub(super) eps: f32,
    /// The tensor-parallel ring whose ranks' partial outputs are summed (none on one rank).
    pub(super) reduce: Option<Arc<RingGroup>>,
}

impl Mamba2 {
    /// The mixer under `model.layers.<layer>.mixer`. The convolution is read in MLX's layout
    /// `[channels, kernel, 1]` or the Hugging Face one `[channels, 1, kernel]`.
    pub(crate) fn load(
        shape: Mamba2Shape,
        hidden: usize,
        eps: f32,
        source: &mut dyn TensorSource,
        layer: usize,
        format: WeightFormat,
    ) -> Result<Mamba2> {
        let p = |part: &str| layer_tensor(layer, &format!("mixer.{part}"));
        let (inner, channels) = (shape.inner(), shape.conv_channels());
        let in_proj = source.linear(&p("in_proj"), format)?;
        check_shape(
            &in_proj.weight,
            &p("in_proj"),
            inner + channels + shape.heads,
        )?;
        let out_proj = source.linear(&p("out_proj"), format)?;
        check_shape(&out_proj.weight, &p("out_proj"), hidden)?;
        let dtype = format.compute_dtype();
        let conv = source.dense(&p("conv1d.weight"), dtype)?;
        let k = shape.kernel as i32;
        let conv = match conv.shape() {
            [c, kk, 1] if *c as usize == channels && *kk == k => conv,
            [c, 1, kk] if *c as usize == channels && *kk == k => conv.swap_axes(1, 2)?,
            other => {
                return Err(InferenceError::BadTensor {
                    name: p("conv1d.weight"),
                    reason: format!(
                        "expected [{channels}, {k}, 1] or [{channels}, 1, {k}], found {other:?}"
                    ),
                })
            }
        };
        let has_conv_bias = source.contains(&p("conv1d.bias"));
        let mut vector = |part: &str, len: usize, dtype: Dtype| -> Result<Array> {
            let a = source.dense(&p(part), dtype)?;
            if a.shape() != [len as i32] {
                return Err(InferenceError::BadTensor {
                    name: p(part),
                    reason: format!("expected [{len}], found {:?}", a.shape()),
                });
            }
            Ok(a)
        };
        let conv_bias = if has_conv_bias {
            Some(vector("conv1d.bias", channels, dtype)?)
        } else {
            None
        };
        Ok(Mamba2 {
            in_proj,
            conv,
            conv_bias,
            dt_bias: vector("dt_bias", shape.heads, Dtype::Float32)?,
            a_log: vector("A_log", shape.heads, Dtype::Float32)?,
            d: vector("D", shape.heads, dtype)?,
            norm: vector("norm.weight", inner, dtype)?,
            out_proj,
            shape,
            eps,
            reduce: None,
        })
    }

    /// The mixer over several sequences' new positions (`x`: `[1, total, hidden]`), each
    /// continuing its own state.
    pub fn forward_segments(&self, x: &Array, segments: &mut [LayerKv<'_>]) -> Result<Array> {
        let s = &self.shape;
        let (inner, channels) = (s.inner() as i32, s.conv_channels() as i32);
        let projected = self.in_proj.forward(x)?;
        let z = projected.index((.., .., 0..inner));
        let conv_in = projected.index((.., .., inner..inner + channels));
        let dt = projected.index((.., .., inner + channels..));
        let mut outs = Vec::with_capacity(segments.len());
        let mut at = 0i32;
        for segment in segments.iter_mut() {
            let LayerKv::Own(len, cache) = segment else {
                return Err(InferenceError::InvalidRequest(
                    "a Mamba-2 layer was given shared decode rows; sequences of a model with \
                     recurrent layers decode on their own caches"
                        .into(),
                ));
            };
            let end = at + *len as i32;
            outs.push(self.recur(
                &conv_in.index((.., at..end)),
                &dt.index((.., at..end)),
                cache,
            )?);
            at = end;
        }
        let y = if outs.len() == 1 {
            outs.pop().expect("one output")
        } else {
            ops::concatenate(&outs, 1)?
        };
        // silu(z)·y, normalized over each group's slice, times the weight.
        let n = x.shape()[1];
        let gated = ops::multiply(&mlx_rs::nn::silu(&z)?, &y.as_dtype(z.dtype())?)?;
        let grouped = gated.reshape(&[1, n, s.groups as i32, -1])?;
        let normed = crate::cpu_layer_ops::rms_norm(&grouped, None, self.eps)?;
        let normed = ops::multiply(&normed.reshape(&[1, n, inner])?, &self.norm)?;
        all_sum(self.out_proj.forward(&normed)?, &self.reduce)
    }

    /// One sequence's positions through the convolution and the state space, continuing and
    /// then replacing `cache`'s state: `[1, n, heads·head_dim]`.
    fn recur(&self, conv_in: &Array, dt: &Array, cache: &mut LayerCache) -> Result<Array> {
        let s = &self.shape;
        let n = conv_in.shape()[1];
        let channels = s.conv_channels() as i32;
        let keep = (s.kernel - 1) as i32;
        let (h, hd, st, g) = (
            s.heads as i32,
            s.head_dim as i32,
            s.state as i32,
            s.groups as i32,
        );
        let (conv_state, mut state) = match cache.state() {
            Some(c) => (c.conv.clone(), c.matrix.clone()),
            None => (
                ops::zeros_dtype(&[1, keep, channels], conv_in.dtype())?,
                ops::zeros_dtype(&[1, h, hd, st], Dtype::Float32)?,
            ),
        };
        let input = ops::concatenate(&[conv_state, conv_in.clone()], 1)?;
        let total = keep + n;
        let next_conv = input.index((.., total - keep..total, ..));
        let mut conv = ops::conv1d(&input, &self.conv, 1, 0, 1, channels)?;
        if let Some(b) = &self.conv_bias {
            conv = ops::add(&conv, b)?;
        }
        let conv = mlx_rs::nn::silu(&conv)?.as_dtype(Dtype::Float32)?;
        let inner = s.inner() as i32;
        let xs = conv.index((.., .., 0..inner)).reshape(&[1, n, h, hd])?;
        let bs = conv
            .index((.., .., inner..inner + g * st))
            .reshape(&[1, n, g, st])?;
        let cs = conv
            .index((.., .., inner + g * st..))
            .reshape(&[1, n, g, st])?;
        // dt = clip(softplus(dt + dt_bias)), per position and head; dA = exp(dt·A).
        let dt = ops::add(&dt.as_dtype(Dtype::Float32)?, &self.dt_bias)?;
        let dt = softplus(&dt)?;
        let dt = match s.dt_max {
            Some(max) => ops::clip(&dt, (s.dt_min, max))?,
            None => ops::maximum(&dt, Array::from_f32(s.dt_min))?,
        };
        let a = ops::negative(&ops::exp(&self.a_log)?)?;
        let da = ops::exp(&ops::multiply(&dt, &a)?)?;
        let per_group = h / g;
        let by_head = |t: &Array| -> Result<Array> {
            // [1, g, st] -> [1, h, 1, st]: each head reads its group's row.
            Ok(Array::repeat_axis::<f32>(t.clone(), per_group, 1)?.reshape(&[1, h, 1, st])?)
        };
        let d = self.d.as_dtype(Dtype::Float32)?.reshape(&[1, h, 1])?;
        let mut ys = Vec::with_capacity(n as usize);
        for t in 0..n {
            let x_t = xs.index((.., t, .., ..)); // [1, h, hd]
            let dt_t = dt.index((.., t, ..)).reshape(&[1, h, 1, 1])?;
            let da_t = da.index((.., t, ..)).reshape(&[1, h, 1, 1])?;
            let b_t = by_head(&bs.index((.., t, .., ..)))?;
            let c_t = by_head(&cs.index((.., t, .., ..)))?;
            let write = ops::multiply(&ops::multiply(&dt_t, &x_t.reshape(&[1, h, hd, 1])?)?, &b_t)?;
            state = ops::add(&ops::multiply(&da_t, &state)?, &write)?;
            let y = ops::multiply(&state, &c_t)?.sum_axis(-1, false)?; // [1, h, hd]
            let y = ops::add(&y, &ops::multiply(&x_t, &d)?)?;
            ys.push(y.reshape(&[1, 1, h * hd])?);
        }
        cache.set_state(
            RecurrentState {
                conv: next_conv,
                matrix: state,
            },
            n as usize,
        );
        Ok(ops::concatenate(&ys, 1)?)
    }

    /// Every array of the mixer (to evaluate them eagerly).
    pub(crate) fn arrays(&self) -> Vec<&Array> {
        let mut v = self.in_proj.arrays();
        v.extend(self.out_proj.arrays());
        v.extend([&self.conv, &self.dt_bias, &self.a_log, &self.d, &self.norm]);
        v.extend(self.conv_bias.iter());
        v
    }
}

/// `log(1 + exp(x))`, computed as MLX's `nn.softplus` is (`logaddexp(x, 0)`).
fn softplus(x: &Array) -> Result<Array> {
    Ok(ops::logaddexp(x, Array::from_f32(0.0))?)
}
