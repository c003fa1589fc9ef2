//! One node's replica of the cluster state and the protocol around it, with no IO: time comes
//! in as milliseconds, messages come in as bytes, and what must be sent goes out through a
//! [`Transport`]. The iroh driver and the simulator drive the same code.

use crate::proto::beat::Beat;
use crate::proto::codec::{self, Message};
use crate::proto::delta::{Delta, NodeDelta};
use crate::proto::failure_detector::{FailureDetector, FailureDetectorConfig, Liveness};
use crate::proto::id::NodeId;
use crate::proto::record::{signed_bytes, Authority, Record, MAX_KEY_LEN, MAX_VALUE_LEN};
use crate::proto::rng::Rng;
use crate::proto::state::{ClusterState, NodeState};
use crate::proto::transport::Transport;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

mod sync;

/// Protocol tuning. The defaults suit a LAN of up to a few hundred nodes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Config {
    /// Period of heartbeats, gossip flushes and sync rounds.
    pub gossip_interval_ms: u64,
    /// Peers synced with per round.
    pub sync_fanout: usize,
    /// Failure detector tuning.
    pub failure_detector: FailureDetectorConfig,
    /// How long a dead node's records are kept before they expire.
    pub dead_grace_ms: u64,
    /// How long a tombstone is kept before garbage collection.
    pub tombstone_grace_ms: u64,
    /// Largest gossip broadcast (iroh-gossip's limit is 4096 bytes including its framing).
    pub max_broadcast_bytes: usize,
    /// Byte budget of one sync delta.
    pub max_sync_delta_bytes: usize,
    /// Most bytes of records one author may hold.
    pub max_author_bytes: usize,
    /// How long another process with this node's id must be seen heartbeating before it is
    /// reported as a duplicate (longer than a stale heartbeat takes to stop spreading).
    pub duplicate_confirm_ms: u64,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            gossip_interval_ms: 250,
            sync_fanout: 3,
            failure_detector: FailureDetectorConfig {
                phi_threshold: 6.0,
                window: 100,
                initial_interval_ms: 250,
                max_interval_ms: 5_000,
                min_mean_ms: 250,
            },
            dead_grace_ms: 60_000,
            tombstone_grace_ms: 120_000,
            max_broadcast_bytes: 3_800,
            max_sync_delta_bytes: 1024 * 1024,
            max_author_bytes: 512 * 1024,
            duplicate_confirm_ms: 5_000,
        }
    }
}

/// Something the node (or its operator) should know about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A node appeared, or restarted with a new generation.
    Joined(NodeId),
    /// A node's heartbeat stopped.
    Died(NodeId),
    /// A node thought dead heartbeats again.
    Revived(NodeId),
    /// A dead node's records expired and were removed.
    Expired(NodeId),
    /// An author's records changed.
    Changed(NodeId),
    /// Another live process uses this node's id (a copied data directory).
    DuplicateId {
        /// Our generation.
        ours: u64,
        /// The other process's generation: if lower, we are the newer process.
        other: u64,
    },
}

/// Counters for operators and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    /// Records dropped because their signature is not their author's.
    pub forged_records: u64,
    /// Parts dropped because their beat (generation, heartbeat, versions) is not signed by
    /// their author.
    pub forged_beats: u64,
    /// Resets not honoured because the records sent are not the set the author's beat signs
    /// (merged as ordinary records instead).
    pub unverified_resets: u64,
    /// Authors whose records held here did not hash to their beat: a sender left some out,
    /// and a full copy was asked for.
    pub inconsistent_authors: u64,
    /// Messages that failed to decode.
    pub malformed_messages: u64,
    /// Own records too big for a gossip broadcast (sent by anti-entropy only).
    pub oversized_for_gossip: u64,
    /// Records merged into the state.
    pub records_applied: u64,
    /// Gossip broadcasts sent.
    pub broadcasts_sent: u64,
    /// Anti-entropy exchanges started.
    pub syncs_started: u64,
}

/// Why a write was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WriteError {
    /// Key too long or empty.
    #[error("record key must be 1..={MAX_KEY_LEN} bytes, got {0}")]
    Key(usize),
    /// Value too long.
    #[error("record value of {0} bytes is over the {MAX_VALUE_LEN}-byte limit")]
    Value(usize),
    /// This node's records would exceed the per-author budget.
    #[error("this node's records would take {0} bytes, over the per-node limit of {1}; delete some first")]
    AuthorFull(usize, usize),
}

#[derive(Debug, Clone, Copy)]
struct Departed {
    generation: u64,
    heartbeat: u64,
    at_ms: u64,
}

