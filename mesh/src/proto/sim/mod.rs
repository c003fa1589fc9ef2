//! A simulator: hundreds of [`Replica`]s in one process, a fake clock, random latency, message
//! loss (everywhere or per link) and partitions. Tests use it to check convergence and
//! liveness; `cargo xtask bench mesh` uses it to measure bandwidth and detection times; the
//! control plane's simulation runs its nodes over it.
//!
//! Gossip broadcasts travel the way iroh-gossip carries them: over a bounded overlay (each node
//! has a few neighbours, see [`overlay`]), pushed along eager links and announced along lazy
//! ones, so a message reaches a large cluster in several hops, each hop with its own latency
//! and loss. Anti-entropy is the replicas' real three-message exchange. Every message is the
//! real codec's bytes with 64-byte stand-in signatures and 32-byte node ids, so sizes are the
//! wire sizes before QUIC and TLS framing.
//!
//! Left out (the figures are the protocol's, not a deployment's): QUIC/TLS/UDP headers and
//! handshakes, connection setup time, iroh-gossip's exact protocol (its passive view, shuffles,
//! tree optimisation and `IHave` batching), CPU time (every message is handled instantly),
//! bandwidth limits and queueing, and the reachability probes' own HTTP traffic.

mod broadcast;
pub mod overlay;
mod scenario;

pub use scenario::{small_profile, GossipStats, RecordsFn, SimConfig, Traffic};

use crate::proto::id::NodeId;
use crate::proto::record::SimAuthority;
use crate::proto::replica::{Event, Replica};
use crate::proto::rng::Rng;
use crate::proto::transport::Outbox;
use overlay::Overlay;
use std::collections::BTreeMap;
use std::sync::Arc;

#[derive(Debug)]
pub(super) enum Delivery {
    Gossip {
        from: usize,
        to: usize,
        id: u64,
        hops: u32,
    },
    IHave {
        from: usize,
        to: usize,
        id: u64,
    },
    Graft {
        from: usize,
        to: usize,
        id: u64,
    },
    Prune {
        from: usize,
        to: usize,
    },
    GraftTimer {
        node: usize,
        id: u64,
    },
    Inject {
        to: usize,
        bytes: Vec<u8>,
    },
    Syn {
        from: usize,
        to: usize,
        bytes: Vec<u8>,
    },
    SynAck {
        from: usize,
        to: usize,
        bytes: Vec<u8>,
    },
    Ack {
        from: usize,
        to: usize,
        bytes: Vec<u8>,
    },
    Tick {
        node: usize,
        generation: u64,
    },
}

struct SimNode {
    replica: Replica,
    alive: bool,
    group: u32,
}

/// The simulated cluster.
pub struct Sim {
    config: SimConfig,
    now_ms: u64,
    seq: u64,
    queue: BTreeMap<(u64, u64), Delivery>,
    nodes: Vec<SimNode>,
    rng: Rng,
    traffic: Vec<Traffic>,
    events: Vec<(u64, usize, Event)>,
    largest_broadcast: usize,
    overlay: Overlay,
    payloads: BTreeMap<u64, Arc<Vec<u8>>>,
    gossip: GossipStats,
    link_loss: BTreeMap<(usize, usize), f64>,
}

impl Sim {
    /// Builds the cluster and its overlay; every node writes its start-up records at time 0.
    pub fn new(config: SimConfig) -> Sim {
        let mut rng = Rng::new(config.seed);
        let overlay = Overlay::new(config.nodes, config.overlay, &mut rng);
        let mut sim = Sim {
            now_ms: 0,
            seq: 0,
            queue: BTreeMap::new(),
            nodes: Vec::new(),
            traffic: vec![Traffic::default(); config.nodes],
            events: Vec::new(),
            largest_broadcast: 0,
            rng: Rng::new(rng.next_u64()),
            overlay,
            payloads: BTreeMap::new(),
            gossip: GossipStats::default(),
            link_loss: BTreeMap::new(),
            config,
        };
        for i in 0..sim.config.nodes {
            let replica = sim.make_replica(i, 1);
            sim.nodes.push(SimNode {
                replica,
                alive: true,
                group: 0,
            });
            let offset = rng.below(sim.config.replica.gossip_interval_ms.max(1));
            sim.schedule(
                offset,
                Delivery::Tick {
                    node: i,
                    generation: 1,
                },
            );
        }
        sim
    }

