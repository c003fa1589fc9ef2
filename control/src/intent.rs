//! Instances as intents in the replicated state: the records nodes write, and the pure rules
//! every node applies to them so that all nodes agree on each instance's placement.
//!
//! # Records (each under its author's id; a node writes only its own)
//! - `instance/<id>` → [`InstanceRecord`]: the intent (the request plus the placement
//!   [`Input`] it was computed from), its epoch and the nodes excluded since. The node that
//!   creates an instance writes epoch 0; a node that re-places it writes its own copy with a
//!   higher epoch; every node holding a rank keeps its own copy of the effective record, so
//!   the instance outlives its creator. Every node takes the same copy as authoritative
//!   ([`effective`]).
//! - `deleted/<id>` → [`DeletedRecord`]: the instance was deleted, by whichever node wrote it.
//!   Every node honours a deletion by any author. The author keeps it while copies exist and
//!   then among its newest [`KEEP_DELETIONS`].
//! - `runner/<id>` → [`RunnerRecord`]: the writer's runner for its rank of the instance.
//!
//! # Re-placement
//! When a node holding a rank of the effective placement is found dead (mesh liveness), every
//! live node that sees it writes `instance/<id>` with `epoch + 1` and the dead ranks added to
//! `excluded` ([`InstanceRecord::replaced`]). The new placement is computed from the intent's
//! own input minus the excluded nodes ([`InstanceRecord::placement_input`]), so every node
//! computes the same one whatever it believes about memory now; its ring port comes from
//! `<id>#<epoch>`, so it differs from the old ring's port and stale TCP listeners do not
//! collide. The copies keep the instance alive when its creator is the node that died.

use placement::{Input, PlaceError, Placement, RunnerStatus};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// Key prefix of instance intents.
pub const INSTANCE_PREFIX: &str = "instance/";
/// Key prefix of deletions.
pub const DELETED_PREFIX: &str = "deleted/";
/// Key prefix of runner status records.
pub const RUNNER_PREFIX: &str = "runner/";

/// What a user asked for, and the snapshot of the cluster it was placed on.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Intent {
    /// The instance id (also the placement request's `instance_id` at epoch 0).
    pub instance_id: String,
    /// How every node finds the model file: `default` (each node's own fixture path) or a
    /// path that must be the same on every node.
    pub model: String,
    /// The model's display id (what `/v1/models` lists and chat requests name).
    pub model_id: String,
    /// The node that created the intent.
    pub created_by: String,
    /// The placement input at creation: live nodes, verified edges, model card, request.
    pub input: Input,
}

/// The `instance/<id>` record.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct InstanceRecord {
    /// The intent, identical in every copy.
    pub intent: Intent,
    /// 0 at creation; each re-placement adds one.
    pub epoch: u32,
    /// Nodes left out by re-placements (they died), sorted.
    pub excluded: Vec<String>,
}

/// The `deleted/<id>` record.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct DeletedRecord {
    /// The deleted instance.
    pub instance_id: String,
    /// The author's count of deletions when it wrote this one (1 for its first): its newest
    /// [`KEEP_DELETIONS`] are kept once no copy of their instance is left (0 in records from
    /// before the count: the oldest).
    #[serde(default)]
    pub seq: u64,
}

/// Deletion records an author keeps after the last copy of their instances is gone.
///
/// Removing a deletion as soon as its author sees no copy let a deleted instance come back:
/// another node could hear of the deletion's removal before a third node's removal of its
/// copy, take that stale copy for a live instance and, holding a rank of it, write its own
/// copy again (seen in `tests/moe_cluster.rs`: all three runners created again 0.5 s after the
/// deletion). Instance ids are never reused, so a kept deletion costs only its bytes (~100):
/// kept this long, every copy is long gone everywhere, and the state stays bounded.
pub const KEEP_DELETIONS: usize = 256;

/// The `runner/<id>` record: the author's runner for its rank of instance `<id>`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct RunnerRecord {
    /// The instance epoch the runner belongs to (records of other epochs are stale).
    pub epoch: u32,
    /// The author's rank.
    pub rank: usize,
    /// The runner's status.
    pub status: RunnerStatus,
    /// Requests queued or running on it (only rank 0 receives requests).
    pub queued: usize,
    /// Whether the model file is on the author's disk.
    pub model_ready: bool,
    /// The runner failed by its step deadline (a rank of its ring hung): the instance is
    /// placed again, as one with a dead node is. Left out of the record when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hung: bool,
}

