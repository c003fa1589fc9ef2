//! The Mixture-of-Experts feed-forward (mlx-lm's `SwitchGLU` with its routers): a router picks
//! `k` of `E` experts per token, each picked expert runs its own SwiGLU ([`super::experts`]),
//! and the outputs are summed with the router's weights. The experts may run on a narrower
//! latent projection of the hidden state (Nemotron 3 Super's `moe_latent_size`): the block
//! projects down before them and back up after their weighted sum.
//!
//! Tensor parallel: every rank keeps every expert at `1/N` of its width and the whole router
//! (and latent projections), so the ranks route alike and one `all_sum` adds the partial
//! outputs.

pub use super::experts::{ExpertActivation, ExpertBiases, Experts};
pub(crate) use super::experts::{ExpertNames, PROJ_NAMES};
use super::mlp::{GateActivation, Mlp};
use super::parts::layer_tensor;
use crate::config::{ModelConfig, MoeConfig, RouterKind};
use crate::error::{InferenceError, Result};
use crate::linear::Linear;
use crate::ring::RingGroup;
use crate::weights::{TensorSource, WeightFormat};
use mlx_rs::ops::argpartition_axis;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{ops, Array};
use std::sync::Arc;

/// A Mixture-of-Experts feed-forward: its router, its experts and, in some families, a shared
/// expert every token runs through.
#[derive(Debug, Clone)]
pub struct MoeBlock {
    router: Linear,
    kind: RouterKind,
    /// The per-expert correction added to the scores to choose experts, not to weigh them
    /// (`e_score_correction_bias`, sigmoid routers).
    correction: Option<Array>,
    experts_per_token: i32,
    experts: Experts,
    /// The shared expert, added to the routed sum (it never reduces itself: the block adds
    /// both up over the ring at once). Boxed: most blocks have none.
    shared: Option<Box<Mlp>>,
    /// Qwen3-Next's gate on the shared expert, `[1, hidden]`: its output is scaled per token
    /// by `sigmoid(gate(x))`. Every rank keeps it whole, so each scales its partial sum alike.
    shared_gate: Option<Linear>,
    /// Tensor parallel: the ring whose ranks each hold a slice of every expert.
    reduce: Option<Arc<RingGroup>>,
    /// A learned factor per expert on its routing weight (Gemma 4's `per_expert_scale`).
    expert_scale: Option<Array>,
    /// The experts' latent projections (Nemotron 3 Super): the routed experts read
    /// `down(x)` and their weighted sum is `up(...)` back to the hidden width; the router and
    /// the shared expert read `x` itself. Boxed: most blocks have none.
    latent: Option<Box<LatentProjection>>,
}

/// The pair of projections around experts that run on a latent width narrower than the
/// hidden state (`fc1_latent_proj` to it, `fc2_latent_proj` back).
#[derive(Debug, Clone)]
pub(crate) struct LatentProjection {
    /// Hidden to latent (`fc1_latent_proj`).
    pub(crate) down: Linear,
    /// Latent to hidden (`fc2_latent_proj`).
    pub(crate) up: Linear,
    /// An RMS norm's weight on the experts' weighted sum before `up`, with its epsilon (Kimi
    /// K3's `routed_expert_norm`); `None` for none.
    pub(crate) norm: Option<(Array, f32)>,
}

impl MoeBlock {
    /// The MoE block of layer `layer` under `mlp` (the router at `mlp.gate`, the experts
    /// beside it), as Qwen3-MoE names them.
    pub(crate) fn load(
        config: &ModelConfig,
        moe: &MoeConfig,
        source: &mut dyn TensorSource,
        layer: usize,
        format: WeightFormat,
    ) -> Result<MoeBlock> {
        let prefix = layer_tensor(layer, "mlp");
        let router = source.linear(&format!("{prefix}.gate"), format)?;
        if router.weight.out_rows() != moe.num_experts {
            return Err(InferenceError::BadTensor {
                name: format!("{prefix}.gate.weight"),
                reason: format!(
                    "a router of {} rows for {} experts",
                    router.weight.out_rows(),
                    moe.num_experts
                ),
            });
        }
        Ok(MoeBlock {
            router,
            kind: moe.router,
            correction: None,
            experts_per_token: moe.experts_per_token as i32,
            experts: Experts::load(config, moe, source, &prefix, PROJ_NAMES, format)?,
            shared: None,
            shared_gate: None,
            reduce: None,
            expert_scale: None,
            latent: None,
        })
    }

