//! The Mixture-of-Experts feed-forward (mlx-lm's `SwitchGLU` with its routers): a router picks
//! `k` of `E` experts per token, each picked expert runs its own SwiGLU, and the outputs are
//! summed with the router's weights.
//!
//! Experts are stacked per projection, `[experts, out, in]`, and run with `gather_mm` (floats)
//! or `gather_qmm` (quantized): every token's `k` rows in one product per projection. Past 64
//! (token, expert) pairs, as in a prefill, the pairs are sorted by expert first so each
//! expert's weights are read once.
//!
//! Tensor parallel: every rank keeps every expert at `1/N` of its width (gate and up by output
//! rows, down by input columns) and the whole router, so the ranks route alike and one
//! `all_sum` adds the partial outputs.

pub use super::expert_activation::ExpertActivation;
use super::mlp::Mlp;
use super::parts::layer_tensor;
use crate::config::{ModelConfig, MoeConfig, RouterKind};
use crate::error::{InferenceError, Result};
use crate::linear::{Linear, Matrix};
use crate::quantized::slice_axis;
use crate::ring::RingGroup;
use crate::weights::{Stacked, TensorSource, WeightFormat};
use mlx_rs::ops::argpartition_axis;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{ops, Array};
use std::sync::Arc;

/// (token, expert) pairs from which the pairs are sorted by expert before the products, as
/// mlx-lm does (a prefill; a decode step of a few sequences runs unsorted).
const SORT_FROM_PAIRS: usize = 64;

impl Stacked {
    /// `x @ W[e]^T` for the expert `e` of each entry of `experts`.
    fn gather(&self, x: &Array, experts: &Array, sorted: bool) -> Result<Array> {
        match self {
            Stacked::Dense(w) => Ok(ops::gather_mm(
                x,
                w.swap_axes(-1, -2)?,
                None,
                experts,
                sorted,
            )?),
            Stacked::Quantized(q) => q.gather_matmul(x, experts, sorted),
        }
    }

    /// `[experts, out, in]`'s `out`.
    fn out_rows(&self) -> usize {
        match self {
            Stacked::Dense(w) => w.shape()[1] as usize,
            Stacked::Quantized(q) => q.out_rows(),
        }
    }

    fn experts(&self) -> usize {
        match self {
            Stacked::Dense(w) => w.shape()[0] as usize,
            Stacked::Quantized(q) => q.packed.shape()[0] as usize,
        }
    }

    fn slice_rows(&self, start: usize, end: usize) -> Result<Stacked> {
        Ok(match self {
            Stacked::Dense(w) => Stacked::Dense(slice_axis(w, 1, start, end)?),
            Stacked::Quantized(q) => Stacked::Quantized(q.slice_rows(start, end)?),
        })
    }

    fn slice_columns(&self, start: usize, end: usize, what: &str) -> Result<Stacked> {
        Ok(match self {
            Stacked::Dense(w) => Stacked::Dense(slice_axis(w, 2, start, end)?),
            Stacked::Quantized(q) => Stacked::Quantized(q.slice_columns(start, end, what)?),
        })
    }

    fn arrays(&self) -> Vec<&Array> {
        match self {
            Stacked::Dense(w) => vec![w],
            Stacked::Quantized(q) => q.arrays(),
        }
    }
}

