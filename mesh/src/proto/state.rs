//! The replicated state: for every author, its generation, heartbeat, records and versions, and
//! the merge rules (per author, per key, by version) that make every replica converge.

use crate::proto::beat::{live_hash, Beat};
use crate::proto::delta::{Delta, NodeDelta, NODE_DELTA_OVERHEAD};
use crate::proto::digest::{Digest, DigestEntry};
use crate::proto::id::NodeId;
use crate::proto::record::Record;
use serde::Serialize;
use std::collections::BTreeMap;

/// One author's part of the state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeState {
    /// The author's generation (a restart starts a new one and replaces the old records).
    pub generation: u64,
    /// Newest heartbeat known (the heartbeat of `beat`).
    pub heartbeat: u64,
    /// The author's newest signed beat known here, relayed with every part of it.
    pub beat: Beat,
    /// All records with versions up to this one are known here.
    pub max_version: u64,
    /// Highest version of a tombstone this replica has garbage-collected; a peer that knows
    /// less than this may have missed a deletion, so it is sent a full copy instead.
    pub gc_floor: u64,
    /// Records by key.
    pub records: BTreeMap<String, Record>,
    /// Local time each tombstone was first seen (for garbage collection; not replicated).
    tombstone_seen: BTreeMap<String, u64>,
}

impl NodeState {
    /// An empty state for `generation`.
    pub fn new(generation: u64) -> NodeState {
        NodeState {
            generation,
            beat: Beat {
                generation,
                ..Beat::default()
            },
            ..NodeState::default()
        }
    }

    /// [`live_hash`] of the records held up to `max_version`.
    pub fn live_hash(&self) -> Option<[u8; 32]> {
        live_hash(&self.records, self.max_version)
    }

    /// Live (non-deleted) values by key.
    pub fn values(&self) -> impl Iterator<Item = (&str, &str)> {
        self.records
            .iter()
            .filter_map(|(k, r)| r.value.as_deref().map(|v| (k.as_str(), v)))
    }

    /// Total size of the author's records, in bytes (bounded by the author).
    pub fn size(&self) -> usize {
        self.records.iter().map(|(k, r)| r.wire_size(k)).sum()
    }

    /// Stores `record` under `key` if it is newer than what is held. True if stored.
    pub fn put(&mut self, key: &str, record: Record, now_ms: u64) -> bool {
        if self
            .records
            .get(key)
            .is_some_and(|old| old.version >= record.version)
        {
            return false;
        }
        if record.value.is_none() {
            self.tombstone_seen.insert(key.to_string(), now_ms);
        } else {
            self.tombstone_seen.remove(key);
        }
        self.records.insert(key.to_string(), record);
        true
    }

    /// Removes tombstones first seen more than `grace_ms` ago. Returns how many.
    pub fn collect_tombstones(&mut self, now_ms: u64, grace_ms: u64) -> usize {
        let expired: Vec<String> = self
            .tombstone_seen
            .iter()
            .filter(|(_, seen)| now_ms.saturating_sub(**seen) >= grace_ms)
            .map(|(k, _)| k.clone())
            .collect();
        for key in &expired {
            self.tombstone_seen.remove(key);
            if let Some(record) = self.records.remove(key) {
                self.gc_floor = self.gc_floor.max(record.version);
            }
        }
        expired.len()
    }

    /// The delta a peer needs, given what it knows of this author (`theirs`).
    pub fn delta_for(&self, node: NodeId, theirs: Option<&DigestEntry>) -> Option<NodeDelta> {
        let full = NodeDelta {
            node,
            beat: self.beat.clone(),
            reset: true,
            from_version: 0,
            to_version: self.max_version,
            records: self.sorted_records(0),
        };
        let Some(theirs) = theirs else {
            return Some(full);
        };
        if theirs.generation < self.generation {
            return Some(full);
        }
        if theirs.generation > self.generation {
            return None;
        }
        // Behind the garbage-collection floor (a deletion it may have missed), or asking for
        // everything again (its copy failed the beat's check): a full copy.
        if (theirs.max_version < self.gc_floor || theirs.max_version == 0)
            && self.max_version > theirs.max_version
        {
            return Some(full);
        }
        if self.max_version > theirs.max_version {
            return Some(NodeDelta {
                reset: false,
                from_version: theirs.max_version,
                records: self.sorted_records(theirs.max_version),
                ..full
            });
        }
        if self.heartbeat > theirs.heartbeat {
            return Some(NodeDelta {
                reset: false,
                from_version: self.max_version,
                records: Vec::new(),
                ..full
            });
        }
        None
    }

