//! A simulator: hundreds of [`Replica`]s in one process, a fake clock, random latency, message
//! loss and partitions. Tests use it to check convergence and liveness; `cargo xtask bench
//! mesh` uses it to measure bandwidth and detection times.
//!
//! Gossip broadcasts are modelled as iroh-gossip delivers them: one copy reaches every other
//! node (each copy lost independently); anti-entropy is the three-message exchange.

use crate::id::NodeId;
use crate::record::SimAuthority;
use crate::replica::{Config, Event, Replica};
use crate::rng::Rng;
use crate::transport::Outbox;
use std::collections::BTreeMap;
use std::sync::Arc;

/// A scenario's network and protocol settings.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Number of nodes.
    pub nodes: usize,
    /// Seed of every random choice (network and replicas).
    pub seed: u64,
    /// Probability that any one message is lost.
    pub loss: f64,
    /// Smallest one-way latency.
    pub min_latency_ms: u64,
    /// Largest one-way latency.
    pub max_latency_ms: u64,
    /// Peers each node knows at start (as discovery would give it).
    pub seed_peers: usize,
    /// Protocol settings of every replica.
    pub replica: Config,
}

impl SimConfig {
    /// `nodes` nodes on a LAN-like network (1–5 ms, no loss) with default protocol settings.
    pub fn lan(nodes: usize, seed: u64) -> SimConfig {
        SimConfig {
            nodes,
            seed,
            loss: 0.0,
            min_latency_ms: 1,
            max_latency_ms: 5,
            seed_peers: 3,
            replica: Config::default(),
        }
    }
}

/// Bytes and messages received by one node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Messages delivered to the node.
    pub messages: u64,
    /// Bytes delivered to the node.
    pub bytes: u64,
}

