//! Attention residuals (Kimi K3's `attn_res_block_size`), as mlx-lm's `kimi_k3.py` runs them.
//!
//! The layers are cut into blocks of `attn_res_block_size`. Instead of one running residual,
//! a layer carries the partial sum of its block's outputs and the inputs at which each earlier
//! block started. Before its attention and before its feed-forward, a layer reads a mix of
//! them: every block and the partial sum get a score `(w · x) / rms(x)` (`w` is the learned
//! `*_res_proj` row times its `*_res_norm` weight, so the score is a projection of `x`'s
//! RMS norm), the scores go through a softmax, and the mix is the weighted sum. A layer that
//! starts a block first stores the partial sum it was given as that block and restarts the
//! partial sum from its attention's output. After the last layer a last mix
//! (`output_attn_res_*`) is what the final norm reads.
//!
//! The blocks travel with the hidden state as the columns after it (the family's
//! `carried_columns`, one hidden-wide slot per block, unused slots zero), so a pipeline rank
//! receives every block its layers read with the activations, whatever the cut, and a tensor
//! ring's ranks, which hold the same hidden state after each all-sum, mix alike. The mix is
//! per position, so a batched step's sequences never meet in it.

use super::base::DecoderLayer;
use super::parts::layer_tensor;
use crate::error::{InferenceError, Result};
use crate::kv_rows::LayerKv;
use crate::weights::TensorSource;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{ops, Array, Dtype};

/// Where the blocks fall in a model of `layers` layers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ResidualBlocks {
    /// `attn_res_block_size`.
    pub block_size: usize,
    /// The model's layers.
    pub layers: usize,
    /// The hidden width (of each block).
    pub hidden: usize,
}

impl ResidualBlocks {
    /// Blocks in the whole model (the layers that start one: 0, `block_size`, ...).
    pub fn count(&self) -> usize {
        self.layers.div_ceil(self.block_size)
    }

    /// Columns carried after the hidden state: a hidden-wide slot per block.
    pub fn carried_columns(&self) -> usize {
        self.count() * self.hidden
    }

    /// Blocks stored before layer `layer` runs.
    fn before(&self, layer: usize) -> usize {
        layer.div_ceil(self.block_size)
    }
}

/// One layer's mixing weights (see the module docs).
#[derive(Debug, Clone)]
pub struct AttentionResiduals {
    /// The mix before the attention: `self_attention_res_norm ⊙ self_attention_res_proj`,
    /// float32 `[hidden, 1]`.
    attention: Array,
    /// The mix before the feed-forward (`mlp_res_*`).
    feed_forward: Array,
    /// The model's last layer: the mix the final norm reads (`output_attn_res_*`).
    output: Option<Array>,
    /// Blocks stored before this layer.
    before: usize,
    /// Whether this layer starts a block.
    starts_block: bool,
    blocks: ResidualBlocks,
    eps: f32,
}

/// The names of a mix's two weights: mlx-lm's (`<src>_proj.weight`, `<src>_norm.weight`)
/// and Moonshot's (`<src>.proj_weight`, `<src>.norm_weight`).
fn weight_names(prefix: &str, src: &str) -> [(String, String); 2] {
    ["proj", "norm"].map(|part| {
        (
            format!("{prefix}{src}_{part}.weight"),
            format!("{prefix}{src}.{part}_weight"),
        )
    })
}

/// The projection row times the norm's weight, float32 `[hidden, 1]`: a score is
/// `x · w / rms(x)`.
fn mix_weight(
    source: &mut dyn TensorSource,
    prefix: &str,
    src: &str,
    hidden: usize,
) -> Result<Array> {
    let mut read = |(mlx, moonshot): (String, String)| -> Result<Array> {
        let name = if source.contains(&mlx) { mlx } else { moonshot };
        let w = source.dense(&name, Dtype::Float32)?;
        if w.size() != hidden {
            return Err(InferenceError::BadTensor {
                name,
                reason: format!("expected {hidden} numbers, found {:?}", w.shape()),
            });
        }
        Ok(w.reshape(&[hidden as i32, 1])?)
    };
    let [proj, norm] = weight_names(prefix, src);
    Ok(ops::multiply(&read(proj)?, &read(norm)?)?)
}