impl InstanceRecord {
    /// A new intent at epoch 0.
    pub fn new(intent: Intent) -> InstanceRecord {
        InstanceRecord {
            intent,
            epoch: 0,
            excluded: Vec::new(),
        }
    }

    /// The instance id.
    pub fn id(&self) -> &str {
        &self.intent.instance_id
    }

    /// The key of this record: `instance/<id>`.
    pub fn key(&self) -> String {
        format!("{INSTANCE_PREFIX}{}", self.id())
    }

    /// The placement request's instance id at this epoch: the ring port derives from it.
    pub fn ring_id(&self) -> String {
        if self.epoch == 0 {
            self.intent.instance_id.clone()
        } else {
            format!("{}#{}", self.intent.instance_id, self.epoch)
        }
    }

    /// The input this epoch is placed on: the intent's, without the excluded nodes (their
    /// edges are dropped by placement), with `required_nodes` minus them and `min_nodes` at
    /// most the nodes that remain (a 3-node instance that loses a node may run on 2).
    pub fn placement_input(&self) -> Input {
        let mut input = self.intent.input.clone();
        input.request.instance_id = self.ring_id();
        if self.epoch == 0 && self.excluded.is_empty() {
            return input;
        }
        let excluded: BTreeSet<&str> = self.excluded.iter().map(String::as_str).collect();
        input.nodes.retain(|n| !excluded.contains(n.id.as_str()));
        input
            .edges
            .retain(|e| !excluded.contains(e.from.as_str()) && !excluded.contains(e.to.as_str()));
        input
            .request
            .required_nodes
            .retain(|n| !excluded.contains(n.as_str()));
        let remaining = u32::try_from(input.nodes.len()).unwrap_or(u32::MAX).max(1);
        input.request.min_nodes = input.request.min_nodes.clamp(1, remaining);
        input
    }

    /// The placement every node computes for this epoch. Computed afresh on every call: the
    /// node asks a [`crate::PlacementCache`] instead, which calls this once per record.
    pub fn place(&self) -> Result<Placement, PlaceError> {
        placement::place(&self.placement_input())
    }

    /// The next epoch, without `dead` (sorted, deduplicated).
    pub fn replaced(&self, dead: &BTreeSet<String>) -> InstanceRecord {
        let mut excluded: BTreeSet<String> = self.excluded.iter().cloned().collect();
        excluded.extend(dead.iter().cloned());
        InstanceRecord {
            intent: self.intent.clone(),
            epoch: self.epoch + 1,
            excluded: excluded.into_iter().collect(),
        }
    }

    /// Whether this copy descends from `other`: a later epoch that leaves out at least every
    /// node `other` left out (a re-placement only ever adds exclusions). A copy another one
    /// descends from is history, whoever still holds it.
    pub fn supersedes(&self, other: &InstanceRecord) -> bool {
        self.epoch > other.epoch && other.excluded.iter().all(|n| self.excluded.contains(n))
    }

    /// The order among copies none of which descends from another: *fewer* exclusions, then
    /// the higher epoch, then the exclusions' ids. A total order, so every node picks the
    /// same copy.
    ///
    /// Such copies come from nodes that saw different nodes die: sides of a partition, each
    /// excluding the other. When the partition heals, the copy that kept the most nodes
    /// stands (the larger side's ring keeps serving and the smaller side's runners stop): the
    /// larger side is the one a model too big for one machine can still fit on. However many
    /// epochs either side went through (a side that sees its peers die one at a time writes
    /// one epoch per death), only what it kept counts. Where two observers of one failure saw
    /// different parts of it (one saw `b` die, the other `b` and `c`), the smaller exclusion
    /// wins this epoch and the next re-placement excludes the rest, one epoch later.
    fn rank_key(&self) -> (std::cmp::Reverse<usize>, u32, &[String]) {
        (
            std::cmp::Reverse(self.excluded.len()),
            self.epoch,
            &self.excluded,
        )
    }
}

