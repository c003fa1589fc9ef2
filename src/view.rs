//! A node's view of the cluster, read from a [`Snapshot`] of the replicated state: the live
//! instances with their placements, the runners of their ranks, the placement input for new
//! instances, and the start-up plan of this node's rank. Pure functions of the snapshot, so
//! that every node with the same state reaches the same conclusions.

use crate::intent::{
    effective, DeletedRecord, InstanceRecord, RunnerRecord, DELETED_PREFIX, INSTANCE_PREFIX,
    RUNNER_PREFIX,
};
use mesh::probe::{EdgeRecord, EDGE_PREFIX};
use mesh::profile::{HostProfile, PROFILE_KEY};
use placement::{Edge, PlaceError, Placement, PlanInput, RankView, RunnerStatus};
use std::collections::{BTreeMap, BTreeSet};

/// One author's part of the state, as this node sees it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Author {
    /// It heartbeats (this node is always alive to itself).
    pub alive: bool,
    /// It was heard from and then went silent.
    pub dead: bool,
    /// Its live records: key → JSON text.
    pub records: BTreeMap<String, String>,
}

/// The replicated state at one moment, plus this node's liveness view.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// This node's id.
    pub me: String,
    /// Every author by node id.
    pub authors: BTreeMap<String, Author>,
}

impl Snapshot {
    /// Reads a snapshot out of a mesh replica.
    pub fn of_replica(replica: &mesh::Replica) -> Snapshot {
        let authors = replica
            .state()
            .nodes
            .iter()
            .map(|(id, state)| {
                let records = state
                    .values()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect();
                (
                    id.to_string(),
                    Author {
                        alive: replica.is_alive(id),
                        dead: replica.is_dead(id),
                        records,
                    },
                )
            })
            .collect();
        Snapshot {
            me: replica.id().to_string(),
            authors,
        }
    }

