//! What every part of a block (attention, MLP, experts) needs while loading and running:
//! its tensors' names, a check of their shapes, and the sum of a row-parallel projection over
//! the tensor-parallel ring. A leaf, so that the parts and the block that holds them
//! ([`super::base`]) do not lean on each other.

use crate::error::{InferenceError, Result};
use crate::linear::Matrix;
use crate::ring::RingGroup;
use crate::weights::TensorSource;
use mlx_rs::{ops, Array, Dtype};
use std::sync::Arc;

/// The GGUF name of `hf_part` in the tables of a family's tensors.
pub(crate) fn gguf_part_in<'a>(
    tables: impl IntoIterator<Item = &'a (&'static str, &'static str)>,
    hf_part: &str,
) -> Option<&'static str> {
    tables
        .into_iter()
        .find(|(hf, _)| *hf == hf_part)
        .map(|(_, gguf)| *gguf)
}

/// The name of tensor `part` (`self_attn.q_proj.weight`) of layer `layer`.
pub(crate) fn layer_tensor(layer: usize, part: &str) -> String {
    format!("model.layers.{layer}.{part}")
}

/// Adds up a row-parallel projection's partial results over the tensor-parallel ring.
pub(crate) fn all_sum(partial: Array, reduce: &Option<Arc<RingGroup>>) -> Result<Array> {
    match reduce {
        Some(group) => Ok(group.all_sum(&partial)?),
        None => Ok(partial),
    }
}

/// Fails unless `m` has `rows` output rows.
pub(crate) fn check_shape(m: &Matrix, name: &str, rows: usize) -> Result<()> {
    let got = m.out_rows();
    if got != rows {
        return Err(InferenceError::BadTensor {
            name: name.to_owned(),
            reason: format!("expected {rows} rows, found {got}"),
        });
    }
    Ok(())
}

/// The norm `name`'s weight as RMS norm takes it: `1 + w` where the checkpoint stores it
/// zero-centred (Gemma's norms, Qwen3.5's and Step 3.5's files, MiniMax M3), else `w`.
pub(crate) fn norm_weight(
    source: &mut dyn TensorSource,
    name: &str,
    dtype: Dtype,
    zero_centred: bool,
) -> Result<Array> {
    let w = source.dense(name, dtype)?;
    if !zero_centred {
        return Ok(w);
    }
    Ok(ops::add(&w, Array::from_f32(1.0).as_dtype(dtype)?)?)
}
