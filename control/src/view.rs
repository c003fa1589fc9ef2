//! One live instance as every node computes it from a [`Snapshot`]: its effective record,
//! its placement, the runners of its ranks, and the start-up plan of one rank.

use crate::cache::PlacementCache;
use crate::intent::{effective, InstanceRecord, RunnerRecord};
use crate::snapshot::Snapshot;
use placement::{InstanceStatus, PlaceError, Placement, PlanInput, RankView, RunnerStatus};
use std::collections::{BTreeMap, BTreeSet};

impl Snapshot {
    /// The live instances (not deleted), each at its effective epoch, with its placement
    /// taken from `placements` (computed there once per record).
    pub fn instances(&self, placements: &PlacementCache) -> BTreeMap<String, InstanceView> {
        let deleted = self.deleted();
        self.instance_copies()
            .into_iter()
            .filter(|(id, _)| !deleted.contains(id))
            .filter_map(|(id, copies)| {
                let record = effective(&copies)?.clone();
                let placement = placements.place(&record);
                Some((id, InstanceView { record, placement }))
            })
            .collect()
    }
}

/// One live instance as every node computes it.
#[derive(Debug, Clone)]
pub struct InstanceView {
    /// The effective record.
    pub record: InstanceRecord,
    /// Its placement at this epoch, or why it cannot be placed.
    pub placement: Result<Placement, PlaceError>,
}

impl InstanceView {
    /// This node's rank, if it has one.
    pub fn rank_of(&self, node: &str) -> Option<usize> {
        self.placement
            .as_ref()
            .ok()?
            .ranks
            .iter()
            .position(|r| r.node == node)
    }

    /// The rank nodes that are dead.
    pub fn dead_ranks(&self, snapshot: &Snapshot) -> BTreeSet<String> {
        let Ok(placement) = &self.placement else {
            return BTreeSet::new();
        };
        placement
            .ranks
            .iter()
            .filter(|r| snapshot.is_dead(&r.node))
            .map(|r| r.node.clone())
            .collect()
    }

    /// The nodes of the intent's input that are dead and not yet excluded, ranks or not: a
    /// re-placement leaves them all out. Left out only as ranks die, a cut-off side would go
    /// through one epoch per node it places on and cannot reach, and the higher epoch would
    /// win when the partition heals; left out at once, both sides write one epoch and the
    /// side that kept more nodes wins (see `intent`'s order of copies).
    pub fn dead_inputs(&self, snapshot: &Snapshot) -> BTreeSet<String> {
        self.record
            .intent
            .input
            .nodes
            .iter()
            .filter(|n| snapshot.is_dead(&n.id) && !self.record.excluded.contains(&n.id))
            .map(|n| n.id.clone())
            .collect()
    }

    /// Every rank's runner status as the state shows it: a dead node's runner is failed, a
    /// record of another epoch does not count. `mine` is this node's own runner, which it
    /// knows better than its published record.
    pub fn rank_statuses(
        &self,
        snapshot: &Snapshot,
        mine: Option<&RunnerStatus>,
    ) -> Vec<(String, Option<RunnerRecord>)> {
        let Ok(placement) = &self.placement else {
            return Vec::new();
        };
        placement
            .ranks
            .iter()
            .enumerate()
            .map(|(rank, r)| {
                let record = if r.node == snapshot.me {
                    mine.map(|status| RunnerRecord {
                        epoch: self.record.epoch,
                        rank,
                        status: status.clone(),
                        queued: 0,
                        model_ready: true,
                        hung: false,
                    })
                } else if snapshot.is_dead(&r.node) {
                    Some(RunnerRecord {
                        epoch: self.record.epoch,
                        rank,
                        status: RunnerStatus::Failed {
                            reason: format!("node {} died", short(&r.node)),
                        },
                        queued: 0,
                        model_ready: false,
                        hung: false,
                    })
                } else {
                    snapshot
                        .runner(&r.node, self.record.id())
                        .filter(|rec| rec.epoch == self.record.epoch && rec.rank == rank)
                };
                (r.node.clone(), record)
            })
            .collect()
    }

    /// What `next_action` needs for this node's rank `my_rank`.
    pub fn plan_input(
        &self,
        snapshot: &Snapshot,
        my_rank: usize,
        mine: Option<&RunnerStatus>,
        my_model_ready: bool,
    ) -> PlanInput {
        let ranks = self
            .rank_statuses(snapshot, mine)
            .into_iter()
            .enumerate()
            .map(|(rank, (node, record))| RankView {
                node,
                model_ready: if rank == my_rank {
                    my_model_ready
                } else {
                    record.as_ref().is_some_and(|r| r.model_ready)
                },
                runner: record.map(|r| r.status),
            })
            .collect();
        PlanInput {
            instance_live: self.placement.is_ok(),
            my_rank,
            ranks,
        }
    }

    /// Whether every rank is ready for requests.
    pub fn is_ready(&self, snapshot: &Snapshot, mine: Option<&RunnerStatus>) -> bool {
        let statuses = self.rank_statuses(snapshot, mine);
        !statuses.is_empty()
            && statuses
                .iter()
                .all(|(_, r)| r.as_ref().is_some_and(|r| r.status.is_serving()))
    }