    /// A block from parts a family read under its own names: the router (`[experts, hidden]`),
    /// its correction (`[experts]`), the experts and the shared expert.
    pub(crate) fn from_parts(
        moe: &MoeConfig,
        router: Linear,
        correction: Option<Array>,
        experts: Experts,
        shared: Option<Mlp>,
        what: &str,
    ) -> Result<MoeBlock> {
        let bad = |reason: String| {
            Err(InferenceError::BadTensor {
                name: what.to_owned(),
                reason,
            })
        };
        if router.weight.out_rows() != moe.num_experts {
            return bad(format!(
                "a router of {} rows for {} experts",
                router.weight.out_rows(),
                moe.num_experts
            ));
        }
        if let Some(c) = &correction {
            if c.shape() != [moe.num_experts as i32] {
                return bad(format!(
                    "a score correction of shape {:?} for {} experts",
                    c.shape(),
                    moe.num_experts
                ));
            }
        }
        Ok(MoeBlock {
            router,
            kind: moe.router,
            correction,
            experts_per_token: moe.experts_per_token as i32,
            experts,
            shared: shared.map(Box::new),
            shared_gate: None,
            reduce: None,
            expert_scale: None,
            latent: None,
        })
    }

    /// The block with `gate` (`[1, hidden]`) scaling its shared expert by `sigmoid(gate(x))`
    /// (Qwen3-Next, Qwen3.5-MoE); `what` names the gate in errors.
    pub(crate) fn with_shared_gate(self, gate: Linear, what: &str) -> Result<MoeBlock> {
        if self.shared.is_none() || gate.weight.out_rows() != 1 {
            return Err(InferenceError::BadTensor {
                name: what.to_owned(),
                reason: format!(
                    "a shared-expert gate of {} rows (one wanted, and a shared expert)",
                    gate.weight.out_rows()
                ),
            });
        }
        Ok(MoeBlock {
            shared_gate: Some(gate),
            ..self
        })
    }

    /// The block with its experts on `latent`'s width: they read `latent.down(x)` and their
    /// weighted sum goes through `latent.up` (the experts must have been made that wide).
    pub(crate) fn with_latent(self, latent: LatentProjection) -> MoeBlock {
        MoeBlock {
            latent: Some(Box::new(latent)),
            ..self
        }
    }

    /// The block with its experts combining gate and up by `experts` and its shared expert
    /// gating by `shared` (Kimi K3's SiTU on both).
    pub(crate) fn with_activations(
        self,
        experts: ExpertActivation,
        shared: GateActivation,
    ) -> Self {
        MoeBlock {
            experts: self.experts.with_activation(experts),
            shared: self.shared.map(|m| Box::new(m.with_activation(shared))),
            ..self
        }
    }

    /// The block with each expert's routing weight multiplied by `scale[expert]`
    /// (`[experts]`).
    pub(crate) fn with_expert_scale(self, scale: Array) -> MoeBlock {
        MoeBlock {
            expert_scale: Some(scale),
            ..self
        }
    }

    /// The experts each token picks, `[..., k]`, and their weights, `[..., k]`.
    fn route(&self, x: &Array) -> Result<(Array, Array)> {
        let (picked, weights) = self.route_unscaled(x)?;
        Ok(match &self.expert_scale {
            Some(scale) => {
                let scale = scale.take_axis(&picked.flatten(None, None)?, 0)?;
                let w = ops::multiply(&weights, &scale.reshape(picked.shape())?)?;
                (picked, w)
            }
            None => (picked, weights),
        })
    }

