//! The digest: for every node a replica knows, how far it knows it. Sent first in every sync so
//! the other side can answer with exactly what is missing.

use crate::proto::beat::{Beat, BEAT_WIRE_SIZE};
use crate::proto::id::NodeId;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// How far a replica knows one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DigestEntry {
    /// The node's generation (a restarted node has a higher one).
    pub generation: u64,
    /// The newest heartbeat known from it.
    pub heartbeat: u64,
    /// All of its records with versions up to this one are known.
    pub max_version: u64,
}

/// A replica's digest: one entry per node, in node-id order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Digest {
    /// Entries by node.
    pub nodes: BTreeMap<NodeId, DigestEntry>,
    /// The sender's own current beat, signed: a peer that hears of another process with the
    /// same id passes it on as proof (see the replica's duplicate check).
    pub own_beat: Option<Beat>,
}

impl Digest {
    /// Rough encoded size in bytes (for statistics and budgets).
    pub fn wire_size(&self) -> usize {
        self.nodes.len() * (32 + 3 * 5) + 4 + BEAT_WIRE_SIZE
    }
}