    fn make_replica(&mut self, i: usize, generation: u64) -> Replica {
        let id = NodeId::from_index(i as u64);
        let mut replica = Replica::new(
            id,
            generation,
            self.config.replica,
            Arc::new(SimAuthority::new(id)),
            self.rng.next_u64(),
        );
        for (key, value) in (self.config.records)(i, self.config.nodes, generation) {
            replica
                .set(&key, &value, self.now_ms)
                .expect("a scenario's start-up records fit the limits");
        }
        let n = self.config.nodes as u64;
        for _ in 0..self.config.seed_peers {
            let peer = self.rng.below(n) as usize;
            replica.add_peer(NodeId::from_index(peer as u64));
        }
        replica
    }

    pub(super) fn schedule(&mut self, delay_ms: u64, delivery: Delivery) {
        self.seq += 1;
        self.queue
            .insert((self.now_ms + delay_ms, self.seq), delivery);
    }

    fn latency(&mut self) -> u64 {
        let span = self.config.max_latency_ms - self.config.min_latency_ms + 1;
        self.config.min_latency_ms + self.rng.below(span)
    }

    /// True if `a` and `b` run and no partition separates them.
    pub fn reachable(&self, a: usize, b: usize) -> bool {
        self.nodes[a].alive && self.nodes[b].alive && self.nodes[a].group == self.nodes[b].group
    }

    /// Sends over the simulated network: lost by chance (the global or the link's loss), by
    /// partition, or later at delivery if the receiver is dead.
    pub(super) fn send(&mut self, from: usize, to: usize, delivery: Delivery) {
        let loss = self
            .link_loss
            .get(&(from.min(to), from.max(to)))
            .copied()
            .unwrap_or(self.config.loss);
        if self.nodes[from].group != self.nodes[to].group || self.rng.chance(loss) {
            return;
        }
        let delay = self.latency();
        self.schedule(delay, delivery);
    }

    /// Current simulated time.
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// Runs until simulated time `until_ms`.
    pub fn run_until(&mut self, until_ms: u64) {
        while let Some(entry) = self.queue.first_entry() {
            if entry.key().0 > until_ms {
                break;
            }
            let ((at, _), delivery) = entry.remove_entry();
            self.now_ms = at;
            self.deliver(delivery);
        }
        self.now_ms = until_ms;
    }

    /// Runs in steps of `step_ms` until `done` holds or `limit_ms` passes; returns the time it
    /// first held.
    pub fn run_until_true(
        &mut self,
        step_ms: u64,
        limit_ms: u64,
        mut done: impl FnMut(&Sim) -> bool,
    ) -> Option<u64> {
        while self.now_ms < limit_ms {
            if done(self) {
                return Some(self.now_ms);
            }
            let next = self.now_ms + step_ms;
            self.run_until(next);
        }
        done(self).then_some(self.now_ms)
    }

    pub(super) fn count(&mut self, to: usize, bytes: usize) {
        self.traffic[to].messages += 1;
        self.traffic[to].bytes += bytes as u64;
    }

