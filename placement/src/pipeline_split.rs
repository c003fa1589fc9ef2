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
    keep_joined_layers(gpu_first.unwrap_or(by_memory), model)
}

/// `counts` with every stage boundary moved off the layers no stage may begin at
/// ([`ModelCard::no_cut_before`]): each boundary, in order, to the nearest allowed layer after
/// the previous boundary that leaves a layer for every later stage (the lower one on a tie),
/// so the split stays as close to the memory's as the model allows. The caller checks the
/// shares as before.
pub fn keep_joined_layers(counts: Vec<u32>, model: &ModelCard) -> Result<Vec<u32>, PlaceError> {
    if model.no_cut_before.is_empty() || counts.len() < 2 {
        return Ok(counts);
    }
    let n = model.n_layers;
    let stages = counts.len() as u32;
    let refused = || PlaceError::UncuttableLayers {
        n_layers: n,
        nodes: counts.len(),
        joined: model.no_cut_before.clone(),
    };
    let mut moved = Vec::with_capacity(counts.len());
    let (mut wanted, mut previous) = (0u32, 0u32);
    for (i, &count) in counts[..counts.len() - 1].iter().enumerate() {
        wanted += count;
        // Room for one layer in each of the later stages.
        let last_allowed = n.saturating_sub(stages - 1 - i as u32);
        let boundary = (previous + 1..=last_allowed)
            .filter(|c| !model.no_cut_before.contains(c))
            .min_by_key(|&c| (c.abs_diff(wanted), c))
            .ok_or_else(refused)?;
        moved.push(boundary - previous);
        previous = boundary;
    }
    if previous >= n {
        return Err(refused());
    }
    moved.push(n - previous);
    Ok(moved)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn joined(n_layers: u32, no_cut_before: &[u32]) -> ModelCard {
        ModelCard {
            no_cut_before: no_cut_before.to_vec(),
            ..crate::fixture::model(n_layers, 1 << 30)
        }
    }

    #[test]
    fn stage_boundaries_move_off_joined_layers_to_the_nearest_allowed_one() {
        // Gemma 4 E2B's fixture: layers 3..6 read layers 1 and 2, so no stage begins at 2..6.
        let model = joined(6, &[2, 3, 4, 5]);
        assert_eq!(keep_joined_layers(vec![3, 3], &model).unwrap(), vec![1, 5]);
        // Nothing to move: unchanged.
        assert_eq!(keep_joined_layers(vec![1, 5], &model).unwrap(), vec![1, 5]);
        assert_eq!(
            keep_joined_layers(vec![2, 2, 2], &joined(6, &[])).unwrap(),
            vec![2, 2, 2]
        );
        // The nearest allowed boundary, the lower one on a tie, one layer left per stage.
        let model = joined(8, &[3, 4, 5]);
        assert_eq!(keep_joined_layers(vec![4, 4], &model).unwrap(), vec![2, 6]);
        assert_eq!(keep_joined_layers(vec![5, 3], &model).unwrap(), vec![6, 2]);
        assert_eq!(
            keep_joined_layers(vec![3, 3, 2], &model).unwrap(),
            vec![2, 4, 2]
        );
    }

    #[test]
    fn a_ring_that_cannot_be_cut_around_joined_layers_is_refused_naming_them() {
        // Every boundary of 3 stages over 4 layers is joined but one.
        let err = keep_joined_layers(vec![2, 1, 1], &joined(4, &[2, 3])).unwrap_err();
        assert_eq!(err.code(), "uncuttable_layers");
        let text = err.to_string();
        assert!(
            text.contains("[2, 3]") && text.contains("3 pipeline stages"),
            "{text}"
        );
    }
}
