//! Rotary position embeddings (RoPE), with the scalings long-context models use.

use crate::config::RopeScaling;
use crate::cpu_layer_ops::RopePositions;
use crate::error::{InferenceError, Result};
use crate::mrope::MropeSpans;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{ops, Array};
use serde_json::Value;

/// RoPE over the full head width, in the Hugging Face ("half split") layout.
#[derive(Debug, Clone)]
pub struct Rope {
    dims: i32,
    base: Option<f32>,
    scale: f32,
    /// Per-frequency periods (`base^(2i/d)` adjusted by the scaling), when not plain.
    periods: Option<Array>,
    /// Factor on queries and keys before rotating (YaRN's attention temperature; 1 otherwise).
    mscale: f32,
    /// M-RoPE's sections (Qwen3.5's `mrope_section`): how a sequence with images rotates its
    /// image tokens ([`crate::mrope`]).
    mrope: Option<[usize; 3]>,
}

impl Rope {
    /// Builds RoPE for heads of `head_dim` with base `theta`.
    pub fn new(head_dim: usize, theta: f32, scaling: &RopeScaling) -> Rope {
        let dims = head_dim as i32;
        let plain_periods = || -> Vec<f32> {
            (0..head_dim / 2)
                .map(|i| theta.powf(2.0 * i as f32 / head_dim as f32))
                .collect()
        };
        match scaling {
            RopeScaling::None => Rope {
                dims,
                base: Some(theta),
                scale: 1.0,
                periods: None,
                mscale: 1.0,
                mrope: None,
            },
            RopeScaling::Linear { factor } => Rope {
                dims,
                base: Some(theta),
                scale: 1.0 / factor,
                periods: None,
                mscale: 1.0,
                mrope: None,
            },
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position,
            } => {
                let low_freq_wavelen = original_max_position / low_freq_factor;
                let high_freq_wavelen = original_max_position / high_freq_factor;
                let periods: Vec<f32> = plain_periods()
                    .into_iter()
                    .map(|p| {
                        let wavelen = 2.0 * std::f32::consts::PI * p;
                        if wavelen > low_freq_wavelen {
                            p * factor
                        } else if wavelen < high_freq_wavelen {
                            p
                        } else {
                            let smooth = (original_max_position / wavelen - low_freq_factor)
                                / (high_freq_factor - low_freq_factor);
                            p / ((1.0 - smooth) / factor + smooth)
                        }
                    })
                    .collect();
                Rope {
                    dims,
                    base: None,
                    scale: 1.0,
                    periods: Some(Array::from_slice(&periods, &[periods.len() as i32])),
                    mscale: 1.0,
                    mrope: None,
                }
            }
            RopeScaling::Yarn {
                factor,
                original_max_position,
                beta_fast,
                beta_slow,
                mscale,
                mscale_all_dim,
            } => Rope::yarn(
                head_dim,
                theta,
                *factor,
                *original_max_position,
                *beta_fast,
                *beta_slow,
                *mscale,
                *mscale_all_dim,
            ),
            RopeScaling::FreqFactors(factors) => {
                let periods: Vec<f32> = plain_periods()
                    .iter()
                    .zip(factors.iter().chain(std::iter::repeat(&1.0)))
                    .map(|(p, f)| p * f)
                    .collect();
                Rope {
                    dims,
                    base: None,
                    scale: 1.0,
                    periods: Some(Array::from_slice(&periods, &[periods.len() as i32])),
                    mscale: 1.0,
                    mrope: None,
                }
            }
        }
    }

    /// RoPE over `dims` features whose `i`-th pair turns with period `periods[i]` (an infinite
    /// period leaves the pair as it is: Gemma 4's proportional RoPE rotates only a part).
    pub fn from_periods(dims: usize, periods: &[f32]) -> Rope {
        Rope {
            dims: dims as i32,
            base: None,
            scale: 1.0,
            periods: Some(Array::from_slice(periods, &[periods.len() as i32])),
            mscale: 1.0,
            mrope: None,
        }
    }

    /// No rotation at all: the layers of a family that leaves some layers without positions
    /// (Llama 4's NoPE layers) keep queries and keys as they are.
    pub fn none() -> Rope {
        Rope {
            dims: 0,
            base: None,
            scale: 1.0,
            periods: None,
            mscale: 1.0,
            mrope: None,
        }
    }

    /// YaRN (mlx-lm's `YarnRoPE`): [`yarn_periods`] over the whole head, queries and keys
    /// scaled by the ratio of the `mscale` and `mscale_all_dim` corrections.
    #[allow(clippy::too_many_arguments)]
    fn yarn(
        head_dim: usize,
        theta: f32,
        factor: f32,
        original_max_position: f32,
        beta_fast: f32,
        beta_slow: f32,
        mscale: f32,
        mscale_all_dim: f32,
    ) -> Rope {
        let periods = yarn_periods(
            head_dim,
            theta,
            factor,
            original_max_position,
            (beta_fast, beta_slow),
        );
        Rope {
            dims: head_dim as i32,
            base: None,
            scale: 1.0,
            periods: Some(Array::from_slice(&periods, &[periods.len() as i32])),
            mscale: yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim),
            mrope: None,
        }
    }

    /// `x` with its rotated features (the first `dims`) times the YaRN magnitude factor, when
    /// there is one; features past `dims` (partial rotation) keep their scale, as mlx-lm's
    /// `YarnRoPE` leaves them.
    fn scaled(&self, x: &Array) -> Result<Array> {
        if self.mscale == 1.0 {
            return Ok(x.clone());
        }
        let factor = Array::from_f32(self.mscale).as_dtype(x.dtype())?;
        let width = *x.shape().last().unwrap_or(&0);
        if width <= self.dims {
            return Ok(ops::multiply(x, &factor)?);
        }
        let rotated = ops::multiply(x.index((.., .., .., ..self.dims)), &factor)?;
        Ok(ops::concatenate(
            &[rotated, x.index((.., .., .., self.dims..))],
            -1,
        )?)
    }

    /// With M-RoPE `sections` for sequences with images (see [`crate::mrope`]).
    pub fn with_mrope(self, sections: Option<[usize; 3]>) -> Rope {
        Rope {
            mrope: sections,
            ..self
        }
    }

    /// Rotates `x` (`[batch, heads, seq, head_dim]`) of sequence indices from `offset` on: by
    /// their M-RoPE positions when the sequence has image `spans` and this RoPE has sections,
    /// else as [`Rope::apply`] (a step without image tokens at the position shifted by the
    /// images before it).
    pub fn apply_in(&self, x: &Array, offset: usize, spans: Option<&MropeSpans>) -> Result<Array> {
        let (Some(spans), Some(sections)) = (spans, self.mrope) else {
            return self.apply(x, offset);
        };
        let l = x.shape()[2] as usize;
        if !spans.has_image_in(offset..offset + l) {
            let shifted = spans.position(offset)[0];
            return self.apply(x, shifted.max(0) as usize);
        }
        match (self.base, self.periods.as_ref(), self.scale, self.mscale) {
            (Some(theta), None, scale, mscale) if scale == 1.0 && mscale == 1.0 => {
                crate::mrope::rotate(x, self.dims, theta, sections, spans, offset)
            }
            _ => Err(crate::error::InferenceError::InvalidRequest(
                "image positions (M-RoPE) with a scaled RoPE are not supported".into(),
            )),
        }
    }

    /// Rotates `x` of shape `[batch, heads, seq, head_dim]`, the first position being `offset`.
    pub fn apply(&self, x: &Array, offset: usize) -> Result<Array> {
        if self.dims == 0 {
            return Ok(x.clone());
        }
        crate::cpu_layer_ops::rope(
            &self.scaled(x)?,
            self.dims,
            self.base,
            self.scale,
            RopePositions::From(offset as i32),
            self.periods.as_ref(),
        )
    }

    /// Rotates `x` of shape `[rows, heads, 1, head_dim]`, row `r`'s position being
    /// `positions[r]` (`[rows]`, int32): one op for every decoding sequence of a step.
    pub fn apply_at(&self, x: &Array, positions: &Array) -> Result<Array> {
        if self.dims == 0 {
            return Ok(x.clone());
        }
        crate::cpu_layer_ops::rope(
            &self.scaled(x)?,
            self.dims,
            self.base,
            self.scale,
            RopePositions::PerEntry(positions),
            self.periods.as_ref(),
        )
    }
}