    /// Records under `prefix` of every author, decoded; undecodable ones are skipped.
    fn records<'a, T: serde::de::DeserializeOwned>(
        &'a self,
        prefix: &'a str,
    ) -> impl Iterator<Item = (&'a str, &'a str, T)> + 'a {
        self.authors.iter().flat_map(move |(author, state)| {
            state
                .records
                .range(prefix.to_string()..)
                .take_while(move |(k, _)| k.starts_with(prefix))
                .filter_map(move |(k, v)| {
                    let value = serde_json::from_str::<T>(v).ok()?;
                    Some((author.as_str(), &k[prefix.len()..], value))
                })
        })
    }

    /// Whether `node` is considered dead (heard from, then silent).
    pub fn is_dead(&self, node: &str) -> bool {
        node != self.me && self.authors.get(node).is_some_and(|a| a.dead)
    }

    /// Ids of instances some node deleted.
    pub fn deleted(&self) -> BTreeSet<String> {
        self.records::<DeletedRecord>(DELETED_PREFIX)
            .map(|(_, id, _)| id.to_string())
            .collect()
    }

    /// Every author's copy of every `instance/<id>`, by id.
    pub fn instance_copies(&self) -> BTreeMap<String, Vec<InstanceRecord>> {
        let mut out: BTreeMap<String, Vec<InstanceRecord>> = BTreeMap::new();
        for (_, id, record) in self.records::<InstanceRecord>(INSTANCE_PREFIX) {
            if record.id() == id {
                out.entry(id.to_string()).or_default().push(record);
            }
        }
        out
    }

    /// The live instances (not deleted), each at its effective epoch, with its placement.
    pub fn instances(&self) -> BTreeMap<String, InstanceView> {
        let deleted = self.deleted();
        self.instance_copies()
            .into_iter()
            .filter(|(id, _)| !deleted.contains(id))
            .filter_map(|(id, copies)| {
                let record = effective(&copies)?.clone();
                let placement = record.place();
                Some((id, InstanceView { record, placement }))
            })
            .collect()
    }

    /// `node`'s runner record for instance `id`, if it has one.
    pub fn runner(&self, node: &str, id: &str) -> Option<RunnerRecord> {
        let text = self
            .authors
            .get(node)?
            .records
            .get(&format!("{RUNNER_PREFIX}{id}"))?;
        serde_json::from_str(text).ok()
    }

    /// The live nodes' profiles and the edges between them, as placement takes them.
    pub fn placement_nodes(&self) -> (Vec<placement::NodeProfile>, Vec<Edge>) {
        let live: BTreeSet<&str> = self
            .authors
            .iter()
            .filter(|(id, a)| a.alive || **id == self.me)
            .map(|(id, _)| id.as_str())
            .collect();
        let mut nodes = Vec::new();
        let mut edges = Vec::new();
        for (id, author) in &self.authors {
            if !live.contains(id.as_str()) {
                continue;
            }
            let Some(profile) = author
                .records
                .get(PROFILE_KEY)
                .and_then(|p| serde_json::from_str::<HostProfile>(p).ok())
            else {
                continue;
            };
            nodes.push(profile.placement_profile(id));
            for edge in author
                .records
                .range(EDGE_PREFIX.to_string()..)
                .take_while(|(k, _)| k.starts_with(EDGE_PREFIX))
                .filter_map(|(_, v)| {
                    serde_json::from_str::<EdgeRecord>(v)
                        .ok()?
                        .placement_edge(id)
                })
            {
                if live.contains(edge.to.as_str()) {
                    edges.push(edge);
                }
            }
        }
        (nodes, edges)
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
            && statuses.iter().all(|(_, r)| {
                matches!(
                    r.as_ref().map(|r| &r.status),
                    Some(RunnerStatus::Ready | RunnerStatus::Running)
                )
            })
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
    use crate::intent::tests::record;
    use mesh::interfaces::{Interface, InterfaceKind};
    use placement::{next_action, Action, ComputeBackend, Link, ShutdownReason};

    fn author(alive: bool, records: &[(String, String)]) -> Author {
        Author {
            alive,
            dead: !alive,
            records: records.iter().cloned().collect(),
        }
    }

    fn json<T: serde::Serialize>(v: &T) -> String {
        serde_json::to_string(v).unwrap()
    }

    fn runner(epoch: u32, rank: usize, status: RunnerStatus) -> String {
        json(&RunnerRecord {
            epoch,
            rank,
            status,
            queued: 0,
            model_ready: true,
        })
    }

    #[test]
    fn a_deletion_by_another_node_removes_the_instance_everywhere() {
        let r = record(2, 700_000_000, 1);
        let key = format!("{INSTANCE_PREFIX}{}", r.id());
        let mut snap = Snapshot {
            me: "b".into(),
            authors: [
                ("a".to_string(), author(true, &[(key.clone(), json(&r))])),
                ("b".to_string(), author(true, &[])),
            ]
            .into(),
        };
        assert_eq!(snap.instances().len(), 1);
        // Node b (not the author) deletes it: every node stops listing it.
        snap.authors.get_mut("b").unwrap().records.insert(
            format!("{DELETED_PREFIX}{}", r.id()),
            json(&DeletedRecord {
                instance_id: r.id().into(),
            }),
        );
        assert!(snap.instances().is_empty());
        assert_eq!(snap.deleted(), [r.id().to_string()].into());
        snap.me = "a".into();
        assert!(snap.instances().is_empty());
    }

    #[test]
    fn a_copy_keyed_under_another_id_is_ignored() {
        let r = record(1, 700_000_000, 1);
        let snap = Snapshot {
            me: "a".into(),
            authors: [(
                "a".to_string(),
                author(true, &[(format!("{INSTANCE_PREFIX}other"), json(&r))]),
            )]
            .into(),
        };
        assert!(snap.instances().is_empty());
    }

    #[test]
    fn plans_follow_the_state_dead_nodes_fail_and_other_epochs_do_not_count() {
        let r = record(3, 400_000_000, 3);
        let key = format!("{INSTANCE_PREFIX}{}", r.id());
        let rkey = format!("{RUNNER_PREFIX}{}", r.id());
        let placement = r.place().unwrap();
        let names: Vec<String> = placement.ranks.iter().map(|r| r.node.clone()).collect();
        let mut snap = Snapshot {
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
        let view = snap.instances().remove(r.id()).unwrap();
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
    fn placement_input_comes_from_live_profiles_and_edges() {
        let profile = |ip: &str| HostProfile {
            name: "h".into(),
            os: "linux".into(),
            os_version: "6".into(),
            cpu: "x".into(),
            cpu_cores: 2,
            memory_total: 8 << 30,
            memory_available: 4 << 30,
            backends: vec![ComputeBackend::MlxCpu],
            interfaces: vec![Interface::new(
                "eth0",
                ip.parse().unwrap(),
                24,
                InterfaceKind::Ethernet,
            )],
            api_port: 52415,
        };
        let edge = |from: &str, to: &str, ip: &str| EdgeRecord {
            edge: Edge {
                from: from.into(),
                to: to.into(),
                link: Link::Ip(ip.parse().unwrap()),
            },
            remote_interface: "eth0".into(),
            remote_kind: InterfaceKind::Ethernet,
            local_interface: Some("eth0".into()),
            local_kind: Some(InterfaceKind::Ethernet),
        };
        let snap = Snapshot {
            me: "a".into(),
            authors: [
                (
                    "a".to_string(),
                    author(
                        true,
                        &[
                            (PROFILE_KEY.into(), json(&profile("10.0.0.1"))),
                            ("edge/b/10.0.0.2".into(), json(&edge("a", "b", "10.0.0.2"))),
                            ("edge/c/10.0.0.3".into(), json(&edge("a", "c", "10.0.0.3"))),
                        ],
                    ),
                ),
                (
                    "b".to_string(),
                    author(
                        true,
                        &[
                            (PROFILE_KEY.into(), json(&profile("10.0.0.2"))),
                            ("edge/a/10.0.0.1".into(), json(&edge("b", "a", "10.0.0.1"))),
                        ],
                    ),
                ),
                (
                    "c".to_string(),
                    author(false, &[(PROFILE_KEY.into(), json(&profile("10.0.0.3")))]),
                ),
            ]
            .into(),
        };
        let (nodes, edges) = snap.placement_nodes();
        let ids: Vec<&str> = nodes.iter().map(|n| n.id.as_str()).collect();
        assert_eq!(ids, ["a", "b"], "dead node c is left out");
        assert_eq!(nodes[0].ram_available, 4 << 30);
        assert_eq!(nodes[0].backends, vec![ComputeBackend::MlxCpu]);
        assert_eq!(
            edges,
            vec![
                Edge {
                    from: "a".into(),
                    to: "b".into(),
                    link: Link::Ip("10.0.0.2".parse().unwrap())
                },
                Edge {
                    from: "b".into(),
                    to: "a".into(),
                    link: Link::Ip("10.0.0.1".parse().unwrap())
                },
            ]
        );
    }
}
