//! Tensor parallelism of the recurrent layers (Gated DeltaNet, Mamba-2, Kimi Delta Attention),
//! Megatron style as the attention cut is ([`super::tensor_parallel`]): each rank keeps a
//! contiguous run of the layer's heads and everything that belongs to them — their rows of the
//! input projections (section by section where one projection holds several parts), their
//! convolution channels, their decay parameters — and the matching columns of the output
//! projection, whose partial sums one `all_sum` adds. The recurrence never mixes heads, so the
//! state a rank keeps (its heads' convolution inputs and matrices) needs no communication.
//!
//! A ring size must divide the heads (and, for Mamba-2, the groups whose `B`/`C` the heads
//! read); quantized output projections are cut at their groups' boundaries.
//! [`linear_divisors`] gives placement the same counts, so it refuses such a ring with the
//! reason before loading anything.

use super::gated_delta::{DeltaNetShape, GatedDeltaNet, InProjection};
use super::kda::KimiDeltaAttention;
use super::mamba2::{Mamba2, Mamba2Shape};
use crate::config::ModelConfig;
use crate::error::{InferenceError, Result};
use crate::linear::Linear;
use crate::quantized::slice_axis;
use crate::ring::RingGroup;
use crate::tensor_divisors::{count_of, TensorDivisor};
use mlx_rs::Array;
use std::sync::Arc;

/// Fails unless `size` ranks split `count` `kind` evenly.
fn check_divides(count: usize, kind: &str, size: usize, what: &str) -> Result<()> {
    if count.is_multiple_of(size) {
        Ok(())
    } else {
        Err(InferenceError::BadSplit(format!(
            "{what}: {count} {kind} cannot be split over {size} ranks; choose a ring size that \
             divides it"
        )))
    }
}

/// Rank `rank`'s share `[r·n/size, (r+1)·n/size)` of each of consecutive sections of `sizes`
/// rows: the rows of a fused projection (or the channels of a convolution) that hold the
/// rank's heads of every part.
fn section_rows(sizes: &[usize], rank: usize, size: usize) -> Vec<i32> {
    let mut rows = Vec::new();
    let mut offset = 0;
    for &n in sizes {
        let (from, to) = (offset + rank * n / size, offset + (rank + 1) * n / size);
        rows.extend((from as i32)..(to as i32));
        offset += n;
    }
    rows
}

/// Rows `rows` of `a` (its first axis).
fn take_rows(a: &Array, rows: &[i32]) -> Result<Array> {
    Ok(a.take_axis(Array::from_slice(rows, &[rows.len() as i32]), 0)?)
}

/// Rank `rank`'s `1/size` of `a`'s first axis.
fn share(a: &Array, rank: usize, size: usize) -> Result<Array> {
    let n = a.shape()[0] as usize;
    slice_axis(a, 0, rank * n / size, (rank + 1) * n / size)
}

/// Rank `rank`'s `1/size` of `linear`'s output rows.
fn share_rows(linear: &Linear, rank: usize, size: usize) -> Result<Linear> {
    let n = linear.weight.out_rows();
    linear.slice_rows(rank * n / size, (rank + 1) * n / size)
}

/// Rank `rank`'s `1/size` of a row-parallel projection's `inputs` columns.
fn share_columns(
    linear: &Linear,
    inputs: usize,
    rank: usize,
    size: usize,
    what: &str,
) -> Result<Linear> {
    linear.slice_columns(rank * inputs / size, (rank + 1) * inputs / size, size, what)
}

impl GatedDeltaNet {
    /// Rank `rank`'s slice of a `size`-way tensor-parallel instance: its key heads and the
    /// value heads that read them (value head `j` reads key head `j / (v_heads / k_heads)`,
    /// so a run of key heads owns a run of value heads). Qwen3.5's `in_proj_qkv` is cut
    /// section by section (queries, keys, values); Qwen3-Next's `in_proj_qkvz` and
    /// `in_proj_ba` are grouped by key head, so the rank's groups are one run of rows.
    pub(crate) fn cut(
        &self,
        rank: usize,
        size: usize,
        group: &Arc<RingGroup>,
        what: &str,
    ) -> Result<GatedDeltaNet> {
        let s = self.shape;
        check_divides(s.k_heads, "linear-attention key heads", size, what)?;
        let (kd, vd) = (s.k_heads * s.k_dim, s.v_heads * s.v_dim);
        let channels = section_rows(&[kd, kd, vd], rank, size);
        let proj = match &self.proj {
            InProjection::Split { qkv, z, b, a } => InProjection::Split {
                qkv: qkv.reorder_rows(&channels)?,
                z: share_rows(z, rank, size)?,
                b: share_rows(b, rank, size)?,
                a: share_rows(a, rank, size)?,
            },
            InProjection::Fused { qkvz, ba } => InProjection::Fused {
                qkvz: share_rows(qkvz, rank, size)?,
                ba: share_rows(ba, rank, size)?,
            },
        };
        Ok(GatedDeltaNet {
            proj,
            conv: take_rows(&self.conv, &channels)?,
            dt_bias: share(&self.dt_bias, rank, size)?,
            a_log: share(&self.a_log, rank, size)?,
            norm: self.norm.clone(),
            out_proj: share_columns(&self.out_proj, vd, rank, size, &format!("{what} out_proj"))?,
            shape: DeltaNetShape {
                k_heads: s.k_heads / size,
                v_heads: s.v_heads / size,
                ..s
            },
            eps: self.eps,
            reduce: Some(group.clone()),
        })
    }
}

