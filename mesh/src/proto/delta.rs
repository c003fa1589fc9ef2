//! Deltas: the records (and heartbeats) one replica sends another, per author, with the version
//! range they cover, cut to a byte budget so a delta always fits its channel.

use crate::proto::beat::{Beat, BEAT_WIRE_SIZE};
use crate::proto::id::NodeId;
use crate::proto::record::{Record, MAX_KEY_LEN, MAX_SIGNATURE_LEN, MAX_VALUE_LEN};
use serde::{Deserialize, Serialize};

/// Encoded-size allowance for the fixed fields of one [`NodeDelta`].
pub const NODE_DELTA_OVERHEAD: usize = 32 + 3 * 10 + 8 + BEAT_WIRE_SIZE;

/// What one author's state changed by, as far as the receiver is concerned.
///
/// `records` holds every record of `node` with a version in `(from_version, to_version]`
/// (records overwritten since then are simply absent), so a receiver that already knows all
/// versions up to `from_version` knows all up to `to_version` after applying it. The author's
/// generation and heartbeat come in its signed [`Beat`], which also bounds `to_version`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeDelta {
    /// The author.
    pub node: NodeId,
    /// The newest beat the sender knows of the author (its generation and heartbeat).
    pub beat: Beat,
    /// The receiver must drop what it holds of this author first (a full copy follows).
    pub reset: bool,
    /// Lower bound (excluded) of the version range covered.
    pub from_version: u64,
    /// Upper bound (included) of the version range covered.
    pub to_version: u64,
    /// The records, by ascending version.
    pub records: Vec<(String, Record)>,
}

impl NodeDelta {
    /// Estimated encoded size.
    pub fn wire_size(&self) -> usize {
        NODE_DELTA_OVERHEAD
            + self
                .records
                .iter()
                .map(|(k, r)| r.wire_size(k))
                .sum::<usize>()
    }

    /// The author's generation these records belong to.
    pub fn generation(&self) -> u64 {
        self.beat.generation
    }

    /// The author's heartbeat the sender knows.
    pub fn heartbeat(&self) -> u64 {
        self.beat.heartbeat
    }

    /// Checks the shape a well-behaved sender produces; a delta that fails is dropped whole.
    pub fn validate(&self) -> Result<(), String> {
        if self.from_version > self.to_version {
            return Err(format!(
                "version range ({}, {}] is empty",
                self.from_version, self.to_version
            ));
        }
        if self.to_version > self.beat.max_version {
            return Err(format!(
                "version range ends at {}, beyond the {} the author's beat signs",
                self.to_version, self.beat.max_version
            ));
        }
        if self.beat.signature.len() > MAX_SIGNATURE_LEN {
            return Err("the beat's signature is too long".into());
        }
        for (key, record) in &self.records {
            if key.len() > MAX_KEY_LEN {
                return Err(format!("key of {} bytes (max {MAX_KEY_LEN})", key.len()));
            }
            if record
                .value
                .as_ref()
                .is_some_and(|v| v.len() > MAX_VALUE_LEN)
            {
                return Err(format!(
                    "value of key {key:?} is over {MAX_VALUE_LEN} bytes"
                ));
            }
            if record.signature.len() > MAX_SIGNATURE_LEN {
                return Err(format!("signature of key {key:?} is too long"));
            }
            if record.version > self.to_version
                || (record.version <= self.from_version && !self.reset)
            {
                return Err(format!(
                    "record {key:?} has version {} outside the range ({}, {}]",
                    record.version, self.from_version, self.to_version
                ));
            }
        }
        Ok(())
    }

