//! The simulated gossip overlay: what each node's iroh-gossip topic knows, modelled on the
//! two protocols iroh-gossip runs (HyParView for membership, Plumtree for broadcast).
//!
//! Every node keeps a small *active view* of neighbours (5 by default, as in HyParView), and a
//! broadcast travels only along those links, so at 50–100 nodes a message takes several hops.
//! Each active link is *eager* (the whole message is pushed over it) or *lazy* (only an
//! `IHave` announcement is): a node that receives a message twice prunes the second link to
//! lazy, so the eager links settle into a spanning tree; a node that hears an `IHave` for a
//! message it lacks grafts the link back to eager after a timeout and asks for it.
//!
//! This is a model written for shoal, not iroh-gossip's code: no passive view or shuffles
//! (a node that must replace a neighbour picks any node it can reach, as shoal's mDNS finds
//! every node on the LAN), no Plumtree tree optimisation, and no batching of `IHave`s.

use crate::proto::rng::Rng;
use std::collections::{BTreeMap, BTreeSet};

/// Tuning of the simulated overlay. The defaults are iroh-gossip's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverlayConfig {
    /// Target size of each node's active view (HyParView's active view capacity).
    pub active_view: usize,
    /// How long after a neighbour became unreachable (crashed, partitioned away) the link is
    /// dropped and replaced. A guess at how long a QUIC connection takes to fail.
    pub link_timeout_ms: u64,
    /// How long a node waits after an `IHave` before it grafts (Plumtree's first timeout).
    pub graft_timeout_ms: u64,
    /// How long it waits before asking the next announcer (Plumtree's second timeout).
    pub graft_retry_ms: u64,
}

impl Default for OverlayConfig {
    fn default() -> OverlayConfig {
        OverlayConfig {
            active_view: 5,
            link_timeout_ms: 5_000,
            graft_timeout_ms: 80,
            graft_retry_ms: 40,
        }
    }
}

/// Estimated bytes of iroh-gossip's framing around one message, over the payload: topic id
/// (32), message id (32), round, scope and length prefixes.
pub const GOSSIP_FRAMING_BYTES: usize = 72;

/// Estimated bytes of one `IHave` announcement (topic id, message id, round, framing).
pub const IHAVE_BYTES: usize = 72;

/// Estimated bytes of a `Graft` request (topic id, message id, round, framing).
pub const GRAFT_BYTES: usize = 72;

/// Estimated bytes of a `Prune` (topic id, framing).
pub const PRUNE_BYTES: usize = 40;

/// One node's part of the overlay.
#[derive(Debug, Clone, Default)]
pub(super) struct Peer {
    /// Neighbours that get whole messages.
    pub eager: BTreeSet<usize>,
    /// Neighbours that get announcements only.
    pub lazy: BTreeSet<usize>,
    /// Messages this node has received (or sent), with the hops they took to get here.
    pub seen: BTreeMap<u64, u32>,
    /// Messages announced to this node but not received: who announced them, in order.
    pub missing: BTreeMap<u64, Vec<usize>>,
    /// Neighbours found unreachable, and since when.
    pub down_since: BTreeMap<usize, u64>,
}

impl Peer {
    /// Every neighbour, eager or lazy.
    pub fn neighbours(&self) -> Vec<usize> {
        self.eager.union(&self.lazy).copied().collect()
    }

    /// Size of the active view.
    pub fn degree(&self) -> usize {
        self.eager.len() + self.lazy.len()
    }

    fn has(&self, peer: usize) -> bool {
        self.eager.contains(&peer) || self.lazy.contains(&peer)
    }

    fn add(&mut self, peer: usize) {
        self.lazy.remove(&peer);
        self.eager.insert(peer);
    }

    /// Turns the link to `peer` eager, if it is a neighbour (a graft, or a message that came
    /// first over a lazy link).
    pub fn make_eager(&mut self, peer: usize) {
        if self.lazy.remove(&peer) {
            self.eager.insert(peer);
        }
    }

    /// Turns the link to `peer` lazy, if it is a neighbour (a prune).
    pub fn make_lazy(&mut self, peer: usize) {
        if self.eager.remove(&peer) {
            self.lazy.insert(peer);
        }
    }

    fn remove(&mut self, peer: usize) {
        self.eager.remove(&peer);
        self.lazy.remove(&peer);
        self.down_since.remove(&peer);
    }
}

/// Every node's active view and broadcast state.
#[derive(Debug, Clone)]
pub(super) struct Overlay {
    pub config: OverlayConfig,
    pub peers: Vec<Peer>,
}