#[derive(Debug)]
enum Delivery {
    Broadcast {
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
    index: BTreeMap<NodeId, usize>,
    rng: Rng,
    traffic: Vec<Traffic>,
    events: Vec<(u64, usize, Event)>,
    largest_broadcast: usize,
}

impl Sim {
    /// Builds the cluster; every node writes a `profile` record of about 300 bytes at time 0.
    pub fn new(config: SimConfig) -> Sim {
        let mut rng = Rng::new(config.seed);
        let mut sim = Sim {
            now_ms: 0,
            seq: 0,
            queue: BTreeMap::new(),
            nodes: Vec::new(),
            index: BTreeMap::new(),
            traffic: vec![Traffic::default(); config.nodes],
            events: Vec::new(),
            largest_broadcast: 0,
            rng: Rng::new(rng.next_u64()),
            config,
        };
        for i in 0..sim.config.nodes {
            let id = NodeId::from_index(i as u64);
            sim.index.insert(id, i);
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
        let profile = format!(
            "{{\"name\":\"node-{i}\",\"generation\":{generation},\"memory\":{},\"pad\":\"{}\"}}",
            64u64 << 30,
            "x".repeat(220)
        );
        replica
            .set("profile", &profile, self.now_ms)
            .expect("a small profile always fits");
        let n = self.config.nodes as u64;
        for _ in 0..self.config.seed_peers {
            let peer = self.rng.below(n) as usize;
            replica.add_peer(NodeId::from_index(peer as u64));
        }
        replica
    }

    fn schedule(&mut self, delay_ms: u64, delivery: Delivery) {
        self.seq += 1;
        self.queue
            .insert((self.now_ms + delay_ms, self.seq), delivery);
    }

    fn latency(&mut self) -> u64 {
        let span = self.config.max_latency_ms - self.config.min_latency_ms + 1;
        self.config.min_latency_ms + self.rng.below(span)
    }

    /// Sends over the simulated network: lost by chance, by partition, or to a dead node.
    fn send(&mut self, from: usize, to: usize, delivery: Delivery) {
        if self.nodes[from].group != self.nodes[to].group || self.rng.chance(self.config.loss) {
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

    fn count(&mut self, to: usize, bytes: &[u8]) {
        self.traffic[to].messages += 1;
        self.traffic[to].bytes += bytes.len() as u64;
    }

    fn deliver(&mut self, delivery: Delivery) {
        let now = self.now_ms;
        match delivery {
            Delivery::Tick { node, generation } => {
                if !self.nodes[node].alive || self.nodes[node].replica.generation() != generation {
                    return;
                }
                let mut outbox = Outbox::default();
                self.nodes[node].replica.tick(now, &mut outbox);
                self.collect_events(node);
                for bytes in outbox.broadcasts {
                    self.largest_broadcast = self.largest_broadcast.max(bytes.len());
                    for to in 0..self.nodes.len() {
                        if to != node {
                            let bytes = bytes.clone();
                            self.send(node, to, Delivery::Broadcast { to, bytes });
                        }
                    }
                }
                for (peer, bytes) in outbox.syncs {
                    if let Some(&to) = self.index.get(&peer) {
                        self.send(
                            node,
                            to,
                            Delivery::Syn {
                                from: node,
                                to,
                                bytes,
                            },
                        );
                    }
                }
                let interval = self.config.replica.gossip_interval_ms;
                self.schedule(interval, Delivery::Tick { node, generation });
            }
            Delivery::Broadcast { to, bytes } => {
                if !self.nodes[to].alive {
                    return;
                }
                self.count(to, &bytes);
                let _ = self.nodes[to].replica.on_broadcast(&bytes, now);
                self.collect_events(to);
            }
            Delivery::Syn { from, to, bytes } => {
                if !self.nodes[to].alive {
                    return;
                }
                self.count(to, &bytes);
                let from_id = NodeId::from_index(from as u64);
                if let Ok(reply) = self.nodes[to].replica.on_syn(from_id, &bytes, now) {
                    self.send(
                        to,
                        from,
                        Delivery::SynAck {
                            from: to,
                            to: from,
                            bytes: reply,
                        },
                    );
                }
                self.collect_events(to);
            }
            Delivery::SynAck { from, to, bytes } => {
                if !self.nodes[to].alive {
                    return;
                }
                self.count(to, &bytes);
                let from_id = NodeId::from_index(from as u64);
                if let Ok(reply) = self.nodes[to].replica.on_synack(from_id, &bytes, now) {
                    self.send(
                        to,
                        from,
                        Delivery::Ack {
                            from: to,
                            to: from,
                            bytes: reply,
                        },
                    );
                }
                self.collect_events(to);
            }
            Delivery::Ack { from, to, bytes } => {
                if !self.nodes[to].alive {
                    return;
                }
                self.count(to, &bytes);
                let from_id = NodeId::from_index(from as u64);
                let _ = self.nodes[to].replica.on_ack(from_id, &bytes, now);
                self.collect_events(to);
            }
        }
    }

    fn collect_events(&mut self, node: usize) {
        let now = self.now_ms;
        for event in self.nodes[node].replica.drain_events() {
            if !matches!(event, Event::Changed(_)) {
                self.events.push((now, node, event));
            }
        }
    }

    /// Stops node `i` (a crash: no goodbye).
    pub fn kill(&mut self, i: usize) {
        self.nodes[i].alive = false;
    }

    /// Starts node `i` again with a new generation and its profile record.
    pub fn restart(&mut self, i: usize) {
        let generation = self.nodes[i].replica.generation() + 1;
        let replica = self.make_replica(i, generation);
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

    /// Sets the message loss probability from now on.
    pub fn set_loss(&mut self, loss: f64) {
        self.config.loss = loss;
    }

    /// Node `i`'s replica.
    pub fn replica(&self, i: usize) -> &Replica {
        &self.nodes[i].replica
    }

    /// Node `i`'s replica, to write records.
    pub fn replica_mut(&mut self, i: usize) -> &mut Replica {
        &mut self.nodes[i].replica
    }

    /// True if node `i` runs.
    pub fn is_running(&self, i: usize) -> bool {
        self.nodes[i].alive
    }

    /// The id of node `i`.
    pub fn id(&self, i: usize) -> NodeId {
        NodeId::from_index(i as u64)
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

    /// Injects raw bytes as a gossip broadcast to node `to` (for bad-input tests).
    pub fn inject_broadcast(&mut self, to: usize, bytes: Vec<u8>) {
        self.schedule(0, Delivery::Broadcast { to, bytes });
    }
}