    /// Splits this delta into pieces that each encode to at most `max_bytes` (estimated), each
    /// covering a contiguous slice of the version range. Records bigger than a piece can hold
    /// are left out and returned separately (anti-entropy carries them; gossip cannot).
    pub fn split(self, max_bytes: usize) -> (Vec<NodeDelta>, Vec<String>) {
        let room = max_bytes.saturating_sub(NODE_DELTA_OVERHEAD);
        if self.wire_size() <= max_bytes {
            return (vec![self], Vec::new());
        }
        let mut pieces = Vec::new();
        let mut refused = Vec::new();
        let mut current: Vec<(String, Record)> = Vec::new();
        let mut used = 0;
        let mut from = self.from_version;
        let mut header = self;
        let records = std::mem::take(&mut header.records);
        for (key, record) in records {
            let size = record.wire_size(&key);
            if size > room {
                // Close the range before this record and start the next one at its version, so
                // no piece claims to cover it: a receiver cannot advance past it by gossip and
                // anti-entropy fetches it.
                let before = record.version.saturating_sub(1).max(from);
                if !current.is_empty() || before > from {
                    pieces.push(header.piece(from, before, std::mem::take(&mut current)));
                }
                from = record.version.max(from);
                used = 0;
                refused.push(key);
                continue;
            }
            if used + size > room && !current.is_empty() {
                let to = current.last().map_or(from, |(_, r)| r.version);
                pieces.push(header.piece(from, to, std::mem::take(&mut current)));
                from = to;
                used = 0;
            }
            used += size;
            current.push((key, record));
        }
        pieces.push(header.piece(from, header.to_version, current));
        (pieces, refused)
    }

    fn piece(&self, from: u64, to: u64, records: Vec<(String, Record)>) -> NodeDelta {
        NodeDelta {
            node: self.node,
            beat: self.beat.clone(),
            reset: self.reset && from == self.from_version,
            from_version: from,
            to_version: to,
            records,
        }
    }
}

/// A delta over several authors.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delta {
    /// Per-author parts, at most one per author.
    pub nodes: Vec<NodeDelta>,
}

impl Delta {
    /// Estimated encoded size.
    pub fn wire_size(&self) -> usize {
        4 + self.nodes.iter().map(NodeDelta::wire_size).sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn beat(max_version: u64) -> Beat {
        Beat {
            generation: 1,
            heartbeat: 5,
            max_version,
            records_hash: [0; 32],
            signature: vec![0; 64],
        }
    }

    fn record(version: u64, len: usize) -> Record {
        Record {
            version,
            value: Some("x".repeat(len)),
            signature: vec![0; 64],
        }
    }

    #[test]
    fn split_keeps_ranges_contiguous_and_sizes_bounded() {
        let delta = NodeDelta {
            node: NodeId::from_index(1),
            beat: beat(40),
            reset: false,
            from_version: 3,
            to_version: 40,
            records: (4..=40)
                .map(|v| (format!("k{v}"), record(v, 500)))
                .collect(),
        };
        let (pieces, refused) = delta.split(4000);
        assert!(refused.is_empty());
        assert!(pieces.len() > 1);
        assert_eq!(pieces[0].from_version, 3);
        assert_eq!(pieces.last().unwrap().to_version, 40);
        for pair in pieces.windows(2) {
            assert_eq!(pair[0].to_version, pair[1].from_version);
        }
        let total: usize = pieces.iter().map(|p| p.records.len()).sum();
        assert_eq!(total, 37);
        for piece in &pieces {
            assert!(piece.wire_size() <= 4000);
            let encoded =
                crate::proto::codec::encode(&crate::proto::codec::Message::Broadcast(Delta {
                    nodes: vec![piece.clone()],
                }));
            assert!(encoded.len() <= 4000, "piece encodes to {}", encoded.len());
        }
    }

    #[test]
    fn split_refuses_records_that_never_fit() {
        let delta = NodeDelta {
            node: NodeId::from_index(1),
            beat: beat(2),
            reset: false,
            from_version: 0,
            to_version: 2,
            records: vec![
                ("big".into(), record(1, 10_000)),
                ("small".into(), record(2, 10)),
            ],
        };
        let (pieces, refused) = delta.split(4000);
        assert_eq!(refused, vec!["big".to_string()]);
        let total: usize = pieces.iter().map(|p| p.records.len()).sum();
        assert_eq!(total, 1);
        // No piece may claim the refused version 1 as covered from below it.
        assert!(pieces
            .iter()
            .all(|p| !(p.from_version < 1 && p.to_version >= 1)));
    }
}
