//! How many layers each rank holds, and whether it can hold them.

use crate::error::PlaceError;
use crate::model::ModelCard;
use crate::node::NodeProfile;

/// Splits `n_layers` across ranks in proportion to their free memory.
///
/// Each rank's quota is `n_layers × memory / total`; ranks get the integer part, and the
/// layers left over go one each to the largest remainders, equal remainders to the lower rank
/// (Hamilton's largest-remainder method, in exact integer arithmetic). A rank left with no
/// layer then takes one from the rank holding the most, the higher rank giving on a tie, so
/// that every rank holds at least one. When no rank has free memory the split is even.
///
/// Examples: 500/500/1000 MB and 12 layers give 3/3/6; 900/50/50 MB and 20 layers give 18/1/1.
/// Fails with `too_few_layers` when there are fewer layers than ranks.
pub fn pipeline_layer_counts(n_layers: u32, memory: &[u64]) -> Result<Vec<u32>, PlaceError> {
    let ranks = memory.len();
    if (n_layers as usize) < ranks || n_layers == 0 {
        return Err(PlaceError::TooFewLayers {
            n_layers,
            nodes: ranks,
        });
    }
    let total: u128 = memory.iter().map(|&m| u128::from(m)).sum();
    let weights: Vec<u128> = if total == 0 {
        vec![1; ranks]
    } else {
        memory.iter().map(|&m| u128::from(m)).collect()
    };
    let total: u128 = weights.iter().sum();
    let layers = u128::from(n_layers);
    let mut counts: Vec<u32> = weights
        .iter()
        .map(|&w| (layers * w / total) as u32)
        .collect();
    let assigned: u32 = counts.iter().sum();
    let mut by_remainder: Vec<usize> = (0..ranks).collect();
    by_remainder.sort_by_key(|&r| (std::cmp::Reverse(layers * weights[r] % total), r));
    for &r in by_remainder.iter().take((n_layers - assigned) as usize) {
        counts[r] += 1;
    }
    for r in 0..ranks {
        if counts[r] == 0 {
            let donor = (0..ranks)
                .max_by_key(|&d| (counts[d], d))
                .expect("at least one rank");
            counts[donor] -= 1;
            counts[r] += 1;
        }
    }
    Ok(counts)
}

/// Checks that a node can hold `parts / of` of a model of `storage_bytes`, compared exactly:
/// a pipeline rank holds `layers / n_layers`, a tensor rank `1 / ranks`.
pub(crate) fn check_share(
    node: &NodeProfile,
    storage_bytes: u64,
    parts: u64,
    of: u64,
) -> Result<(), PlaceError> {
    let of = u128::from(of.max(1));
    let need = u128::from(storage_bytes) * u128::from(parts);
    let have = u128::from(node.ram_available) * of;
    if need > have {
        return Err(PlaceError::NodeShortOfMemory {
            node: node.id.clone(),
            needed: u64::try_from(need.div_ceil(of)).unwrap_or(u64::MAX),
            available: node.ram_available,
        });
    }
    Ok(())
}

/// The layer counts a pipeline over `ring` (its nodes in rank order) gets: accelerated ranks
/// first where the ring mixes them with CPU ranks ([`crate::accel::gpu_first_counts`]) when
/// every rank can hold that split, else in proportion to free memory
/// ([`pipeline_layer_counts`]). Shares are not checked here for the memory split; the caller
/// checks them.
pub fn pipeline_split(ring: &[&NodeProfile], model: &ModelCard) -> Result<Vec<u32>, PlaceError> {
    let memory: Vec<u64> = ring.iter().map(|n| n.ram_available).collect();
    let by_memory = pipeline_layer_counts(model.n_layers, &memory)?;
    let fast: Vec<bool> = ring
        .iter()
        .map(|n| crate::accel::is_accelerated(n, model))
        .collect();
    let gpu_first =
        crate::accel::gpu_first_counts(model.n_layers, model.storage_bytes, &memory, &fast).filter(
            |counts| {
                ring.iter().zip(counts).all(|(node, &c)| {
                    check_share(
                        node,
                        model.storage_bytes,
                        u64::from(c),
                        u64::from(model.n_layers),
                    )
                    .is_ok()
                })
            },
        );
    Ok(gpu_first.unwrap_or(by_memory))
}
