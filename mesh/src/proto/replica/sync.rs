//! The anti-entropy exchange (syn, syn-ack, ack), broadcast deltas, and how a received delta
//! merges into the replica: version checks per author, conflict notices, and spotting a second
//! process that runs with this node's id.

use super::{Event, Replica};
use crate::proto::codec::{self, CodecError, Message, MAX_MESSAGE_BYTES};
use crate::proto::delta::{Delta, NodeDelta};
use crate::proto::failure_detector::Liveness;
use crate::proto::id::NodeId;
use crate::proto::record::signed_bytes;
use std::collections::BTreeSet;

impl Replica {
    /// The first message of an anti-entropy exchange (also sent at once when a neighbour
    /// comes up).
    pub fn syn(&self) -> Vec<u8> {
        codec::encode(&Message::Syn(self.state.digest()))
    }

    /// Responder side of a sync: answers a `Syn` from `from` with a `SynAck`.
    pub fn on_syn(
        &mut self,
        from: NodeId,
        bytes: &[u8],
        now_ms: u64,
    ) -> Result<Vec<u8>, CodecError> {
        let Message::Syn(theirs) = self.decode(bytes)? else {
            return Err(self.unexpected("Syn"));
        };
        self.add_peer(from);
        self.note_claim(from, &theirs, now_ms);
        self.rotation = self.rotation.wrapping_add(1);
        let mut delta =
            self.state
                .delta_for(&theirs, self.config.max_sync_delta_bytes, self.rotation);
        self.add_conflict_notices(from, &theirs, &mut delta, now_ms);
        Ok(codec::encode(&Message::SynAck {
            digest: self.state.digest(),
            delta,
        }))
    }

    /// Initiator side: merges the `SynAck` from `from` and returns the `Ack` to send back.
    pub fn on_synack(
        &mut self,
        from: NodeId,
        bytes: &[u8],
        now_ms: u64,
    ) -> Result<Vec<u8>, CodecError> {
        let Message::SynAck { digest, delta } = self.decode(bytes)? else {
            return Err(self.unexpected("SynAck"));
        };
        self.add_peer(from);
        self.note_claim(from, &digest, now_ms);
        self.merge(&delta, now_ms);
        self.rotation = self.rotation.wrapping_add(1);
        let mut back =
            self.state
                .delta_for(&digest, self.config.max_sync_delta_bytes, self.rotation);
        self.add_conflict_notices(from, &digest, &mut back, now_ms);
        Ok(codec::encode(&Message::Ack(back)))
    }

    /// Responder side: merges the final `Ack`.
    pub fn on_ack(&mut self, from: NodeId, bytes: &[u8], now_ms: u64) -> Result<(), CodecError> {
        let _ = from;
        let Message::Ack(delta) = self.decode(bytes)? else {
            return Err(self.unexpected("Ack"));
        };
        self.merge(&delta, now_ms);
        Ok(())
    }

    /// Merges a gossip broadcast (any size limit was enforced by the gossip layer).
    pub fn on_broadcast(&mut self, bytes: &[u8], now_ms: u64) -> Result<(), CodecError> {
        let Message::Broadcast(delta) = self.decode(bytes)? else {
            return Err(self.unexpected("Broadcast"));
        };
        self.merge(&delta, now_ms);
        Ok(())
    }

    pub(super) fn decode(&mut self, bytes: &[u8]) -> Result<Message, CodecError> {
        codec::decode(bytes, MAX_MESSAGE_BYTES).inspect_err(|_| {
            self.stats.malformed_messages += 1;
        })
    }

    pub(super) fn unexpected(&mut self, wanted: &str) -> CodecError {
        self.stats.malformed_messages += 1;
        CodecError::Malformed(format!("expected a {wanted} message"))
    }

    pub(super) fn merge(&mut self, delta: &Delta, now_ms: u64) {
        let mut seen = BTreeSet::new();
        for part in &delta.nodes {
            if part.node != self.id && !seen.insert(part.node) {
                continue;
            }
            self.merge_node(part, now_ms);
        }
    }