/// YaRN's periods for `dims` rotated dimensions: frequencies that turn more than `beta_fast`
/// times over the original context keep their period `θ^(2i/d)`, those turning fewer than
/// `beta_slow` times are stretched `factor` times, with a linear ramp between (computed in f32
/// as mlx-lm's `YarnRoPE` does).
pub fn yarn_periods(
    dims: usize,
    theta: f32,
    factor: f32,
    original_max_position: f32,
    (beta_fast, beta_slow): (f32, f32),
) -> Vec<f32> {
    let d = dims as f64;
    // The dimension whose frequency turns `rotations` times over the original context.
    let correction_dim = |rotations: f32| {
        d * (original_max_position as f64 / (rotations as f64 * 2.0 * std::f64::consts::PI)).ln()
            / (2.0 * (theta as f64).ln())
    };
    let low = correction_dim(beta_fast).floor().max(0.0);
    let mut high = correction_dim(beta_slow).ceil().min(d - 1.0);
    if low == high {
        high += 0.001;
    }
    let (low, high) = (low as f32, high as f32);
    (0..dims / 2)
        .map(|i| {
            let extra = theta.powf((2 * i) as f32 / dims as f32);
            let inter = factor * extra;
            let keep = 1.0 - ((i as f32 - low) / (high - low)).clamp(0.0, 1.0);
            inter * extra / (inter * keep + extra * (1.0 - keep))
        })
        .collect()
}

