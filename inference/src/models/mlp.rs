//! The gated feed-forward of dense blocks and of the experts' shared MLP: [`Mlp`], with its
//! gate's activation.

use super::parts::{all_sum, check_shape, layer_tensor};
use crate::config::ModelConfig;
use crate::error::{InferenceError, Result};
use crate::linear::Linear;
use crate::ring::RingGroup;
use crate::weights::{TensorSource, WeightFormat};
use mlx_rs::{nn, ops, Array};
use std::sync::Arc;

/// What a gated MLP applies to its gate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum GateActivation {
    /// `silu` (SwiGLU: Llama, Qwen).
    Silu,
    /// The tanh approximation of GELU (GeGLU: Gemma's `gelu_pytorch_tanh`).
    GeluApprox,
    /// No gate: `relu(up(x))²` (Nemotron-H's MLP; `gate_proj` is `up_proj` again and never
    /// run).
    Relu2,
    /// Step 3.5's clamped SwiGLU: `min(silu(gate), limit) · clip(up, -limit, limit)`.
    ClampedSilu {
        /// The layer's `swiglu_limits` entry.
        limit: f32,
    },
    /// gpt-oss's clamped SwiGLU (MiniMax M3's dense MLPs and shared experts):
    /// `(clip(up, -limit, limit) + 1) · g · sigmoid(alpha · g)`, `g = min(gate, limit)`.
    ClampedSwiGlu {
        /// `swiglu_alpha` (1.702).
        alpha: f32,
        /// `swiglu_limit` (7).
        limit: f32,
    },
    /// Kimi K3's SiTU: `beta·tanh(gate/beta)·sigmoid(gate) · up`, `up` first squashed to
    /// `linear_beta·tanh(up/linear_beta)` when the family sets it; in float32.
    Situ(Situ),
}

/// The constants of Kimi K3's SiTU (`activation_situ_beta`, `activation_situ_linear_beta`).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Situ {
    /// The gate's bound, `beta·tanh(gate/beta)` (1 when the configuration leaves it out).
    pub beta: f32,
    /// The bound on the up projection, none when absent.
    pub linear_beta: Option<f32>,
}

impl Situ {
    /// `up` gated by `gate` (each `[..., width]`), computed in float32 as mlx-lm's `_situ`
    /// and returned in `up`'s dtype.
    pub(crate) fn apply(self, gate: Array, up: Array) -> Result<Array> {
        let dtype = up.dtype();
        let f32 = mlx_rs::Dtype::Float32;
        let (gate, mut up) = (gate.as_dtype(f32)?, up.as_dtype(f32)?);
        let bounded = |x: &Array, bound: f32| -> Result<Array> {
            let b = Array::from_f32(bound);
            Ok(ops::multiply(&ops::tanh(&ops::divide(x, &b)?)?, &b)?)
        };
        let a = ops::multiply(&bounded(&gate, self.beta)?, &ops::sigmoid(&gate)?)?;
        if let Some(lb) = self.linear_beta {
            up = bounded(&up, lb)?;
        }
        Ok(ops::multiply(&a, &up)?.as_dtype(dtype)?)
    }
}

/// gpt-oss's clamped SwiGLU of `gate` and `up` (see [`GateActivation::ClampedSwiGlu`]).
pub(crate) fn clamped_swiglu(gate: Array, up: Array, alpha: f32, limit: f32) -> Result<Array> {
    let gate = ops::minimum(&gate, Array::from_f32(limit))?;
    let up = ops::maximum(
        ops::minimum(&up, Array::from_f32(limit))?,
        Array::from_f32(-limit),
    )?;
    let glu = ops::multiply(
        &gate,
        ops::sigmoid(ops::multiply(&gate, Array::from_f32(alpha))?)?,
    )?;
    Ok(ops::multiply(ops::add(&up, Array::from_f32(1.0))?, &glu)?)
}

/// `relu(x)²`.
pub(crate) fn relu_squared(x: &Array) -> Result<Array> {
    let r = ops::maximum(x, Array::from_f32(0.0))?;
    Ok(ops::multiply(&r, &r)?)
}

/// `gate` and `up` combined by `activation`, the clamped forms clipping as they do.
pub(crate) fn clamped_silu(gate: Array, up: Array, limit: f32) -> Result<Array> {
    let gate = ops::minimum(&nn::silu(gate)?, Array::from_f32(limit))?;
    let up = ops::maximum(
        ops::minimum(&up, Array::from_f32(limit))?,
        Array::from_f32(-limit),
    )?;
    Ok(ops::multiply(&gate, &up)?)
}

/// The gated feed-forward: `down(act(gate(x)) * up(x))`, SwiGLU unless the family says.
#[derive(Debug, Clone)]
pub struct Mlp {
    pub(crate) gate_proj: Linear,
    pub(crate) up_proj: Linear,
    pub(crate) down_proj: Linear,
    pub(crate) activation: GateActivation,
    /// Tensor parallel: see [`super::attention::Attention`].
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
            activation: GateActivation::Silu,
            reduce: None,
        };
        check_shape(&mlp.gate_proj.weight, &p("gate_proj"), width)?;
        check_shape(&mlp.up_proj.weight, &p("up_proj"), width)?;
        check_shape(&mlp.down_proj.weight, &p("down_proj"), config.hidden_size)?;
        Ok(mlp)
    }

    /// With another activation on the gate.
    pub(crate) fn with_activation(self, activation: GateActivation) -> Mlp {
        Mlp { activation, ..self }
    }

    /// Applies the block.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        if self.activation == GateActivation::Silu {
            if let Some(h) = crate::linear::swiglu(x, &self.gate_proj, &self.up_proj)? {
                return all_sum(self.down_proj.forward(&h)?, &self.reduce);
            }
        }
        if self.activation == GateActivation::Relu2 {
            let h = relu_squared(&self.up_proj.forward(x)?)?;
            return all_sum(self.down_proj.forward(&h)?, &self.reduce);
        }
        let (gate, up) = (self.gate_proj.forward(x)?, self.up_proj.forward(x)?);
        let h = match self.activation {
            GateActivation::Silu => ops::multiply(&nn::silu(gate)?, &up)?,
            GateActivation::GeluApprox => ops::multiply(&nn::gelu_approximate(gate)?, &up)?,
            GateActivation::ClampedSilu { limit } => clamped_silu(gate, up, limit)?,
            GateActivation::Relu2 => relu_squared(&up)?,
            GateActivation::ClampedSwiGlu { alpha, limit } => {
                clamped_swiglu(gate, up, alpha, limit)?
            }
            GateActivation::Situ(situ) => situ.apply(gate, up)?,
        };
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
            activation: self.activation,
            reduce: Some(group.clone()),
        })
    }
}
