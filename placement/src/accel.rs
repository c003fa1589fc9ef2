//! Accelerated nodes first: where a cluster mixes GPU nodes (MLX on CUDA or Metal) with nodes
//! that only compute on the CPU, a model goes on the GPU nodes alone when they can run it, and a
//! ring that has to mix them gives the GPU nodes as many layers as they hold.
//!
//! Why: a CPU rank decodes several times slower than a GPU rank, and a pipeline runs at the
//! pace of its slowest stage, so handing a CPU node layers that GPU nodes could hold makes the
//! whole instance slower. exo does not tell the two apart; here the rule changes nothing on a
//! cluster whose nodes are all of one kind (every Mac cluster, every CPU cluster), so placement
//! still agrees with exo's there.
//!
//! Both rules are pure functions of the [`Input`], so every node decides the same.

use crate::input::Input;
use crate::model::ModelCard;
use crate::node::{ComputeBackend, NodeProfile};

/// Whether `node` can run `model` on a GPU: it offers a GPU backend the model runs on.
pub fn is_accelerated(node: &NodeProfile, model: &ModelCard) -> bool {
    node.backends.iter().any(|b| {
        matches!(b, ComputeBackend::MlxCuda | ComputeBackend::MlxMetal)
            && model.backends.contains(b)
    })
}

/// The inputs [`crate::place()`] tries, in order, before the input itself, when the cluster
/// mixes accelerated and other nodes (none otherwise, since then there is nothing to prefer):
/// the accelerated nodes alone (with the edges between them), then the whole cluster with every
/// accelerated node required in the ring (so what the GPUs cannot hold is all that goes to CPU
/// nodes). The first that places wins.
pub fn gpu_first_attempts(input: &Input) -> Vec<Input> {
    let fast: Vec<&NodeProfile> = input
        .nodes
        .iter()
        .filter(|n| is_accelerated(n, &input.model))
        .collect();
    if fast.is_empty() || fast.len() == input.nodes.len() {
        return Vec::new();
    }
    let kept = |id: &str| fast.iter().any(|n| n.id == id);
    let alone = Input {
        nodes: fast.iter().map(|n| (*n).clone()).collect(),
        edges: input
            .edges
            .iter()
            .filter(|e| kept(&e.from) && kept(&e.to))
            .cloned()
            .collect(),
        model: input.model.clone(),
        request: input.request.clone(),
    };
    let mut with_all = input.clone();
    for node in &fast {
        if !with_all.request.required_nodes.contains(&node.id) {
            with_all.request.required_nodes.push(node.id.clone());
        }
    }
    with_all.request.required_nodes.sort();
    vec![alone, with_all]
}

/// A pipeline split of `n_layers` that fills the accelerated ranks first: they hold together as
/// many layers as their memory takes (each split among them in proportion to memory), leaving
/// one layer at least to every other rank, and the other ranks share the rest in proportion to
/// their memory. `None` when the ring is not mixed, or the accelerated ranks cannot take one
/// layer each; the caller then splits by memory alone. The caller still checks every share.
pub fn gpu_first_counts(
    n_layers: u32,
    storage_bytes: u64,
    memory: &[u64],
    fast: &[bool],
) -> Option<Vec<u32>> {
    let fast_ranks: Vec<usize> = (0..memory.len()).filter(|&r| fast[r]).collect();
    let slow_ranks: Vec<usize> = (0..memory.len()).filter(|&r| !fast[r]).collect();
    if fast_ranks.is_empty() || slow_ranks.is_empty() {
        return None;
    }
    let layers_held = |m: u64| -> u64 {
        if storage_bytes == 0 {
            return u64::from(n_layers);
        }
        let held = u128::from(m) * u128::from(n_layers) / u128::from(storage_bytes);
        u64::try_from(held.min(u128::from(n_layers))).unwrap_or(u64::from(n_layers))
    };
    let fast_capacity: u64 = fast_ranks.iter().map(|&r| layers_held(memory[r])).sum();
    let left_for_slow = slow_ranks.len() as u64;
    let fast_total = fast_capacity.min(u64::from(n_layers).checked_sub(left_for_slow)?);
    let fast_total = u32::try_from(fast_total).ok()?;
    if (fast_total as usize) < fast_ranks.len() {
        return None;
    }
    let fast_memory: Vec<u64> = fast_ranks.iter().map(|&r| memory[r]).collect();
    let slow_memory: Vec<u64> = slow_ranks.iter().map(|&r| memory[r]).collect();
    let fast_counts = crate::split::pipeline_layer_counts(fast_total, &fast_memory).ok()?;
    let slow_counts =
        crate::split::pipeline_layer_counts(n_layers - fast_total, &slow_memory).ok()?;
    let mut counts = vec![0; memory.len()];
    for (&r, c) in fast_ranks.iter().zip(fast_counts) {
        counts[r] = c;
    }
    for (&r, c) in slow_ranks.iter().zip(slow_counts) {
        counts[r] = c;
    }
    Some(counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mixed_ring_fills_the_gpu_ranks_first() {
        // 32 layers of 32 GB: the GPU rank holds 24 GB (24 layers), the CPU rank 64 GB. By memory
        // alone the CPU rank would take 23 of them.
        let gb = 1_000_000_000;
        let counts = gpu_first_counts(32, 32 * gb, &[24 * gb, 64 * gb], &[true, false]);
        assert_eq!(counts, Some(vec![24, 8]));
        // Two GPU ranks split what they take by memory; the CPU rank keeps at least one layer.
        let counts = gpu_first_counts(
            10,
            10 * gb,
            &[8 * gb, 8 * gb, 64 * gb],
            &[true, true, false],
        );
        assert_eq!(counts, Some(vec![5, 4, 1]));
    }

    #[test]
    fn rings_of_one_kind_are_left_to_the_memory_split() {
        assert_eq!(gpu_first_counts(8, 8, &[4, 4], &[true, true]), None);
        assert_eq!(gpu_first_counts(8, 8, &[4, 4], &[false, false]), None);
        // No room for a layer on every GPU rank.
        assert_eq!(
            gpu_first_counts(2, 100, &[1, 1, 100], &[true, true, false]),
            None
        );
    }
}