/// YaRN's magnitude correction `0.1 · m · ln(factor) + 1` for a context stretched `factor`
/// times (1 when not stretched).
pub fn yarn_mscale(factor: f32, m: f32) -> f32 {
    if factor <= 1.0 {
        1.0
    } else {
        0.1 * m * factor.ln() + 1.0
    }
}

/// One layer kind's RoPE, as Gemma 4's `rope_parameters` gives it per kind (`default`,
/// `linear`, or `proportional`: only a fraction of the head turns).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct RopeSpec {
    theta: f32,
    /// Proportional: only the first `fraction` of the head turns, at periods
    /// `factor · theta^(2i / head_dim)`.
    proportional: bool,
    fraction: f32,
    /// Linear scaling (positions divided) or the proportional factor.
    factor: f32,
}

impl RopeSpec {
    /// The spec of layer kind `kind` (`sliding_attention`, `full_attention`) in
    /// `parameters`.
    pub(crate) fn read(parameters: &Value, kind: &str) -> Result<RopeSpec> {
        let p = parameters.get(kind).cloned().unwrap_or(Value::Null);
        let f = |key: &str, default: f64| p.get(key).and_then(Value::as_f64).unwrap_or(default);
        let spec = |proportional: bool| RopeSpec {
            theta: f("rope_theta", 10_000.0) as f32,
            proportional,
            fraction: f("partial_rotary_factor", 1.0) as f32,
            factor: f("factor", 1.0) as f32,
        };
        match p
            .get("rope_type")
            .and_then(Value::as_str)
            .unwrap_or("default")
        {
            "default" => Ok(RopeSpec {
                factor: 1.0,
                ..spec(false)
            }),
            "linear" => Ok(spec(false)),
            "proportional" => Ok(spec(true)),
            other => Err(InferenceError::BadConfig(format!(
                "a config.json's {kind} rope_type `{other}` is not supported \
                 (default, linear and proportional are)"
            ))),
        }
    }

    /// The RoPE of a head `head_dim` wide.
    pub(crate) fn rope(&self, head_dim: usize) -> Rope {
        if !self.proportional {
            let scaling = if self.factor == 1.0 {
                crate::config::RopeScaling::None
            } else {
                crate::config::RopeScaling::Linear {
                    factor: self.factor,
                }
            };
            return Rope::new(head_dim, self.theta, &scaling);
        }
        let rotated = (head_dim as f32 * self.fraction) as usize / 2;
        let periods: Vec<f32> = (0..head_dim / 2)
            .map(|i| {
                if i < rotated {
                    self.factor * self.theta.powf(2.0 * i as f32 / head_dim as f32)
                } else {
                    f32::INFINITY
                }
            })
            .collect();
        Rope::from_periods(head_dim, &periods)
    }
}
