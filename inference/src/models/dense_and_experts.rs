//! A dense MLP and routed experts side by side in one feed-forward, each with a norm before and
//! after (Gemma 4's Mixture-of-Experts layers, mlx-lm's `gemma4_text.py`):
//!
//! `rms(mlp(rms(h)·w₁))·v₁ + rms(experts(rms(h)·w₂, picked from rms(h)·s))·v₂`
//!
//! The block is given `u = rms(h)` (the decoder layer's pre-feed-forward norm, of weight one,
//! is shared by all three), so each input is `u` times its own weight. The experts' router
//! reads `u · scale · hidden^-½`. Cut for tensor parallelism as its two parts are; each adds its
//! own partial sums over the ring before its output norm.

use super::mlp::Mlp;
use super::moe::MoeBlock;
use crate::error::Result;
use crate::ring::RingGroup;
use mlx_rs::{ops, Array};
use std::sync::Arc;

/// Gemma 4's feed-forward of a Mixture-of-Experts layer (see the module docs).
#[derive(Debug, Clone)]
pub struct DenseAndExperts {
    /// The dense MLP.
    pub(crate) mlp: Mlp,
    /// The weight on `u` the MLP reads (`pre_feedforward_layernorm`).
    pub(crate) mlp_in: Array,
    /// The norm of the MLP's output (`post_feedforward_layernorm_1`).
    pub(crate) mlp_out: Array,
    /// The routed experts.
    pub(crate) experts: MoeBlock,
    /// The weight on `u` the experts read (`pre_feedforward_layernorm_2`).
    pub(crate) experts_in: Array,
    /// The norm of the experts' output (`post_feedforward_layernorm_2`).
    pub(crate) experts_out: Array,
    /// The weight on `u` the router reads (`router.scale · hidden^-½`).
    pub(crate) router_in: Array,
    /// The norms' epsilon.
    pub(crate) eps: f32,
}

impl DenseAndExperts {
    /// The feed-forward of `u` (`[batch, seq, hidden]`, already RMS-normalized).
    pub fn forward(&self, u: &Array) -> Result<Array> {
        let norm = |t: &Array, w: &Array| crate::cpu_layer_ops::rms_norm(t, Some(w), self.eps);
        let dense = norm(
            &self.mlp.forward(&ops::multiply(u, &self.mlp_in)?)?,
            &self.mlp_out,
        )?;
        let routed = self.experts.forward_routed(
            &ops::multiply(u, &self.router_in)?,
            &ops::multiply(u, &self.experts_in)?,
        )?;
        let routed = norm(&routed, &self.experts_out)?;
        Ok(ops::add(&dense, &routed)?)
    }

    /// Rank `rank`'s slice of a `size`-way tensor-parallel instance over `group`.
    pub(crate) fn cut(
        &self,
        rank: usize,
        size: usize,
        group: &Arc<RingGroup>,
        what: &str,
    ) -> Result<DenseAndExperts> {
        Ok(DenseAndExperts {
            mlp: self.mlp.cut(rank, size, group, what)?,
            experts: self.experts.cut(rank, size, group, what)?,
            ..self.clone()
        })
    }

    /// Every array of the feed-forward.
    pub(crate) fn arrays(&self) -> Vec<&Array> {
        let mut v = self.mlp.arrays();
        v.extend(self.experts.arrays());
        v.extend([
            &self.mlp_in,
            &self.mlp_out,
            &self.experts_in,
            &self.experts_out,
            &self.router_in,
        ]);
        v
    }
}