    /// Records with versions in `(after, max_version]`, by ascending version.
    fn sorted_records(&self, after: u64) -> Vec<(String, Record)> {
        let mut records: Vec<(String, Record)> = self
            .records
            .iter()
            .filter(|(_, r)| r.version > after && r.version <= self.max_version)
            .map(|(k, r)| (k.clone(), r.clone()))
            .collect();
        records.sort_by(|a, b| a.1.version.cmp(&b.1.version).then(a.0.cmp(&b.0)));
        records
    }
}

/// What applying a [`NodeDelta`] changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Applied {
    /// The author was unknown, or came back with a new generation.
    pub new_generation: bool,
    /// The author's heartbeat went up.
    pub heartbeat_advanced: bool,
    /// Records stored.
    pub records: usize,
    /// The delta was for an older generation than the one held, and was ignored.
    pub stale: bool,
    /// The records held up to the beat's version do not hash to what the beat signed (a
    /// sender left some out): the claim was dropped, and a full copy will be asked for.
    pub inconsistent: bool,
}

/// Every author's state, by node id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterState {
    /// Authors by id.
    pub nodes: BTreeMap<NodeId, NodeState>,
}

impl ClusterState {
    /// Merges one author's delta (its beat and records already checked for signatures).
    /// `reset` says whether the delta's reset was verified against its beat (an unverified one
    /// merges as ordinary records). Never touches other authors.
    pub fn apply(&mut self, delta: &NodeDelta, reset: bool, now_ms: u64) -> Applied {
        let mut applied = Applied::default();
        let generation = delta.generation();
        let state = self.nodes.entry(delta.node).or_insert_with(|| {
            applied.new_generation = true;
            NodeState::new(generation)
        });
        if state.generation > generation {
            applied.stale = true;
            return applied;
        }
        if state.generation < generation {
            *state = NodeState::new(generation);
            applied.new_generation = true;
        }
        let before = (state.max_version, state.beat.max_version);
        let contiguous = delta.from_version <= state.max_version;
        if reset && delta.to_version > state.max_version {
            // The sender holds every record up to `to_version`: whatever we hold up to there
            // and it does not send was superseded (a deletion it already collected).
            let cut = delta.to_version;
            state.records.retain(|_, r| r.version > cut);
            let records = &state.records;
            state.tombstone_seen.retain(|k, _| records.contains_key(k));
        }
        for (key, record) in &delta.records {
            if state.put(key, record.clone(), now_ms) {
                applied.records += 1;
            }
        }
        if contiguous || reset {
            state.max_version = state.max_version.max(delta.to_version);
        }
        if delta.beat.is_newer_than(&state.beat) {
            state.beat = delta.beat.clone();
        }
        if state.beat.heartbeat > state.heartbeat {
            state.heartbeat = state.beat.heartbeat;
            applied.heartbeat_advanced = true;
        }
        let changed = applied.records > 0 || before != (state.max_version, state.beat.max_version);
        if changed && state.max_version > 0 && state.max_version == state.beat.max_version {
            if let Some(hash) = state.live_hash() {
                if hash != state.beat.records_hash {
                    state.max_version = 0;
                    applied.inconsistent = true;
                }
            }
        }
        applied
    }

    /// The digest of this replica.
    pub fn digest(&self) -> Digest {
        Digest {
            nodes: self
                .nodes
                .iter()
                .map(|(id, s)| {
                    (
                        *id,
                        DigestEntry {
                            generation: s.generation,
                            heartbeat: s.heartbeat,
                            max_version: s.max_version,
                        },
                    )
                })
                .collect(),
            own_beat: None,
        }
    }