/// A node's replica of the cluster state plus the protocol logic.
pub struct Replica {
    id: NodeId,
    config: Config,
    authority: Arc<dyn Authority>,
    state: ClusterState,
    detector: FailureDetector,
    rng: Rng,
    known_peers: BTreeSet<NodeId>,
    broadcast_up_to: u64,
    departed: BTreeMap<NodeId, Departed>,
    self_sightings: BTreeMap<u64, (u64, u64)>,
    /// Signed beats peers showed of themselves, by peer and generation, with when.
    claims: BTreeMap<NodeId, BTreeMap<u64, (Beat, u64)>>,
    duplicate_reported: bool,
    events: Vec<Event>,
    /// When a peer last joined or came back from the dead, on the `now_ms` clock.
    last_return_ms: Option<u64>,
    stats: Stats,
    rotation: usize,
}

impl std::fmt::Debug for Replica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replica")
            .field("id", &self.id)
            .field("nodes", &self.state.nodes.len())
            .finish()
    }
}

impl Replica {
    /// A replica for node `id` in `generation` (a restart must use a higher one), signing with
    /// `authority`, picking peers with a generator seeded by `seed`.
    pub fn new(
        id: NodeId,
        generation: u64,
        config: Config,
        authority: Arc<dyn Authority>,
        seed: u64,
    ) -> Replica {
        let mut state = ClusterState::default();
        state.nodes.insert(id, NodeState::new(generation));
        let mut replica = Replica {
            id,
            config,
            authority,
            state,
            detector: FailureDetector::new(config.failure_detector),
            rng: Rng::new(seed),
            known_peers: BTreeSet::new(),
            broadcast_up_to: 0,
            departed: BTreeMap::new(),
            self_sightings: BTreeMap::new(),
            claims: BTreeMap::new(),
            duplicate_reported: false,
            events: Vec::new(),
            last_return_ms: None,
            stats: Stats::default(),
            rotation: 0,
        };
        replica.sign_beat();
        replica
    }

    /// Signs this node's beat of its state as it is now (after a heartbeat or a write), so
    /// that what it sends is always covered by its own signature.
    fn sign_beat(&mut self) {
        let own = self.own();
        let records_hash = own.live_hash().unwrap_or_default();
        let beat = Beat::sign(
            &self.id,
            self.authority.as_ref(),
            own.generation,
            own.heartbeat,
            own.max_version,
            records_hash,
        );
        self.own_mut().beat = beat;
    }

    /// This node's current signed beat.
    pub fn own_beat(&self) -> &Beat {
        &self.own().beat
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// This node's generation.
    pub fn generation(&self) -> u64 {
        self.own().generation
    }

    /// The protocol configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    fn own(&self) -> &NodeState {
        &self.state.nodes[&self.id]
    }

    fn own_mut(&mut self) -> &mut NodeState {
        self.state
            .nodes
            .get_mut(&self.id)
            .expect("a replica always holds its own node")
    }

    /// The whole replicated state.
    pub fn state(&self) -> &ClusterState {
        &self.state
    }

