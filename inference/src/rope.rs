//! Rotary position embeddings (RoPE), with the scalings long-context models use.

use crate::config::RopeScaling;
use crate::error::Result;
use mlx_rs::{fast, Array};

/// RoPE over the full head width, in the Hugging Face ("half split") layout.
#[derive(Debug, Clone)]
pub struct Rope {
    dims: i32,
    base: Option<f32>,
    scale: f32,
    /// Per-frequency periods (`base^(2i/d)` adjusted by the scaling), when not plain.
    periods: Option<Array>,
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
            },
            RopeScaling::Linear { factor } => Rope {
                dims,
                base: Some(theta),
                scale: 1.0 / factor,
                periods: None,
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
                }
            }
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
                }
            }
        }
    }

    /// Rotates `x` of shape `[batch, heads, seq, head_dim]`, the first position being `offset`.
    pub fn apply(&self, x: &Array, offset: usize) -> Result<Array> {
        Ok(fast::rope(
            x,
            self.dims,
            false,
            self.base,
            self.scale,
            offset as i32,
            self.periods.as_ref(),
        )?)
    }

    /// Rotates `x` of shape `[rows, heads, 1, head_dim]`, row `r`'s position being
    /// `positions[r]` (`[rows]`, int32): one op for every decoding sequence of a step.
    pub fn apply_at(&self, x: &Array, positions: &Array) -> Result<Array> {
        Ok(fast::rope_dynamic(
            x,
            self.dims,
            false,
            self.base,
            self.scale,
            positions,
            self.periods.as_ref(),
        )?)
    }
}