    fn route_unscaled(&self, x: &Array) -> Result<(Array, Array)> {
        let logits = self.router.forward(x)?;
        let k = self.experts_per_token;
        match self.kind {
            RouterKind::SoftmaxTopK { normalize } => {
                let probs = ops::softmax_axis(&logits, -1, true)?;
                let experts = *probs.shape().last().unwrap_or(&0);
                let picked =
                    argpartition_axis(&probs, experts - k, -1)?.index((.., .., (experts - k)..));
                let mut weights = probs.take_along_axis(&picked, -1)?;
                if normalize {
                    weights = ops::divide(&weights, &weights.sum_axis(-1, true)?)?;
                }
                Ok((picked, weights))
            }
            RouterKind::TopKSoftmax => {
                let experts = *logits.shape().last().unwrap_or(&0);
                let picked =
                    argpartition_axis(&logits, experts - k, -1)?.index((.., .., (experts - k)..));
                let top = logits.take_along_axis(&picked, -1)?;
                Ok((picked, ops::softmax_axis(&top, -1, true)?))
            }
            RouterKind::SigmoidGroupedTopK {
                groups,
                top_groups,
                normalize,
                scale,
            }
            | RouterKind::SoftmaxGroupedTopK {
                groups,
                top_groups,
                normalize,
                scale,
            } => {
                let scores = match self.kind {
                    RouterKind::SoftmaxGroupedTopK { .. } => ops::softmax_axis(&logits, -1, true)?,
                    _ => ops::sigmoid(&logits)?,
                };
                let mut choice = match &self.correction {
                    Some(c) => ops::add(&scores, c)?,
                    None => scores.clone(),
                };
                if groups > 1 && top_groups < groups {
                    choice = drop_weak_groups(&choice, groups as i32, top_groups as i32)?;
                }
                let experts = *choice.shape().last().unwrap_or(&0);
                let picked =
                    argpartition_axis(&choice, experts - k, -1)?.index((.., .., (experts - k)..));
                let mut weights = scores.take_along_axis(&picked, -1)?;
                if normalize {
                    weights = ops::divide(&weights, &weights.sum_axis(-1, true)?)?;
                }
                Ok((picked, ops::multiply(&weights, Array::from_f32(scale))?))
            }
        }
    }

