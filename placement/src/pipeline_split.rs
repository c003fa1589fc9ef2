//! The layer split a pipeline ring gets: accelerated ranks first where they mix with CPU
//! ranks and every rank can hold that, else in proportion to free memory. It chooses between
//! the arithmetic of [`crate::split`] and [`crate::accel`], which do not know of each other.

use crate::accel::{gpu_first_counts, is_accelerated};
use crate::error::PlaceError;
use crate::model::ModelCard;
use crate::node::NodeProfile;
use crate::split::{check_share, pipeline_layer_counts, weighted_layer_counts};

/// The layer counts a pipeline over `ring` (its nodes in rank order) gets: accelerated ranks
/// first where the ring mixes them with CPU ranks ([`gpu_first_counts`], which
/// counts layers as equal) when every rank can hold that split, else in proportion to free
/// memory ([`pipeline_layer_counts`], or [`weighted_layer_counts`] when the layers weigh
/// differently). Rank 0's memory counts without what it holds besides its layers
/// ([`ModelCard::rank0_bytes`], a vision tower), so the layers are split over what is left.
/// Shares are not checked here for the memory split; the caller checks them.
pub fn pipeline_split(ring: &[&NodeProfile], model: &ModelCard) -> Result<Vec<u32>, PlaceError> {
    let memory: Vec<u64> = ring
        .iter()
        .enumerate()
        .map(|(r, n)| n.ram_available.saturating_sub(model.extra_on_rank(r)))
        .collect();
    let by_memory = if model.layers_differ() {
        weighted_layer_counts(&model.layer_weights, &memory)?
    } else {
        pipeline_layer_counts(model.n_layers, &memory)?
    };
    let fast: Vec<bool> = ring.iter().map(|n| is_accelerated(n, model)).collect();
    let gpu_first =
        gpu_first_counts(model.n_layers, model.storage_bytes, &memory, &fast).filter(|counts| {
            let mut start = 0;
            ring.iter().zip(counts).enumerate().all(|(r, (node, &c))| {
                let (part, whole) = model.layer_weight(start, start + c);
                start += c;
                check_share(
                    node,
                    model.storage_bytes,
                    part,
                    whole,
                    model.extra_on_rank(r),
                )
                .is_ok()
            })
        });
    Ok(gpu_first.unwrap_or(by_memory))
}