    fn deliver(&mut self, delivery: Delivery) {
        let now = self.now_ms;
        match delivery {
            Delivery::Tick { node, generation } => {
                if !self.nodes[node].alive || self.nodes[node].replica.generation() != generation {
                    return;
                }
                self.maintain_overlay(node);
                let mut outbox = Outbox::default();
                self.nodes[node].replica.tick(now, &mut outbox);
                self.collect_events(node);
                for bytes in outbox.broadcasts {
                    self.largest_broadcast = self.largest_broadcast.max(bytes.len());
                    self.originate(node, bytes);
                }
                for (peer, bytes) in outbox.syncs {
                    let to = index_of(&peer);
                    if to < self.nodes.len() {
                        let syn = Delivery::Syn {
                            from: node,
                            to,
                            bytes,
                        };
                        self.send(node, to, syn);
                    }
                }
                let interval = self.config.replica.gossip_interval_ms;
                self.schedule(interval, Delivery::Tick { node, generation });
            }
            Delivery::Gossip { from, to, id, hops } => self.on_gossip(from, to, id, hops),
            Delivery::IHave { from, to, id } => self.on_ihave(from, to, id),
            Delivery::Graft { from, to, id } => self.on_graft(from, to, id),
            Delivery::Prune { from, to } => self.on_prune(from, to),
            Delivery::GraftTimer { node, id } => self.on_graft_timer(node, id),
            Delivery::Inject { to, bytes } => {
                if self.nodes[to].alive {
                    self.count(to, bytes.len());
                    let _ = self.nodes[to].replica.on_broadcast(&bytes, now);
                    self.collect_events(to);
                }
            }
            Delivery::Syn { from, to, bytes } => {
                if !self.nodes[to].alive {
                    return;
                }
                self.count(to, bytes.len());
                let from_id = NodeId::from_index(from as u64);
                if let Ok(reply) = self.nodes[to].replica.on_syn(from_id, &bytes, now) {
                    let synack = Delivery::SynAck {
                        from: to,
                        to: from,
                        bytes: reply,
                    };
                    self.send(to, from, synack);
                }
                self.collect_events(to);
            }
            Delivery::SynAck { from, to, bytes } => {
                if !self.nodes[to].alive {
                    return;
                }
                self.count(to, bytes.len());
                let from_id = NodeId::from_index(from as u64);
                if let Ok(reply) = self.nodes[to].replica.on_synack(from_id, &bytes, now) {
                    let ack = Delivery::Ack {
                        from: to,
                        to: from,
                        bytes: reply,
                    };
                    self.send(to, from, ack);
                }
                self.collect_events(to);
            }
            Delivery::Ack { from, to, bytes } => {
                if !self.nodes[to].alive {
                    return;
                }
                self.count(to, bytes.len());
                let from_id = NodeId::from_index(from as u64);
                let _ = self.nodes[to].replica.on_ack(from_id, &bytes, now);
                self.collect_events(to);
            }
        }
    }

    pub(super) fn collect_events(&mut self, node: usize) {
        let now = self.now_ms;
        for event in self.nodes[node].replica.drain_events() {
            match event {
                Event::Changed(_) => continue,
                // Shoal's discovery joins a peer it considered gone again on the topic.
                Event::Revived(peer) => {
                    let peer = index_of(&peer);
                    if peer < self.nodes.len() && self.reachable(node, peer) {
                        self.overlay.rejoin(node, peer);
                    }
                }
                _ => {}
            }
            self.events.push((now, node, event));
        }
    }

    /// Stops node `i` (a crash: no goodbye).
    pub fn kill(&mut self, i: usize) {
        self.nodes[i].alive = false;
    }

    /// Starts node `i` again with a new generation, its start-up records and an empty
    /// overlay view (it joins again at its first tick).
    pub fn restart(&mut self, i: usize) {
        let generation = self.nodes[i].replica.generation() + 1;
        let replica = self.make_replica(i, generation);
        self.overlay.reset(i);
        self.nodes[i] = SimNode {
            replica,
            alive: true,
            group: self.nodes[i].group,
        };
        self.schedule(
            0,
            Delivery::Tick {
                node: i,
                generation,
            },
        );
    }

    /// Splits the network: node `i` can only reach nodes with the same `groups[i]`.
    pub fn partition(&mut self, groups: &[u32]) {
        for (node, group) in self.nodes.iter_mut().zip(groups) {
            node.group = *group;
        }
    }

    /// Joins every partition again.
    pub fn heal(&mut self) {
        for node in &mut self.nodes {
            node.group = 0;
        }
    }

    /// Sets the message loss probability from now on (links with their own loss keep it).
    pub fn set_loss(&mut self, loss: f64) {
        self.config.loss = loss;
    }