    /// Applies the block to `x` `[batch, seq, hidden]`.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        self.forward_routed(x, x)
    }

    /// The block over `x`, its experts chosen from `router_x` (Gemma 4 routes from another
    /// norm of the same hidden state than the experts see).
    pub fn forward_routed(&self, router_x: &Array, x: &Array) -> Result<Array> {
        let (picked, weights) = self.route(router_x)?;
        let y = match &self.latent {
            Some(latent) => self.experts.forward(&latent.down.forward(x)?, &picked)?,
            None => self.experts.forward(x, &picked)?,
        };
        let y = ops::multiply(&y, &weights.expand_dims(-1)?)?.sum_axis(-2, false)?;
        let shared = match &self.shared {
            Some(shared) => {
                let mut s = shared.forward(x)?;
                if let Some(gate) = &self.shared_gate {
                    s = ops::multiply(&s, &ops::sigmoid(&gate.forward(x)?)?)?;
                }
                Some(s)
            }
            None => None,
        };
        if let Some(LatentProjection {
            norm: Some((norm, eps)),
            up,
            ..
        }) = self.latent.as_deref()
        {
            // A norm is not linear: the ring adds the experts' partial sums (with the shared
            // expert's, in the same all-sum, as mlx-lm's `shard` does) before it.
            let (y, shared) = self.reduce_latent(y, shared)?;
            let y = up.forward(&crate::cpu_layer_ops::rms_norm(&y, Some(norm), *eps)?)?;
            return Ok(match shared {
                Some(s) => ops::add(&y, &s)?,
                None => y,
            });
        }
        let mut y = match &self.latent {
            Some(latent) => latent.up.forward(&y)?,
            None => y,
        };
        if let Some(s) = shared {
            y = ops::add(&y, &s)?;
        }
        match &self.reduce {
            Some(group) => Ok(group.all_sum(&y)?),
            None => Ok(y),
        }
    }

    /// The experts' latent sum and the shared expert's output, each summed over the ring
    /// (one all-sum of the two side by side); as they are without one.
    fn reduce_latent(&self, y: Array, shared: Option<Array>) -> Result<(Array, Option<Array>)> {
        let Some(group) = &self.reduce else {
            return Ok((y, shared));
        };
        let Some(s) = shared else {
            return Ok((group.all_sum(&y)?, None));
        };
        let split = *y.shape().last().unwrap_or(&0);
        let both = group.all_sum(&ops::concatenate(&[y, s], -1)?)?;
        Ok((
            both.index((.., .., ..split)),
            Some(both.index((.., .., split..))),
        ))
    }

    /// Rank `rank`'s slice of a `size`-way tensor-parallel instance over `group`.
    pub(crate) fn cut(
        &self,
        rank: usize,
        size: usize,
        group: &Arc<RingGroup>,
        what: &str,
    ) -> Result<MoeBlock> {
        let width = self.experts.width();
        if !width.is_multiple_of(size) {
            return Err(InferenceError::BadSplit(format!(
                "{what}: experts {width} wide cannot be split over {size} ranks"
            )));
        }
        let (start, end) = (rank * width / size, (rank + 1) * width / size);
        let shared = match &self.shared {
            Some(m) => {
                let mut m = m.cut(rank, size, group, &format!("{what} shared expert"))?;
                m.reduce = None;
                Some(Box::new(m))
            }
            None => None,
        };
        Ok(MoeBlock {
            router: self.router.clone(),
            kind: self.kind,
            correction: self.correction.clone(),
            experts_per_token: self.experts_per_token,
            experts: self.experts.cut(start, end, size, what)?,
            shared,
            shared_gate: self.shared_gate.clone(),
            reduce: Some(group.clone()),
            expert_scale: self.expert_scale.clone(),
            // Whole on every rank: `up` is linear, so each rank lifts its partial sum and the
            // ring adds them; its bias, added by every rank, is divided among them. With a
            // norm before `up` the ring adds the latent sums first and every rank lifts the
            // whole sum, bias and all.
            latent: match &self.latent {
                Some(l) => Some(Box::new(LatentProjection {
                    down: l.down.clone(),
                    up: Linear {
                        weight: l.up.weight.clone(),
                        bias: match (&l.up.bias, &l.norm) {
                            (Some(b), None) => Some(ops::divide(b, Array::from_f32(size as f32))?),
                            (bias, _) => bias.clone(),
                        },
                    },
                    norm: l.norm.clone(),
                })),
                None => None,
            },
        })
    }

    /// Every array of the block.
    pub(crate) fn arrays(&self) -> Vec<&Array> {
        let mut v = self.router.arrays();
        v.extend(&self.correction);
        v.extend(self.experts.arrays());
        v.extend(self.shared.iter().flat_map(|m| m.arrays()));
        v.extend(self.shared_gate.iter().flat_map(Linear::arrays));
        v.extend(&self.expert_scale);
        if let Some(l) = &self.latent {
            v.extend(l.down.arrays());
            v.extend(l.up.arrays());
            v.extend(l.norm.iter().map(|(w, _)| w));
        }
        v
    }
}

/// `choice` `[..., experts]` with the scores of every group but the `keep` best of `groups`
/// set to zero, a group ranking by the sum of its two best scores (DeepSeek's group-limited
/// routing; zero, not minus infinity, as the reference does).
fn drop_weak_groups(choice: &Array, groups: i32, keep: i32) -> Result<Array> {
    let shape = choice.shape().to_vec();
    let mut grouped_shape = shape[..shape.len() - 1].to_vec();
    grouped_shape.extend([groups, -1]);
    let grouped = choice.reshape(&grouped_shape)?;
    let best_two = ops::indexing::topk_axis(&grouped, 2, -1)?.sum_axis(-1, true)?;
    let weak =
        argpartition_axis(&best_two, groups - keep - 1, -2)?.index((.., .., ..(groups - keep), ..));
    let zeroed = grouped.put_along_axis(&weak, Array::from_f32(0.0), -2)?;
    Ok(zeroed.reshape(&shape)?)
}