    pub(super) fn merge_node(&mut self, part: &NodeDelta, now_ms: u64) {
        if part.node == self.id {
            self.check_duplicate(part, now_ms);
            return;
        }
        if let Some(gone) = self.departed.get(&part.node) {
            let back = part.generation > gone.generation
                || (part.generation == gone.generation && part.heartbeat > gone.heartbeat);
            if !back {
                return;
            }
            self.departed.remove(&part.node);
        }
        let forged = part
            .records
            .iter()
            .filter(|(key, r)| {
                let message = signed_bytes(
                    &part.node,
                    part.generation,
                    key,
                    r.version,
                    r.value.as_deref(),
                );
                !self.authority.verify(&part.node, &message, &r.signature)
            })
            .count();
        if forged > 0 {
            // One bad record taints the whole part (its version range and heartbeat).
            self.stats.forged_records += forged as u64;
            return;
        }
        let applied = self.state.apply(part, now_ms);
        if applied.stale {
            return;
        }
        if applied.new_generation {
            self.detector.forget(&part.node);
            self.events.push(Event::Joined(part.node));
            self.detector.heartbeat(part.node, now_ms);
        } else if applied.heartbeat_advanced {
            if let Some(Liveness::Revived(id)) = self.detector.heartbeat(part.node, now_ms) {
                self.events.push(Event::Revived(id));
            }
        }
        if applied.records > 0 {
            self.stats.records_applied += applied.records as u64;
            self.events.push(Event::Changed(part.node));
        }
    }

    /// Remembers which generation an authenticated peer says it runs: two generations of one
    /// id heartbeating at once means two processes share an identity.
    pub(super) fn note_claim(
        &mut self,
        from: NodeId,
        digest: &crate::proto::digest::Digest,
        now_ms: u64,
    ) {
        let Some(entry) = digest.nodes.get(&from) else {
            return;
        };
        let window = 2 * self.config.duplicate_confirm_ms;
        let claims = self.claims.entry(from).or_default();
        claims.insert(entry.generation, (entry.heartbeat, now_ms));
        claims.retain(|_, (_, at)| now_ms.saturating_sub(*at) < window);
        self.claims.retain(|_, c| !c.is_empty());
    }

    /// Tells `from` about other generations of its own id that recently synced with us (an
    /// empty part with that generation's heartbeat): it decides whether it is a duplicate.
    pub(super) fn add_conflict_notices(
        &self,
        from: NodeId,
        digest: &crate::proto::digest::Digest,
        delta: &mut Delta,
        now_ms: u64,
    ) {
        let (Some(claims), Some(entry)) = (self.claims.get(&from), digest.nodes.get(&from)) else {
            return;
        };
        let window = 2 * self.config.duplicate_confirm_ms;
        for (generation, (heartbeat, at)) in claims {
            if *generation != entry.generation && now_ms.saturating_sub(*at) < window {
                delta.nodes.push(NodeDelta {
                    node: from,
                    generation: *generation,
                    heartbeat: *heartbeat,
                    reset: false,
                    from_version: 0,
                    to_version: 0,
                    records: Vec::new(),
                });
            }
        }
    }

    /// Another process with our id shows up as a different generation whose heartbeat keeps
    /// advancing over `duplicate_confirm_ms` (a dead former self stops advancing).
    pub(super) fn check_duplicate(&mut self, part: &NodeDelta, now_ms: u64) {
        let ours = self.generation();
        if part.generation == ours || self.duplicate_reported {
            return;
        }
        let (first_heartbeat, first_ms) = *self
            .self_sightings
            .entry(part.generation)
            .or_insert((part.heartbeat, now_ms));
        if part.heartbeat > first_heartbeat
            && now_ms.saturating_sub(first_ms) >= self.config.duplicate_confirm_ms
        {
            self.duplicate_reported = true;
            self.events.push(Event::DuplicateId {
                ours,
                other: part.generation,
            });
        }
    }
}
