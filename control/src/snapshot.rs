//! The replicated state at one moment, as plain data: every author's records and this node's
//! liveness view of it. The node's adapter fills it from its mesh replica; tests build it by
//! hand. Everything here is a pure function of it, so that every node with the same state
//! reaches the same conclusions.

use crate::intent::{
    DeletedRecord, InstanceRecord, RunnerRecord, DELETED_PREFIX, INSTANCE_PREFIX, RUNNER_PREFIX,
};
use std::collections::{BTreeMap, BTreeSet};

/// How long after a peer comes back a node's beliefs about deaths count as stale
/// ([`Snapshot::settling`]): a few gossip rounds (one is 250 ms), time for the returning side
/// to pass on its news of the others.
pub const SETTLE_AFTER_RETURN_MS: u64 = 3_000;

/// [`Snapshot::settling`] at `now_ms` for a node whose last peer came back at `last_return_ms`
/// (both on the mesh's clock): within [`SETTLE_AFTER_RETURN_MS`] of it.
pub fn settling(last_return_ms: Option<u64>, now_ms: u64) -> bool {
    last_return_ms.is_some_and(|at| now_ms.saturating_sub(at) < SETTLE_AFTER_RETURN_MS)
}

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
    /// A peer came back (joined, or revived after a partition) a moment ago, so the deaths
    /// this node believes in may be stale: the news that the others live arrives a gossip
    /// round after the first of them. See [`crate::reconcile`]'s rule for excluded nodes.
    pub settling: bool,
}

impl Snapshot {
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

    /// The `seq` of this node's next deletion record: one more than its newest.
    pub fn next_deletion_seq(&self) -> u64 {
        self.records::<DeletedRecord>(DELETED_PREFIX)
            .filter(|(author, _, _)| *author == self.me)
            .map(|(_, _, record)| record.seq)
            .max()
            .unwrap_or(0)
            + 1
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

    /// The model references (`Intent::model`) of every instance copy in the state: what the
    /// node must look for on its disk before it reconciles.
    pub fn model_references(&self) -> BTreeSet<String> {
        self.records::<InstanceRecord>(INSTANCE_PREFIX)
            .map(|(_, _, record)| record.intent.model)
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixture::{author, json, record};

    #[test]
    fn a_copy_keyed_under_another_id_is_ignored() {
        let r = record(1, 700_000_000, 1);
        let snap = Snapshot {
            settling: false,
            me: "a".into(),
            authors: [(
                "a".to_string(),
                author(true, &[(format!("{INSTANCE_PREFIX}other"), json(&r))]),
            )]
            .into(),
        };
        assert!(snap.instance_copies().is_empty());
        assert_eq!(snap.model_references(), ["default".to_string()].into());
    }
}