/// What a family calls each expert's gate, up and down projections in Hugging Face
/// checkpoints (`<moe>.experts.<e>.<name>`); mlx-lm stacks them as `switch_mlp.gate_proj`,
/// `up_proj`, `down_proj` whatever the family.
pub(crate) type ExpertNames = [&'static str; 3];

/// Qwen's, DeepSeek's and GLM's names.
pub(crate) const PROJ_NAMES: ExpertNames = ["gate_proj", "up_proj", "down_proj"];

/// Reads one projection of every expert: stacked (`<moe>.switch_mlp.<proj>`, as mlx-lm saves
/// it) or one matrix per expert (`<moe>.experts.<e>.<hf_proj>`, as Hugging Face checkpoints
/// store it), stacked here.
fn load_projection(
    source: &mut dyn TensorSource,
    moe_prefix: &str,
    (proj, hf_proj): (&str, &str),
    experts: usize,
    format: WeightFormat,
) -> Result<Stacked> {
    if let Some(stacked) = source.stacked(&format!("{moe_prefix}.switch_mlp.{proj}"), format)? {
        return Ok(stacked);
    }
    let mut parts = Vec::with_capacity(experts);
    for e in 0..experts {
        match source.matrix(&format!("{moe_prefix}.experts.{e}.{hf_proj}"), format)? {
            Matrix::Dense(w) => parts.push(w),
            Matrix::Quantized(q) => parts.push(q.dequantize(format.compute_dtype())?),
        }
    }
    Ok(Stacked::Dense(ops::stack(&parts, 0)?))
}

/// Per-expert biases of the three projections, `[experts, out]` (gpt-oss).
#[derive(Debug, Clone)]
pub struct ExpertBiases {
    /// The gate projection's.
    pub gate: Array,
    /// The up projection's.
    pub up: Array,
    /// The down projection's.
    pub down: Array,
}

/// Every expert's gated feed-forward, stacked per projection.
#[derive(Debug, Clone)]
pub struct Experts {
    gate_proj: Stacked,
    up_proj: Stacked,
    down_proj: Stacked,
    biases: Option<ExpertBiases>,
    activation: ExpertActivation,
}

/// `x @ W[e]^T (+ b[e])` for the expert `e` of each entry of `experts`.
fn project(
    w: &Stacked,
    bias: Option<&Array>,
    x: &Array,
    experts: &Array,
    sorted: bool,
) -> Result<Array> {
    let y = w.gather(x, experts, sorted)?;
    Ok(match bias {
        // The products are `[..., 1, out]`: the bias joins on the row axis.
        Some(b) => ops::add(&y, b.take_axis(experts, 0)?.expand_dims(-2)?)?,
        None => y,
    })
}

impl Experts {
    /// The experts of the MoE block at `moe_prefix` (`model.layers.3.mlp`), their
    /// per-expert projections called `names` in Hugging Face checkpoints, checked against the
    /// configuration.
    pub(crate) fn load(
        config: &ModelConfig,
        moe: &MoeConfig,
        source: &mut dyn TensorSource,
        moe_prefix: &str,
        names: ExpertNames,
        format: WeightFormat,
    ) -> Result<Experts> {
        let mut load = |i: usize| {
            let proj = (PROJ_NAMES[i], names[i]);
            load_projection(source, moe_prefix, proj, moe.num_experts, format)
        };
        let projections = [load(0)?, load(1)?, load(2)?];
        let prefix = format!("{moe_prefix}.switch_mlp");
        Experts::new(
            config,
            moe,
            &prefix,
            projections,
            None,
            ExpertActivation::SwiGlu,
        )
    }

    /// The experts with another activation (MiniMax M3's clamped SwiGLU).
    pub(crate) fn with_activation(self, activation: ExpertActivation) -> Experts {
        Experts { activation, ..self }
    }

    /// Experts from their stacked projections (gate, up, down) and biases, checked against
    /// the configuration (`prefix` names them in errors).
    pub(crate) fn new(
        config: &ModelConfig,
        moe: &MoeConfig,
        prefix: &str,
        [gate_proj, up_proj, down_proj]: [Stacked; 3],
        biases: Option<ExpertBiases>,
        activation: ExpertActivation,
    ) -> Result<Experts> {
        let experts = Experts {
            gate_proj,
            up_proj,
            down_proj,
            biases,
            activation,
        };
        for (what, m, rows) in [
            ("gate_proj", &experts.gate_proj, moe.expert_width),
            ("up_proj", &experts.up_proj, moe.expert_width),
            ("down_proj", &experts.down_proj, config.hidden_size),
        ] {
            if m.experts() != moe.num_experts || m.out_rows() != rows {
                return Err(InferenceError::BadTensor {
                    name: format!("{prefix}.{what}"),
                    reason: format!(
                        "expected {} experts of {rows} rows, found {} of {}",
                        moe.num_experts,
                        m.experts(),
                        m.out_rows()
                    ),
                });
            }
        }
        if let Some(b) = &experts.biases {
            let want = |rows: usize| vec![moe.num_experts as i32, rows as i32];
            for (what, bias, rows) in [
                ("gate_proj", &b.gate, moe.expert_width),
                ("up_proj", &b.up, moe.expert_width),
                ("down_proj", &b.down, config.hidden_size),
            ] {
                if bias.shape() != want(rows) {
                    return Err(InferenceError::BadTensor {
                        name: format!("{prefix}.{what}.bias"),
                        reason: format!(
                            "expected shape {:?}, found {:?}",
                            want(rows),
                            bias.shape()
                        ),
                    });
                }
            }
        }
        Ok(experts)
    }

    /// `x` `[..., hidden]` through the experts `picked` `[..., k]`: `[..., k, hidden]`.
    pub fn forward(&self, x: &Array, picked: &Array) -> Result<Array> {
        let k = *picked.shape().last().unwrap_or(&1);
        let hidden = *x.shape().last().unwrap_or(&0);
        let pairs = picked.size();
        if pairs < SORT_FROM_PAIRS {
            // [..., 1, 1, hidden] against [..., k]: [..., k, 1, out].
            let x = x.expand_dims_axes(&[-2, -3])?;
            let y = self.swiglu(&x, picked, false)?;
            return Ok(y.squeeze_axes(&[-2])?);
        }
        // Sorted by expert: row i of the products is pair order[i], token order[i] / k.
        let flat = picked.flatten(None, None)?;
        let order = ops::argsort_axis(&flat, 0)?;
        let back = ops::argsort_axis(&order, 0)?;
        let tokens = x.reshape(&[-1, 1, hidden])?;
        let rows = tokens.take_axis(ops::floor_divide(&order, Array::from_int(k))?, 0)?;
        let y = self.swiglu(&rows, &flat.take_axis(&order, 0)?, true)?;
        let mut shape = picked.shape().to_vec();
        shape.push(hidden);
        Ok(y.take_axis(&back, 0)?.reshape(&shape)?)
    }

    fn swiglu(&self, x: &Array, experts: &Array, sorted: bool) -> Result<Array> {
        let b = self.biases.as_ref();
        let up = project(&self.up_proj, b.map(|b| &b.up), x, experts, sorted)?;
        let gate = if self.activation == ExpertActivation::Relu2 {
            up.clone()
        } else {
            project(&self.gate_proj, b.map(|b| &b.gate), x, experts, sorted)?
        };
        let h = self.activation.apply(gate, up)?;
        project(&self.down_proj, b.map(|b| &b.down), &h, experts, sorted)
    }

    /// This rank's slice of every expert (one of `ranks`): `[start, end)` of each expert's
    /// hidden units; the down projection's bias divided by the ranks, whose sum adds it once.
    fn cut(&self, start: usize, end: usize, ranks: usize, what: &str) -> Result<Experts> {
        let biases = match &self.biases {
            Some(b) => Some(ExpertBiases {
                gate: slice_axis(&b.gate, 1, start, end)?,
                up: slice_axis(&b.up, 1, start, end)?,
                down: ops::divide(&b.down, Array::from_f32(ranks as f32))?,
            }),
            None => None,
        };
        Ok(Experts {
            gate_proj: self.gate_proj.slice_rows(start, end)?,
            up_proj: self.up_proj.slice_rows(start, end)?,
            down_proj: self.down_proj.slice_columns(start, end, what)?,
            biases,
            activation: self.activation,
        })
    }

    fn width(&self) -> usize {
        self.gate_proj.out_rows()
    }

    fn arrays(&self) -> Vec<&Array> {
        let mut v: Vec<&Array> = [&self.gate_proj, &self.up_proj, &self.down_proj]
            .into_iter()
            .flat_map(Stacked::arrays)
            .collect();
        v.extend(self.biases.iter().flat_map(|b| [&b.gate, &b.up, &b.down]));
        v
    }
}

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
        let y = self.experts.forward(x, &picked)?;
        let mut y = ops::multiply(&y, &weights.expand_dims(-1)?)?.sum_axis(-2, false)?;
        if let Some(shared) = &self.shared {
            let mut s = shared.forward(x)?;
            if let Some(gate) = &self.shared_gate {
                s = ops::multiply(&s, &ops::sigmoid(&gate.forward(x)?)?)?;
            }
            y = ops::add(&y, &s)?;
        }
        match &self.reduce {
            Some(group) => Ok(group.all_sum(&y)?),
            None => Ok(y),
        }
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
