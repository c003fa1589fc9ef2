//! The anti-entropy exchange (syn, syn-ack, ack), broadcast deltas, and how a received delta
//! merges into the replica: version checks per author, conflict notices, and spotting a second
//! process that runs with this node's id.

use super::{Event, Replica};
use crate::proto::beat::live_hash_of_part;
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
        codec::encode(&Message::Syn(self.digest()))
    }

    /// The digest this replica sends: what it knows, plus its own signed beat.
    fn digest(&self) -> crate::proto::digest::Digest {
        let mut digest = self.state.digest();
        digest.own_beat = Some(self.own_beat().clone());
        digest
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
            digest: self.digest(),
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
        // The beat vouches for the generation, the heartbeat and the version range: a part
        // whose beat its author did not sign is dropped whole (one already checked is not
        // checked again).
        let known = self
            .state
            .nodes
            .get(&part.node)
            .is_some_and(|s| s.beat == part.beat);
        if !known && !part.beat.verify(&part.node, self.authority.as_ref()) {
            self.stats.forged_beats += 1;
            return;
        }
        if part.node == self.id {
            self.check_duplicate(part, now_ms);
            return;
        }
        let (generation, heartbeat) = (part.generation(), part.heartbeat());
        if let Some(gone) = self.departed.get(&part.node) {
            let back = generation > gone.generation
                || (generation == gone.generation && heartbeat > gone.heartbeat);
            if !back {
                return;
            }
            self.departed.remove(&part.node);
        }
        let forged = part
            .records
            .iter()
            .filter(|(key, r)| {
                let message =
                    signed_bytes(&part.node, generation, key, r.version, r.value.as_deref());
                !self.authority.verify(&part.node, &message, &r.signature)
            })
            .count();
        if forged > 0 {
            // One bad record taints the whole part (its version range and heartbeat).
            self.stats.forged_records += forged as u64;
            return;
        }
        // A reset drops records, so it must carry exactly the live set the author signed.
        let reset = part.reset
            && part.to_version == part.beat.max_version
            && live_hash_of_part(&part.records, part.to_version) == Some(part.beat.records_hash);
        if part.reset && !reset {
            self.stats.unverified_resets += 1;
        }
        let applied = self.state.apply(part, reset, now_ms);
        if applied.stale {
            return;
        }
        if applied.inconsistent {
            self.stats.inconsistent_authors += 1;
        }
        if applied.new_generation {
            self.detector.forget(&part.node);
            self.events.push(Event::Joined(part.node));
            self.last_return_ms = Some(now_ms);
            self.detector.heartbeat(part.node, now_ms);
        } else if applied.heartbeat_advanced {
            if let Some(Liveness::Revived(id)) = self.detector.heartbeat(part.node, now_ms) {
                self.events.push(Event::Revived(id));
                self.last_return_ms = Some(now_ms);
            }
        }
        if applied.records > 0 {
            self.stats.records_applied += applied.records as u64;
            self.events.push(Event::Changed(part.node));
        }
    }

    /// Remembers which generation an authenticated peer says it runs, with its signed beat:
    /// two generations of one id heartbeating at once means two processes share an identity.
    pub(super) fn note_claim(
        &mut self,
        from: NodeId,
        digest: &crate::proto::digest::Digest,
        now_ms: u64,
    ) {
        let Some(beat) = &digest.own_beat else {
            return;
        };
        if !beat.verify(&from, self.authority.as_ref()) {
            self.stats.forged_beats += 1;
            return;
        }
        let window = 2 * self.config.duplicate_confirm_ms;
        let claims = self.claims.entry(from).or_default();
        claims.insert(beat.generation, (beat.clone(), now_ms));
        claims.retain(|_, (_, at)| now_ms.saturating_sub(*at) < window);
        self.claims.retain(|_, c| !c.is_empty());
    }

    /// Tells `from` about other generations of its own id that recently synced with us (an
    /// empty part with that generation's signed beat): it decides whether it is a duplicate.
    pub(super) fn add_conflict_notices(
        &self,
        from: NodeId,
        digest: &crate::proto::digest::Digest,
        delta: &mut Delta,
        now_ms: u64,
    ) {
        let (Some(claims), Some(current)) = (self.claims.get(&from), &digest.own_beat) else {
            return;
        };
        let window = 2 * self.config.duplicate_confirm_ms;
        for (generation, (beat, at)) in claims {
            if *generation != current.generation && now_ms.saturating_sub(*at) < window {
                delta.nodes.push(NodeDelta {
                    node: from,
                    beat: beat.clone(),
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
        let (generation, heartbeat) = (part.generation(), part.heartbeat());
        if generation == ours || self.duplicate_reported {
            return;
        }
        let (first_heartbeat, first_ms) = *self
            .self_sightings
            .entry(generation)
            .or_insert((heartbeat, now_ms));
        if heartbeat > first_heartbeat
            && now_ms.saturating_sub(first_ms) >= self.config.duplicate_confirm_ms
        {
            self.duplicate_reported = true;
            self.events.push(Event::DuplicateId {
                ours,
                other: generation,
            });
        }
    }
}