impl AttentionResiduals {
    /// Layer `layer`'s mixing weights (and, for the model's last layer, the output mix's).
    pub(crate) fn load(
        source: &mut dyn TensorSource,
        layer: usize,
        blocks: ResidualBlocks,
        eps: f32,
    ) -> Result<AttentionResiduals> {
        let prefix = layer_tensor(layer, "");
        let hidden = blocks.hidden;
        let last = layer + 1 == blocks.layers;
        Ok(AttentionResiduals {
            attention: mix_weight(source, &prefix, "self_attention_res", hidden)?,
            feed_forward: mix_weight(source, &prefix, "mlp_res", hidden)?,
            output: match last {
                true => Some(mix_weight(source, "model.", "output_attn_res", hidden)?),
                false => None,
            },
            before: blocks.before(layer),
            starts_block: layer.is_multiple_of(blocks.block_size),
            blocks,
            eps,
        })
    }

    /// Moonshot's names of layer `layer`'s mixing weights (with the output mix's on the
    /// model's last layer).
    pub(crate) fn tensor_names(layer: usize, layers: usize) -> Vec<String> {
        let prefix = layer_tensor(layer, "");
        let mut sources = vec![(prefix.clone(), "self_attention_res"), (prefix, "mlp_res")];
        if layer + 1 == layers {
            sources.push(("model.".into(), "output_attn_res"));
        }
        sources
            .iter()
            .flat_map(|(p, src)| weight_names(p, src).map(|(_, moonshot)| moonshot))
            .collect()
    }

    /// `layer`'s block over `x` (`[1, n, hidden + carried]`: the partial sum, then the
    /// blocks' slots), giving the same layout back.
    pub(crate) fn forward(
        &self,
        layer: &DecoderLayer,
        x: &Array,
        segments: &mut [LayerKv<'_>],
    ) -> Result<Array> {
        let (n, d) = (x.shape()[1], self.blocks.hidden as i32);
        let slots = self.blocks.count() as i32;
        if x.shape()[2] != d * (slots + 1) {
            return Err(InferenceError::InvalidRequest(format!(
                "attention residuals expected {} columns per position, found {}",
                d * (slots + 1),
                x.shape()[2]
            )));
        }
        let partial = x.index((.., .., ..d));
        let stored = x.index((.., .., d..)).reshape(&[1, n, slots, d])?;
        let before = self.before as i32;
        let h = mix(&stored, before, &partial, &self.attention, self.eps)?;
        let (stored, count, carried) = if self.starts_block {
            let mut parts = vec![partial.expand_dims(2)?];
            if before > 0 {
                parts.insert(0, stored.index((.., .., ..before, ..)));
            }
            if before + 1 < slots {
                parts.push(stored.index((.., .., before + 1.., ..)));
            }
            (ops::concatenate(&parts, 2)?, before + 1, None)
        } else {
            (stored, before, Some(partial))
        };
        let a = layer.attend(&h, segments)?;
        let partial = match carried {
            Some(p) => ops::add(&p, &a)?,
            None => a,
        };
        let h = mix(&stored, count, &partial, &self.feed_forward, self.eps)?;
        let partial = ops::add(&partial, &layer.feed_forward(&h)?)?;
        let out = match &self.output {
            Some(w) => mix(&stored, count, &partial, w, self.eps)?,
            None => partial,
        };
        Ok(ops::concatenate(
            &[out, stored.reshape(&[1, n, slots * d])?],
            -1,
        )?)
    }

    /// Every array (to evaluate them eagerly).
    pub(crate) fn arrays(&self) -> Vec<&Array> {
        let mut v = vec![&self.attention, &self.feed_forward];
        v.extend(self.output.iter());
        v
    }
}

/// The mix of the first `count` stored blocks (`[1, n, slots, d]`) and `partial` (`[1, n,
/// d]`) under the scores `x · w / rms(x)`, softmaxed over the `count + 1`; in float32, given
/// back in `partial`'s dtype. With no block stored it is `partial` itself.
fn mix(stored: &Array, count: i32, partial: &Array, w: &Array, eps: f32) -> Result<Array> {
    if count == 0 {
        return Ok(partial.clone());
    }
    let all = ops::concatenate(
        &[stored.index((.., .., ..count, ..)), partial.expand_dims(2)?],
        2,
    )?
    .as_dtype(Dtype::Float32)?;
    let scores = ops::matmul(&all, w)?;
    let mean_square = ops::square(&all)?.mean_axis(-1, true)?;
    let inv_rms = ops::rsqrt(&ops::add(&mean_square, Array::from_f32(eps))?)?;
    let p = ops::softmax_axis(&ops::multiply(&scores, &inv_rms)?, 2, true)?;
    let out = ops::multiply(&p, &all)?.sum_axis(2, false)?;
    Ok(out.as_dtype(partial.dtype())?)
}
