//! The experts of a Mixture-of-Experts block, stacked per projection, `[experts, out, in]`,
//! and run with `gather_mm` (floats) or `gather_qmm` (quantized): every token's `k` rows in one
//! product per projection. Past 64 (token, expert) pairs, as in a prefill, the pairs are
//! sorted by expert first so each expert's weights are read once. Their router and the block
//! around them are [`super::moe`]'s.
//!
//! Tensor parallel: every rank keeps every expert at `1/N` of its width (gate and up by output
//! rows, down by input columns).

pub use super::expert_activation::ExpertActivation;
use crate::config::{ModelConfig, MoeConfig};
use crate::error::{InferenceError, Result};
use crate::linear::Matrix;
use crate::quantized::slice_axis;
use crate::weights::FormatOnMlx;
use crate::weights::{Stacked, TensorSource, WeightFormat};
use mlx_rs::{ops, Array};

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
        projections: [Stacked; 3],
        biases: Option<ExpertBiases>,
        activation: ExpertActivation,
    ) -> Result<Experts> {
        // Experts on a latent projection (`MoeConfig::latent_width`) read and write it.
        let io = match moe.latent_width {
            0 => config.hidden_size,
            latent => latent,
        };
        Experts::new_in(moe, io, prefix, projections, biases, activation)
    }

    /// [`Experts::new`] for experts that read and write `io` wide vectors rather than the
    /// hidden state (those on a latent projection, Nemotron 3 Super's `moe_latent_size`).
    pub(crate) fn new_in(
        moe: &MoeConfig,
        io: usize,
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
            ("down_proj", &experts.down_proj, io),
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
                ("down_proj", &b.down, io),
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
    pub(crate) fn cut(
        &self,
        start: usize,
        end: usize,
        ranks: usize,
        what: &str,
    ) -> Result<Experts> {
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

    pub(crate) fn width(&self) -> usize {
        self.gate_proj.out_rows()
    }

    pub(crate) fn arrays(&self) -> Vec<&Array> {
        let mut v: Vec<&Array> = [&self.gate_proj, &self.up_proj, &self.down_proj]
            .into_iter()
            .flat_map(Stacked::arrays)
            .collect();
        v.extend(self.biases.iter().flat_map(|b| [&b.gate, &b.up, &b.down]));
        v
    }
}