    /// Where the instance stands as a whole: ready when every rank serves, unplaceable
    /// without a placement, failed when a rank failed (or its node died), else starting.
    pub fn status(&self, snapshot: &Snapshot, mine: Option<&RunnerStatus>) -> InstanceStatus {
        if self.is_ready(snapshot, mine) {
            InstanceStatus::Ready
        } else if self.placement.is_err() {
            InstanceStatus::Unplaceable
        } else if self.failure(snapshot, mine).is_some() {
            InstanceStatus::Failed
        } else {
            InstanceStatus::Starting
        }
    }

    /// The first failure among the ranks, as "rank R on node N: reason".
    pub fn failure(&self, snapshot: &Snapshot, mine: Option<&RunnerStatus>) -> Option<String> {
        if let Err(e) = &self.placement {
            return Some(format!("cannot be placed: {e}"));
        }
        self.rank_statuses(snapshot, mine)
            .into_iter()
            .enumerate()
            .find_map(|(rank, (node, r))| match r.map(|r| r.status) {
                Some(RunnerStatus::Failed { reason }) => {
                    Some(format!("rank {rank} on node {}: {reason}", short(&node)))
                }
                _ => None,
            })
    }
}

/// The first 10 characters of a node id, for messages.
pub fn short(node: &str) -> &str {
    node.get(..10).unwrap_or(node)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixture::{author, json, record};
    use crate::intent::{DeletedRecord, DELETED_PREFIX, INSTANCE_PREFIX, RUNNER_PREFIX};
    use placement::{next_action, Action, ShutdownReason};

    fn runner(epoch: u32, rank: usize, status: RunnerStatus) -> String {
        json(&RunnerRecord {
            epoch,
            rank,
            status,
            queued: 0,
            model_ready: true,
            hung: false,
        })
    }

    #[test]
    fn plans_follow_the_state_dead_nodes_fail_and_other_epochs_do_not_count() {
        let r = record(3, 400_000_000, 3);
        let key = format!("{INSTANCE_PREFIX}{}", r.id());
        let rkey = format!("{RUNNER_PREFIX}{}", r.id());
        let placement = r.place().unwrap();
        let names: Vec<String> = placement.ranks.iter().map(|r| r.node.clone()).collect();
        let mut snap = Snapshot {
            settling: false,
            me: names[2].clone(),
            authors: [
                (
                    names[0].clone(),
                    author(
                        true,
                        &[
                            (key.clone(), json(&r)),
                            (rkey.clone(), runner(0, 0, RunnerStatus::Connecting)),
                        ],
                    ),
                ),
                (
                    names[1].clone(),
                    // A stale record of an older epoch is no runner at all.
                    author(true, &[(rkey.clone(), runner(7, 1, RunnerStatus::Ready))]),
                ),
                (names[2].clone(), author(true, &[])),
            ]
            .into(),
        };
        let view = snap
            .instances(&PlacementCache::default())
            .remove(r.id())
            .unwrap();
        assert_eq!(view.rank_of(&names[2]), Some(2));
        let plan = view.plan_input(&snap, 2, None, true);
        assert_eq!(plan.ranks[1].runner, None);
        assert_eq!(next_action(&plan), Action::CreateRunner);
        // The last rank connects only when every other rank is connecting.
        let idle = RunnerStatus::Idle;
        assert_eq!(
            next_action(&view.plan_input(&snap, 2, Some(&idle), true)),
            Action::Wait
        );
        snap.authors
            .get_mut(&names[1])
            .unwrap()
            .records
            .insert(rkey.clone(), runner(0, 1, RunnerStatus::Connecting));
        assert_eq!(
            next_action(&view.plan_input(&snap, 2, Some(&idle), true)),
            Action::Connect
        );
        assert!(!view.is_ready(&snap, Some(&idle)));
        // Rank 1's node dies: its runner counts as failed, and this rank shuts down.
        snap.authors.get_mut(&names[1]).unwrap().dead = true;
        snap.authors.get_mut(&names[1]).unwrap().alive = false;
        assert_eq!(
            next_action(&view.plan_input(&snap, 2, Some(&idle), true)),
            Action::ShutDown(ShutdownReason::SiblingFailed { rank: 1 })
        );
        assert_eq!(view.dead_ranks(&snap), [names[1].clone()].into());
        assert!(view.failure(&snap, Some(&idle)).unwrap().contains("died"));
    }

    #[test]
    fn a_deletion_by_another_node_removes_the_instance_everywhere() {
        let cache = PlacementCache::default();
        let r = record(2, 700_000_000, 1);
        let key = format!("{INSTANCE_PREFIX}{}", r.id());
        let mut snap = Snapshot {
            settling: false,
            me: "b".into(),
            authors: [
                ("a".to_string(), author(true, &[(key.clone(), json(&r))])),
                ("b".to_string(), author(true, &[])),
            ]
            .into(),
        };
        assert_eq!(snap.instances(&cache).len(), 1);
        // Node b (not the author) deletes it: every node stops listing it.
        snap.authors.get_mut("b").unwrap().records.insert(
            format!("{DELETED_PREFIX}{}", r.id()),
            json(&DeletedRecord {
                instance_id: r.id().into(),
                seq: 1,
            }),
        );
        assert!(snap.instances(&cache).is_empty());
        assert_eq!(snap.deleted(), [r.id().to_string()].into());
        snap.me = "a".into();
        assert!(snap.instances(&cache).is_empty());
    }
}
