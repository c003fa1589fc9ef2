//! How an expert of a Mixture-of-Experts layer combines its gate and up projections (each
//! family's activation, applied to the gathered products of the picked experts).

use crate::error::Result;
use mlx_rs::{nn, ops, Array};

/// How an expert combines its gate and up projections.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ExpertActivation {
    /// `silu(gate) * up`.
    SwiGlu,
    /// `gelu(gate) * up`, GELU's tanh approximation (Gemma 4).
    GeGlu,
    /// No gate: `relu(up)²` (Nemotron-H's experts; their gate projection is not run).
    Relu2,
    /// Step 3.5's: `min(silu(gate), limit) · clip(up, -limit, limit)`.
    ClampedSilu {
        /// The layer's `swiglu_limits` entry.
        limit: f32,
    },
    /// gpt-oss's: the gate clamped from above and the up projection on both sides at `limit`,
    /// then `(up + 1) * gate * sigmoid(alpha * gate)`.
    ClampedSwiGlu {
        /// `alpha` (1.702).
        alpha: f32,
        /// `swiglu_limit` (7).
        limit: f32,
    },
    /// Kimi K3's SiTU ([`super::mlp::Situ`]).
    Situ(super::mlp::Situ),
}

impl ExpertActivation {
    /// `gate` and `up` combined (`[..., width]` each).
    pub(crate) fn apply(self, gate: Array, up: Array) -> Result<Array> {
        Ok(match self {
            ExpertActivation::SwiGlu => ops::multiply(&nn::silu(gate)?, &up)?,
            ExpertActivation::GeGlu => ops::multiply(&nn::gelu_approximate(gate)?, &up)?,
            ExpertActivation::ClampedSilu { limit } => super::mlp::clamped_silu(gate, up, limit)?,
            ExpertActivation::Relu2 => super::mlp::relu_squared(&up)?,
            ExpertActivation::ClampedSwiGlu { alpha, limit } => {
                super::mlp::clamped_swiglu(gate, up, alpha, limit)?
            }
            ExpertActivation::Situ(situ) => situ.apply(gate, up)?,
        })
    }
}