impl Overlay {
    /// `nodes` nodes joined into a random graph where each has about `active_view`
    /// neighbours, as HyParView forms when every node joins through nodes it discovered.
    pub fn new(nodes: usize, config: OverlayConfig, rng: &mut Rng) -> Overlay {
        let mut overlay = Overlay {
            config,
            peers: vec![Peer::default(); nodes],
        };
        let all: Vec<usize> = (0..nodes).collect();
        let mut order = all.clone();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        for node in order {
            overlay.fill(node, &all, config.active_view, rng);
        }
        overlay
    }

    /// Links `a` and `b` (both ends eager).
    pub fn connect(&mut self, a: usize, b: usize) {
        if a != b {
            self.peers[a].add(b);
            self.peers[b].add(a);
        }
    }

    /// Drops the link between `a` and `b` at both ends.
    pub fn disconnect(&mut self, a: usize, b: usize) {
        self.peers[a].remove(b);
        self.peers[b].remove(a);
    }

    /// Drops every link of `node` and forgets its messages (a restarted process).
    pub fn reset(&mut self, node: usize) {
        for peer in self.peers[node].neighbours() {
            self.disconnect(node, peer);
        }
        self.peers[node] = Peer::default();
    }

    /// Most neighbours a node accepts once the overlay runs: a little over the target, so a
    /// node replacing a lost link or rejoining after a partition finds room without evicting
    /// anyone (HyParView evicts instead; the model keeps it simple).
    pub fn soft_cap(&self) -> usize {
        self.config.active_view + 2
    }

    /// Adds random links from `node` to `candidates` until it has the target number of
    /// neighbours; a candidate that already has `cap` neighbours is skipped.
    pub fn fill(&mut self, node: usize, candidates: &[usize], cap: usize, rng: &mut Rng) {
        let target = self.config.active_view;
        let mut open: Vec<usize> = candidates
            .iter()
            .copied()
            .filter(|&c| c != node && !self.peers[node].has(c) && self.peers[c].degree() < cap)
            .collect();
        while self.peers[node].degree() < target && !open.is_empty() {
            let pick = open.swap_remove(rng.below(open.len() as u64) as usize);
            self.connect(node, pick);
        }
    }

    /// A node that came back into reach (a healed partition, a revived peer) is joined again
    /// if both ends have room, as shoal's discovery re-joins peers it considered gone.
    pub fn rejoin(&mut self, a: usize, b: usize) {
        let cap = self.soft_cap();
        if a != b
            && !self.peers[a].has(b)
            && self.peers[a].degree() < cap
            && self.peers[b].degree() < cap
        {
            self.connect(a, b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_are_small_symmetric_and_connected() {
        let mut rng = Rng::new(3);
        let overlay = Overlay::new(100, OverlayConfig::default(), &mut rng);
        for (i, peer) in overlay.peers.iter().enumerate() {
            assert!(
                peer.degree() <= 5,
                "node {i} has {} neighbours",
                peer.degree()
            );
            assert!(
                peer.degree() >= 3,
                "node {i} has {} neighbours",
                peer.degree()
            );
            for n in peer.neighbours() {
                assert!(overlay.peers[n].neighbours().contains(&i));
            }
        }
        let mut reached = BTreeSet::from([0usize]);
        let mut frontier = vec![0usize];
        while let Some(n) = frontier.pop() {
            for m in overlay.peers[n].neighbours() {
                if reached.insert(m) {
                    frontier.push(m);
                }
            }
        }
        assert_eq!(reached.len(), 100);
    }

    #[test]
    fn prune_and_graft_move_links_between_eager_and_lazy() {
        let mut rng = Rng::new(1);
        let mut overlay = Overlay::new(3, OverlayConfig::default(), &mut rng);
        overlay.peers[0].make_eager(7);
        assert!(
            !overlay.peers[0].neighbours().contains(&7),
            "only neighbours are grafted"
        );
        overlay.peers[0].make_lazy(1);
        assert!(overlay.peers[0].lazy.contains(&1) && !overlay.peers[0].eager.contains(&1));
        overlay.peers[0].make_eager(1);
        assert!(overlay.peers[0].eager.contains(&1) && overlay.peers[0].lazy.is_empty());
        overlay.reset(0);
        assert_eq!(overlay.peers[0].degree(), 0);
        assert!(!overlay.peers[1].neighbours().contains(&0));
    }
}