    /// Counters.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Takes the events that happened since the last call.
    pub fn drain_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.events)
    }

    /// When a peer last joined or came back from the dead (`now_ms` clock), if ever. Right
    /// after a partition heals, the first peers heard from bring news of the others only a
    /// gossip round later: until then this node still takes those others for dead.
    pub fn last_return_ms(&self) -> Option<u64> {
        self.last_return_ms
    }

    /// True if `node` is this node, or heartbeats and is not considered dead.
    pub fn is_alive(&self, node: &NodeId) -> bool {
        *node == self.id || self.detector.is_alive(node)
    }

    /// True if `node` was heard from and then went silent (a detected death). A node not
    /// heard from yet is neither alive nor dead: a late joiner must not take the nodes it
    /// only knows from the state for dead ones.
    pub fn is_dead(&self, node: &NodeId) -> bool {
        *node != self.id && self.detector.dead_since(node).is_some()
    }

    /// Nodes currently considered alive, this one included, in id order.
    pub fn live_nodes(&self) -> Vec<NodeId> {
        self.state
            .nodes
            .keys()
            .filter(|id| self.is_alive(id))
            .copied()
            .collect()
    }

    /// Suspicion level of `node` (see the failure detector).
    pub fn phi(&self, node: &NodeId, now_ms: u64) -> Option<f64> {
        self.detector.phi(node, now_ms)
    }

    /// Adds a peer to sync with (found by discovery or given by the user) before it is known
    /// from the state.
    pub fn add_peer(&mut self, peer: NodeId) {
        if peer != self.id {
            self.known_peers.insert(peer);
        }
    }

    /// Writes this node's record `key`. It reaches others at the next tick (gossip) or sync.
    pub fn set(&mut self, key: &str, value: &str, now_ms: u64) -> Result<(), WriteError> {
        if key.is_empty() || key.len() > MAX_KEY_LEN {
            return Err(WriteError::Key(key.len()));
        }
        if value.len() > MAX_VALUE_LEN {
            return Err(WriteError::Value(value.len()));
        }
        if self.own().records.get(key).and_then(|r| r.value.as_deref()) == Some(value) {
            return Ok(());
        }
        let old = self.own().records.get(key).map_or(0, |r| r.wire_size(key));
        let new_size = self.own().size() - old + key.len() + value.len() + 80;
        if new_size > self.config.max_author_bytes {
            return Err(WriteError::AuthorFull(
                new_size,
                self.config.max_author_bytes,
            ));
        }
        self.write(key, Some(value), now_ms);
        Ok(())
    }

    /// Deletes this node's record `key` (a tombstone replicates the deletion). True if it
    /// existed.
    pub fn delete(&mut self, key: &str, now_ms: u64) -> bool {
        let exists = self
            .own()
            .records
            .get(key)
            .is_some_and(|r| r.value.is_some());
        if exists {
            self.write(key, None, now_ms);
        }
        exists
    }

    /// This node's live value of `key`.
    pub fn get_own(&self, key: &str) -> Option<&str> {
        self.own().records.get(key)?.value.as_deref()
    }

    fn write(&mut self, key: &str, value: Option<&str>, now_ms: u64) {
        let generation = self.generation();
        let version = self.own().max_version + 1;
        let signature = self
            .authority
            .sign(&signed_bytes(&self.id, generation, key, version, value));
        let own = self.own_mut();
        own.put(
            key,
            Record {
                version,
                value: value.map(str::to_string),
                signature,
            },
            now_ms,
        );
        own.max_version = version;
        self.sign_beat();
        let id = self.id;
        self.events.push(Event::Changed(id));
    }

    /// One protocol round: heartbeat, gossip own changes, liveness, expiry, garbage collection,
    /// and anti-entropy with `sync_fanout` random peers.
    pub fn tick(&mut self, now_ms: u64, transport: &mut dyn Transport) {
        self.own_mut().heartbeat += 1;
        self.sign_beat();
        self.flush_broadcast(transport);
        self.update_liveness(now_ms);
        let grace = self.config.tombstone_grace_ms;
        for state in self.state.nodes.values_mut() {
            state.collect_tombstones(now_ms, grace);
        }
        for peer in self.pick_sync_peers() {
            self.stats.syncs_started += 1;
            transport.sync(peer, self.syn());
        }
    }

    fn flush_broadcast(&mut self, transport: &mut dyn Transport) {
        let own = self.own();
        if own.max_version <= self.broadcast_up_to {
            return;
        }
        let from = self.broadcast_up_to;
        let mut records: Vec<(String, Record)> = own
            .records
            .iter()
            .filter(|(_, r)| r.version > from)
            .map(|(k, r)| (k.clone(), r.clone()))
            .collect();
        records.sort_by_key(|(_, r)| r.version);
        let delta = NodeDelta {
            node: self.id,
            beat: own.beat.clone(),
            reset: false,
            from_version: from,
            to_version: own.max_version,
            records,
        };
        self.broadcast_up_to = own.max_version;
        let (pieces, refused) = delta.split(self.config.max_broadcast_bytes - 64);
        self.stats.oversized_for_gossip += refused.len() as u64;
        for piece in pieces {
            let bytes = codec::encode(&Message::Broadcast(Delta { nodes: vec![piece] }));
            if bytes.len() > self.config.max_broadcast_bytes {
                // The estimate was off: leave it to anti-entropy rather than break the topic.
                self.stats.oversized_for_gossip += 1;
                continue;
            }
            self.stats.broadcasts_sent += 1;
            transport.broadcast(bytes);
        }
    }

    fn update_liveness(&mut self, now_ms: u64) {
        for change in self.detector.update(now_ms) {
            if let Liveness::Died(id) = change {
                self.events.push(Event::Died(id));
            }
        }
        let expired: Vec<NodeId> = self
            .detector
            .dead_nodes()
            .filter(|id| {
                self.detector
                    .dead_since(id)
                    .is_some_and(|since| now_ms.saturating_sub(since) >= self.config.dead_grace_ms)
            })
            .copied()
            .collect();
        for id in expired {
            self.detector.forget(&id);
            if let Some(state) = self.state.nodes.remove(&id) {
                self.departed.insert(
                    id,
                    Departed {
                        generation: state.generation,
                        heartbeat: state.heartbeat,
                        at_ms: now_ms,
                    },
                );
            }
            self.known_peers.remove(&id);
            self.events.push(Event::Expired(id));
        }
        let keep = 2 * self.config.dead_grace_ms;
        self.departed
            .retain(|_, d| now_ms.saturating_sub(d.at_ms) < keep);
    }

    fn pick_sync_peers(&mut self) -> Vec<NodeId> {
        let live: Vec<NodeId> = self
            .state
            .nodes
            .keys()
            .chain(self.known_peers.iter())
            .filter(|id| **id != self.id && !self.detector.dead_nodes().any(|d| d == *id))
            .copied()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut peers = self.rng.sample(&live, self.config.sync_fanout);
        // Now and then try a dead node too, so a node that comes back is noticed.
        let dead: Vec<NodeId> = self.detector.dead_nodes().copied().collect();
        if !dead.is_empty() {
            let p = dead.len() as f64 / (live.len() + dead.len()) as f64;
            if self.rng.chance(p) {
                peers.extend(self.rng.sample(&dead, 1));
            }
        }
        peers
    }
}