    /// What a peer with digest `theirs` is missing, within `budget_bytes`. Authors are visited
    /// starting at `start` (rotating), so under a tight budget every author gets its turn;
    /// a part that does not fit whole is cut at a version boundary (and left out if it is a
    /// full copy, unless it is the first part, which is always sent).
    pub fn delta_for(&self, theirs: &Digest, budget_bytes: usize, start: usize) -> Delta {
        let mut delta = Delta::default();
        let mut used = 4;
        let count = self.nodes.len();
        let ids: Vec<&NodeId> = self.nodes.keys().collect();
        for i in 0..count {
            let id = ids[(start + i) % count];
            let Some(part) = self.nodes[id].delta_for(*id, theirs.nodes.get(id)) else {
                continue;
            };
            let size = part.wire_size();
            if used + size <= budget_bytes || delta.nodes.is_empty() {
                used += size;
                delta.nodes.push(part);
                continue;
            }
            if part.reset {
                continue;
            }
            let room = budget_bytes.saturating_sub(used);
            if room <= NODE_DELTA_OVERHEAD {
                continue;
            }
            let (pieces, _) = part.split(room);
            if let Some(first) = pieces.into_iter().next() {
                used += first.wire_size();
                delta.nodes.push(first);
            }
        }
        delta
    }