impl Mamba2 {
    /// Rank `rank`'s slice of a `size`-way tensor-parallel instance: its heads (their rows of
    /// `in_proj`'s gate, values and `dt`, their `A_log`, `D`, `dt_bias`) and the groups those
    /// heads read (their rows of `B` and `C`); the convolution's channels of both; the gated
    /// norm's weight over its heads (the norm is per group, and a rank holds whole groups);
    /// `out_proj`'s columns, summed over the ring.
    pub(crate) fn cut(
        &self,
        rank: usize,
        size: usize,
        group: &Arc<RingGroup>,
        what: &str,
    ) -> Result<Mamba2> {
        let s = self.shape;
        check_divides(s.groups, "Mamba-2 groups", size, what)?;
        // Heads come in whole groups ([`Mamba2Shape::validate`]), so this holds too.
        check_divides(s.heads, "Mamba-2 heads", size, what)?;
        let (inner, bc) = (s.inner(), s.groups * s.state);
        let in_rows = section_rows(&[inner, inner, bc, bc, s.heads], rank, size);
        let channels = section_rows(&[inner, bc, bc], rank, size);
        Ok(Mamba2 {
            in_proj: self.in_proj.reorder_rows(&in_rows)?,
            conv: take_rows(&self.conv, &channels)?,
            conv_bias: self
                .conv_bias
                .as_ref()
                .map(|b| take_rows(b, &channels))
                .transpose()?,
            dt_bias: share(&self.dt_bias, rank, size)?,
            a_log: share(&self.a_log, rank, size)?,
            d: share(&self.d, rank, size)?,
            norm: share(&self.norm, rank, size)?,
            out_proj: share_columns(
                &self.out_proj,
                inner,
                rank,
                size,
                &format!("{what} out_proj"),
            )?,
            shape: Mamba2Shape {
                heads: s.heads / size,
                groups: s.groups / size,
                ..s
            },
            eps: self.eps,
            reduce: Some(group.clone()),
        })
    }
}

impl KimiDeltaAttention {
    /// Rank `rank`'s slice of a `size`-way tensor-parallel instance: its heads' rows of the
    /// query, key and value projections and of their convolutions, of the decay's and the
    /// gate's second (per-head) projections, of `b_proj`, `A_log` and `dt_bias`; the low-rank
    /// first projections and the per-head norm whole; `o_proj`'s columns, summed over the
    /// ring.
    pub(crate) fn cut(
        &self,
        rank: usize,
        size: usize,
        group: &Arc<RingGroup>,
        what: &str,
    ) -> Result<KimiDeltaAttention> {
        let s = self.shape;
        check_divides(s.v_heads, "Kimi Delta Attention heads", size, what)?;
        let width = s.v_heads * s.v_dim;
        let channels = section_rows(&[width, width, width], rank, size);
        let [q, k, v] = &self.qkv;
        let [f_a, f_b] = &self.f;
        // The gate's last projection is per head; a low-rank first one stays whole.
        let mut gate = self.gate.clone();
        if let Some(last) = gate.last_mut() {
            *last = share_rows(last, rank, size)?;
        }
        Ok(KimiDeltaAttention {
            qkv: [
                share_rows(q, rank, size)?,
                share_rows(k, rank, size)?,
                share_rows(v, rank, size)?,
            ],
            conv: take_rows(&self.conv, &channels)?,
            f: [f_a.clone(), share_rows(f_b, rank, size)?],
            b_proj: share_rows(&self.b_proj, rank, size)?,
            gate,
            a_log: share(&self.a_log, rank, size)?,
            dt_bias: share(&self.dt_bias, rank, size)?,
            o_norm: self.o_norm.clone(),
            o_proj: share_columns(&self.o_proj, width, rank, size, &format!("{what} o_proj"))?,
            shape: DeltaNetShape {
                k_heads: s.k_heads / size,
                v_heads: s.v_heads / size,
                ..s
            },
            eps: self.eps,
            reduce: Some(group.clone()),
            lower_bound: self.lower_bound,
        })
    }
}

