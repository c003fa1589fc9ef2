//! How many layers each rank holds, and whether it can hold them.

use crate::error::PlaceError;
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

/// Splits layers of unequal `weights` across ranks by `memory`: rank r's layers end where the
/// running weight comes nearest to r's running share of the memory (the earlier boundary on a
/// tie), each rank keeping at least one layer. When no rank has free memory the weight is split
/// evenly. With equal weights [`pipeline_layer_counts`] decides instead.
///
/// Example: DeepSeek V3's shape, 3 dense layers of weight 1 then 58 of weight 20, on two
/// equal nodes gives 32/29 (weights 583/580); by layer count it would be 31/30 (563/600).
pub fn weighted_layer_counts(weights: &[u64], memory: &[u64]) -> Result<Vec<u32>, PlaceError> {
    let (n, ranks) = (weights.len(), memory.len());
    if n < ranks || n == 0 {
        return Err(PlaceError::TooFewLayers {
            n_layers: u32::try_from(n).unwrap_or(u32::MAX),
            nodes: ranks,
        });
    }
    let mut running = vec![0u128; n + 1];
    for (i, &w) in weights.iter().enumerate() {
        running[i + 1] = running[i] + u128::from(w);
    }
    let total_weight = running[n];
    let shares: Vec<u128> = if memory.iter().all(|&m| m == 0) {
        vec![1; ranks]
    } else {
        memory.iter().map(|&m| u128::from(m)).collect()
    };
    let total_share: u128 = shares.iter().sum();
    let mut bounds = vec![0usize];
    let mut share_so_far = 0u128;
    for r in 0..ranks - 1 {
        share_so_far += shares[r];
        let target = total_weight * share_so_far;
        let (lo, hi) = (bounds[r] + 1, n - (ranks - 1 - r));
        let end = (lo..=hi)
            .min_by_key(|&k| ((running[k] * total_share).abs_diff(target), k))
            .expect("lo <= hi: at least one layer per rank is left");
        bounds.push(end);
    }
    bounds.push(n);
    Ok(bounds
        .windows(2)
        .map(|b| u32::try_from(b[1] - b[0]).unwrap_or(u32::MAX))
        .collect())
}

/// Checks that a node can hold `parts / of` of a model of `storage_bytes` and `extra` bytes
/// more (rank 0's vision tower, [`crate::model::ModelCard::rank0_bytes`]), compared exactly: a
/// pipeline rank holds its layers' weight of the whole
/// ([`crate::model::ModelCard::layer_weight`]), a tensor rank `1 / ranks`.
pub(crate) fn check_share(
    node: &NodeProfile,
    storage_bytes: u64,
    parts: u128,
    of: u128,
    extra: u64,
) -> Result<(), PlaceError> {
    let of = of.max(1);
    let need = u128::from(storage_bytes) * parts + u128::from(extra) * of;
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