    /// A JSON view of the replicated records (no heartbeats or local liveness), in key order:
    /// two replicas that converged print the same bytes.
    pub fn to_json(&self) -> serde_json::Value {
        #[derive(Serialize)]
        struct NodeView<'a> {
            generation: u64,
            max_version: u64,
            records: BTreeMap<&'a str, serde_json::Value>,
        }
        let view: BTreeMap<String, NodeView> = self
            .nodes
            .iter()
            .map(|(id, s)| {
                let records = s
                    .values()
                    .map(|(k, v)| {
                        let value = serde_json::from_str(v)
                            .unwrap_or_else(|_| serde_json::Value::String(v.to_string()));
                        (k, value)
                    })
                    .collect();
                (
                    id.to_string(),
                    NodeView {
                        generation: s.generation,
                        max_version: s.max_version,
                        records,
                    },
                )
            })
            .collect();
        serde_json::to_value(view).unwrap_or(serde_json::Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(version: u64, value: Option<&str>) -> Record {
        Record::unsigned(version, value)
    }

    fn author_with(records: &[(&str, u64, Option<&str>)]) -> NodeState {
        let mut s = NodeState::new(7);
        for (k, v, val) in records {
            s.put(k, rec(*v, *val), 0);
            s.max_version = s.max_version.max(*v);
        }
        s.heartbeat = 3;
        seal(&mut s);
        s
    }

    /// What the author does after a change: a beat of its state as it is (unsigned here: the
    /// state does not check signatures, the replica does).
    fn seal(s: &mut NodeState) {
        s.beat = Beat {
            generation: s.generation,
            heartbeat: s.heartbeat,
            max_version: s.max_version,
            records_hash: s.live_hash().unwrap(),
            signature: Vec::new(),
        };
    }

    fn apply(state: &mut ClusterState, delta: &NodeDelta, now_ms: u64) -> Applied {
        state.apply(delta, delta.reset, now_ms)
    }

    #[test]
    fn merge_converges_in_any_order() {
        let a = NodeId::from_index(1);
        let source = author_with(&[("x", 1, Some("1")), ("y", 2, Some("2")), ("x", 3, None)]);
        let full = source.delta_for(a, None).unwrap();
        let (pieces, _) = full.clone().split(NODE_DELTA_OVERHEAD + 20);
        assert!(pieces.len() >= 2);
        let mut forward = ClusterState::default();
        for p in &pieces {
            apply(&mut forward, p, 0);
        }
        let mut backward = ClusterState::default();
        for p in pieces.iter().rev() {
            apply(&mut backward, p, 0);
        }
        // Out of order, the replica holds the records but cannot claim all versions...
        assert_eq!(forward.nodes[&a].records, backward.nodes[&a].records);
        assert_eq!(forward.nodes[&a].max_version, 3);
        // ...and a sync from the digest repairs the claim.
        let repair = source.delta_for(a, backward.digest().nodes.get(&a));
        if let Some(repair) = repair {
            apply(&mut backward, &repair, 0);
        }
        assert_eq!(backward.nodes[&a].max_version, 3);
        assert_eq!(forward.to_json(), backward.to_json());
    }

    #[test]
    fn newer_generation_replaces_and_older_is_ignored() {
        let a = NodeId::from_index(1);
        let mut state = ClusterState::default();
        let old = author_with(&[("x", 1, Some("1"))]);
        apply(&mut state, &old.delta_for(a, None).unwrap(), 0);
        let mut new = NodeState::new(8);
        new.put("y", rec(1, Some("2")), 0);
        new.max_version = 1;
        seal(&mut new);
        let applied = apply(&mut state, &new.delta_for(a, None).unwrap(), 0);
        assert!(applied.new_generation);
        assert!(state.nodes[&a].records.contains_key("y"));
        assert!(!state.nodes[&a].records.contains_key("x"));
        let applied = apply(&mut state, &old.delta_for(a, None).unwrap(), 0);
        assert!(applied.stale);
        assert_eq!(state.nodes[&a].generation, 8);
    }

    #[test]
    fn tombstones_are_collected_and_laggards_get_a_full_copy() {
        let a = NodeId::from_index(1);
        let mut source = author_with(&[("x", 1, Some("1")), ("y", 2, Some("2"))]);
        let mut laggard = ClusterState::default();
        apply(&mut laggard, &source.delta_for(a, None).unwrap(), 0);
        source.put("x", rec(3, None), 10);
        source.max_version = 3;
        seal(&mut source);
        assert_eq!(source.collect_tombstones(20, 100), 0);
        assert_eq!(source.collect_tombstones(110, 100), 1);
        assert_eq!(source.gc_floor, 3);
        let delta = source.delta_for(a, laggard.digest().nodes.get(&a)).unwrap();
        assert!(delta.reset, "a peer behind the GC floor needs a full copy");
        apply(&mut laggard, &delta, 200);
        assert!(!laggard.nodes[&a].records.contains_key("x"));
        assert_eq!(laggard.nodes[&a].max_version, 3);
    }

    #[test]
    fn a_range_with_records_left_out_is_caught_and_a_full_copy_repairs_it() {
        let a = NodeId::from_index(1);
        let source = author_with(&[("x", 1, Some("1")), ("y", 2, Some("2"))]);
        let mut receiver = ClusterState::default();
        let mut short = source.delta_for(a, None).unwrap();
        short.reset = false;
        short.records.retain(|(k, _)| k != "y");
        let applied = apply(&mut receiver, &short, 0);
        assert!(applied.inconsistent);
        assert_eq!(receiver.nodes[&a].max_version, 0, "the claim is dropped");
        let repair = source
            .delta_for(a, receiver.digest().nodes.get(&a))
            .unwrap();
        assert!(
            repair.reset,
            "a replica asking for everything gets a full copy"
        );
        assert!(!apply(&mut receiver, &repair, 0).inconsistent);
        assert_eq!(receiver.nodes[&a].max_version, 2);
        assert_eq!(receiver.nodes[&a].records, source.records);
    }

    #[test]
    fn delta_budget_rotates_through_authors() {
        let mut state = ClusterState::default();
        for i in 0..10 {
            let s = author_with(&[("k", 1, Some(&"v".repeat(200)))]);
            apply(
                &mut state,
                &s.delta_for(NodeId::from_index(i), None).unwrap(),
                0,
            );
        }
        let empty = Digest::default();
        let d0 = state.delta_for(&empty, 700, 0);
        let d5 = state.delta_for(&empty, 700, 5);
        assert!(d0.wire_size() <= 700 || d0.nodes.len() == 1);
        assert!(d0.nodes.len() < 10);
        assert_ne!(d0.nodes[0].node, d5.nodes[0].node);
    }
}
