//! Memory that live instances already hold, or will hold once their runners load, on each
//! node, taken off what a new placement may use.
//!
//! A node's profile reports the memory free now; a runner placed a moment ago has not loaded
//! yet, so without this a node would accept instance after instance (about 200 of the SmolLM2
//! fixture on a 24 GB machine) and run out of memory once they load. Each live instance holds,
//! on each of its nodes, its card's memory need (which counts the weights as they run, the KV
//! budget and a runner's overhead) times that rank's share: `layers / n_layers` for a
//! pipeline rank, `1 / ranks` for a tensor rank; rank 0 holds the vision tower besides
//! (`rank0_bytes`). A new placement then sees
//! `min(ram_available − pending, ram_total − held)`: `pending` is what runners that have not
//! loaded yet will take (loaded ones are already gone from `ram_available`), `held` is every
//! instance's share, so neither is counted twice and the sum never exceeds the machine.

use crate::view::InstanceView;
use placement::{NodeProfile, Sharding};
use std::collections::BTreeMap;

/// What the live instances hold on one node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Held {
    /// Every instance's share.
    pub all: u64,
    /// The shares of ranks whose runner has not loaded yet.
    pub pending: u64,
}

/// What each node holds for the live instances in `instances`, by node id; `loaded(view,
/// rank)` says whether that rank's runner holds its model already.
pub fn committed_memory<'a>(
    instances: impl IntoIterator<Item = &'a InstanceView>,
    loaded: impl Fn(&InstanceView, usize) -> bool,
) -> BTreeMap<String, Held> {
    let mut committed: BTreeMap<String, Held> = BTreeMap::new();
    for view in instances {
        let Ok(placement) = &view.placement else {
            continue;
        };
        let model = &view.record.intent.input.model;
        let ranks = placement.ranks.len().max(1) as u128;
        for (i, rank) in placement.ranks.iter().enumerate() {
            let share = if placement.sharding == Sharding::Tensor && ranks > 1 {
                u64::try_from(u128::from(model.storage_bytes).div_ceil(ranks)).unwrap_or(u64::MAX)
            } else {
                model.bytes_of_layers(rank.start_layer, rank.end_layer)
            }
            .saturating_add(model.extra_on_rank(i));
            let entry = committed.entry(rank.node.clone()).or_default();
            entry.all = entry.all.saturating_add(share);
            if !loaded(view, i) {
                entry.pending = entry.pending.saturating_add(share);
            }
        }
    }
    committed
}