/// The authoritative copy among every author's `instance/<id>` records for one id: of the
/// copies no other copy supersedes ([`InstanceRecord::supersedes`]), the highest by (fewest
/// exclusions, epoch, exclusions). `None` for no copies.
pub fn effective<'a>(
    copies: impl IntoIterator<Item = &'a InstanceRecord>,
) -> Option<&'a InstanceRecord> {
    let copies: Vec<&InstanceRecord> = copies.into_iter().collect();
    copies
        .iter()
        .copied()
        .filter(|c| !copies.iter().any(|d| d.supersedes(c)))
        .max_by(|a, b| a.rank_key().cmp(&b.rank_key()))
}

/// A path-friendly form of a model id for instance ids.
pub fn instance_slug(model_id: &str) -> String {
    model_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixture::record;

    #[test]
    fn every_node_computes_the_same_placement_from_the_intent() {
        let r = record(3, 400_000_000, 3);
        let json = serde_json::to_string(&r).unwrap();
        // Another node decodes the record and places it: same bytes out.
        let theirs: InstanceRecord = serde_json::from_str(&json).unwrap();
        let mine = r.place().unwrap();
        assert_eq!(
            serde_json::to_string(&theirs.place().unwrap()).unwrap(),
            serde_json::to_string(&mine).unwrap()
        );
        assert_eq!(mine.ranks.len(), 3);
        assert_eq!(mine.port, placement::views::ring_port("default-1"));
        // The order of nodes and edges in the input does not matter.
        let mut shuffled = r.clone();
        shuffled.intent.input.nodes.reverse();
        shuffled.intent.input.edges.reverse();
        assert_eq!(shuffled.place().unwrap(), mine);
    }

    #[test]
    fn replacement_leaves_out_dead_nodes_and_takes_a_new_port() {
        let r = record(3, 700_000_000, 3);
        let before = r.place().unwrap();
        assert_eq!(before.ranks.len(), 3);
        let dead: BTreeSet<String> = [before.ranks[1].node.clone()].into();
        let next = r.replaced(&dead);
        assert_eq!(next.epoch, 1);
        assert_eq!(next.excluded, vec![before.ranks[1].node.clone()]);
        let input = next.placement_input();
        assert_eq!(input.nodes.len(), 2);
        assert!(input.nodes.iter().all(|n| !dead.contains(&n.id)));
        assert!(input
            .edges
            .iter()
            .all(|e| !dead.contains(&e.from) && !dead.contains(&e.to)));
        assert_eq!(
            input.request.min_nodes, 2,
            "min_nodes shrinks to the survivors"
        );
        let after = next.place().unwrap();
        assert_eq!(after.ranks.len(), 2);
        assert!(after.ranks.iter().all(|rank| !dead.contains(&rank.node)));
        assert_ne!(after.port, before.port, "a new ring gets a new port");
        // Losing a second node at epoch 1: the exclusions accumulate.
        let dead2: BTreeSet<String> = [after.ranks[0].node.clone()].into();
        let last = next.replaced(&dead2);
        assert_eq!(last.epoch, 2);
        assert_eq!(last.excluded.len(), 2);
        // 1 GB on one 700 MB node cannot be held: the error says so.
        assert!(last.place().is_err(), "one 700 MB node cannot hold 1 GB");
    }

    #[test]
    fn the_highest_copy_wins_whatever_the_order() {
        let r0 = record(3, 700_000_000, 1);
        let r1a = r0.replaced(&["b".to_string()].into());
        let r1b = r0.replaced(&["b".to_string(), "c".to_string()].into());
        let r1c = r0.replaced(&["c".to_string()].into());
        let copies = [r0.clone(), r1a.clone(), r1b.clone(), r1c.clone()];
        // One epoch: fewest exclusions, then the exclusions' ids.
        assert_eq!(effective(&copies), Some(&r1c));
        let mut reversed = copies.clone();
        reversed.reverse();
        assert_eq!(effective(&reversed), Some(&r1c));
        assert_eq!(effective(&[r1a.clone(), r1b.clone()]), Some(&r1a));
        // A higher epoch wins whatever it excludes.
        let r2 = r1b.replaced(&["d".to_string()].into());
        assert_eq!(
            effective(&[r1a.clone(), r2.clone(), r1c.clone()]),
            Some(&r2)
        );
        assert_eq!(effective(&Vec::<InstanceRecord>::new()), None);
    }

    #[test]
    fn instance_ids_are_path_friendly() {
        assert_eq!(instance_slug("Foo/Bar 7B.Q4"), "foo-bar-7b.q4");
    }
}
