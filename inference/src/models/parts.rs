//! What every part of a block (attention, MLP, experts) needs while loading and running:
//! its tensors' names, a check of their shapes, and the sum of a row-parallel projection over
//! the tensor-parallel ring. A leaf, so that the parts and the block that holds them
//! ([`super::base`]) do not lean on each other.

use crate::error::{InferenceError, Result};
use crate::linear::Matrix;
use crate::ring::RingGroup;
use mlx_rs::Array;
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