/// The kind of recurrent layer a family's linear layers are, for [`linear_divisors`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RecurrentKind {
    /// Gated DeltaNet (Qwen3.5, Qwen3-Next): key heads and the value heads that read them.
    GatedDeltaNet,
    /// Mamba-2 (Nemotron-H): heads, and the groups whose `B`/`C` they read. Its
    /// [`crate::config::LinearLayers`] shape holds the groups as key heads, the heads as
    /// value heads.
    Mamba2,
    /// Kimi Delta Attention: as many key as value heads.
    Kda,
}

/// What a ring size must divide in a model whose linear layers are `kind`, beside
/// [`crate::tensor_divisors::standard_divisors`]: the layers' heads (Mamba-2's groups too),
/// and the output projection's inputs in quantization groups.
pub(crate) fn linear_divisors(config: &ModelConfig, kind: RecurrentKind) -> Vec<TensorDivisor> {
    let mut out = crate::tensor_divisors::standard_divisors(config);
    let Some(linear) = &config.attention.linear else {
        return out;
    };
    let s = linear.shape;
    let (counts, name): (&[(&str, usize)], &str) = match kind {
        RecurrentKind::GatedDeltaNet => (
            &[
                ("linear-attention key heads", s.k_heads),
                ("linear-attention value heads", s.v_heads),
            ],
            "linear-attention output projection inputs",
        ),
        RecurrentKind::Mamba2 => (
            &[("Mamba-2 heads", s.v_heads), ("Mamba-2 groups", s.k_heads)],
            "Mamba-2 output projection inputs",
        ),
        RecurrentKind::Kda => (
            &[("Kimi Delta Attention heads", s.v_heads)],
            "Kimi Delta Attention output projection inputs",
        ),
    };
    out.extend(counts.iter().map(|&(what, count)| TensorDivisor {
        what: what.into(),
        count: count_of(count),
    }));
    let width = s.v_heads * s.v_dim;
    if let Some(g) = config.quantization.as_ref().map(|q| q.group_size as usize) {
        if g > 0 {
            out.push(TensorDivisor {
                what: format!("{name} ({width}) in quantization groups of {g}"),
                count: count_of(width / g),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each section gives the rank its own share, in the sections' order.
    #[test]
    fn a_rank_takes_its_share_of_each_section() {
        assert_eq!(section_rows(&[4, 4, 8], 1, 2), [2, 3, 6, 7, 12, 13, 14, 15]);
        assert_eq!(section_rows(&[4, 4, 8], 0, 2), [0, 1, 4, 5, 8, 9, 10, 11]);
        assert_eq!(section_rows(&[6, 3], 2, 3), [4, 5, 8]);
    }

    /// Qwen3.5-35B-A3B's linear layers (16 key heads, 32 value heads of 128, 4-bit groups of
    /// 64), with 16 key/value heads of attention so that the attention does not limit the
    /// ring first: 8 ranks split it; 16 would cut the experts' 8 groups (not a head); 32 would
    /// cut a key head.
    #[test]
    fn the_key_heads_limit_a_gated_delta_net_ring() {
        let json = serde_json::json!({
            "model_type": "qwen3_5_moe",
            "quantization": {"group_size": 64, "bits": 4},
            "text_config": {
                "model_type": "qwen3_5_moe_text", "hidden_size": 2048,
                "num_hidden_layers": 40, "num_attention_heads": 16,
                "num_key_value_heads": 16, "head_dim": 256, "vocab_size": 248320,
                "linear_num_key_heads": 16, "linear_num_value_heads": 32,
                "linear_key_head_dim": 128, "linear_value_head_dim": 128,
                "num_experts": 256, "num_experts_per_tok": 8,
                "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
            },
        });
        let config = ModelConfig::from_hf_json(&json).unwrap();
        let refusal = |n| crate::tensor_split::tensor_refusal(&config, n);
        assert_eq!(refusal(8), None);
        let sixteen = refusal(16).unwrap();
        assert!(sixteen.contains("8 expert width (512)"), "{sixteen}");
        assert!(!sixteen.contains("linear-attention"), "{sixteen}");
        let thirty_two = refusal(32).unwrap();
        assert!(
            thirty_two.contains("16 linear-attention key heads"),
            "{thirty_two}"
        );
        assert!(
            !thirty_two.contains("linear-attention value heads"),
            "{thirty_two}"
        );
    }
}