    /// Sets the loss probability of the link between `a` and `b` (both directions), over the
    /// global one; `None` gives the link the global loss again.
    pub fn set_link_loss(&mut self, a: usize, b: usize, loss: Option<f64>) {
        let key = (a.min(b), a.max(b));
        match loss {
            Some(loss) => self.link_loss.insert(key, loss),
            None => self.link_loss.remove(&key),
        };
    }

    /// Node `i`'s replica.
    pub fn replica(&self, i: usize) -> &Replica {
        &self.nodes[i].replica
    }

    /// Node `i`'s replica, to write records.
    pub fn replica_mut(&mut self, i: usize) -> &mut Replica {
        &mut self.nodes[i].replica
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True if the cluster has no nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// True if node `i` runs.
    pub fn is_running(&self, i: usize) -> bool {
        self.nodes[i].alive
    }

    /// The id of node `i`.
    pub fn id(&self, i: usize) -> NodeId {
        NodeId::from_index(i as u64)
    }

    /// Node `i`'s neighbours in the gossip overlay.
    pub fn neighbours(&self, i: usize) -> Vec<usize> {
        self.overlay.peers[i].neighbours()
    }

    /// True if every running node holds the same version of every running node's records.
    pub fn converged(&self) -> bool {
        let running: Vec<&SimNode> = self.nodes.iter().filter(|n| n.alive).collect();
        let Some(first) = running.first() else {
            return true;
        };
        let view = |n: &SimNode| -> Vec<(NodeId, u64, u64)> {
            running
                .iter()
                .map(|r| {
                    let id = r.replica.id();
                    let s = n.replica.state().nodes.get(&id);
                    (
                        id,
                        s.map_or(0, |s| s.generation),
                        s.map_or(0, |s| s.max_version),
                    )
                })
                .collect()
        };
        let reference = view(first);
        reference
            .iter()
            .zip(running.iter())
            .all(|((_, generation, version), r)| {
                *generation == r.replica.generation()
                    && *version == r.replica.state().nodes[&r.replica.id()].max_version
            })
            && running.iter().all(|n| view(n) == reference)
    }

    /// True if every running node other than `i` considers `i` dead (or has expired it).
    pub fn all_see_dead(&self, i: usize) -> bool {
        let id = self.id(i);
        self.nodes
            .iter()
            .enumerate()
            .filter(|(j, n)| *j != i && n.alive)
            .all(|(_, n)| !n.replica.is_alive(&id))
    }

    /// Liveness events so far: (time, observer, event).
    pub fn events(&self) -> &[(u64, usize, Event)] {
        &self.events
    }

    /// Per-node traffic received so far.
    pub fn traffic(&self) -> &[Traffic] {
        &self.traffic
    }

    /// Clears the traffic counters (to measure a steady-state window).
    pub fn reset_traffic(&mut self) {
        self.traffic = vec![Traffic::default(); self.nodes.len()];
    }

    /// How broadcasts travelled the overlay so far.
    pub fn gossip_stats(&self) -> GossipStats {
        self.gossip
    }

    /// Size of the largest gossip broadcast any node sent.
    pub fn largest_broadcast(&self) -> usize {
        self.largest_broadcast
    }

    /// Forged records dropped, summed over all nodes.
    pub fn forged_records(&self) -> u64 {
        self.nodes
            .iter()
            .map(|n| n.replica.stats().forged_records)
            .sum()
    }

    /// Injects raw bytes as a gossip broadcast to node `to` (for bad-input tests); it is
    /// handed to that node's replica only, not forwarded.
    pub fn inject_broadcast(&mut self, to: usize, bytes: Vec<u8>) {
        self.schedule(0, Delivery::Inject { to, bytes });
    }
}

/// The sim index of a made-up id ([`NodeId::from_index`]); out of range for any other id.
fn index_of(id: &NodeId) -> usize {
    let bytes = id.as_bytes();
    if bytes[8..].iter().any(|b| *b != 0) {
        return usize::MAX;
    }
    let mut first = [0u8; 8];
    first.copy_from_slice(&bytes[..8]);
    usize::try_from(u64::from_be_bytes(first)).unwrap_or(usize::MAX)
}