/// Takes `committed` off each node's `ram_available` (see the module docs). A node that does
/// not report its total memory (`ram_total` 0) keeps what it reports free.
pub fn without_committed(nodes: &mut [NodeProfile], committed: &BTreeMap<String, Held>) {
    for node in nodes {
        let Some(held) = committed.get(&node.id) else {
            continue;
        };
        let mut free = node.ram_available.saturating_sub(held.pending);
        if node.ram_total > 0 {
            free = free.min(node.ram_total.saturating_sub(held.all));
        }
        node.ram_available = free;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixture::cluster_input;
    use crate::intent::{InstanceRecord, Intent};

    /// Places instances of a 1.1 GB model one after another on one node with 4 GB free (8 GB
    /// in all), each placed on the node's profile minus what the earlier ones hold, until
    /// placement refuses. Returns how many it accepted.
    fn accepted(storage_bytes: u64, account: bool) -> usize {
        let mut live: Vec<InstanceView> = Vec::new();
        for n in 0..500 {
            let mut input = cluster_input(1, 4 << 30, 1, &format!("i{n}"));
            input.model.storage_bytes = storage_bytes;
            if account {
                without_committed(&mut input.nodes, &committed_memory(&live, |_, _| false));
            }
            let record = InstanceRecord::new(Intent {
                instance_id: format!("i{n}"),
                model: "default".into(),
                model_id: "default".into(),
                created_by: "a".into(),
                input,
            });
            let placement = record.place();
            if placement.is_err() {
                return n;
            }
            live.push(InstanceView { record, placement });
        }
        live.len()
    }

    #[test]
    fn a_node_accepts_only_the_instances_it_can_hold() {
        // The fixture as a runner holds it: 538 MB of f32 weights, 377 MB of KV budget,
        // 160 MB of overhead.
        let need = 538_060_032 + 8192 * 46_080 + (160 << 20);
        // Before: every placement saw the same free memory and took them all.
        assert_eq!(accepted(need, false), 500);
        // Now: 4 GB hold three of them, and the fourth is refused.
        assert_eq!(accepted(need, true), ((4u64 << 30) / need) as usize);
        assert_eq!(accepted(need, true), 3);
    }

    #[test]
    fn shares_follow_the_layers_a_rank_holds_or_the_tensor_split() {
        let mut input = cluster_input(2, 4 << 30, 2, "p");
        input.model.storage_bytes = 3_000;
        input.model.n_layers = 30;
        let record = InstanceRecord::new(Intent {
            instance_id: "p".into(),
            model: "default".into(),
            model_id: "default".into(),
            created_by: "a".into(),
            input: input.clone(),
        });
        let view = InstanceView {
            placement: record.place(),
            record,
        };
        let held = committed_memory([&view], |_, rank| rank == 0);
        assert_eq!(held.values().map(|h| h.all).sum::<u64>(), 3_000);
        let mut nodes = input.nodes.clone();
        without_committed(&mut nodes, &held);
        for n in &nodes {
            let h = held[&n.id];
            assert_eq!(
                n.ram_available,
                ((4 << 30) - h.pending).min((8 << 30) - h.all)
            );
        }
        // Rank 0's runner has loaded (its memory is gone from what the node reports free).
        let rank0 = &view.placement.as_ref().unwrap().ranks[0].node;
        assert_eq!(held[rank0].pending, 0);
        let mut tensor = input;
        tensor.request.sharding = Sharding::Tensor;
        // Two ranks must divide the key/value heads.
        tensor.model.num_key_value_heads = 4;
        let record = InstanceRecord::new(Intent {
            instance_id: "t".into(),
            model: "default".into(),
            model_id: "default".into(),
            created_by: "a".into(),
            input: tensor,
        });
        let view = InstanceView {
            placement: record.place(),
            record,
        };
        assert!(view.placement.is_ok(), "{:?}", view.placement);
        let held = committed_memory([&view], |_, _| false);
        let shares: Vec<u64> = held.values().map(|h| h.pending).collect();
        assert_eq!(shares, vec![1_500, 1_500]);
    }

    /// A vision tower (`rank0_bytes`) is held whole by rank 0's node, in a pipeline and in a
    /// tensor ring, on top of its share; the other rank holds none of it.
    #[test]
    fn rank_0_holds_the_tower_besides_its_share() {
        for sharding in [Sharding::Pipeline, Sharding::Tensor] {
            let mut input = cluster_input(2, 4 << 30, 2, "v");
            input.request.sharding = sharding;
            input.model.storage_bytes = 3_000;
            input.model.n_layers = 30;
            input.model.num_key_value_heads = 4;
            input.model.rank0_bytes = 700;
            let record = InstanceRecord::new(Intent {
                instance_id: "v".into(),
                model: "default".into(),
                model_id: "default".into(),
                created_by: "a".into(),
                input,
            });
            let view = InstanceView {
                placement: record.place(),
                record,
            };
            let placement = view.placement.as_ref().expect("placed").clone();
            let held = committed_memory([&view], |_, _| false);
            let share = |i: usize| {
                let r = &placement.ranks[i];
                if sharding == Sharding::Tensor {
                    1_500
                } else {
                    100 * u64::from(r.end_layer - r.start_layer)
                }
            };
            let rank0 = &placement.ranks[0].node;
            let rank1 = &placement.ranks[1].node;
            assert_eq!(held[rank0].all, share(0) + 700, "{sharding:?}");
            assert_eq!(held[rank1].all, share(1), "{sharding:?}");
            assert_eq!(held.values().map(|h| h.all).sum::<u64>(), 3_700);
        }
    }
}
